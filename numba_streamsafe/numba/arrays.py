"""Tracked device arrays and copies.

Each function takes the ``stream`` to queue on (a Numba stream, a
``cuda.core`` stream, a handle, or None for the innermost
:func:`~numba_streamsafe.stream_scope`, else the default stream) and runs the
copy between preflight and commit, like a tracked kernel.

New arrays are allocated on the current device (Numba's current context on a
GPU; :func:`~numba_streamsafe.use_device` on the simulator), and copies run
there. Copies reach arrays of other devices without peer access, ordered
across the devices; a memset of another device's array needs peer access,
like a kernel.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from numba_streamsafe.core.access import Access
from numba_streamsafe.core.blocks import Block
from numba_streamsafe.core.errors import InvalidArgument, InvalidArgumentType
from numba_streamsafe.core.uses import CopyUses
from numba_streamsafe.numba import target
from numba_streamsafe.numba.array_args import (
    check_dtype,
    device_block,
    is_contiguous,
    is_strict,
    is_tracking,
    stream_or_scope,
)
from numba_streamsafe.numba.interop import dlpack as _dlpack  # noqa: F401 - gives the arrays __dlpack__
from numba_streamsafe.numba.interop.boundaries import export_interface
from numba_streamsafe.numba.scope import numba_call
from numba_streamsafe.protocol import fenced, single

__all__ = ["device_array", "to_device", "copy_to_host", "copy", "memset", "block_of"]


#: The most bytes a device array may span: its size, shape and strides are int64.
_MAX_BYTES = 2**63 - 1


def _shape(shape: Any) -> tuple[int, ...]:
    """``shape`` as a tuple of Python ints (NumPy integers accepted)."""
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        dims: tuple[Any, ...] = (shape,)
    else:
        try:
            dims = tuple(shape)
        except TypeError:
            dims = (shape,)
    if any(not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 0 for n in dims):
        raise InvalidArgument(
            f"shape {shape!r} must be an int or a tuple of non-negative ints "
            "(NumPy integers accepted); pass for example 1024 or (32, 32)"
        )
    return tuple(int(n) for n in dims)


def _dtype(dtype: Any) -> np.dtype:
    """``dtype`` as a NumPy dtype a device array can hold."""
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentType(
            f"dtype {dtype!r} is not a dtype ({exc}); pass a NumPy dtype such as np.float64"
        ) from None
    check_dtype(dt, "device_array: dtype")
    return dt


def _nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    """Bytes of a contiguous array of ``shape`` and ``dtype``, in Python ints.

    Raises
    ------
    InvalidArgument
        When the shape, strides or size would not fit int64 (the span counts
        every empty dimension as 1, as the strides do).
    """
    span = math.prod(max(n, 1) for n in shape) * dtype.itemsize
    if span > _MAX_BYTES:
        raise InvalidArgument(
            f"shape {shape} of dtype {dtype} is too large: laid out contiguously it spans "
            f"{span} bytes (empty dimensions counted as 1), past 2**63 - 1, the most a device "
            "array's shape, strides and size can hold. Use a smaller shape (split the data)"
        )
    return math.prod(shape) * dtype.itemsize


def _dtype_code(dtype: np.dtype) -> str:
    """How to write ``dtype`` in a suggestion: ``np.int32``, or its string."""
    if dtype.fields is None and dtype.subdtype is None and dtype.kind in "biufc":
        return f"np.{dtype.name}"
    return repr(dtype.descr if dtype.fields is not None else dtype.str)


def _geometry(array: Any) -> tuple[tuple[int, ...], tuple[int, ...], np.dtype]:
    """Shape, strides and dtype of a host or device array (strides None: C order)."""
    shape = tuple(int(n) for n in array.shape)
    dtype = np.dtype(array.dtype)
    strides = getattr(array, "strides", None)
    if strides is None:
        return shape, target.c_strides(shape, dtype.itemsize), dtype
    return shape, tuple(int(s) for s in strides), dtype


def _squeezed(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """Extent and stride of each dimension of extent other than 1 (Numba compares these)."""
    return tuple((n, s) for n, s in zip(shape, strides, strict=True) if n != 1)


def _order_name(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> str:
    if strides == target.c_strides(shape, itemsize, "C"):
        return "C"
    if strides == target.c_strides(shape, itemsize, "F"):
        return "F"
    return "strided"


def device_array(shape: Any, dtype: Any = np.float64, *, stream: Any = None,
                 order: str = "C", tag: str = "device_array") -> Any:
    """An uninitialised device array whose block is allocated on ``stream``.

    Parameters
    ----------
    shape : int or tuple of int
        Non-negative Python or NumPy integers.
    dtype : dtype-like
        Any dtype of fixed size that holds no Python objects (numbers, bool,
        datetime64, bytes, records of these).
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

    Raises
    ------
    InvalidArgument
        A bad shape, order or dtype (object, or of 0 bytes), or a size past
        2**63 - 1 bytes; nothing is allocated.
    """
    shape = _shape(shape)
    dtype = _dtype(dtype)
    if order not in ("C", "F"):
        raise InvalidArgument(f"order must be 'C' or 'F', got {order!r}")
    nbytes = _nbytes(shape, dtype)
    stream = stream_or_scope(stream)
    rt, context = target.allocation_target()
    # A zero-size array still gets a (minimal) block so it has an identity.
    block = rt.allocate(max(nbytes, 1), stream, tag)
    strides = target.c_strides(shape, dtype.itemsize, order)
    return target.make_array(rt, block, shape, strides, dtype, stream, context)


def block_of(array: Any) -> Block | None:
    """The live block behind ``array`` (or any view of it), or None.

    Parameters
    ----------
    array : device array
        Any device array, view or not.

    Returns
    -------
    Block or None
        The block of the library the array lies in; None for memory the
        library does not track."""
    return target.resolve(target.runtime(), array)[1]


def to_device(host: Any, *, stream: Any = None, to: Any = None,
              tag: str = "to_device") -> Any:
    """Copy a host array to a new (or the given ``to``) device array on ``stream``.

    Pageable host memory is staged by the driver, so ``host`` may be changed
    as soon as this returns.

    Parameters
    ----------
    host : array-like
        Rectangular data of a dtype :func:`device_array` accepts (no Python
        objects).
    stream : stream-like, optional
    to : device array, optional
        Contiguous, of the host data's dtype and shape (dimensions of extent
        1 aside); default: a new array allocated on ``stream``.
    tag : str
        Label of a new array's block.

    Returns
    -------
    device array
        ``to``, or the new array; the copy is queued on ``stream``, and later
        tracked uses on other streams wait for it.

    Raises
    ------
    InvalidArgument
        Data that is not rectangular or holds Python objects, or a ``to``
        that does not fit it; nothing is allocated or queued.
    """
    try:
        arr = np.asarray(host)
        # A Fortran-ordered host array stays Fortran-ordered on the device, as with
        # Numba's cuda.to_device; anything else is copied in C order.
        order = "F" if (to is None and arr.ndim > 1 and arr.flags.f_contiguous
                        and not arr.flags.c_contiguous) else "C"
        # (np.ascontiguousarray would make a 0-d array 1-d: Numba keeps it 0-d.)
        host = arr if order == "F" or arr.ndim == 0 else np.ascontiguousarray(arr)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(
            "to_device needs rectangular host data (a NumPy array, or nested sequences whose "
            f"rows have one length) and NumPy could not make an array of it: "
            f"{str(exc).rstrip('.')}. Give every row the same length"
        ) from None
    check_dtype(host.dtype, "to_device: the host data's dtype")
    stream = stream_or_scope(stream)
    rt = target.runtime()
    if rt.capture is not None:  # a graph is being captured (graphs.py)
        rt.capture.refuse_host_copy(rt.stream_handle(stream), "to_device")
    if to is None:
        to = device_array(host.shape, host.dtype, stream=stream, tag=tag, order=order)
        block = device_block(rt, to, "to")
    else:
        block = device_block(rt, to, "to")
        _check_fits(host, to)
    handle, owner = rt.stream_ref(stream)

    if host.nbytes:
        fenced(rt, handle, single(block, Access.WRITE, "to", True, target.array_span(block, to)),
               f"copy to device ({tag})",
               is_strict(rt), owner, numba_call, to.copy_to_device, host,
               target.numba_stream(stream), tracking=is_tracking(rt))
    return to


def _check_fits(host: np.ndarray, to: Any) -> None:
    """Refuse a device array ``to`` that Numba's host-to-device copy would refuse."""
    shape, strides, dtype = _geometry(to)
    check_dtype(dtype, "to_device: to's dtype")
    if dtype != host.dtype:
        raise InvalidArgumentType(
            f"to_device: to has dtype {dtype} but the host data has {host.dtype}; pass "
            f"host.astype({_dtype_code(dtype)}), or a to of dtype {_dtype_code(host.dtype)}"
        )
    if tuple(n for n in shape if n != 1) != tuple(n for n in host.shape if n != 1):
        raise InvalidArgument(
            f"to_device: to has shape {shape} but the host data has {host.shape}; reshape the "
            f"host data, or pass a to of shape {host.shape}"
        )
    if not is_contiguous(shape, strides, dtype.itemsize):
        raise InvalidArgument(
            f"to_device: to is not contiguous (shape {shape}, strides {strides}), so no single "
            "copy can fill it; upload into a contiguous array (to=None) and copy from it "
            "with a tracked kernel"
        )


def copy_to_host(array: Any, out: np.ndarray | None = None, *, stream: Any = None) -> np.ndarray:
    """Copy ``array`` to host memory on ``stream``, after every write to it.

    With a non-default ``stream`` the copy is asynchronous: synchronise the
    stream before reading ``out``.

    Parameters
    ----------
    array : device array
        Any view. A view with negative strides (``x[::-1]``) is copied as NumPy
        would copy it: the axes turned round on the device, turned back on the
        host (the result is then a view with those strides; with ``out`` the
        copy waits for ``stream`` before filling it).
    out : numpy.ndarray, optional
        Writeable, of ``array``'s dtype, shape and layout (dimensions of
        extent 1 aside): ``np.empty(array.shape, array.dtype)`` for a C-order
        array. Default: a new array.
    stream : stream-like, optional

    Returns
    -------
    numpy.ndarray
        ``out``, or the new array.

    Raises
    ------
    InvalidArgument
        ``array`` is not a device array, or ``out``
        does not fit it (:class:`~numba_streamsafe.core.errors.InvalidArgumentType`
        when it is no NumPy array or of another dtype); nothing is queued.
    """
    stream = stream_or_scope(stream)
    rt = target.runtime()
    if rt.capture is not None:  # a graph is being captured (graphs.py)
        rt.capture.refuse_host_copy(rt.stream_handle(stream), "copy_to_host")
    block = device_block(rt, array, "array")
    shape, strides, dtype = _geometry(array)
    check_dtype(dtype, "copy_to_host: the array's dtype")
    if any(s < 0 for s in strides):
        # Numba's copy takes no negative stride: copy the view with those axes
        # turned round, and turn them back on the host (NumPy's result).
        if out is not None:
            _check_out(out, shape, tuple(abs(s) for s in strides), dtype, reversed_ok=True)
        turn = tuple(slice(None, None, -1) if s < 0 else slice(None) for s in strides)
        host = copy_to_host(array[turn], stream=stream)[turn]
        if out is None:
            return host  # a view of the copy's buffer: filled once the stream gets there
        rt.driver.stream_synchronize(rt.stream_handle(stream))  # out is filled from the buffer
        out[...] = host
        return out
    if out is not None:
        _check_out(out, shape, strides, dtype)
    handle, owner = rt.stream_ref(stream)

    return fenced(rt, handle,
                  single(block, Access.READ, "array", True, target.array_span(block, array)),
                  "copy to host",
                  is_strict(rt),
                  owner, numba_call, array.copy_to_host, out, target.numba_stream(stream),
                  tracking=is_tracking(rt))


def _check_out(out: Any, shape: tuple[int, ...], strides: tuple[int, ...],
               dtype: np.dtype, reversed_ok: bool = False) -> None:
    """Refuse an ``out`` Numba's device-to-host copy would refuse, or could not write."""
    order = _order_name(shape, strides, dtype.itemsize)
    if order == "strided":
        advice = "leave out=None: a strided view is copied into a new array"
    else:
        advice = (f"pass out=np.empty({shape}, dtype={_dtype_code(dtype)}"
                  + (", order='F'" if order == "F" and len(shape) > 1 else "")
                  + "), or leave out=None for a new array")
    if not isinstance(out, np.ndarray):
        raise InvalidArgumentType(f"out must be a NumPy array, got {type(out).__name__}; {advice}")
    check_dtype(out.dtype, "copy_to_host: out's dtype")
    if out.dtype != dtype:
        raise InvalidArgumentType(f"out has dtype {out.dtype}, the array {dtype}; {advice}")
    if tuple(n for n in out.shape if n != 1) != tuple(n for n in shape if n != 1):
        raise InvalidArgument(f"out has shape {out.shape}, the array {shape}; {advice}")
    if not out.flags.writeable:
        raise InvalidArgument(f"out is not writeable (a read-only view?); {advice}")
    if out.size and not reversed_ok and \
            _squeezed(out.shape, out.strides) != _squeezed(shape, strides):
        raise InvalidArgument(
            f"out has another memory layout than the array (strides {out.strides}, the "
            f"array's {strides}) and the copy moves the bytes as they lie; {advice}"
        )


def copy(dst: Any, src: Any, *, stream: Any = None) -> None:
    """Device-to-device copy of ``src`` into ``dst`` on ``stream``.

    Parameters
    ----------
    dst, src : device array
        Of one shape and dtype, each contiguous (C or F order, or a
        contiguous view), of one layout.
    stream : stream-like, optional

    Raises
    ------
    InvalidArgument
        Either is not a device array, or they do not match or are not
        contiguous; checked before any wait is queued.
    """
    stream = stream_or_scope(stream)
    rt = target.runtime()
    src_block = device_block(rt, src, "src")
    dst_block = device_block(rt, dst, "dst")
    dst_shape, dst_strides, dst_dtype = _geometry(dst)
    src_shape, src_strides, src_dtype = _geometry(src)
    if dst_shape != src_shape or dst_dtype != src_dtype:
        kind = InvalidArgumentType if dst_shape == src_shape else InvalidArgument
        raise kind(
            f"copy needs matching arrays: dst is {dst_shape} {dst_dtype}, src is "
            f"{src_shape} {src_dtype}; copy between arrays of one shape and dtype"
        )
    check_dtype(src_dtype, "copy: the arrays' dtype")
    for what, strides in (("dst", dst_strides), ("src", src_strides)):
        if not is_contiguous(dst_shape, strides, dst_dtype.itemsize):
            raise InvalidArgument(
                f"copy needs contiguous arrays: {what} is a strided view (shape {dst_shape}, "
                f"strides {strides}), which one copy cannot move; copy the whole arrays, or "
                "move a strided view with a tracked kernel"
            )
    if math.prod(dst_shape) and _squeezed(dst_shape, dst_strides) != _squeezed(src_shape,
                                                                                src_strides):
        dst_order = _order_name(dst_shape, dst_strides, dst_dtype.itemsize)
        src_order = _order_name(src_shape, src_strides, src_dtype.itemsize)
        raise InvalidArgument(
            f"copy needs one memory layout: dst is {dst_order}-ordered (strides {dst_strides}) "
            f"and src {src_order}-ordered (strides {src_strides}); allocate both with one "
            "order= ('C' or 'F')"
        )
    handle, owner = rt.stream_ref(stream)

    uses = CopyUses()
    uses.add(src_block, Access.READ, "src", *target.array_span(src_block, src))
    uses.add(dst_block, Access.WRITE, "dst", *target.array_span(dst_block, dst))
    if _across_devices(rt, dst_block, src_block):
        nbytes = math.prod(dst_shape) * dst_dtype.itemsize
        if nbytes:
            fenced(rt, handle, uses, "device copy across devices", is_strict(rt), owner,
                   rt.driver.copy_async, target.pointer_of(dst), target.pointer_of(src), nbytes,
                   handle, tracking=is_tracking(rt))
        return
    fenced(rt, handle, uses, "device copy", is_strict(rt), owner, numba_call, dst.copy_to_device,
           src, target.numba_stream(stream), tracking=is_tracking(rt))


def _across_devices(rt: Any, *blocks: Block | None) -> bool:
    """Whether a block lies on another device than ``rt``'s (a copy between
    devices goes through the driver's ``cuMemcpyAsync``)."""
    return any(b is not None and b.device != rt.device for b in blocks)


def memset(array: Any, value: int, *, stream: Any = None) -> None:
    """Set every byte of ``array`` to ``value`` (0–255) on ``stream``.

    The fill is a tracked write: it waits for the array's uses on other
    streams, and later uses there wait for it.

    Parameters
    ----------
    array : device array
        A contiguous array of the library.
    value : int
        The byte, 0 to 255.
    stream : stream-like, optional
        Where the fill is queued (default: the array's allocation stream).

    Raises
    ------
    InvalidArgument
        ``value`` out of range, or an array that is not contiguous (a strided
        view: nothing is queued)."""
    if not isinstance(value, (int, np.integer)) or not 0 <= value <= 255:
        raise InvalidArgument(f"memset value must be a byte (0-255), got {value!r}")
    stream = stream_or_scope(stream)
    rt = target.runtime()
    block = device_block(rt, array, "array")
    if not (array.flags["C_CONTIGUOUS"] or array.flags["F_CONTIGUOUS"]):
        raise InvalidArgument(
            f"memset needs a contiguous array, got a view of shape {array.shape} with strides "
            f"{array.strides}: memset the whole array (or a contiguous slice of it, such as "
            "x[1:3]), or set the view's elements with a kernel")
    handle, owner = rt.stream_ref(stream)

    fenced(rt, handle, single(block, Access.WRITE, "array", False, target.array_span(block, array)),
           "memset", is_strict(rt),
           owner, numba_call, target.memset, array, int(value), target.numba_stream(stream),
           tracking=is_tracking(rt))


target.export_hook = export_interface


if target.SIMULATOR:
    # Numba's simulator has no memory managers: with the plugin selected, its
    # allocation calls are routed to this module (sim_plugin).
    from numba_streamsafe.numba import sim_plugin as _sim_plugin

    _sim_plugin.setup(device_array, to_device)
