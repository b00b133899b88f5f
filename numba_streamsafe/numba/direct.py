"""Direct launches: a tracked kernel's compiled overload launched with one
``cuLaunchKernel``, its parameters packed in one ``struct`` call.

Numba's launch path re-derives per launch what is fixed per overload (the
argument types, the marshalling of each argument, a ``cuda.core`` stream and
launch configuration) and costs tens of microseconds of host time. A tracked
kernel already walks its arguments to fence them, so it caches, per tuple of
argument types, a :class:`LaunchPlan`: the overload's function handle and the
layout of its flattened parameters, which are the ones Numba passes (for an
array: meminfo, parent, size, itemsize, data pointer, shape, strides in bytes;
for a scalar: its value at the kernel's type; complex numbers as two
parameters).

The direct path covers device arrays and scalars (integers, floats,
booleans, complex) of kernels that are not compiled with ``debug``, not
cooperative, not launch-configuration sensitive and have no argument
extensions. Everything else, the first launch of each argument-type tuple
(which compiles) and launches Numba would warn about, go through Numba's own
launch, so behaviour never depends on which path ran.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from typing import Any

import numpy as np
from numba.cuda import types as _numba_types

types: Any = _numba_types  # Numba's type objects (untyped for checkers)

__all__ = ["LaunchPlan", "argtypes_of", "build_plan", "param_slots", "normalize_dims",
           "UNSUPPORTED"]

_ARRAY = 0
_SCALAR = 1
_COMPLEX = 2
# float32 / complex64 converted by ctypes first (see _F32_BY_CTYPES).
_F32 = 3
_C64 = 4

# struct codes of the scalar types Numba passes by value.
_SCALAR_CODES: dict[Any, str] = {
    types.int8: "b", types.uint8: "B", types.int16: "h", types.uint16: "H",
    types.int32: "i", types.uint32: "I", types.int64: "q", types.uint64: "Q",
    types.float32: "f", types.float64: "d", types.boolean: "?",
}
_COMPLEX_CODES: dict[Any, str] = {types.complex64: "f", types.complex128: "d"}

# Numba types of Python scalars as kernel arguments (numba's typeof).
_PY_SCALARS: dict[type, Any] = {int: types.int64, float: types.float64, bool: types.boolean,
                                complex: types.complex128}


def _struct_f_is_c_cast() -> bool:
    """Whether ``struct``'s ``f`` packs a double as C's ``(float)`` cast does,
    which is how Numba's marshalling converts (``ctypes.c_float``). CPython
    3.14 made ``struct`` keep a signalling NaN signalling (the cast quiets
    it), so there the two differ for such NaNs."""
    snan = struct.unpack("=d", struct.pack("=Q", 0x7FF0_0000_2000_0001))[0]
    return struct.pack("=f", snan) == bytes(ctypes.c_float(snan))


#: float32 parameters (and complex64 parts) go through ``ctypes.c_float``
#: before packing, where ``struct`` would pack some NaNs otherwise than Numba.
_F32_BY_CTYPES: bool = not _struct_f_is_c_cast()


def param_slots(argtypes: tuple[Any, ...]) -> tuple[list[str], list[int]] | None:
    """The flattened kernel parameters of an overload taking ``argtypes``.

    Returns
    -------
    (codes, kinds) or None
        One struct code per kernel parameter (``Q`` pointers, ``q`` sizes,
        shapes and strides, the scalar's own code otherwise), and one kind per
        argument; None when an argument type has no direct marshalling.
    """
    codes: list[str] = []
    kinds: list[int] = []
    for ty in argtypes:
        if isinstance(ty, types.Array):
            # meminfo, parent, nitems, itemsize, data, shape..., strides...
            codes += ["Q", "Q", "q", "q", "Q"] + ["q"] * (2 * ty.ndim)
            kinds.append(_ARRAY)
        elif ty in _SCALAR_CODES:
            codes.append(_SCALAR_CODES[ty])
            kinds.append(_F32 if _F32_BY_CTYPES and ty == types.float32 else _SCALAR)
        elif ty in _COMPLEX_CODES:
            codes += [_COMPLEX_CODES[ty]] * 2
            kinds.append(_C64 if _F32_BY_CTYPES and ty == types.complex64 else _COMPLEX)
        else:
            return None
    return codes, kinds


def compiled_codes(argtypes: tuple[Any, ...]) -> bytes:
    """The parameter codes the compiled hot path (``numba_streamsafe._hot``)
    packs by, for an overload whose parameters are ``argtypes`` (covered by
    :func:`param_slots`): one per argument, ``A`` for an array (the fields
    cached on the array fill its parameters), ``C`` / ``Z`` for complex64 /
    complex128, otherwise the scalar's struct code."""
    out = []
    for ty in argtypes:
        if isinstance(ty, types.Array):
            out.append("A")
        elif ty in _COMPLEX_CODES:
            out.append("C" if _COMPLEX_CODES[ty] == "f" else "Z")
        else:
            out.append(_SCALAR_CODES[ty])
    return "".join(out).encode()


def array_fields(arg: Any) -> bytes:
    """The launch parameters of a device array as Numba passes them (meminfo,
    parent, size, itemsize, data pointer, shape, strides), packed as
    :meth:`LaunchPlan.pack` packs them: cached on the array by the compiled
    hot path (a device array's pointer, shape and strides never change)."""
    ndim = len(arg.shape)
    return struct.pack(f"=QQqqQ{2 * ndim}q", 0, 0, arg.size, arg.dtype.itemsize,
                       int(arg.gpu_data.device_pointer), *arg.shape, *arg.strides)


def _layout(codes: list[str]) -> tuple[str, list[int], int]:
    """A native-size, unaligned struct format placing every parameter at an
    offset that is a multiple of 8; the offsets; the total size."""
    fmt = ["="]
    offsets = []
    at = 0
    for code in codes:
        offsets.append(at)
        size = struct.calcsize("=" + code)
        fmt.append(code)
        pad = -size % 8
        if pad:
            fmt.append(f"{pad}x")
        at += size + pad
    return "".join(fmt), offsets, max(at, 8)


def _as_float32(value: Any) -> Any:
    """``value`` as Numba's marshalling converts it for a float32 parameter
    (``ctypes.c_float``, C's cast), as a Python float; ``value`` itself when
    ctypes refuses it (packing then refuses it too). Used where ``struct``
    would pack a signalling NaN otherwise (:data:`_F32_BY_CTYPES`)."""
    try:
        return ctypes.c_float(value).value
    except (TypeError, OverflowError):
        return value


class _Scratch(threading.local):
    """One parameter buffer and pointer array per thread: the driver copies
    the parameters when the launch is queued, so they are reused at once."""

    def __init__(self, size: int, offsets: list[int]) -> None:
        self.buffer = ctypes.create_string_buffer(size)
        base = ctypes.addressof(self.buffer)
        self.pointers = (ctypes.c_void_p * max(len(offsets), 1))(*[base + o for o in offsets])
        self.address = ctypes.addressof(self.pointers)


class LaunchPlan:
    """How to launch one compiled overload directly.

    Parameters
    ----------
    kernel : numba.cuda.dispatcher._Kernel
        The compiled overload.
    argtypes : tuple of numba types
        The overload's argument types, which fix the marshalling.
    kinds : list of int
        Per argument: array, scalar or complex (see :func:`param_slots`).
    codes : list of str
        Per flattened parameter, its struct code.
    """

    __slots__ = ("kernel", "function", "_cache", "_cufunc", "kinds", "_struct", "_scratch",
                 "nparams", "codes")

    def __init__(self, kernel: Any, kinds: list[int], codes: list[str],
                 fast_codes: bytes = b"") -> None:
        self.kernel = kernel
        cufunc = kernel._codelibrary.get_cufunc()
        self._cache = kernel._codelibrary._cufunc_cache
        self._cufunc = cufunc
        self.function = int(cufunc.handle)
        self.kinds = kinds
        #: One code per argument for the compiled hot path (:func:`compiled_codes`).
        self.codes = fast_codes
        fmt, offsets, size = _layout(codes)
        self._struct = struct.Struct(fmt)
        self._scratch = _Scratch(size, offsets)
        self.nparams = len(codes)

    def current(self, device_id: int) -> bool:
        """Whether the overload's loaded function is still the one Numba uses
        on ``device_id`` (a context reset unloads modules)."""
        return self._cache.get(device_id) is self._cufunc

    def pack(self, args: tuple[Any, ...]) -> int | None:
        """Write ``args`` into this thread's parameter buffer.

        Returns
        -------
        int or None
            The address of the parameter pointer array, or None when a value
            does not fit its parameter (Numba's path then converts it).
        """
        values: list[Any] = []
        append = values.append
        extend = values.extend
        for kind, arg in zip(self.kinds, args, strict=True):
            if kind == _ARRAY:
                extend((0, 0, arg.size, arg.dtype.itemsize, int(arg.gpu_data.device_pointer)))
                extend(arg.shape)
                extend(arg.strides)
            elif kind == _SCALAR:
                append(arg)
            elif kind == _COMPLEX:
                append(arg.real)
                append(arg.imag)
            elif kind == _F32:
                append(_as_float32(arg))
            else:
                append(_as_float32(arg.real))
                append(_as_float32(arg.imag))
        scratch = self._scratch
        try:
            self._struct.pack_into(scratch.buffer, 0, *values)
        except (struct.error, TypeError, OverflowError):
            # Out of the parameter's range (struct refuses; Numba's ctypes
            # conversion wraps integers and rounds floats to inf), or not a
            # number of its kind: Numba's path converts it, its own way.
            return None
        return scratch.address


def _argtype(arg: Any) -> Any:
    """The Numba type of one argument, or None when the direct path does not
    cover it."""
    ty = _PY_SCALARS.get(type(arg))
    if ty is not None:
        return ty
    if getattr(arg, "gpu_data", None) is not None:
        return arg._numba_type_
    # A NumPy scalar; not a 0-d array of any kind (a host one, or one of CuPy
    # or PyTorch): it has no ``gpu_data`` to pass, so Numba's path marshals it.
    if isinstance(arg, np.generic):
        from numba.cuda.typing.typeof import Purpose, typeof

        return typeof(arg, Purpose.argument)
    return None


def _accepts(param: Any, arg: Any) -> bool:
    """Whether an argument of type ``arg`` may be passed where the overload
    declares ``param`` without conversion."""
    if param == arg:
        return True
    if param == types.boolean:
        # Numba converts a number to a boolean parameter its own way (0.5 gives
        # False there; struct packing would give True): its path does it.
        return False
    if isinstance(param, types.Array) and isinstance(arg, types.Array):
        return (param.dtype == arg.dtype and param.ndim == arg.ndim and param.layout == "A"
                and param.mutable == arg.mutable)
    # Scalars convert as Numba's marshalling does (packing refuses what does not fit).
    return param in _SCALAR_CODES and arg in _SCALAR_CODES


def argtypes_of(args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The Numba types of ``args``, or None when one is not covered."""
    argtypes = []
    for arg in args:
        ty = _argtype(arg)
        if ty is None:
            return None
        argtypes.append(ty)
    return tuple(argtypes)


#: :func:`build_plan`'s answer for a kernel the direct path never covers.
UNSUPPORTED = "unsupported"


def build_plan(dispatcher: Any, argtypes: tuple[Any, ...]) -> LaunchPlan | str | None:
    """The plan of the overload ``dispatcher`` would run for ``argtypes``.

    Returns
    -------
    LaunchPlan, UNSUPPORTED or None
        The plan; :data:`UNSUPPORTED` when the direct path does not apply to
        these types (a conversion needed, an argument it does not marshal, a
        debug, cooperative or launch-configuration sensitive kernel); None when
        the overload is not compiled yet.
    """
    overloads = dispatcher.overloads
    if dispatcher.specialized:
        kernel = next(iter(overloads.values()))
        declared = tuple(kernel.argument_types)
        if len(declared) != len(argtypes) or not all(map(_accepts, declared, argtypes)):
            return UNSUPPORTED
    else:
        kernel = overloads.get(argtypes)
        if kernel is None:
            # ``forall`` launches through a specialized copy of the dispatcher.
            for (_, types_), spec in list(getattr(dispatcher, "specializations", {}).items()):
                if types_ == argtypes and spec.overloads:
                    kernel = next(iter(spec.overloads.values()))
                    break
            else:
                return None
        declared = argtypes
    if (kernel.debug or kernel.cooperative or getattr(kernel, "launch_config_sensitive", False)
            or dispatcher.targetoptions.get("extensions")
            or getattr(dispatcher, "_launch_config_sensitive", False)):
        return UNSUPPORTED
    slots = param_slots(declared)
    if slots is None:
        return UNSUPPORTED
    codes, kinds = slots
    return LaunchPlan(kernel, kinds, codes, compiled_codes(declared))


def normalize_dims(dim: Any) -> tuple[int, int, int] | None:
    """``dim`` (an int or 1 to 3 ints) as three ints, or None when it is not
    plainly valid (Numba's path then reports the error)."""
    if type(dim) is int:
        return (dim, 1, 1) if dim > 0 else None
    if type(dim) is tuple and 1 <= len(dim) <= 3:
        for d in dim:
            if type(d) is not int or d <= 0:
                return None
        return (dim + (1, 1))[:3]  # type: ignore[return-value]
    return None
