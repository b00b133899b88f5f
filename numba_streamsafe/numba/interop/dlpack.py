"""DLPack: tracked arrays leave as DLPack capsules, ordered for their
consumer; the capsules of other libraries are read here for
:mod:`numba_streamsafe.numba.interop.imports`.

Export (``TrackedDeviceNDArray.__dlpack__``, used by ``torch.from_dlpack`` and
``cupy.from_dlpack``), the DLPack stream protocol of the array API standard:
the consumer passes the stream it will use (``None``: the legacy default
stream; ``1`` legacy, ``2`` per-thread default, any other positive value a
stream handle; ``-1``: no ordering, the consumer orders itself; ``0`` is not
allowed). That stream is made to wait for every use of the array the library
knows of (the last write included, whichever stream made it), and the export
is recorded there as a read-write use (the consumer gets a writable view):
later tracked uses of the array wait for what the consumer queued on that
stream up to the export. The export's event is recorded at once: the library
knows the consumer's stream by its handle only, and its owner may destroy it
at any time. Work the consumer queues later, on its stream or others, is
outside the library: wrap it in :func:`numba_streamsafe.lend`.

The capsule is a ``dltensor_versioned`` (``DLManagedTensorVersioned``, DLPack
1.0 ABI) when the consumer's ``max_version`` allows major version 1, else a
legacy ``dltensor`` (``DLManagedTensor``, DLPack 0.8 ABI). Either keeps the
array alive until the consumer calls its deleter; a capsule never consumed
(still carrying its name) calls it when collected.

Shapes and strides are in elements; the dtype codes are kDLInt, kDLUInt,
kDLFloat, kDLComplex and kDLBool (lanes 1); the device is
``(kDLCUDA, the array's device)``.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from typing import Any, NamedTuple

import numpy as np

from numba_streamsafe.core.errors import InvalidArgument, InvalidArgumentType
from numba_streamsafe.numba import target
from numba_streamsafe.numba.interop.exports import order_export

__all__ = ["export_dlpack", "dlpack_device", "make_capsule", "read_capsule", "DLView",
           "KDL_CUDA", "FLAG_READ_ONLY"]

#: DLPack device type of CUDA device memory.
KDL_CUDA = 2
_KDL_INT, _KDL_UINT, _KDL_FLOAT, _KDL_COMPLEX, _KDL_BOOL = 0, 1, 2, 5, 6
_CODES = {"i": _KDL_INT, "u": _KDL_UINT, "f": _KDL_FLOAT, "c": _KDL_COMPLEX, "b": _KDL_BOOL}
_KINDS = {code: kind for kind, code in _CODES.items()}
#: ``DLPACK_FLAG_BITMASK_READ_ONLY`` of a versioned tensor: the consumer must not write.
FLAG_READ_ONLY = 1
#: The DLPack version of the versioned capsules made here.
VERSION = (1, 0)


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    """``DLManagedTensor`` of ``dlpack.h`` (the legacy ``dltensor`` capsule)."""


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    """``DLManagedTensorVersioned`` of ``dlpack.h`` 1.0 (the ``dltensor_versioned``
    capsule)."""


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", _DELETER)]
_DELETER_VERSIONED = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [("version", DLPackVersion),
                                     ("manager_ctx", ctypes.c_void_p),
                                     ("deleter", _DELETER_VERSIONED),
                                     ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]

# The destructor gets the dying capsule as a raw pointer (a py_object argument
# would take a new reference to an object being destroyed).
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_NAME = b"dltensor"
_USED = b"used_dltensor"
_NAME_VERSIONED = b"dltensor_versioned"
_USED_VERSIONED = b"used_dltensor_versioned"

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

#: Exports alive: address of the managed tensor -> what it keeps (the array,
#: the structure and the shape and stride buffers). The deleter drops it.
_live: dict[int, tuple[Any, ...]] = {}
_live_lock = threading.Lock()


def _forget(managed: Any, _finalizing: Any = sys.is_finalizing) -> None:
    if _finalizing():
        return  # ctypes may be gone: nothing is left to forget at exit
    address = ctypes.cast(managed, ctypes.c_void_p).value
    if address:
        with _live_lock:
            _live.pop(address, None)


_delete = _DELETER(_forget)
_delete_versioned = _DELETER_VERSIONED(_forget)


@_CAPSULE_DESTRUCTOR
def _capsule_destructor(capsule: Any, _finalizing: Any = sys.is_finalizing) -> None:
    # Not consumed (still carrying its name): the producer releases it. While the
    # interpreter shuts down (a capsule a borrowed block kept until then),
    # ctypes' own state may already be torn down: calling into it would crash
    # the process, and nothing needs releasing any more.
    if _finalizing():
        return
    for name, struct in ((_NAME, DLManagedTensor), (_NAME_VERSIONED, DLManagedTensorVersioned)):
        if _raw_is_valid(capsule, name):
            address = _raw_get_pointer(capsule, name)
            if address:
                struct.from_address(address).deleter(  # type: ignore[attr-defined]
                    ctypes.cast(address, ctypes.POINTER(struct)))
            return


# The C code of the capsules this module makes calls these three through their
# ctypes thunks, possibly while the interpreter shuts down (a capsule that a
# borrowed array held until then): a thunk freed with this module's globals
# would crash the process. A reference that is never dropped keeps them.
for _thunk in (_delete, _delete_versioned, _capsule_destructor):
    _pyapi.Py_IncRef(ctypes.py_object(_thunk))
del _thunk


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


def _versioned(max_version: Any) -> bool:
    """Whether a consumer that reads up to ``max_version`` takes a 1.x capsule."""
    if max_version is None:
        return False
    if not isinstance(max_version, (tuple, list)) or len(max_version) != 2 or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in max_version):
        raise InvalidArgumentType(f"__dlpack__: max_version must be a (major, minor) tuple of "
                                  f"ints or None, got {max_version!r}")
    return bool(max_version[0] >= VERSION[0])


def export_dlpack(array: Any, *, stream: Any = None, max_version: Any = None,
                  dl_device: Any = None, copy: Any = None) -> Any:
    """The DLPack capsule of a tracked device array, its consumer's stream
    ordered after every known use (the module's documentation has the contract).

    Parameters
    ----------
    array : device array
        An array of the library (any view).
    stream : int or None
        The consumer's stream, as the DLPack stream protocol names it.
    max_version : tuple of int, optional
        The highest DLPack version the consumer reads: ``(1, x)`` or more
        gives a ``dltensor_versioned`` capsule, None or ``(0, x)`` a legacy
        ``dltensor`` one.
    dl_device : tuple of int, optional
        Must be the array's ``(kDLCUDA, device)`` when given.
    copy : bool, optional
        True is refused (the export is always a view).

    Raises
    ------
    InvalidArgument
        Not a library array; a stream value the protocol does not allow; a
        dtype DLPack has no code for (records, non-native byte order).
    BufferError
        A copy or another device asked for; strides that are not a whole
        number of elements.
    """
    if copy:
        raise BufferError("__dlpack__: copy=True is not supported; the export is a view")
    versioned = _versioned(max_version)
    block = _block(array)
    if dl_device is not None and tuple(dl_device) != (KDL_CUDA, block.device):
        raise BufferError(f"__dlpack__: the array is on (kDLCUDA, {block.device}); "
                          f"{tuple(dl_device)} was asked for")
    dtype = np.dtype(array.dtype)
    code = _CODES.get(dtype.kind)
    if code is None or dtype.fields is not None or dtype.subdtype is not None or \
            not dtype.isnative:
        raise InvalidArgument(f"__dlpack__: dtype {dtype} has no DLPack code (DLPack carries "
                              "native-order ints, uints, floats, complex and bool)")
    itemsize = dtype.itemsize
    strides = []
    for s in array.strides:
        if s % itemsize:
            raise BufferError(f"__dlpack__: stride {s} B is not a whole number of "
                              f"{itemsize}-byte elements")
        strides.append(s // itemsize)
    handle = _consumer_handle(stream)
    if handle is not None:
        order_export(block, handle, "DLPack export", target.array_span(block, array))
    data = target.pointer_of(array) if array.size else block.ptr
    return make_capsule(data, tuple(array.shape), tuple(strides), dtype, block.device, array,
                        versioned)


def make_capsule(data: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: np.dtype,
                 device: int, keep: Any, versioned: bool) -> Any:
    """A DLPack capsule of CUDA memory at ``data`` (strides in elements) that
    holds ``keep`` alive until its consumer calls the deleter, or until it is
    collected unconsumed. ``versioned``: a ``dltensor_versioned`` capsule
    (DLPack 1.0, writable), else a legacy ``dltensor`` one."""
    ndim = len(shape)
    shape_buf = (ctypes.c_int64 * max(ndim, 1))(*shape)
    stride_buf = (ctypes.c_int64 * max(ndim, 1))(*strides)
    managed: Any
    if versioned:
        managed = DLManagedTensorVersioned()
        managed.version = DLPackVersion(*VERSION)
        managed.flags = 0  # writable, not a copy
        managed.deleter = _delete_versioned
        name = _NAME_VERSIONED
    else:
        managed = DLManagedTensor()
        managed.deleter = _delete
        name = _NAME
    managed.manager_ctx = None
    tensor = managed.dl_tensor
    tensor.data = data
    tensor.device = DLDevice(KDL_CUDA, device)
    tensor.ndim = ndim
    tensor.dtype = DLDataType(_CODES[dtype.kind], 8 * dtype.itemsize, 1)
    tensor.shape = ctypes.cast(shape_buf, ctypes.POINTER(ctypes.c_int64))
    tensor.strides = ctypes.cast(stride_buf, ctypes.POINTER(ctypes.c_int64))
    tensor.byte_offset = 0
    address = ctypes.addressof(managed)
    with _live_lock:
        _live[address] = (keep, managed, shape_buf, stride_buf)
    return _pyapi.PyCapsule_New(address, name, _capsule_destructor)


# ------------------------------------------------------------- consumer side
class DLView(NamedTuple):
    """What a DLPack capsule describes: the address of the first element
    (``byte_offset`` added), the shape, the strides in **bytes** (None:
    C-contiguous), the dtype, ``(device_type, device_id)`` and whether the
    producer marked the data read-only (a DLPack 1.x flag)."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None
    dtype: np.dtype
    device: tuple[int, int]
    readonly: bool


def read_capsule(capsule: Any, what: str = "from_dlpack") -> DLView:
    """Read an unconsumed ``dltensor`` or ``dltensor_versioned`` capsule.

    The capsule is left as it is (not renamed): it stays the producer's to
    release when it is collected, so keep it alive while the memory is used.

    Raises
    ------
    InvalidArgumentType
        ``capsule`` is no unconsumed DLPack capsule.
    InvalidArgument
        A DLPack major version above 1, or a dtype NumPy has no equal of
        (bfloat16, float8, vector lanes...).
    """
    tensor: Any
    if _pyapi.PyCapsule_IsValid(capsule, _NAME_VERSIONED):
        versioned = DLManagedTensorVersioned.from_address(
            _pyapi.PyCapsule_GetPointer(capsule, _NAME_VERSIONED))
        if versioned.version.major > VERSION[0]:
            raise InvalidArgument(f"{what}: the producer gave a DLPack "
                                  f"{versioned.version.major}.{versioned.version.minor} capsule; "
                                  f"this library reads major version {VERSION[0]}")
        tensor, readonly = versioned.dl_tensor, bool(versioned.flags & FLAG_READ_ONLY)
    elif _pyapi.PyCapsule_IsValid(capsule, _NAME):
        tensor = DLManagedTensor.from_address(_pyapi.PyCapsule_GetPointer(capsule, _NAME)).dl_tensor
        readonly = False
    else:
        raise InvalidArgumentType(f"{what}: __dlpack__ returned {type(capsule).__name__}, not an "
                                  "unconsumed DLPack capsule ('dltensor' or 'dltensor_versioned')")
    kind = _KINDS.get(tensor.dtype.code)
    bits = tensor.dtype.bits
    if kind is None or tensor.dtype.lanes != 1 or bits % 8 or (kind == "b" and bits != 8):
        raise InvalidArgument(f"{what}: DLPack dtype (code {tensor.dtype.code}, {bits} bits, "
                              f"{tensor.dtype.lanes} lanes) has no NumPy equal; convert the "
                              "data to an int, uint, float, complex or bool dtype first")
    try:
        dtype = np.dtype(f"{kind}{bits // 8}")
    except TypeError:
        raise InvalidArgument(f"{what}: DLPack dtype code {tensor.dtype.code} of {bits} bits "
                              "has no NumPy equal") from None
    ndim = tensor.ndim
    shape = tuple(int(tensor.shape[i]) for i in range(ndim))
    strides = None
    if tensor.strides:
        strides = tuple(int(tensor.strides[i]) * dtype.itemsize for i in range(ndim))
    ptr = (tensor.data or 0) + tensor.byte_offset
    return DLView(ptr, shape, strides, dtype,
                  (int(tensor.device.device_type), int(tensor.device.device_id)), readonly)


# The library's device arrays export through this module (their __dlpack__).
target.dlpack_methods = (export_dlpack, dlpack_device)
