"""DLPack: tracked arrays leave as DLPack capsules, ordered for their
consumer, and DLPack (or CUDA Array Interface) producers' arrays come in as
tracked arrays, ordered after their producer.

Export (``TrackedDeviceNDArray.__dlpack__``, used by ``torch.from_dlpack`` and
``cupy.from_dlpack``), the DLPack stream protocol: the consumer passes the
stream it will use (``None``: the legacy default stream; ``1`` legacy, ``2``
per-thread default, any other value a stream handle; ``-1``: no ordering, the
consumer orders itself). That stream is made to wait for every use of the
array the library knows of, and the export is recorded there as a read-write
use (the consumer gets a writable view): later tracked uses of the array wait
for what the consumer queued on that stream up to the export. The export's
event is recorded at once: the library knows the consumer's stream by its
handle only, and its owner may destroy it at any time. Work the consumer
queues later, on its stream or others, is outside the library: wrap it in
:func:`numba_streamsafe.lend`.

The capsule is a legacy ``dltensor`` (``DLManagedTensor``, DLPack 0.8 ABI),
which every consumer accepts. It keeps the array alive until the consumer
calls its deleter; a capsule never consumed calls it when collected.

Import (:func:`import_array`): a DLPack producer is asked for its data on the
given stream (it orders its own work before that stream, as the protocol
says), a CUDA Array Interface producer's ``stream`` is waited for; then the
data is copied into a new tracked array on that stream, so it is ordered like
any tracked array from there on.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np

from numba_streamsafe.access import Access
from numba_streamsafe.errors import InvalidArgument, InvalidArgumentType
from numba_streamsafe.numba import arrays, target
from numba_streamsafe.protocol import commit, preflight, single
from numba_streamsafe.runtime import get_runtime

__all__ = ["export_dlpack", "dlpack_device", "import_array", "KDL_CUDA"]

#: DLPack device type of CUDA device memory.
KDL_CUDA = 2
_KDL_INT, _KDL_UINT, _KDL_FLOAT, _KDL_COMPLEX, _KDL_BOOL = 0, 1, 2, 5, 6
_CODES = {"i": _KDL_INT, "u": _KDL_UINT, "f": _KDL_FLOAT, "c": _KDL_COMPLEX, "b": _KDL_BOOL}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", _DELETER)]

# The destructor gets the dying capsule as a raw pointer (a py_object argument
# would take a new reference to an object being destroyed).
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_NAME = b"dltensor"
_USED = b"used_dltensor"

_pyapi = ctypes.pythonapi
_pyapi.PyCapsule_New.restype = ctypes.py_object
_pyapi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]
_pyapi.PyCapsule_GetPointer.restype = ctypes.c_void_p
_pyapi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_pyapi.PyCapsule_IsValid.restype = ctypes.c_int
_pyapi.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_pyapi.PyCapsule_SetName.restype = ctypes.c_int
_pyapi.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_raw_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", _pyapi))
_raw_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _pyapi))

#: Exports alive: address of the DLManagedTensor -> what it keeps (the array,
#: the structures and the shape and stride buffers). The deleter drops it.
_live: dict[int, tuple[Any, ...]] = {}
_live_lock = threading.Lock()


@_DELETER
def _delete(managed: Any) -> None:
    address = ctypes.cast(managed, ctypes.c_void_p).value
    if address:
        with _live_lock:
            _live.pop(address, None)


@_CAPSULE_DESTRUCTOR
def _capsule_destructor(capsule: Any) -> None:
    # Not consumed (still named "dltensor"): the producer releases it.
    if _raw_is_valid(capsule, _NAME):
        address = _raw_get_pointer(capsule, _NAME)
        if address:
            DLManagedTensor.from_address(address).deleter(
                ctypes.cast(address, ctypes.POINTER(DLManagedTensor)))


def live_exports() -> int:
    """Capsules whose consumer has not released them yet (for tests)."""
    return len(_live)


def dlpack_device(array: Any) -> tuple[int, int]:
    """``(kDLCUDA, device ordinal)`` of a tracked array."""
    block = _block(array)
    return (KDL_CUDA, block.device)


def _block(array: Any) -> Any:
    rt = target.runtime()
    kind, block, _ = target.resolve(rt, array)
    if kind != target.DEVICE or block is None:
        raise InvalidArgument("DLPack export: the array was not allocated by numba_streamsafe")
    return block


def _consumer_handle(stream: Any) -> int | None:
    """The stream handle a DLPack consumer names (None: no ordering asked)."""
    if stream is None:
        return 0  # the legacy default stream
    if isinstance(stream, bool) or not isinstance(stream, int):
        raise InvalidArgumentType(f"__dlpack__: stream must be an int or None (DLPack stream "
                                  f"protocol), got {type(stream).__name__} {stream!r}")
    if stream == -1:
        return None
    if stream == 0 or stream < -1:
        raise InvalidArgument(f"__dlpack__: stream {stream} is not allowed for CUDA: pass None "
                              "or 1 (legacy default stream), 2 (per-thread default stream), a "
                              "stream handle, or -1 (no ordering)")
    return 0 if stream == 1 else stream


def export_dlpack(array: Any, *, stream: Any = None, max_version: Any = None,
                  dl_device: Any = None, copy: Any = None) -> Any:
    """The DLPack capsule of a tracked device array, its consumer's stream
    ordered after every known use (the module's documentation has the contract).

    Raises
    ------
    InvalidArgument
        Not a library array; a stream value the protocol does not allow; a
        dtype DLPack has no code for; a copy or another device asked for.
    BufferError
        Strides that are not a whole number of elements.
    """
    if copy:
        raise BufferError("__dlpack__: copy=True is not supported; the export is a view")
    block = _block(array)
    if dl_device is not None and tuple(dl_device) != (KDL_CUDA, block.device):
        raise BufferError(f"__dlpack__: the array is on (kDLCUDA, {block.device}); "
                          f"{tuple(dl_device)} was asked for")
    dtype = np.dtype(array.dtype)
    code = _CODES.get(dtype.kind)
    if code is None or dtype.fields is not None or dtype.subdtype is not None:
        raise InvalidArgument(f"__dlpack__: dtype {dtype} has no DLPack code")
    itemsize = dtype.itemsize
    strides = []
    for s in array.strides:
        if s % itemsize:
            raise BufferError(f"__dlpack__: stride {s} B is not a whole number of "
                              f"{itemsize}-byte elements")
        strides.append(s // itemsize)
    handle = _consumer_handle(stream)
    if handle is not None:
        _order_consumer(block, handle)
    ndim = len(array.shape)
    shape_buf = (ctypes.c_int64 * max(ndim, 1))(*array.shape)
    stride_buf = (ctypes.c_int64 * max(ndim, 1))(*strides)
    managed = DLManagedTensor()
    tensor = managed.dl_tensor
    tensor.data = target.pointer_of(array) if array.size else block.ptr
    tensor.device = DLDevice(KDL_CUDA, block.device)
    tensor.ndim = ndim
    tensor.dtype = DLDataType(code, 8 * itemsize, 1)
    tensor.shape = ctypes.cast(shape_buf, ctypes.POINTER(ctypes.c_int64))
    tensor.strides = ctypes.cast(stride_buf, ctypes.POINTER(ctypes.c_int64))
    tensor.byte_offset = 0
    managed.manager_ctx = None
    managed.deleter = _delete
    address = ctypes.addressof(managed)
    with _live_lock:
        _live[address] = (array, managed, shape_buf, stride_buf)
    return _pyapi.PyCapsule_New(address, _NAME, _capsule_destructor)


def _order_consumer(block: Any, handle: int) -> None:
    """``handle`` waits for every known use of ``block``; the export is recorded
    there as a read-write use."""
    rt = target.runtime()
    if block.device != rt.device:
        rt = get_runtime(block.device)
    if not arrays._tracking(rt):
        return
    uses = single(block, Access.READ_WRITE, "DLPack export")
    with rt.activate():
        preflight(rt, handle, uses, False)
        commit(rt, handle, uses)
        _seal_now(rt, handle)


def _seal_now(rt: Any, handle: int) -> None:
    """The consumer's stream is known by its handle only (its object may go at
    any time): record its mark's event now, while the stream surely exists."""
    seal = getattr(rt.resource, "seal_open", None)
    if seal is not None:
        seal(handle)


# ------------------------------------------------------------------- import
def import_array(obj: Any, *, stream: Any, tag: str = "imported") -> Any:
    """A tracked copy, on ``stream``, of a DLPack or CUDA Array Interface
    producer's device array, ordered after the producer's work.

    A DLPack producer (``__dlpack__``: PyTorch, CuPy, JAX...) is asked for its
    data with ``stream``'s handle, so it orders its work before ``stream``; a
    CUDA Array Interface producer that names a ``stream`` has ``stream`` wait
    for it. The copy (contiguous data, C or Fortran order) is queued on
    ``stream`` as a tracked write of the new array.

    Parameters
    ----------
    obj : array-like
        A device array with ``__dlpack__`` or ``__cuda_array_interface__``.
    stream : stream-like
        The stream the data is wanted on (not a default stream's ``None``: name it).
    tag : str
        Names the new array in reports.

    Raises
    ------
    InvalidArgument
        ``obj`` is no device array of those kinds, or its data is not
        contiguous (make it contiguous first).
    """
    rt = target.runtime()
    handle, owner = rt.stream_ref(stream)
    desc = _describe(obj, rt, handle, arrays._tracking(rt))
    shape, dtype = tuple(desc["shape"]), np.dtype(desc["typestr"])
    order = _contiguous_order(shape, desc.get("strides"), dtype.itemsize)
    out = arrays.device_array(shape, dtype, stream=stream, tag=tag, order=order)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes:
        from numba_streamsafe.protocol import fenced

        dst = target.resolve(rt, out)[1]
        assert dst is not None  # a new array of the library
        fenced(rt, handle, single(dst, Access.WRITE, tag, copy=True), f"import {tag}", False,
               owner, rt.driver.copy_async, dst.ptr, int(desc["data"][0]), nbytes, handle)
    return out


def _describe(obj: Any, rt: Any, handle: int, ordered: bool = True) -> dict[str, Any]:
    """A CUDA Array Interface description of ``obj``'s data, its producer
    ordered before ``handle`` (DLPack's stream argument, or a wait for the
    interface's stream); with ``ordered`` False (tracking off) nothing is
    ordered (DLPack's ``stream=-1``)."""
    consumer = (handle if handle > 0 else 1) if ordered else -1
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__cuda_array_interface__"):
        obj.__dlpack__(stream=consumer)  # the producer orders its work
        desc = dict(obj.__cuda_array_interface__)
        desc.pop("stream", None)  # ordered already
        return desc
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is None and hasattr(obj, "__dlpack__"):
        return _describe_capsule(obj, consumer)
    if cai is None:
        raise InvalidArgument(f"import_array: {type(obj).__name__} has neither __dlpack__ nor "
                              "__cuda_array_interface__")
    desc = dict(cai)
    producer = desc.pop("stream", None)
    if producer is not None and ordered:
        rt.order_after_stream(handle, 0 if producer in (1, 2) else int(producer))
    return desc


def _describe_capsule(obj: Any, consumer: int) -> dict[str, Any]:
    capsule = obj.__dlpack__(stream=consumer)
    address = _pyapi.PyCapsule_GetPointer(capsule, _NAME)
    tensor = DLManagedTensor.from_address(address).dl_tensor
    if tensor.device.device_type != KDL_CUDA:
        raise InvalidArgument("import_array: the DLPack producer's data is not CUDA device memory")
    kinds = {v: k for k, v in _CODES.items()}
    dtype = np.dtype(f"{kinds[tensor.dtype.code]}{tensor.dtype.bits // 8}")
    shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    strides = None
    if tensor.strides:
        strides = tuple(tensor.strides[i] * dtype.itemsize for i in range(tensor.ndim))
    # Kept with the description until the copy is queued; the producer frees
    # its data only once the capsule goes (stream order covers the copy).
    return {"shape": shape, "typestr": dtype.str, "strides": strides,
            "data": (tensor.data + tensor.byte_offset, False), "capsule": capsule}


def _contiguous_order(shape: tuple[int, ...], strides: Any, itemsize: int) -> str:
    if strides is None:
        return "C"
    c = []
    step = itemsize
    for n in reversed(shape):
        c.append(step)
        step *= n
    if tuple(reversed(c)) == tuple(strides):
        return "C"
    f = []
    step = itemsize
    for n in shape:
        f.append(step)
        step *= n
    if tuple(f) == tuple(strides):
        return "F"
    raise InvalidArgument("import_array: the producer's data is not contiguous; make it "
                          "contiguous first (e.g. .contiguous() in PyTorch, "
                          "cupy.ascontiguousarray)")

