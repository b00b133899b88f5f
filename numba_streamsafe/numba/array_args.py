"""What the tracked copies and the array boundaries ask of an argument and of
the launch policy (:mod:`.arrays`, :mod:`.boundaries`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from numba_streamsafe.core.blocks import Block
from numba_streamsafe.core.errors import InvalidArgument
from numba_streamsafe.core.modes import RecorderMode
from numba_streamsafe.numba import target
from numba_streamsafe.numba.launch.policy import launch_policy
from numba_streamsafe.numba.scope import current_stream

__all__ = ["is_tracking", "is_strict", "stream_or_scope", "device_block", "check_dtype",
           "is_contiguous"]


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


def check_dtype(dtype: np.dtype, where: str) -> None:
    """Refuse dtypes a device cannot hold: Python objects, and no bytes at all.

    An object dtype stores pointers into this process: on a device they mean
    nothing, and reading them back as objects crashes the interpreter.
    ``where`` names the dtype in the message ("copy: src's dtype").
    """
    if dtype.hasobject:
        raise InvalidArgument(
            f"{where} {dtype} holds Python objects, which a device cannot hold (their "
            "pointers mean nothing there, and reading them back would crash Python). Use a "
            "numeric, bool, datetime64, bytes or record dtype without object fields"
        )
    if dtype.itemsize == 0:
        raise InvalidArgument(
            f"{where} {dtype} has 0 bytes per element and can hold no data. Pass a sized "
            "dtype such as 'S8', 'U8' or 'V8'"
        )


def is_contiguous(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> bool:
    """Whether one copy can move the array: C or F contiguous, dimensions of
    extent 1 ignored, as Numba's copies require (an empty array always is)."""
    if 0 in shape:
        return True
    dims = [(n, s) for n, s in zip(shape, strides, strict=True) if n != 1]
    if any(s == 0 for _, s in dims):
        return False  # broadcast

    def packed(order: list[tuple[int, int]]) -> bool:
        step = itemsize
        for n, s in order:
            if s != step:
                return False
            step *= n
        return True

    return packed(dims[::-1]) or packed(dims)
