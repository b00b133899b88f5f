"""What the launch protocol does with memory that no resource tracks."""

from __future__ import annotations

import enum

__all__ = ["RecorderMode"]


class RecorderMode(str, enum.Enum):
    """What a launch does with memory that no resource of the runtime tracks."""

    #: Refuse it at preflight: every buffer must be tracked.
    STRICT = "strict"
    #: Skip it: no ordering is applied to that buffer.
    PERMISSIVE = "permissive"
