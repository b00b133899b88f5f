"""What the tracked copies and the array boundaries ask of an argument and of
the launch policy (:mod:`.arrays`, :mod:`.boundaries`)."""

from __future__ import annotations

from typing import Any

from numba_streamsafe.core.blocks import Block
from numba_streamsafe.core.errors import InvalidArgument
from numba_streamsafe.core.modes import RecorderMode
from numba_streamsafe.numba import target
from numba_streamsafe.numba.policy import launch_policy
from numba_streamsafe.numba.scope import current_stream

__all__ = ["is_tracking", "is_strict", "stream_or_scope", "device_block"]


def is_tracking(rt: Any) -> bool:
    """Whether ``rt``'s launch policy tracks (``tracking()`` may switch it off)."""
    return launch_policy(rt).tracking


def is_strict(rt: Any) -> bool:
    """Whether ``rt`` records in strict mode (an unfinished launch raises)."""
    return rt.mode is RecorderMode.STRICT


def stream_or_scope(stream: Any) -> Any:
    """``stream``, or the innermost :func:`~.scope.stream_scope`'s when it is None."""
    return current_stream() if stream is None else stream


def device_block(rt: Any, array: Any, what: str) -> Block | None:
    kind, block, _ = target.resolve(rt, array)
    if kind != target.DEVICE:
        raise InvalidArgument(
            f"{what} must be a device array, got {type(array).__name__}; "
            "copy host data with numba_streamsafe.to_device(host, stream=...) first"
        )
    return block
