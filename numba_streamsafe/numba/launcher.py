# mypy: disable-error-code="operator, call-overload, arg-type"
# (C-typed values that mypy sees as Python objects: cython.cast and C arithmetic.)
"""The launch engine: a configured tracked launch (:class:`Launcher`), the
parameter packing of a direct launch (:func:`pack_into`), and the direct
launch itself (:func:`launch`): argument resolution through the fields cached
on each array, the tracking rules of :mod:`numba_streamsafe.resources.tracking`
under the resource's lock, ``cuLaunchKernel``, and the commit.

Written in Cython's pure-Python mode, like the tracking engine: the package
build compiles this file where a compiler is present. :func:`launch` queues a
kernel itself only when compiled (it calls libcuda with the GIL released);
run as Python it hands every launch back, and the Numba layer's Python path
(the same packing and the same tracking rules) does the launch.
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any

import cython

from numba_streamsafe import tracehook
from numba_streamsafe.resources import tracking
from numba_streamsafe.runtime import sole_runtime

__all__ = ["Launcher", "LaunchState", "Plan", "ArgFields", "pack_into", "launch", "launches",
           "available", "MAX_PARAM_BYTES", "COMPILED"]

#: Whether this module runs compiled (else it runs as Python source).
COMPILED: bool = cython.compiled

#: The most parameter bytes one direct launch passes (CUDA's limit is 4 KiB
#: before Volta and 32 KiB after; larger launches go through Numba).
MAX_PARAM_BYTES = 4096
_MAX_ARGS = 64

_FLT_MAX = 3.4028234663852886e38
_INT_RANGES = {ord("b"): (-(1 << 7), (1 << 7) - 1), ord("B"): (0, (1 << 8) - 1),
               ord("h"): (-(1 << 15), (1 << 15) - 1), ord("H"): (0, (1 << 16) - 1),
               ord("i"): (-(1 << 31), (1 << 31) - 1), ord("I"): (0, (1 << 32) - 1),
               ord("q"): (-(1 << 63), (1 << 63) - 1), ord("Q"): (0, (1 << 64) - 1)}
_STRUCTS = {c: struct.Struct("=" + chr(c)) for c in b"bBhHiIqQfd?"}

_cu_launch = cython.declare(cython.size_t, 0)
_launches = cython.declare(cython.ulonglong, 0)



def available() -> bool:
    """Whether :func:`launch` can queue kernels itself: compiled, with libcuda
    loaded in this process."""
    global _cu_launch
    if _cu_launch == 0:  # looked up until libcuda is loaded
        _cu_launch = tracking.entry_point("cuLaunchKernel")
    return _cu_launch != 0


def launches() -> int:
    """Kernels :func:`launch` queued itself in this process."""
    return _launches


# -------------------------------------------------------------------- packing
@cython.cfunc
def _scalar(code: cython.int, value: Any) -> object:
    """``value`` converted for ``struct``'s ``code`` (a float, an int, or the
    value itself for ``?``, which packs any value's truth); None where
    ``struct`` refuses it (Numba's path then converts it its own way)."""
    if code == 63:  # '?'
        return value
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


def pack_into(codes: bytes, args: tuple, fields: list, buffer: Any, address: int,
              capacity: cython.Py_ssize_t) -> cython.Py_ssize_t:
    """Pack a direct launch's parameters into ``buffer`` (at ``address``), one
    8-byte slot per kernel parameter, as Numba passes them.

    ``codes`` has one code per argument: ``A`` an array (``fields[i]``, its
    launch fields as :func:`numba_streamsafe.numba.direct.array_fields`
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
            if 8 * slot + 16 > capacity or isinstance(value, (str, bytes)):
                return -1
            try:
                z = complex(value)
            except (TypeError, ValueError, OverflowError):
                return -1
            part: cython.int = 102 if code == 67 else 100
            if (_store(part, z.real, buffer, base, 8 * slot) == 0
                    or _store(part, z.imag, buffer, base, 8 * slot + 8) == 0):
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


# ---------------------------------------------------------------- the records
@cython.cclass
class ArgFields:
    """What a direct launch reads of a device array over a tracked block,
    cached on the array (fixed for its life): the block, its address, the
    array's Numba type and its launch fields."""

    block = cython.declare(object, visibility="readonly")
    ptr = cython.declare(object, visibility="readonly")
    argtype = cython.declare(object, visibility="readonly")
    fields = cython.declare(bytes, visibility="readonly")

    def __init__(self, block: Any, argtype: Any, fields: bytes) -> None:
        self.block = block
        self.ptr = block.ptr
        self.argtype = argtype
        self.fields = fields


@cython.cclass
class Plan:
    """One compiled overload as :func:`launch` takes it: its argument types
    (Numba's for arrays, the Python type for a Python scalar), its function
    handle, its parameter codes (see :func:`pack_into`), and Numba's
    per-device function cache with the function it held, to tell
    that the module is still loaded (a context reset unloads it)."""

    argtypes = cython.declare(tuple, visibility="readonly")
    function = cython.declare(object, visibility="readonly")
    codes = cython.declare(bytes, visibility="readonly")
    cache = cython.declare(object, visibility="readonly")
    cufunc = cython.declare(object, visibility="readonly")
    device = cython.declare(object, visibility="readonly")

    def __init__(self, argtypes: tuple, function: int, codes: bytes, cache: Any, cufunc: Any,
                 device: int) -> None:
        self.argtypes = argtypes
        self.function = function
        self.codes = codes
        self.cache = cache
        self.cufunc = cufunc
        self.device = device


@cython.cclass
class LaunchState:
    """What :func:`launch` reads for one tracked kernel on one runtime: the
    runtime, its resource's table, mark book and lock, the launch policy, the
    kernel's access per parameter (-1: none) and its known plans."""

    rt = cython.declare(object, visibility="readonly")
    resource = cython.declare(object, visibility="readonly")
    lock = cython.declare(object, visibility="readonly")
    table = cython.declare(object, visibility="readonly")
    live = cython.declare(dict, visibility="readonly")
    book = cython.declare(object, visibility="readonly")
    policy = cython.declare(object, visibility="readonly")
    destroyed = cython.declare(object, visibility="readonly")
    deferred = cython.declare(object, visibility="readonly")
    accesses = cython.declare(tuple, visibility="readonly")
    plans = cython.declare(list, visibility="readonly")
    warned = cython.declare(object, visibility="readonly")
    no_warn = cython.declare(cython.bint, visibility="readonly")
    eager = cython.declare(cython.bint, visibility="readonly")
    driver_launch = cython.declare(object, visibility="readonly")

    def __init__(self, rt: Any, policy: Any, accesses: tuple, warned: set, no_warn: bool,
                 driver_launch: Any) -> None:
        resource = rt.resource
        self.rt = rt
        self.resource = resource
        self.lock = resource.lock
        self.table = resource.table
        self.live = resource.table.live
        self.book = resource.marks
        self.policy = policy
        self.destroyed = rt.driver.destroyed_streams
        self.deferred = resource.deferred_queue
        self.accesses = accesses
        self.plans = []
        self.warned = warned
        self.no_warn = no_warn
        self.eager = resource.eager
        self.driver_launch = driver_launch

    def add_plan(self, plan: Plan) -> None:
        """Know ``plan`` (the newest eight are kept)."""
        for known in self.plans:
            if cython.cast(Plan, known).argtypes == plan.argtypes:
                return
        if len(self.plans) >= 8:
            del self.plans[0]
        self.plans.append(plan)


# ------------------------------------------------------------------ the launch
@cython.cfunc
@cython.exceptval(-1)
def _dim3(d: object, out: cython.p_uint) -> cython.int:
    """``d`` (an int or 1 to 3 ints, each in 1 .. 2**31 - 1) into ``out``; 0
    when it is not plainly valid (the Python path checks and reports it)."""
    out[0] = out[1] = out[2] = 1
    if type(d) is int:
        if d <= 0 or d > 0x7FFFFFFF:
            return 0
        out[0] = d
        return 1
    if type(d) is not tuple or not 1 <= len(d) <= 3:
        return 0
    i: cython.int
    for i in range(len(d)):
        v = d[i]
        if type(v) is not int or v <= 0 or v > 0x7FFFFFFF:
            return 0
        out[i] = v
    return 1


def launch(state: LaunchState, config: tuple, args: tuple) -> bool:
    """Queue ``kernel[config](*args)`` directly: when every argument with an
    access is a device array with cached :class:`ArgFields` over the live
    block, the others Python scalars, a plan for these argument types is
    known, and nothing asks for the Python path (a trace, a graph capture,
    queued frees, a switched-off policy, another sole runtime). The waits
    and the commit follow :mod:`~numba_streamsafe.resources.tracking`'s
    rules under the resource's lock, which also checks, on every path, that
    the blocks are live and the stream not destroyed.

    Returns
    -------
    bool
        True when launched; False, with nothing queued and no state changed,
        when the Python path must do the launch.
    """
    if not cython.compiled or (_cu_launch == 0 and not available()) or not _takes(state):
        return False
    dims = cython.declare(cython.uint[7])  # grid, block, shared memory
    if not _dims(state, config, dims):
        return False
    stream = _stream_of(state.rt, config)
    if stream is None:
        return False
    fields: list = []
    plan = _plan_for(state, args, fields)
    if plan is None:
        return False
    buf = cython.declare(cython.uchar[4096])
    address: cython.size_t = cython.cast(cython.size_t, cython.address(buf[0]))
    nparams: cython.Py_ssize_t = pack_into(plan.codes, args, fields, None, address,
                                           MAX_PARAM_BYTES)
    if nparams < 0:
        return False
    return _queue(state, plan, dims, stream[0], stream[1], args, address, nparams)


@cython.cfunc
def _takes(state: LaunchState) -> cython.bint:
    """Whether nothing asks for the Python path."""
    rt: Any = state.rt
    policy = state.policy
    return not (tracehook.active is not None or rt.capture is not None
                or sole_runtime() is not rt or not policy.tracking or not policy.direct_launch
                or state.deferred)


@cython.cfunc
@cython.exceptval(-1)
def _dims(state: LaunchState, config: tuple, dims: cython.p_uint) -> cython.int:
    """Grid, block and shared memory of ``config`` into ``dims``; 0 when not
    plainly valid, or when Numba's low-occupancy warning is due (the Python
    path checks, reports and warns)."""
    nconf: cython.Py_ssize_t = len(config)
    if nconf < 2 or nconf > 4 or not _dim3(config[0], dims) or not _dim3(config[1], dims + 3):
        return 0
    dims[6] = 0
    if nconf > 3:
        sm = config[3]
        if type(sm) is not int or sm < 0 or sm > 0x7FFFFFFF:
            return 0
        dims[6] = sm
    if cython.cast(cython.ulonglong, dims[0]) * dims[1] * dims[2] < 128 and not state.no_warn:
        return (dims[0], dims[1], dims[2]) in state.warned
    return 1


@cython.cfunc
def _stream_of(rt: Any, config: tuple) -> tuple | None:
    """``(handle, owner)`` of the configuration's stream: an int handle, or an
    object with its handle cached for ``rt``; None otherwise."""
    if len(config) < 3:
        return (0, None)
    stream = config[2]
    if type(stream) is int:
        return (stream, None) if stream >= 0 else None
    cached = getattr(stream, "_nss_stream", None)
    if type(cached) is not tuple or len(cached) != 2 or cached[0] is not rt:
        return None
    return (cached[1], stream)


@cython.cfunc
def _plan_for(state: LaunchState, args: tuple, fields: list) -> Plan | None:
    """The known plan of the arguments' types, with each argument's launch
    fields appended to ``fields`` (None for a scalar); None when an argument
    is not covered or no plan is known (or its module was unloaded)."""
    accesses = state.accesses
    nargs: cython.Py_ssize_t = len(args)
    if nargs != len(accesses) or nargs > _MAX_ARGS:
        return None
    types = []
    i: cython.Py_ssize_t
    for i in range(nargs):
        arg = args[i]
        if accesses[i] >= 0:
            f = getattr(arg, "_nss_fast", None)
            if type(f) is not ArgFields:
                return None
            fields.append(cython.cast(ArgFields, f).fields)
            types.append(cython.cast(ArgFields, f).argtype)
        else:
            t = type(arg)
            if t is not int and t is not float and t is not bool and t is not complex:
                return None
            fields.append(None)
            types.append(t)
    plan: Plan
    for known in state.plans:
        plan = known
        if _matches(plan.argtypes, types):
            return plan if plan.cache.get(plan.device) is plan.cufunc else None
    return None


@cython.cfunc
def _queue(state: LaunchState, plan: Plan, dims: cython.p_uint, handle: object, owner: object,
           args: tuple, address: cython.size_t, nparams: cython.Py_ssize_t) -> cython.bint:
    """Preflight, ``cuLaunchKernel`` with the GIL released, commit; False
    (nothing queued) when a check under the lock sends the launch to the
    Python path."""
    global _launches
    ptrs = cython.declare(cython.p_void[512])
    i: cython.Py_ssize_t
    for i in range(nparams):
        ptrs[i] = cython.cast(cython.p_void, address + 8 * i)
    hv: cython.size_t = handle
    function: cython.size_t = plan.function
    book = state.book
    with state.lock:
        if handle in state.destroyed:
            return False  # the Python path raises the driver layer's error
        entries = _entries(state, args, state.accesses)
        if entries is None:
            return False  # a block freed or replaced: the Python path decides
        same = tracking.preflight_locked(book, entries, handle, owner, True)
        if same:
            state.resource.same_stream_uses += same
    fn = cython.cast(launch_fn, _cu_launch)  # type: ignore[name-defined]  # noqa: F821
    err: cython.int
    with cython.nogil:
        err = fn(cython.cast(cython.p_void, function), dims[0], dims[1], dims[2], dims[3],
                 dims[4], dims[5], dims[6], cython.cast(cython.p_void, hv), ptrs, cython.NULL)
    if err:
        # The driver layer retries in the right context, or raises its error.
        state.driver_launch(plan.function, (dims[0], dims[1], dims[2]),
                            (dims[3], dims[4], dims[5]), dims[6], handle,
                            cython.cast(cython.size_t, cython.address(ptrs[0])))
    with state.lock:
        tracking.commit_locked(book, _recheck(state, entries), handle, owner, state.eager,
                               True)
    _launches += 1
    return True


@cython.cfunc
def _matches(argtypes: tuple, types: list) -> cython.bint:
    """Whether a plan's argument types are ``types``, by identity (Numba's
    types are interned; a Python scalar is matched by its Python type)."""
    n: cython.Py_ssize_t = len(types)
    if len(argtypes) != n:
        return False
    i: cython.Py_ssize_t
    for i in range(n):
        if argtypes[i] is not types[i]:
            return False
    return True


@cython.cfunc
def _entries(state: LaunchState, args: tuple, accesses: tuple) -> list | None:
    """The entries of the launch's arrays with their merged accesses (as
    :func:`~numba_streamsafe.resources.tracking.resolve` gives them), or None
    when an array's block is not the live one at its address. Caller holds
    the resource's lock."""
    live = state.live
    out: list = []
    i: cython.Py_ssize_t
    j: cython.Py_ssize_t
    for i in range(len(args)):
        acc: cython.int = accesses[i]
        if acc < 0:
            continue
        f: ArgFields = args[i]._nss_fast
        entry = live.get(f.ptr)
        if entry is None or entry.block is not f.block:
            return None
        for j in range(0, len(out), 2):
            if out[j] is entry:
                out[j + 1] = out[j + 1] | acc
                break
        else:
            out.append(entry)
            out.append(acc)
    return out


@cython.cfunc
def _recheck(state: LaunchState, entries: list) -> list:
    """``entries`` again at the commit, under the lock: a block freed by
    another thread since the preflight is refused here with the same error
    the Python path's commit raises (``BlockTable.entry``)."""
    live = state.live
    i: cython.Py_ssize_t
    for i in range(0, len(entries), 2):
        entry = entries[i]
        block = entry.block
        if live.get(block.ptr) is not entry:
            state.table.entry(block, "commit")
    return entries


# ------------------------------------------------------------------ launcher
@cython.cclass
class Launcher:
    """The base of a configured launch ``kernel[config]``: calling it runs
    :func:`launch` with the kernel's ``launch_state``, and the subclass's
    ``_slow(*args)`` when that hands the launch back."""

    kernel = cython.declare(object, visibility="readonly")
    config = cython.declare(tuple, visibility="readonly")
    #: The configuration's stream (0 when it names none).
    stream = cython.declare(object, visibility="readonly")

    def __init__(self, kernel: Any, config: tuple) -> None:
        self.kernel = kernel
        self.config = config
        self.stream = config[2] if len(config) > 2 else 0

    def __call__(self, *args: Any) -> None:
        state = self.kernel.launch_state
        if state is not None and launch(state, self.config, args):
            return
        self._slow(*args)

    def _slow(self, *args: Any) -> None:
        raise NotImplementedError

