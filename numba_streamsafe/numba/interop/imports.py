"""Arrays of other libraries coming in, ordered after their producer.

Two ways in, for a DLPack producer (``__dlpack__``: PyTorch, CuPy, JAX...) or
a CUDA Array Interface producer (``__cuda_array_interface__``), both given
the stream ``s`` the data is wanted on:

- **Borrowed, no copy** (:func:`from_dlpack`, :func:`from_cuda_array_interface`):
  a tracked array over the producer's own memory. The memory becomes a
  *borrowed* block of the tracking resource (``AsyncResource.borrow``), ready
  after everything queued on ``s`` by the import: later tracked launches,
  copies and exports on any stream are ordered against it and against each
  other, as on any block. The library never frees it. When the last array
  over it goes, its release makes ``s`` wait for every use on other streams
  and keeps the producer's objects alive until ``s`` has completed them
  (found at the next import, allocation or :meth:`~numba_streamsafe.DeviceRuntime.reap`),
  so the producer (PyTorch's caching allocator, say) cannot hand the memory
  to new work while a tracked use is in flight.
- **Copied** (:func:`import_array`): the data is copied into a new tracked
  array on ``s``.

The producer's work before the import is ordered before ``s``: a DLPack
producer is asked for its data with ``s``'s handle (DLPack's stream
protocol: the producer makes ``s`` wait for its work; PyTorch and CuPy order
their *current* stream, so import with the producer's stream current in its
library); a CUDA Array Interface producer that names a ``stream`` has ``s``
wait for it. With tracking off (``nss.tracking(False)``) nothing is ordered
(DLPack's ``stream=-1``), which shows the race.

Work the producer queues on the data *after* the import is outside the
library, as any foreign use is: order it with :func:`numba_streamsafe.lend`
on the imported array, or import again (a new import of memory the library
already tracks is recorded as a read-write use on its stream, so later
tracked uses wait for the producer's work ordered before it).
"""

from __future__ import annotations

import math
import weakref
from typing import Any, NamedTuple

import numpy as np

from numba_streamsafe.core.access import Access
from numba_streamsafe.core.blocks import Block
from numba_streamsafe.core.errors import InvalidArgument, InvalidArgumentType
from numba_streamsafe.core.uses import CopyUses
from numba_streamsafe.numba import arrays, target
from numba_streamsafe.numba.array_args import check_dtype, is_contiguous, is_tracking
from numba_streamsafe.numba.interop import dlpack
from numba_streamsafe.protocol import commit, fenced, preflight, single

__all__ = ["from_dlpack", "from_cuda_array_interface", "import_array"]


class _Foreign(NamedTuple):
    """A producer's device array: the address of its first element, shape,
    strides in bytes, dtype, whether it is read-only, and what keeps the
    memory alive (the producer object, and its DLPack capsule)."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype
    readonly: bool
    keep: tuple[Any, ...]


def _dlpack_stream(handle: int, ordered: bool) -> int:
    """The ``stream`` argument of ``__dlpack__`` for the consumer stream ``handle``."""
    if not ordered:
        return -1  # no synchronisation
    return 1 if handle == 0 else handle  # DLPack names the legacy stream 1 (0 is refused)


def _check_device(device: tuple[int, int], rt: Any, what: str) -> None:
    kind, ordinal = device
    if kind != dlpack.KDL_CUDA:
        raise InvalidArgument(
            f"{what}: the producer's data is on DLPack device type {kind}, not CUDA device "
            f"memory (kDLCUDA = {dlpack.KDL_CUDA}); move it to the GPU first")
    if ordinal != rt.device:
        raise InvalidArgument(
            f"{what}: the producer's data is on device {ordinal}, and work is queued on "
            f"device {rt.device}; import it with that device current "
            f"(nss.use_device({ordinal}) or cuda.gpus[{ordinal}])")


def _open_dlpack(obj: Any, rt: Any, handle: int, ordered: bool, what: str) -> _Foreign:
    """Ask a DLPack producer for its data on ``handle`` (it orders its work
    before that stream) and read the capsule."""
    device = getattr(obj, "__dlpack_device__", None)
    if device is not None:
        _check_device(tuple(device()), rt, what)
    stream = _dlpack_stream(handle, ordered)
    try:
        capsule = obj.__dlpack__(stream=stream, max_version=dlpack.VERSION)
    except TypeError:  # a producer older than DLPack 1.0 takes no max_version
        capsule = obj.__dlpack__(stream=stream)
    view = dlpack.read_capsule(capsule, what)
    _check_device(view.device, rt, what)
    strides = view.strides
    if strides is None:
        strides = target.c_strides(view.shape, view.dtype.itemsize)
    return _Foreign(view.ptr, view.shape, strides, view.dtype, view.readonly, (obj, capsule))


def _open_interface(obj: Any, rt: Any, handle: int, ordered: bool, what: str) -> _Foreign:
    """Read a CUDA Array Interface producer's description and make ``handle``
    wait for the stream it names."""
    desc = obj.__cuda_array_interface__
    if desc.get("mask") is not None:
        raise InvalidArgument(f"{what}: masked arrays (the interface's 'mask') are not "
                              "supported; pass the data without its mask")
    dtype = _interface_dtype(desc, what)
    shape = tuple(int(n) for n in desc["shape"])
    strides = desc.get("strides")
    strides = (target.c_strides(shape, dtype.itemsize) if strides is None
               else tuple(int(s) for s in strides))
    ptr, readonly = desc["data"]
    producer = desc.get("stream") if desc.get("version", 0) >= 3 else None
    if producer is not None and ordered:
        _order_after_producer(rt, handle, producer, what)
    return _Foreign(int(ptr or 0), shape, strides, dtype, bool(readonly), (obj,))


def _interface_dtype(desc: dict[str, Any], what: str) -> np.dtype:
    """The dtype a CUDA Array Interface description names."""
    try:
        if "descr" not in desc or len(desc["descr"]) < 2:
            return np.dtype(desc["typestr"])
        return np.dtype(desc["descr"])
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"{what}: the interface's typestr {desc.get('typestr')!r} is "
                              f"no dtype ({exc})") from None


def _order_after_producer(rt: Any, handle: int, producer: Any, what: str) -> None:
    """Make ``handle`` wait for the producer stream an interface names."""
    if producer == 0 or isinstance(producer, bool) or not isinstance(producer, int):
        raise InvalidArgument(f"{what}: the interface names stream {producer!r}, which the "
                              "CUDA Array Interface does not allow (1: legacy default "
                              "stream, 2: per-thread default stream, else a handle)")
    rt.order_after_stream(handle, 0 if producer == 1 else producer)


def _not_a_producer(obj: Any, what: str, wanted: str, other: str, use: str
                    ) -> InvalidArgumentType:
    hint = f"; it has {other}: use nss.{use}" if hasattr(obj, other) else ""
    return InvalidArgumentType(f"{what}: {type(obj).__name__} has no {wanted}{hint}")


# ------------------------------------------------------------ borrowed arrays
class _Lease:
    """Held by every array over one borrowed block: when the last one goes, the
    block is released (finalizer-safe: the release is only queued)."""

    __slots__ = ("block", "release", "__weakref__")

    def __init__(self, block: Block, release: Any) -> None:
        self.block = block
        self.release = release

    def __del__(self) -> None:
        self.release(self.block)


#: The lease of each live borrowed block, by (device, address, generation).
_leases: weakref.WeakValueDictionary[tuple[int, int, int], _Lease] = \
    weakref.WeakValueDictionary()


def _key(block: Block) -> tuple[int, int, int]:
    return (block.device, block.ptr, block.generation)


def from_dlpack(obj: Any, *, stream: Any, tag: str = "from_dlpack") -> Any:
    """A tracked array over a DLPack producer's device memory, without a copy,
    ordered after the producer's work.

    ``obj.__dlpack__`` is called with ``stream``'s handle, so the producer
    orders its work before ``stream`` (PyTorch and CuPy order their current
    stream: call this with the producer's stream current in its library).
    The memory becomes a borrowed block, ready after ``stream``'s work so
    far: tracked launches, copies and exports on any stream are ordered
    against each other on it, as on an array of the library. The producer's
    objects are kept alive while an array over the memory lives, and after
    the last one goes until every tracked use is complete (the module's
    documentation has the contract).

    Parameters
    ----------
    obj : DLPack producer
        A CUDA device array with ``__dlpack__`` (PyTorch tensor, CuPy array...)
        on the current device, with no negative stride.
    stream : stream-like
        The stream the data is wanted on (a Numba, PyTorch, CuPy or cuda.core
        stream, or a handle; 0 or None for the legacy default stream).
    tag : str
        Names the memory in reports.

    Returns
    -------
    DeviceNDArray
        A writable device array of the library's kind (the simulator's on the
        CPU): pass it to tracked kernels, copies and exports like any.

    Raises
    ------
    InvalidArgumentType
        ``obj`` has no ``__dlpack__``, or it returned no DLPack capsule.
    InvalidArgument
        The data is not CUDA memory of the current device, is read-only, has
        a dtype NumPy has no equal of or a negative stride, or overlaps
        memory the library tracks without lying inside it.
    StreamMisuse
        The runtime does not track uses (``NUMBA_STREAMSAFE_RESOURCE=direct``):
        use :func:`import_array`.
    """
    if not hasattr(obj, "__dlpack__"):
        raise _not_a_producer(obj, "from_dlpack", "__dlpack__", "__cuda_array_interface__",
                              "from_cuda_array_interface")
    rt = target.runtime()
    handle, owner = rt.stream_ref(stream)
    ordered = is_tracking(rt)
    foreign = _open_dlpack(obj, rt, handle, ordered, "from_dlpack")
    return _adopt(rt, foreign, stream, handle, owner, ordered, tag, "from_dlpack")


def from_cuda_array_interface(obj: Any, *, stream: Any,
                              tag: str = "from_cuda_array_interface") -> Any:
    """A tracked array over a CUDA Array Interface producer's device memory,
    without a copy, ordered after the producer's work: ``stream`` waits for
    the stream the interface names (version 3's ``stream``; none named: the
    producer says its data is ready). The rest is as :func:`from_dlpack`.

    Parameters
    ----------
    obj : CUDA Array Interface producer
        An object with ``__cuda_array_interface__`` over memory of the current
        device, with no mask and no negative stride.
    stream : stream-like
        The stream the data is wanted on.
    tag : str
        Names the array in reports.

    Returns
    -------
    device array
        A tracked array over ``obj``'s memory (borrowed: the producer is kept
        alive until the uses recorded on it are complete).

    Raises
    ------
    InvalidArgumentType
        ``obj`` has no ``__cuda_array_interface__``.
    InvalidArgument
        As :func:`from_dlpack`; a mask, or a stream value the interface
        does not allow (0).
    """
    if not hasattr(obj, "__cuda_array_interface__"):
        raise _not_a_producer(obj, "from_cuda_array_interface", "__cuda_array_interface__",
                              "__dlpack__", "from_dlpack")
    rt = target.runtime()
    handle, owner = rt.stream_ref(stream)
    ordered = is_tracking(rt)
    foreign = _open_interface(obj, rt, handle, ordered, "from_cuda_array_interface")
    return _adopt(rt, foreign, stream, handle, owner, ordered, tag, "from_cuda_array_interface")


def _span(foreign: _Foreign) -> int:
    """Bytes from the first element to the end of the last (no negative stride)."""
    return sum((n - 1) * s for n, s in zip(foreign.shape, foreign.strides, strict=True)) + \
        foreign.dtype.itemsize


def _adopt(rt: Any, f: _Foreign, stream: Any, handle: int, owner: Any, ordered: bool,
           tag: str, what: str, writable: bool = True) -> Any:
    """The tracked array over ``f``'s memory: a new borrowed block, or the
    block the library already tracks there (``writable`` False: read-only data
    is accepted, for a caller that only reads it)."""
    check_dtype(f.dtype, f"{what}: the producer's dtype")
    if f.readonly and writable:
        raise InvalidArgument(f"{what}: the producer marked its data read-only, and a tracked "
                              "array is writable; copy it in with nss.import_array")
    if len(f.strides) != len(f.shape):
        raise InvalidArgument(f"{what}: {len(f.strides)} strides for {len(f.shape)} dimensions")
    if not math.prod(f.shape):
        return arrays.device_array(f.shape, f.dtype, stream=stream, tag=tag)
    if any(s < 0 for s in f.strides):
        raise InvalidArgument(
            f"{what}: the producer's view has negative strides {f.strides}; import the array "
            "it views (or a copy with non-negative strides) instead")
    if not f.ptr:
        raise InvalidArgument(f"{what}: the producer's data pointer is null for a non-empty "
                              f"array of shape {f.shape}")
    nbytes = _span(f)
    rt.flush()  # releases queued by finalizers run first: a block on its way out is not reused
    block = rt.find(f.ptr)
    if block is not None:
        if f.ptr + nbytes > block.ptr + block.nbytes:
            raise InvalidArgument(
                f"{what}: {nbytes} B at {f.ptr:#x} run past the end of the {block.describe()}, "
                "which the library tracks; import views that lie inside one array")
        lease = _leases.get(_key(block)) if block.borrowed else None
        if not block.borrowed or lease is not None:
            return _rejoin(rt, f, block, lease, stream, handle, owner, ordered, tag)
        # A borrowed block whose arrays are gone and whose release is still queued:
        # borrow afresh (borrow runs the queued releases first).
    block = rt.borrow(f.ptr, nbytes, stream, tag, keep=[f.keep])
    lease = _Lease(block, rt.resource.tracker.defer_free)
    _leases[_key(block)] = lease
    return target.wrap_memory(rt, block, f.ptr, f.shape, f.strides, f.dtype, stream, lease)


def _rejoin(rt: Any, f: _Foreign, block: Block, lease: _Lease | None, stream: Any,
            handle: int, owner: Any, ordered: bool, tag: str) -> Any:
    """An array over memory the library tracks already (a borrowed block, or a
    block of its own lent back): the import is recorded as a read-write use of
    the bytes it spans on ``stream`` (the producer may have written them
    since), and the array keeps the producer's objects alive."""
    if ordered:
        rt_block = rt.runtime_of(block.device) or rt
        uses = single(block, Access.READ_WRITE, tag, False,
                      target.extent_span(block, f.ptr, f.shape, f.strides, f.dtype.itemsize))
        with rt_block.activate():
            preflight(rt_block, handle, uses, False, owner)
            commit(rt_block, handle, uses, owner)
    if lease is not None:
        block.keep.append(f.keep)  # released with the block, after its uses
        keep: Any = lease
    else:
        keep = f.keep
    return target.wrap_memory(rt, block, f.ptr, f.shape, f.strides, f.dtype, stream, keep)


# ------------------------------------------------------------ copied arrays
def import_array(obj: Any, *, stream: Any, tag: str = "imported") -> Any:
    """A tracked copy, on ``stream``, of a DLPack or CUDA Array Interface
    producer's device array, ordered after the producer's work.

    A DLPack producer (``__dlpack__``: PyTorch, CuPy, JAX...; preferred when
    both are there) is asked for its data with ``stream``'s handle, so it
    orders its work before ``stream``; a CUDA Array Interface producer that
    names a ``stream`` has ``stream`` wait for it. The copy (contiguous data,
    C or Fortran order) is queued on ``stream`` as a tracked read of the
    producer's memory (borrowed for the copy, as :func:`from_dlpack` does: the
    producer is kept alive until ``stream`` has completed the copy) and a
    tracked write of the new array. :func:`from_dlpack` takes the data
    without a copy.

    Parameters
    ----------
    obj : array-like
        A device array with ``__dlpack__`` or ``__cuda_array_interface__``
        (read-only data is fine: it is only read).
    stream : stream-like
        The stream the data is wanted on.
    tag : str
        Names the new array in reports.

    Returns
    -------
    device array
        A new array of the library holding the copy, written on ``stream``.

    Raises
    ------
    InvalidArgument
        ``obj`` is no device array of those kinds, or its data is not
        contiguous (make it contiguous first).
    """
    rt = target.runtime()
    handle, owner = rt.stream_ref(stream)
    ordered = is_tracking(rt)
    if hasattr(obj, "__dlpack__"):
        f = _open_dlpack(obj, rt, handle, ordered, "import_array")
    elif hasattr(obj, "__cuda_array_interface__"):
        f = _open_interface(obj, rt, handle, ordered, "import_array")
    else:
        raise InvalidArgument(f"import_array: {type(obj).__name__} has neither __dlpack__ nor "
                              "__cuda_array_interface__")
    order = _contiguous_order(f.shape, f.strides, f.dtype.itemsize)
    out = arrays.device_array(f.shape, f.dtype, stream=stream, tag=tag, order=order)
    nbytes = math.prod(f.shape) * f.dtype.itemsize
    if not nbytes:
        return out
    uses = CopyUses()
    source = None
    if rt.resource.tracker.supports_tracking():
        # Borrowed for the copy: when ``source`` goes, the producer is kept
        # until ``stream`` has completed the copy (its allocator may otherwise
        # hand the memory to new work on its own stream under the copy).
        source = _adopt(rt, f, stream, handle, owner, ordered, f"{tag} (source)",
                        "import_array", writable=False)
        uses.add(target.resolve(rt, source)[1], Access.READ, "source")
    dst = target.resolve(rt, out)[1]
    assert dst is not None  # a new array of the library
    uses.add(dst, Access.WRITE, tag)
    fenced(rt, handle, uses, f"import {tag}", False, owner, rt.driver.copy_async, dst.ptr,
           f.ptr, nbytes, handle, tracking=ordered)
    del source
    return out


def _contiguous_order(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> str:
    """'C' or 'F': the order one copy of the bytes as they lie fills."""
    if not is_contiguous(shape, strides, itemsize):
        raise InvalidArgument("import_array: the producer's data is not contiguous; make it "
                              "contiguous first (e.g. .contiguous() in PyTorch, "
                              "cupy.ascontiguousarray)")
    dims = [(n, s) for n, s in zip(shape, strides, strict=True) if n != 1]
    step = itemsize
    for n, s in dims:
        if s != step:
            return "C"
        step *= n
    return "F" if len(dims) > 1 else "C"
