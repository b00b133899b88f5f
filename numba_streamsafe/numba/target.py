"""What differs between Numba's CUDA target and its CPU simulator.

Everything else in the Numba layer is written once against these helpers:
making an array over a block, finding the block behind an argument, and
turning a user's stream into the object Numba wants.
"""

from __future__ import annotations

import ctypes
import weakref
from typing import Any

import numpy as np
from numba import cuda

from numba_streamsafe.core.blocks import Block
from numba_streamsafe.core.streams import stream_handle
from numba_streamsafe.numba import stream_origins
from numba_streamsafe.numba.scope import SIMULATOR, current_device
from numba_streamsafe.runtime import DeviceRuntime, get_runtime, sole_runtime

__all__ = ["SIMULATOR", "Resolved", "make_array", "wrap_memory", "resolve", "numba_stream",
           "runtime", "launch_runtime", "current_device", "device_id", "allocation_target",
           "span", "array_span", "extent_span"]


# Kinds of kernel argument.
DEVICE, HOST, OTHER = 0, 1, 2


#: A kernel argument as the tracker sees it: ``(kind, block, producer)`` with
#: ``kind`` one of DEVICE / HOST / OTHER, ``block`` the live block the data lies
#: in (None for memory the library did not allocate) and ``producer`` the stream
#: a foreign array's interface names, if any. A plain tuple: it is built for
#: every argument of every launch.
Resolved = tuple[int, "Block | None", "int | None"]

_NOT_ARRAY: Resolved = (OTHER, None, None)
_HOST: Resolved = (HOST, None, None)


def runtime(device: int | None = None) -> DeviceRuntime:
    """The process-wide runtime of ``device``; by default the one work is queued
    on now (:func:`launch_runtime`)."""
    if device is None:
        return launch_runtime()
    return get_runtime(device)


def device_id(device: Any) -> int:
    """The ordinal of a Numba context's ``device``: a Numba ``Device`` (its
    ``id``), or the raw ``CUdevice`` a context Numba attached to may hold."""
    ordinal = getattr(device, "id", None)
    if ordinal is None:
        try:
            ordinal = int(device)
        except TypeError:  # the simulator's device names no ordinal: it has one
            ordinal = 0
    return int(ordinal)


def launch_runtime() -> DeviceRuntime:
    """The runtime of the device a launch, copy or memset queued now runs on.

    While one device's runtime is installed, that one (no question asked:
    the single-device path costs nothing). Otherwise the current device
    (:func:`current_device`).
    """
    rt = sole_runtime()
    if rt is None:
        rt = get_runtime(current_device())
    return rt


def c_strides(shape: tuple[int, ...], itemsize: int, order: str = "C") -> tuple[int, ...]:
    """Contiguous strides of ``shape`` in ``order`` ('C' or 'F')."""
    strides = [0] * len(shape)
    step = itemsize
    dims = range(len(shape) - 1, -1, -1) if order == "C" else range(len(shape))
    for i in dims:
        strides[i] = step
        step *= max(shape[i], 1)
    return tuple(strides)


def span(block: Block, ptr: int, nbytes: int) -> tuple[int, int]:
    """The bytes ``ptr .. ptr + nbytes - 1`` as offsets ``(lo, hi)`` into
    ``block``; the whole block when they reach outside it (an access past its
    end is the kernel's error, and ordering all of it is never too little)."""
    lo = ptr - block.ptr
    hi = lo + nbytes
    if lo < 0 or hi > block.nbytes:
        return 0, block.nbytes
    return lo, hi


def array_span(block: Block | None, arg: Any) -> tuple[int, int]:
    """The bytes of ``block`` that the device array ``arg`` may touch, as
    offsets ``(lo, hi)``: from its lowest to one past its highest byte (the
    whole extent of a strided or reversed view; nothing for an empty array).

    ``arg`` is any device array of Numba (or its simulator) or one with a
    ``__cuda_array_interface__``; an array whose layout cannot be read spans
    the whole block; ``(0, 0)`` when ``block`` is None (memory no resource
    tracks, whose use names no bytes).
    """
    if block is None:
        return 0, 0
    try:
        ptr = pointer_of(arg)
        shape = arg.shape
        strides = arg.strides
        itemsize = arg.dtype.itemsize
    except (AttributeError, TypeError, KeyError):
        cai = getattr(arg, "__cuda_array_interface__", None)
        if cai is None:
            return 0, block.nbytes
        ptr, shape = cai["data"][0], tuple(cai["shape"])
        itemsize = np.dtype(cai["typestr"]).itemsize
        strides = cai.get("strides")
    return extent_span(block, ptr, shape, strides, itemsize)


def extent_span(block: Block, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...] | None,
                itemsize: int) -> tuple[int, int]:
    """The bytes of ``block`` an array at ``ptr`` (its first element) of
    ``shape`` and byte ``strides`` (None: C order) may touch, as offsets
    ``(lo, hi)``: :func:`array_span` of an array given by its layout."""
    if strides is None:
        strides = c_strides(shape, itemsize)
    low = high = ptr
    for n, stride in zip(shape, strides, strict=False):
        if n <= 0:
            return (0, 0) if block.ptr <= ptr <= block.ptr + block.nbytes else (0, block.nbytes)
        step = (n - 1) * stride
        if step < 0:
            low += step
        else:
            high += step
    return span(block, low, high + itemsize - low)


def numba_stream(stream: Any) -> Any:
    """The object Numba's launch and copy APIs accept for ``stream``."""
    if stream is None or (isinstance(stream, int) and stream == 0):
        return 0
    if SIMULATOR or (hasattr(stream, "handle") and hasattr(stream, "synchronize")):
        return stream
    return cuda.external_stream(stream_handle(stream))


# The race reports name who made each of Numba's streams, from here on.
stream_origins.install()

if SIMULATOR:
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray as _SimArray

    def allocation_target() -> tuple[DeviceRuntime, Any]:
        """The runtime new arrays are allocated from, and the context to make them in."""
        return launch_runtime(), None

    def make_array(rt: DeviceRuntime, block: Block, shape: tuple[int, ...],
                   strides: tuple[int, ...], dtype: np.dtype, stream: Any,
                   context: Any = None) -> Any:
        buffer = rt.driver.buffer(block.ptr, block.nbytes)  # type: ignore[attr-defined]
        owner = (ctypes.c_uint8 * block.nbytes).from_address(block.ptr)
        owner.keep = buffer  # type: ignore[attr-defined]  # the chunk outlives every view
        owner._nss_block = block  # type: ignore[attr-defined]  # as on a GPU
        weakref.finalize(owner, rt.defer_free, block)
        host = np.ndarray(shape, dtype=dtype, buffer=owner,  # type: ignore[arg-type]
                          strides=strides)
        return _SimArray(host, stream=stream or 0)

    def wrap_memory(rt: DeviceRuntime, block: Block, ptr: int, shape: tuple[int, ...],
                    strides: tuple[int, ...], dtype: np.dtype, stream: Any, keep: Any) -> Any:
        """A device array whose data starts at ``ptr`` inside ``block`` (a borrowed
        block, or a block of the library another library lends back), holding
        ``keep`` alive; its death frees nothing (``keep`` decides)."""
        buffer = rt.driver.buffer(block.ptr, block.nbytes)  # type: ignore[attr-defined]
        owner = (ctypes.c_uint8 * block.nbytes).from_address(block.ptr)
        owner.keep = (buffer, keep)  # type: ignore[attr-defined]
        owner._nss_block = block  # type: ignore[attr-defined]
        host = np.ndarray(shape, dtype=dtype, buffer=owner,  # type: ignore[arg-type]
                          offset=ptr - block.ptr, strides=strides)
        return _SimArray(host, stream=stream or 0)

    def _owner_block(ary: np.ndarray) -> Block | None:
        # The block behind the ctypes owner at the end of the view chain, so
        # that a block freed by a context reset is refused (StaleContext) as on
        # a GPU, not mistaken for foreign memory.
        base: Any = ary
        while isinstance(base, np.ndarray):
            base = base.base
        return getattr(base, "_nss_block", None)

    def resolve(rt: DeviceRuntime, arg: Any) -> Resolved:
        if isinstance(arg, _SimArray):
            block = _owner_block(arg._ary)
            if block is None:
                block = rt.find(arg._ary.__array_interface__["data"][0])
            return (DEVICE, block, None)
        if isinstance(arg, np.ndarray):
            return _HOST
        return _resolve_interface(rt, arg)

    def pointer_of(arg: Any) -> int:
        return int(arg._ary.__array_interface__["data"][0])

    def memset(array: Any, value: int, stream: Any) -> None:
        """Set every byte of a contiguous array (the simulator runs it at once)."""
        array._ary.reshape(-1, order="A").view(np.uint8)[...] = value

else:
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    from numba.cuda.cudadrv.driver import MemoryPointer
    from numba.cuda.cudadrv.driver import binding as _binding

    from numba_streamsafe.numba import shared_libraries

    _CUdeviceptr = _binding.CUdeviceptr
    # Two GPUs of one kind share each kernel's library: unload it once.
    shared_libraries.install()

    def allocation_target() -> tuple[DeviceRuntime, Any]:
        """The runtime of the current Numba context's device, and that context
        (new arrays are allocated there)."""
        context = cuda.current_context()
        return get_runtime(device_id(context.device)), context

    class _Release:
        """``MemoryPointer._finalizer`` of a :class:`BlockPointer`, made when
        asked for: ``alive`` until the pointer's block is released, and
        calling it releases the block (what ``MemoryPointer.free()`` uses)."""

        __slots__ = ("pointer",)

        def __init__(self, pointer: BlockPointer) -> None:
            self.pointer = pointer

        @property
        def alive(self) -> bool:
            return self.pointer._nss_defer is not None

        def __call__(self) -> None:
            self.pointer._release()

    class BlockPointer(MemoryPointer):
        """A Numba ``MemoryPointer`` owning one block.

        Dropping the last reference (``__del__``) or ``free()`` queues the
        block's free once on the finalizer-safe path (a ``deque.append``, no
        lock, no driver call). It replaces the ``weakref.finalize`` a plain
        ``MemoryPointer`` registers per allocation, which costs more than the
        rest of the plugin's allocation path.
        """

        #: What a pointer of :func:`wrap_memory` keeps alive (None for a block's own).
        _nss_keep: Any = None
        _nss_defer: Any = None

        def __init__(self, context: Any, block: Block, defer: Any, ptr: int | None = None
                     ) -> None:
            # MemoryPointer.__init__'s fields, set directly.
            self.context = context
            if ptr is None:
                self.device_pointer = self.handle = _CUdeviceptr(block.ptr)
                self.size = self._cuda_memsize_ = block.nbytes
            else:
                self.device_pointer = self.handle = _CUdeviceptr(ptr)
                self.size = self._cuda_memsize_ = block.ptr + block.nbytes - ptr
            self.is_managed = True
            self.refct = 1
            self._owner = None
            self._nss_block = block
            #: Called once with the block when the pointer dies or is freed;
            #: None afterwards.
            self._nss_defer = defer

        @property
        def _finalizer(self) -> _Release:  # type: ignore[override]
            return _Release(self)

        def _release(self) -> None:
            """Hand the block to its release, once."""
            defer = self._nss_defer
            if defer is not None:
                self._nss_defer = None
                defer(self._nss_block)

        __del__ = _release

    class TrackedDeviceNDArray(DeviceNDArray):
        """A Numba device array over a library block whose
        ``__cuda_array_interface__`` orders its consumer: the stream it names
        is made to wait for every use the library knows of
        (:func:`numba_streamsafe.numba.interop.boundaries.export_interface`). Views made
        by indexing keep the class."""

        @property
        def __cuda_array_interface__(self) -> dict[str, Any]:  # type: ignore[override]
            desc = DeviceNDArray.__cuda_array_interface__.fget(self)  # type: ignore[attr-defined]
            hook = export_hook
            return hook(self, desc) if hook is not None else desc

        def __dlpack__(self, *, stream: Any = None, max_version: Any = None,
                       dl_device: Any = None, copy: Any = None) -> Any:
            """A DLPack capsule of the array, ``stream`` (DLPack's stream
            protocol) ordered after its known uses
            (:func:`numba_streamsafe.numba.interop.dlpack.export_dlpack`)."""
            return dlpack_methods[0](self, stream=stream, max_version=max_version,
                                           dl_device=dl_device, copy=copy)

        def __dlpack_device__(self) -> tuple[int, int]:
            return dlpack_methods[1](self)  # type: ignore[no-any-return]

    def make_array(rt: DeviceRuntime, block: Block, shape: tuple[int, ...],
                   strides: tuple[int, ...], dtype: np.dtype, stream: Any,
                   context: Any = None) -> Any:
        if context is None:
            context = cuda.current_context()
        mp = BlockPointer(context, block, rt.resource.defer_free)
        array = TrackedDeviceNDArray(shape, strides, dtype, stream=numba_stream(stream),
                                     gpu_data=mp)
        if array.gpu_data is not mp:
            # Numba gives an empty array a null pointer and drops ours: keep the
            # block, so the array has an identity as on the simulator.
            array.gpu_data = mp
        return array

    def _keep_only(block: Block) -> None:
        """The release of a pointer that frees nothing (:func:`wrap_memory`)."""

    def wrap_memory(rt: DeviceRuntime, block: Block, ptr: int, shape: tuple[int, ...],
                    strides: tuple[int, ...], dtype: np.dtype, stream: Any, keep: Any) -> Any:
        """A device array whose data starts at ``ptr`` inside ``block`` (a borrowed
        block, or a block of the library another library lends back), holding
        ``keep`` alive; its death frees nothing (``keep`` decides)."""
        mp = BlockPointer(cuda.current_context(), block, _keep_only, ptr)
        mp._nss_keep = keep
        array = TrackedDeviceNDArray(shape, strides, dtype, stream=numba_stream(stream),
                                     gpu_data=mp)
        if array.gpu_data is not mp:
            array.gpu_data = mp
        return array

    def resolve(rt: DeviceRuntime, arg: Any) -> Resolved:
        gpu_data: Any = getattr(arg, "gpu_data", _MISSING)
        if gpu_data is not _MISSING:
            if gpu_data is None:
                return (DEVICE, None, None)
            block = getattr(gpu_data.owner, "_nss_block", None)
            if block is None:
                block = rt.find(int(gpu_data.device_pointer_value or 0))
            return (DEVICE, block, None)
        if isinstance(arg, np.ndarray):
            return _HOST
        return _resolve_interface(rt, arg)

    def memset(array: Any, value: int, stream: Any) -> None:
        """Queue ``cuMemsetD8Async`` over a contiguous array on ``stream``."""
        from numba.cuda.cudadrv import driver as numba_driver

        numba_driver.device_memset(array, value, array.nbytes, stream=stream)

    def pointer_of(arg: Any) -> int:
        gpu_data = getattr(arg, "gpu_data", None)
        if gpu_data is not None:
            return int(gpu_data.device_pointer_value or 0)
        return int(arg.__cuda_array_interface__["data"][0])


_MISSING = object()

#: Set by :mod:`numba_streamsafe.numba.arrays`: orders the consumer of an
#: exported ``__cuda_array_interface__`` (``hook(array, desc) -> desc``).
export_hook: Any = None


#: ``(export_dlpack, dlpack_device)`` of :mod:`numba_streamsafe.numba.interop.dlpack`, set
#: when it loads (the array module loads it, and every array of the library is
#: made after that): the arrays' ``__dlpack__`` and ``__dlpack_device__``.
dlpack_methods: Any = None


def _resolve_interface(rt: DeviceRuntime, arg: Any) -> Resolved:
    cai = getattr(arg, "__cuda_array_interface__", None)
    if cai is None:
        return _NOT_ARRAY
    ptr = cai["data"][0]
    producer = cai.get("stream") if cai.get("version", 0) >= 3 else None
    if producer == 1:  # the interface's name for the legacy default stream
        producer = 0
    return (DEVICE, rt.find(ptr) if ptr else None, producer)

