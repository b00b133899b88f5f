"""The parameters of a direct launch: one 8-byte slot per kernel parameter,
packed as Numba passes them (:func:`pack_into`).

Part of the engine (:mod:`numba_streamsafe.compiled`), written in Cython's
pure-Python mode (C declarations in ``packing.pxd``): compiled, it writes the
slots itself; run as Python, ``struct`` writes them. Both pack a value
exactly where ``struct`` would and refuse exactly what it refuses (the
launch then goes through Numba, which converts the value its own way).
"""

from __future__ import annotations

import ctypes
import struct
import threading
from typing import Any

import cython

__all__ = ["pack_into", "ParamScratch", "MAX_PARAM_BYTES", "COMPILED"]

#: Whether this module runs compiled (else it runs as Python source).
COMPILED: bool = cython.compiled

#: The most parameter bytes one direct launch passes (CUDA's limit is 4 KiB
#: before Volta and 32 KiB after; larger launches go through Numba).
MAX_PARAM_BYTES = 4096

_FLT_MAX = 3.4028234663852886e38
_INT_RANGES = {ord("b"): (-(1 << 7), (1 << 7) - 1), ord("B"): (0, (1 << 8) - 1),
               ord("h"): (-(1 << 15), (1 << 15) - 1), ord("H"): (0, (1 << 16) - 1),
               ord("i"): (-(1 << 31), (1 << 31) - 1), ord("I"): (0, (1 << 32) - 1),
               ord("q"): (-(1 << 63), (1 << 63) - 1), ord("Q"): (0, (1 << 64) - 1)}
_STRUCTS = {ord(c): struct.Struct("=" + c) for c in "bBhHiIqQfd?"}


@cython.cfunc
def _scalar(code: cython.int, value: Any) -> object:
    """``value`` converted for ``struct``'s ``code`` (a float, an int, or for
    ``?`` the value's truth, as ``struct`` packs it); None where
    ``struct`` refuses it (Numba's path then converts it its own way)."""
    if code == 63:  # '?'
        return bool(value)
    if isinstance(value, (str, bytes)):
        return None
    if code == 102 or code == 100:  # 'f', 'd'
        try:
            x: cython.double = float(value)
        except (TypeError, ValueError, OverflowError):
            return None
        if code == 102 and x == x and _FLT_MAX < abs(x) < float("inf"):
            return None
        return x
    try:
        v = value.__index__()
    except (AttributeError, TypeError):
        return None
    lo, hi = _INT_RANGES[code]
    return v if lo <= v <= hi else None


@cython.cfunc
@cython.exceptval(-2)
def _store(code: cython.int, value: Any, buffer: Any, address: cython.size_t,
           offset: cython.Py_ssize_t) -> cython.int:
    """One scalar into the 8-byte slot at ``offset`` as ``struct``'s ``code``
    packs it; 0 when ``struct`` would refuse the value."""
    v = _scalar(code, value)
    if v is None:
        return 0
    if not cython.compiled:
        buffer[offset:offset + 8] = bytes(8)
        if code == 102 and _F32_BY_CTYPES:
            v = _as_float32(v)
        _STRUCTS[code].pack_into(buffer, offset, v)
        return 1
    p: cython.p_uchar = cython.cast(cython.p_uchar, address + offset)
    cython.cast(cython.p_ulonglong, p)[0] = 0
    if code == 100:
        cython.cast(cython.p_double, p)[0] = v
    elif code == 102:
        cython.cast(cython.p_float, p)[0] = cython.cast(cython.float, cython.cast(cython.double, v))
    elif code == 63:
        p[0] = 1 if v else 0
    elif code == 81 or code == 113:  # 'Q', 'q': two's complement, 64 bits
        cython.cast(cython.p_ulonglong, p)[0] = cython.cast(cython.ulonglong,
                                                             v & 0xFFFFFFFFFFFFFFFF)
    elif code == 105 or code == 73:  # 'i', 'I'
        cython.cast(cython.p_uint, p)[0] = cython.cast(cython.uint, v & 0xFFFFFFFF)
    elif code == 104 or code == 72:  # 'h', 'H'
        cython.cast(cython.p_ushort, p)[0] = cython.cast(cython.ushort, v & 0xFFFF)
    else:  # 'b', 'B'
        p[0] = cython.cast(cython.uchar, v & 0xFF)
    return 1


@cython.cfunc
@cython.exceptval(-2)
def _store_complex(code: cython.int, value: Any, buffer: Any, address: cython.size_t,
                   offset: cython.Py_ssize_t) -> cython.int:
    """A complex64 (``C``) or complex128 (``Z``) into two slots at ``offset``;
    0 when its parts do not fit."""
    if isinstance(value, (str, bytes)):
        return 0
    try:
        z = complex(value)
    except (TypeError, ValueError, OverflowError):
        return 0
    part: cython.int = 102 if code == 67 else 100
    if _store(part, z.real, buffer, address, offset) == 0:
        return 0
    return _store(part, z.imag, buffer, address, offset + 8)


def pack_into(codes: bytes, args: tuple, fields: list, buffer: Any, address: cython.size_t,
              capacity: cython.Py_ssize_t) -> cython.Py_ssize_t:
    """Pack a direct launch's parameters into ``buffer`` (at ``address``), one
    8-byte slot per kernel parameter, as Numba passes them.

    ``codes`` has one code per argument: ``A`` an array (``fields[i]``, its
    launch fields as :func:`numba_streamsafe.numba.launch.launch_plan.array_fields`
    packs them, fills its slots), ``C`` / ``Z`` a complex64 / complex128
    (two slots), else the scalar's ``struct`` code. Returns the slots
    written, or -1 when a value does not fit its parameter or the parameters
    do not fit ``capacity`` bytes (nothing is launched from the buffer then).
    """
    slot: cython.Py_ssize_t = 0
    n: cython.Py_ssize_t = len(codes)
    i: cython.Py_ssize_t
    base: cython.size_t = address
    if n != len(args):
        return -1
    for i in range(n):
        code: cython.int = codes[i]
        value = args[i]
        if code == 65:  # 'A'
            data = fields[i]
            size: cython.Py_ssize_t = len(data)
            if size % 8 or 8 * slot + size > capacity:
                return -1
            if cython.compiled:
                src: cython.p_char = data
                memcpy(cython.cast(cython.p_void, base + 8 * slot), src, size)  # type: ignore[name-defined]  # noqa: F821
            else:
                buffer[8 * slot:8 * slot + size] = data
            slot += size // 8
        elif code == 67 or code == 90:  # 'C', 'Z'
            if 8 * slot + 16 > capacity or not _store_complex(code, value, buffer, base,
                                                              8 * slot):
                return -1
            slot += 2
        else:
            if 8 * slot + 8 > capacity or _store(code, value, buffer, base, 8 * slot) == 0:
                return -1
            slot += 1
    return slot


def _struct_f_is_c_cast() -> bool:
    """Whether ``struct``'s ``f`` packs a double as C's ``(float)`` cast does,
    which is how Numba's marshalling converts (``ctypes.c_float``). CPython
    3.14 made ``struct`` keep a signalling NaN signalling (the cast quiets
    it), so there the two differ for such NaNs."""
    snan = struct.unpack("=d", struct.pack("=Q", 0x7FF0_0000_2000_0001))[0]
    return struct.pack("=f", snan) == bytes(ctypes.c_float(snan))


#: float32 parameters (and complex64 parts) go through ``ctypes.c_float``
#: before ``struct`` packs them where the two differ (Python source only; the
#: compiled build casts as C does).
_F32_BY_CTYPES: bool = not _struct_f_is_c_cast()


def _as_float32(value: float) -> float:
    return ctypes.c_float(value).value


class ParamScratch(threading.local):
    """One parameter buffer of ``nparams`` 8-byte slots per thread, and the
    array of pointers to its slots that ``cuLaunchKernel`` takes: the driver
    copies the parameters when the launch is queued, so they are reused at
    once. ``buffer`` (at ``base``, ``size`` bytes) is what :func:`pack_into`
    fills; ``address`` is the pointer array's."""

    def __init__(self, nparams: int) -> None:
        self.size = 8 * max(nparams, 1)
        self.buffer = ctypes.create_string_buffer(self.size)
        self.base = ctypes.addressof(self.buffer)
        self.pointers = (ctypes.c_void_p * max(nparams, 1))(
            *[self.base + 8 * i for i in range(nparams)])
        self.address = ctypes.addressof(self.pointers)
