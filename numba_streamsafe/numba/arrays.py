"""Tracked device arrays and copies.

Each function takes the ``stream`` to queue on (a Numba stream, a
``cuda.core`` stream, a handle, or None for the innermost
:func:`~numba_streamsafe.stream_scope`, else the default stream) and runs the
copy between preflight and commit, like a tracked kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from numba_streamsafe.access import Access
from numba_streamsafe.blocks import Block
from numba_streamsafe.errors import InvalidArgument, StreamMisuse
from numba_streamsafe.numba import target
from numba_streamsafe.numba.launch import Uses, fenced, single
from numba_streamsafe.numba.scope import current_stream
from numba_streamsafe.recorder import RecorderMode

__all__ = ["device_array", "to_device", "copy_to_host", "copy", "memset", "block_of"]


def _strict(rt: Any) -> bool:
    return rt.mode is RecorderMode.STRICT


def _owner(stream: Any) -> Any:
    """What keeps ``stream`` alive: the user's stream object (None for handles)."""
    return None if stream is None or isinstance(stream, int) else stream


def _stream(stream: Any) -> Any:
    return current_stream() if stream is None else stream


def _shape(shape: Any) -> tuple[int, ...]:
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if any(not isinstance(n, (int, np.integer)) or n < 0 for n in shape):
        raise InvalidArgument(f"shape {shape!r} must be non-negative integers")
    return tuple(int(n) for n in shape)


def device_array(shape: Any, dtype: Any = np.float64, *, stream: Any = None,
                 order: str = "C", tag: str = "device_array") -> Any:
    """An uninitialised device array whose block is allocated on ``stream``.

    Parameters
    ----------
    shape : int or tuple of int
    dtype : dtype-like
    stream : stream-like, optional
        Orders the allocation, and later the free; other streams that use the
        array wait for the allocation automatically.
    order : {'C', 'F'}
    tag : str
        Label for logs and error messages.

    Returns
    -------
    DeviceNDArray
        A Numba device array (the simulator's on the CPU).
    """
    shape = _shape(shape)
    dtype = np.dtype(dtype)
    if order not in ("C", "F"):
        raise InvalidArgument(f"order must be 'C' or 'F', got {order!r}")
    stream = _stream(stream)
    rt = target.runtime()
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    # A zero-size array still gets a (minimal) block so it has an identity.
    block = rt.allocate(max(nbytes, 1), stream, tag)
    strides = target.c_strides(shape, dtype.itemsize, order)
    return target.make_array(rt, block, shape, strides, dtype, stream)


def block_of(array: Any) -> Block | None:
    """The live block behind ``array`` (or any view of it), or None."""
    return target.resolve(target.runtime(), array)[1]


def _device_block(rt: Any, array: Any, what: str) -> Block | None:
    kind, block, _ = target.resolve(rt, array)
    if kind != target.DEVICE:
        raise InvalidArgument(
            f"{what} must be a device array, got {type(array).__name__}; "
            "copy host data with numba_streamsafe.to_device(host, stream=...) first"
        )
    return block


def to_device(host: Any, *, stream: Any = None, to: Any = None,
              tag: str = "to_device") -> Any:
    """Copy a host array to a new (or the given ``to``) device array on ``stream``.

    Pageable host memory is staged by the driver, so ``host`` may be changed
    as soon as this returns.
    """
    host = np.ascontiguousarray(host)
    stream = _stream(stream)
    rt = target.runtime()
    if to is None:
        to = device_array(host.shape, host.dtype, stream=stream, tag=tag)
    block = _device_block(rt, to, "to")
    handle = rt.stream_handle(stream)

    if host.nbytes:
        fenced(rt, handle, single(block, Access.WRITE, "to"), f"copy to device ({tag})",
               _strict(rt), _owner(stream), to.copy_to_device, host, target.numba_stream(stream))
    return to


def copy_to_host(array: Any, out: np.ndarray | None = None, *, stream: Any = None) -> np.ndarray:
    """Copy ``array`` to host memory on ``stream``, after every write to it.

    With a non-default ``stream`` the copy is asynchronous: synchronise the
    stream before reading ``out``.
    """
    stream = _stream(stream)
    rt = target.runtime()
    block = _device_block(rt, array, "array")
    handle = rt.stream_handle(stream)
    if out is not None and not isinstance(out, np.ndarray):
        raise InvalidArgument(f"out must be a NumPy array, got {type(out).__name__}")

    return fenced(rt, handle, single(block, Access.READ, "array"), "copy to host", _strict(rt),
                  _owner(stream), array.copy_to_host, out, target.numba_stream(stream))


def copy(dst: Any, src: Any, *, stream: Any = None) -> None:
    """Device-to-device copy of ``src`` into ``dst`` on ``stream``."""
    stream = _stream(stream)
    rt = target.runtime()
    src_block = _device_block(rt, src, "src")
    dst_block = _device_block(rt, dst, "dst")
    if dst.shape != src.shape or dst.dtype != src.dtype:
        raise InvalidArgument(
            f"copy needs matching arrays: dst is {dst.shape} {dst.dtype}, src is "
            f"{src.shape} {src.dtype}"
        )
    handle = rt.stream_handle(stream)

    uses = Uses()
    uses.add(src_block, Access.READ, "src")
    uses.add(dst_block, Access.WRITE, "dst")
    fenced(rt, handle, uses, "device copy", _strict(rt), _owner(stream), dst.copy_to_device, src,
           target.numba_stream(stream))


def memset(array: Any, value: int, *, stream: Any = None) -> None:
    """Set every byte of ``array`` to ``value`` (0–255) on ``stream``."""
    if not isinstance(value, (int, np.integer)) or not 0 <= value <= 255:
        raise InvalidArgument(f"memset value must be a byte (0-255), got {value!r}")
    stream = _stream(stream)
    rt = target.runtime()
    block = _device_block(rt, array, "array")
    handle = rt.stream_handle(stream)
    if not (array.flags["C_CONTIGUOUS"] or array.flags["F_CONTIGUOUS"]):
        raise StreamMisuse("memset needs a contiguous array; copy the view first")

    fenced(rt, handle, single(block, Access.WRITE, "array"), "memset", _strict(rt),
           _owner(stream), target.memset, array, int(value), target.numba_stream(stream))
