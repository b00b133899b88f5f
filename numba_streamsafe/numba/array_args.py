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

__all__: list[str] = []


def _tracking(rt: Any) -> bool:
    return launch_policy(rt).tracking


def _strict(rt: Any) -> bool:
    return rt.mode is RecorderMode.STRICT


def _stream(stream: Any) -> Any:
    return current_stream() if stream is None else stream


def _device_block(rt: Any, array: Any, what: str) -> Block | None:
    kind, block, _ = target.resolve(rt, array)
    if kind != target.DEVICE:
        raise InvalidArgument(
            f"{what} must be a device array, got {type(array).__name__}; "
            "copy host data with numba_streamsafe.to_device(host, stream=...) first"
        )
    return block
