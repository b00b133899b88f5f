"""What the launch protocol does with memory that no resource tracks."""

from __future__ import annotations

import enum
from typing import Any

from numba_streamsafe.core.errors import InvalidArgument

__all__ = ["RecorderMode", "recorder_mode"]


class RecorderMode(str, enum.Enum):
    """What a launch does with memory that no resource of the runtime tracks."""

    #: Refuse it at preflight: every buffer must be tracked.
    STRICT = "strict"
    #: Skip it: no ordering is applied to that buffer.
    PERMISSIVE = "permissive"


def recorder_mode(mode: Any, where: str = "mode") -> RecorderMode:
    """The :class:`RecorderMode` that ``mode`` names.

    Parameters
    ----------
    mode : RecorderMode or str
        A member, or its value (``"strict"`` or ``"permissive"``).
    where : str, optional
        What the value was given to, named in the error (default ``"mode"``).

    Returns
    -------
    RecorderMode
        The member.

    Raises
    ------
    InvalidArgument
        ``mode`` is neither a member nor the value of one.
    """
    if isinstance(mode, RecorderMode):
        return mode
    try:
        return RecorderMode(mode)
    except (ValueError, TypeError):
        valid = " or ".join(repr(m.value) for m in RecorderMode)
        raise InvalidArgument(f"{where} must be {valid} (or a RecorderMode), got {mode!r}") \
            from None
