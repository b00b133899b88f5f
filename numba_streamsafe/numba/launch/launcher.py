"""The direct launch: a configured tracked launch (:class:`Launcher`) and the
launch itself (:func:`launch`): argument resolution through the fields cached
on each array (:class:`ArgFields`), the overload's :class:`Plan`, the
parameters packed by :mod:`~numba_streamsafe.numba.launch.packing`, the rules of
:mod:`~numba_streamsafe.resources.tracking.rules` under the resource's lock,
``cuLaunchKernel`` (the GIL kept through it while launches return promptly:
:func:`release_gil`), and the commit.

Part of the engine (:mod:`numba_streamsafe.compiled`), written in Cython's
pure-Python mode (C declarations in ``launcher.pxd``). Both builds run the
same launch; only its last step differs: compiled, the parameters are packed
on the C stack and ``cuLaunchKernel`` is called through libcuda's entry point
(:mod:`numba_streamsafe._driver.libcuda`); run as Python, they are packed
into a per-thread buffer and the driver layer's ``launch_kernel`` queues the
kernel (as it does when libcuda refuses the call).
"""

from __future__ import annotations

from typing import Any

import cython

from numba_streamsafe._driver import libcuda
from numba_streamsafe._driver.libcuda import launch_entry
from numba_streamsafe.core.errors import InvalidArgument
from numba_streamsafe.core.settings import Settings, on_reload, settings
from numba_streamsafe.core.sites import capture_stack
from numba_streamsafe.core.tracehook import TraceLog, current_log, launches_direct
from numba_streamsafe.numba.launch.packing import MAX_PARAM_BYTES, ParamScratch, pack_into
from numba_streamsafe.numba.program_order import stream_ref
from numba_streamsafe.resources.tracking.rules import Entry, commit_locked, preflight_locked
from numba_streamsafe.runtime import RUNTIMES

__all__ = ["Kernel", "Launcher", "LaunchState", "Plan", "ArgFields", "launch", "launches",
           "recalled", "by_driver", "retried", "available", "release_gil", "releases_gil",
           "slow_launches", "SLOW_LAUNCH_NS", "RELEASE_AFTER_SLOW", "RECENT", "COMPILED"]

#: Whether this module runs compiled (else it runs as Python source).
COMPILED: bool = cython.compiled

_MAX_ARGS = 64

_MAX_PARAMS = 512  # MAX_PARAM_BYTES / 8

#: The argument lists a kernel's launch state remembers (``LaunchState.recent``).
RECENT: int = 4
_RECENT = cython.declare(cython.Py_ssize_t, RECENT)

_launches = cython.declare(cython.ulonglong, 0)
_by_driver = cython.declare(cython.ulonglong, 0)
_retried = cython.declare(cython.ulonglong, 0)
_recalled = cython.declare(cython.ulonglong, 0)
#: Whether every launch releases the GIL through ``cuLaunchKernel`` (see
#: :func:`release_gil`), the launches left that release it after a slow one,
#: and the slow launches seen.
_release_always = cython.declare(cython.bint, False)
_asked = cython.declare(cython.bint, False)
_setting_releases = cython.declare(cython.bint, False)
_release_left = cython.declare(cython.longlong, 0)
_slow = cython.declare(cython.ulonglong, 0)
#: A launch that kept the GIL this long (nanoseconds) was held up in the driver
#: (its queue full, or its lock held by a long call of another thread) ...
SLOW_LAUNCH_NS: int = 200_000
#: ... and the launches after it release the GIL, this many of them.
RELEASE_AFTER_SLOW: int = 4096
_slow_ns = cython.declare(cython.longlong, SLOW_LAUNCH_NS)
_after_slow = cython.declare(cython.longlong, RELEASE_AFTER_SLOW)
#: The parameter buffer of the build that runs as Python (per thread).
_scratch = ParamScratch(_MAX_PARAMS)


def _by_setting(s: Settings) -> None:
    global _setting_releases, _release_always
    _setting_releases = s.launch_gil == "release"
    _release_always = _setting_releases or _asked


def release_gil(always: bool) -> bool:
    """Set whether every compiled launch releases the GIL around
    ``cuLaunchKernel``; returns the setting before.

    By default (``NUMBA_STREAMSAFE_LAUNCH_GIL=auto``) a launch keeps the GIL
    through the driver call, as the library's own event record and wait do:
    the call returns in microseconds, and handing the GIL to another thread
    and taking it back costs more than that when several threads launch (the
    handoff, not the launch, is what serializes them). A launch that took
    longer than :data:`SLOW_LAUNCH_NS` (the driver's queue was full, say)
    makes the next :data:`RELEASE_AFTER_SLOW` launches release the GIL, so
    other Python threads run while a launch waits. Every launch releases it
    from the moment the program queues a Python host callback through Numba
    (``Stream.add_callback``, ``async_done``: the callback needs the GIL,
    and a launch queued behind it could wait for it), and always with
    ``NUMBA_STREAMSAFE_LAUNCH_GIL=release`` (for programs whose other
    libraries queue Python host callbacks), whatever is set here.
    """
    global _asked, _release_always
    before = bool(_asked)
    _asked = bool(always)
    _release_always = _setting_releases or _asked
    return before


_by_setting(settings())
on_reload.append(_by_setting)


def releases_gil() -> bool:
    """Whether every compiled launch releases the GIL now (the setting, or
    :func:`release_gil`)."""
    return bool(_release_always)


def slow_launches() -> int:
    """Compiled launches that kept the GIL longer than :data:`SLOW_LAUNCH_NS`
    (each made the next launches release it)."""
    return _slow


def available() -> bool:
    """Whether :func:`launch` calls libcuda itself: compiled, with libcuda
    loaded in this process (else its kernels are queued by the driver layer)."""
    return cython.compiled and libcuda.loaded()


def launches() -> int:
    """Kernels :func:`launch` queued in this process (either build)."""
    return _launches


def recalled() -> int:
    """Launches of :func:`launch` that reused a recent launch's plan, entries
    and parameters (``LaunchState.recent``) in this process (either build)."""
    return _recalled


def by_driver() -> int:
    """Launches of :func:`launch` that the driver layer queued (``launch_kernel``):
    all of them where the build runs as Python, else those libcuda refused at
    first or could not be called for."""
    return _by_driver


def retried() -> int:
    """Launches of :func:`launch` that libcuda refused at first and the driver
    layer then queued (another context current on the thread, say)."""
    return _retried


# ---------------------------------------------------------------- the records
@cython.cclass
class ArgFields:
    """What a direct launch reads of a device array over a tracked block,
    cached on the array (fixed for its life): the block, its address, the
    array's Numba type and its launch fields, the bytes of the block the
    array spans (``lo .. hi - 1``, offsets into the block; ``empty`` when it
    spans no byte), the block's identity as a trace keeps it (``(ptr,
    generation, device)``), and the block's entry once a launch found it
    (read and written under the resource's lock; an entry that is ``gone``
    is looked up again)."""

    def __init__(self, block: Any, argtype: Any, fields: bytes, lo: int, hi: int) -> None:
        self.block = block
        self.ptr = block.ptr
        self.key = tuple(block.id)  # a plain tuple: a trace keeps it untracked by the GC
        self.entry = None
        self.argtype = argtype
        self.fields = fields
        # Python ints, kept: a launch appends them to its entries as they are.
        self.lo = int(lo)
        self.hi = int(hi)
        self.empty = self.hi <= self.lo


@cython.cclass
class Plan:
    """One compiled overload as :func:`launch` takes it: its argument types
    (Numba's for arrays, the Python type for a Python scalar), its function
    handle, its parameter codes (see
    :func:`~numba_streamsafe.numba.launch.packing.pack_into`), and Numba's
    per-device function cache with the function it held, to tell that the
    module is still loaded (a context reset unloads it)."""

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
    kernel's access per parameter (-1: none) and its known plans, and what a
    trace records of its launches: the kernel's name and the names of the
    parameters with an access; and who the race reports say queued them
    (``library``: this library's tracked kernel, or plain Numba).

    ``fields_of(array)``, where given, makes and caches the :class:`ArgFields`
    of an array no launch met before (None when the array is not one the
    direct launch covers), so that a program making new arrays every step
    keeps to this launch.

    ``recent`` holds the last :data:`RECENT` argument lists the kernel was
    launched with, each as ``(keys, plan, arrays, entries, packed)``: the
    arrays' :class:`ArgFields` and the scalars (the keys), the plan, the
    arrays with their accesses, their entries and the packed parameters,
    so that a launch with the same arguments as one of those (a loop over
    the same arrays) reuses them instead of working them out again. A list
    of arguments gets its slot the second time it is met (``seen`` holds the
    keys of the last :data:`RECENT` lists launched without a slot). A slot
    whose plan was unloaded, or one of whose blocks left the table, is
    dropped at its next launch. Neither keeps an array's memory: they hold
    the arrays' fields (with their blocks' records and entries) and the
    plans, not the arrays, whose deaths free the memory."""

    def __init__(self, rt: Any, policy: Any, accesses: tuple, warned: set, no_warn: bool,
                 label: str = "", names: tuple = (), library: str = "numba_streamsafe",
                 fields_of: Any = None) -> None:
        resource = rt.resource
        self.rt = rt
        self.table = resource.table
        self.live = resource.table.live
        self.book = resource.marks
        self.lock = resource.lock
        self.policy = policy
        self.destroyed = rt.driver.destroyed_streams
        self.deferred = resource.deferred_queue
        self.accesses = accesses
        self.narrays = sum(1 for a in accesses if a >= 0)
        self.plans = []
        self.warned = warned
        self.no_warn = no_warn
        self.eager = resource.eager
        self.label = label
        self.names = names
        self.device = rt.device
        self.library = library
        self.fields_of = fields_of
        self.recent = []
        self.turn = 0
        self.seen = []
        self.seen_turn = 0

    def add_plan(self, plan: Plan) -> None:
        """Know ``plan`` (the newest eight are kept), in place of a known plan
        of the same argument types whose module was unloaded (a context reset)."""
        i: cython.Py_ssize_t
        for i in range(len(self.plans)):
            known: Plan = self.plans[i]
            if known.argtypes == plan.argtypes:
                if not _loaded(known):
                    self.plans[i] = plan
                return
        if len(self.plans) >= 8:
            del self.plans[0]
        self.plans.append(plan)


# ------------------------------------------------------------------ the launch
@cython.cfunc
@cython.exceptval(-1)
def _dim3(d: object, out: cython.p_uint, at: cython.int) -> cython.int:
    """``d`` (an int or 1 to 3 ints, each in 1 .. 2**31 - 1) into ``out[at]``
    to ``out[at + 2]``; 0 when it is not plainly valid (the Python path checks
    and reports it)."""
    out[at] = out[at + 1] = out[at + 2] = 1
    if type(d) is int:
        if d <= 0 or d > 0x7FFFFFFF:
            return 0
        out[at] = d
        return 1
    if type(d) is not tuple or not 1 <= len(d) <= 3:
        return 0
    i: cython.int
    for i in range(len(d)):
        v = d[i]
        if type(v) is not int or v <= 0 or v > 0x7FFFFFFF:
            return 0
        out[at + i] = v
    return 1


def launch(state: LaunchState, config: tuple, args: tuple) -> bool:
    """Queue ``kernel[config](*args)`` directly: when every argument with an
    access is a device array with cached :class:`ArgFields` over the live
    block, the others Python scalars, a plan for these argument types is
    known, and nothing asks for the Python path (a graph capture, a trace
    with NVTX ranges or device times, queued frees, a switched-off policy,
    another sole runtime). A trace that records is told of the launch
    (:func:`~numba_streamsafe.core.tracehook.current_log`). The waits
    and the commit follow :mod:`~numba_streamsafe.resources.tracking.rules` under the
    resource's lock, which also checks, on every path, that the blocks are
    live and the stream not destroyed.

    A launch with the arguments of one of the kernel's recent launches
    (``LaunchState.recent``: the same arrays' fields, the same scalars) reuses
    that launch's plan, entries and packed parameters; the waits and the
    commit are decided afresh.

    Returns
    -------
    bool
        True when launched; False, with nothing queued and no tracking state
        changed (an array's fields or a stream's handle may have been cached,
        as the Python path caches them), when the Python path must do the
        launch.
    """
    global _recalled
    if not _takes(state):
        return False
    if cython.compiled:
        dims = cython.declare(cython.uint[7])  # grid, block, shared memory
    else:
        dims = [1] * 7
    if not _dims(state, config, dims):
        return False
    # A stream or an array met for the first time is resolved through Python
    # code, which may hand the GIL to another thread: what _takes read is read
    # again after it.
    resolved: cython.bint = False
    stream = _stream_of(state.rt, config)
    if stream is None:
        stream = _new_stream(state.rt, config)
        if stream is None:
            return False
        resolved = True
    keys = _keys(state, args)
    if keys is None:
        keys = _new_keys(state, args)
        if keys is None:
            return False
        resolved = True
    if resolved and not _takes(state):
        return False
    buffer: Any = None
    if cython.compiled:
        buf = cython.declare(cython.uchar[4096])
        address: cython.size_t = cython.cast(cython.size_t, cython.address(buf[0]))
    else:
        address = _scratch.base
        buffer = _scratch.buffer
    slot = _recall(state, keys)
    if slot is not None:  # the arguments of a recent launch: its plan, entries and parameters
        if not _again(state, slot, dims, stream, address, buffer):
            return False
        _recalled += 1
        return True
    return _first(state, keys, args, dims, stream, address, buffer)


@cython.cfunc
def _again(state: LaunchState, slot: tuple, dims: cython.p_uint, stream: tuple,
           address: cython.size_t, buffer: Any) -> cython.bint:
    """:func:`launch` with a recent launch's arguments (``slot``:
    ``(keys, plan, arrays, entries, packed)``): its plan, arrays, entries and
    packed parameters (copied to ``address``; ``buffer`` where the build runs
    as Python). A slot one of whose blocks left the table is dropped, and
    the launch handed back."""
    packed: bytes = slot[4]
    size: cython.Py_ssize_t = len(packed)
    if cython.compiled:
        src: cython.p_char = packed
        memcpy(cython.cast(cython.p_void, address), src, size)  # type: ignore[name-defined]  # noqa: F821
    else:
        buffer[:size] = packed
    if _queue(state, slot[1], dims, stream[0], stream[1], slot[2], address, size // 8,
              slot[3]) is not None:
        return True
    if not _live(slot[2]):
        _drop(state.recent, slot)
    return False


@cython.cfunc
def _first(state: LaunchState, keys: list, args: tuple, dims: cython.p_uint, stream: tuple,
           address: cython.size_t, buffer: Any) -> cython.bint:
    """:func:`launch` with arguments no recent launch had: the plan found,
    the parameters packed (at ``address``; into ``buffer`` where the build
    runs as Python), the entries looked up; once launched, kept among the
    recent launches (``state.recent``) when they were met before
    (:func:`_sighted`)."""
    fields: list = [None] * len(args)
    arrays: list = [None] * (2 * state.narrays)
    plan = _plan_for(state, keys, args, fields, arrays)
    if plan is None:
        return False
    nparams: cython.Py_ssize_t = pack_into(plan.codes, args, fields, buffer, address,
                                           MAX_PARAM_BYTES)
    if nparams < 0:
        return False
    packed = None
    if _sighted(state, keys):  # met before: kept for the next launches with them
        if cython.compiled:
            packed = cython.cast(cython.p_char, address)[:8 * nparams]
        else:
            packed = bytes(buffer[:8 * nparams])
    entries = _queue(state, plan, dims, stream[0], stream[1], arrays, address, nparams, None)
    if entries is None:
        return False
    if packed is not None:
        state.turn = _put(state.recent, (keys, plan, arrays, entries, packed), state.turn)
    return True


@cython.cfunc
def _takes(state: LaunchState) -> cython.bint:
    """Whether nothing asks for the Python path. Reads attributes only: a call
    into Python code here could hand the GIL to another thread mid-launch."""
    rt: Any = state.rt
    policy: LaunchPolicy = state.policy  # noqa: F821 (policy.pxd)
    return (launches_direct() and rt.capture is None and RUNTIMES.sole is rt
            and policy.tracking and policy.direct_launch and not state.deferred)


@cython.cfunc
@cython.exceptval(-1)
def _dims(state: LaunchState, config: tuple, dims: cython.p_uint) -> cython.int:
    """Grid, block and shared memory of ``config`` into ``dims``; 0 when not
    plainly valid, or when Numba's low-occupancy warning is due (the Python
    path checks, reports and warns)."""
    nconf: cython.Py_ssize_t = len(config)
    if nconf < 2 or nconf > 4 or not _dim3(config[0], dims, 0) or not _dim3(config[1], dims, 3):
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
def _new_stream(rt: Any, config: tuple) -> tuple | None:
    """``(handle, owner)`` of a stream object no launch cached its handle on,
    resolved and cached for the next launches as Numba's copies and syncs
    resolve it (:func:`~numba_streamsafe.numba.program_order.stream_ref`);
    None when the Python path must decide (it raises the error)."""
    stream = config[2]
    if type(stream) is int or getattr(stream, "_nss_stream", None) is not None:
        return None  # refused by _stream_of: a negative handle, another runtime's stream
    try:
        return stream_ref(rt, stream)
    except Exception:
        return None


@cython.cfunc
def _new_keys(state: LaunchState, args: tuple) -> list | None:
    """:func:`_keys` of arguments some of whose arrays no launch met, once
    their fields are made (:func:`_new_arrays`); None when one cannot be."""
    if not _new_arrays(state, args):
        return None
    return _keys(state, args)


@cython.cfunc
def _new_arrays(state: LaunchState, args: tuple) -> cython.bint:
    """Cache the :class:`ArgFields` of each array argument no launch met
    (``state.fields_of``); True when at least one was, and every array
    argument has its fields now."""
    fields_of = state.fields_of
    if fields_of is None:
        return False
    accesses = state.accesses
    nargs: cython.Py_ssize_t = len(args)
    if nargs != len(accesses):
        return False
    made: cython.bint = False
    i: cython.Py_ssize_t
    for i in range(nargs):
        if accesses[i] >= 0:
            arg = args[i]
            f = getattr(arg, "_nss_fast", None)
            if f is None:
                f = fields_of(arg)
                made = True
            if type(f) is not ArgFields:
                return False
    return made


@cython.cfunc
@cython.boundscheck(False)
@cython.wraparound(False)
def _keys(state: LaunchState, args: tuple) -> list | None:
    """What tells the arguments apart from a recent launch's: each array's
    cached :class:`ArgFields` (fixed for the array's life), each scalar as it
    is. None when an argument is not covered: an array with no fields cached
    (yet), an argument that is neither such an array nor a Python scalar."""
    accesses = state.accesses
    nargs: cython.Py_ssize_t = len(args)
    if nargs != len(accesses) or nargs > _MAX_ARGS:
        return None
    keys: list = [None] * nargs
    i: cython.Py_ssize_t
    for i in range(nargs):
        arg = args[i]
        if accesses[i] >= 0:
            f = getattr(arg, "_nss_fast", None)
            if type(f) is not ArgFields:
                return None
            keys[i] = f
        else:
            t = type(arg)
            if t is not int and t is not float and t is not bool and t is not complex:
                return None
            keys[i] = arg
    return keys


@cython.cfunc
def _recall(state: LaunchState, keys: list) -> tuple | None:
    """The recent launch (``state.recent``) whose arguments are ``keys``: the
    same array fields, the same scalar objects (an int, of the same value),
    and its plan's module still loaded; else None."""
    plan: Plan
    for slot in state.recent:
        if _same(keys, cython.cast(tuple, slot)[0]):
            plan = cython.cast(tuple, slot)[1]
            if _loaded(plan):
                return slot
            _drop(state.recent, slot)
            return None
    return None


@cython.cfunc
def _same(keys: list, known: list) -> cython.bint:
    """Whether ``keys`` are ``known``: the same objects, or ints of the same
    value."""
    n: cython.Py_ssize_t = len(keys)
    if len(known) != n:
        return False
    i: cython.Py_ssize_t
    for i in range(n):
        a = keys[i]
        b = known[i]
        if a is not b and (type(a) is not int or type(b) is not int or a != b):
            return False
    return True


@cython.cfunc
def _sighted(state: LaunchState, keys: list) -> cython.bint:
    """Whether a recent launch that no slot holds had ``keys``
    (``state.seen``); if not, ``keys`` are noted there, in place of the
    oldest. Only arguments met twice get a slot: a program that makes new
    arrays every launch pays for no slot it never reuses."""
    for known in state.seen:
        if _same(keys, known):
            return True
    state.seen_turn = _put(state.seen, keys, state.seen_turn)
    return False


@cython.cfunc
@cython.exceptval(-1)
def _put(ring: list, item: object, turn: cython.Py_ssize_t) -> cython.Py_ssize_t:
    """Keep ``item`` in ``ring`` (at most :data:`RECENT` items): appended
    while there is room, else in place of the oldest, at ``turn``. Returns
    the next turn."""
    n: cython.Py_ssize_t = len(ring)
    if n < _RECENT:
        ring.append(item)
        return turn
    turn = turn % n  # n > RECENT only where threads appended at once (the Python build)
    ring[turn] = item
    return turn + 1


@cython.cfunc
@cython.exceptval(-1)
def _drop(ring: list, item: object) -> cython.int:
    """Take ``item`` (by identity) out of ``ring``, if it is still there."""
    i: cython.Py_ssize_t
    for i in range(len(ring)):
        if ring[i] is item:
            del ring[i]
            break
    return 0


@cython.cfunc
def _loaded(plan: Plan) -> cython.bint:
    """Whether ``plan``'s function is still the one Numba holds loaded (a
    context reset unloads it)."""
    cache = plan.cache
    if type(cache) is dict:  # Numba's per-device function cache
        loaded = cython.cast(dict, cache).get(plan.device)
    else:
        loaded = cache.get(plan.device)
    return loaded is plan.cufunc


@cython.cfunc
@cython.boundscheck(False)  # fields: one item per argument, arrays: two per array (launch)
@cython.wraparound(False)
def _plan_for(state: LaunchState, keys: list, args: tuple, fields: list,
              arrays: list) -> Plan | None:
    """The known plan of the arguments' types (``keys``: as :func:`_keys`
    gives them). Sets each argument's launch fields in ``fields`` (None for a
    scalar; one item per argument) and each array's ``ArgFields, access`` in
    ``arrays`` (two items per array). None when no plan is known (or its
    module was unloaded)."""
    accesses = state.accesses
    nargs: cython.Py_ssize_t = len(args)
    i: cython.Py_ssize_t
    j: cython.Py_ssize_t = 0
    for i in range(nargs):
        access = accesses[i]
        if access >= 0:
            f = keys[i]
            fields[i] = cython.cast(ArgFields, f).fields
            arrays[j] = f
            arrays[j + 1] = access
            j += 2
    plan: Plan
    for known in state.plans:
        plan = known
        if _matches(plan.argtypes, args, accesses, arrays):
            return plan if _loaded(plan) else None
    return None


@cython.cfunc
def _queue(state: LaunchState, plan: Plan, dims: cython.p_uint, handle: object, owner: object,
           arrays: list, address: cython.size_t, nparams: cython.Py_ssize_t,
           known: list | None) -> list | None:
    """Preflight, ``cuLaunchKernel`` (:func:`_call_libcuda`), commit. Returns
    the launch's entries (``known``, a recent launch's entries of these
    arrays, where every array's entry is still its block's: :func:`_live`);
    None (nothing queued) when a check under the lock sends the launch to
    the Python path."""
    global _launches, _by_driver, _retried
    if cython.compiled:
        ptrs = cython.declare(cython.p_void[512])
        i: cython.Py_ssize_t
        for i in range(nparams):
            ptrs[i] = cython.cast(cython.p_void, address + 8 * i)
        params: cython.size_t = cython.cast(cython.size_t, cython.address(ptrs[0]))
    else:
        params = _scratch.address  # its pointers point at the slots already
    book: MarkBook = state.book  # noqa: F821 (marks.pxd)
    lock = state.lock
    op_id: cython.longlong = 0
    t0: cython.longlong = 0
    w0: cython.Py_ssize_t = 0
    e0: cython.Py_ssize_t = 0
    log: TraceLog = current_log()
    if log is not None:  # a trace records: where its logs stand before
        op_id = log.next_id()
        t0 = log.now()
        w0 = len(log.waits)
        e0 = len(log.seals)
    what = None
    if book.checking or book.reporting:  # the reports name the kernel, its arguments, the line
        what = (state.label, capture_stack(), (state.names, arrays), state.library)
    lock.take()
    try:
        if handle in state.destroyed:
            return None  # the Python path raises the driver layer's error
        entries = known if known is not None and _live(arrays) else _entries(state, arrays)
        if entries is None:
            return None  # a block freed or replaced: the Python path decides
        preflight_locked(book, entries, handle, owner, True, what)
    finally:
        lock.give()
    err: cython.int = _call_libcuda(plan.function, dims, handle, params)
    if err:
        # The driver layer queues it: run as Python, or without libcuda's entry
        # point (-1); or after libcuda refused it (it retries in the right
        # context, or raises its error).
        if err > 0:
            _retried += 1
        _by_driver += 1
        state.rt.driver.launch_kernel(plan.function, (dims[0], dims[1], dims[2]),
                                      (dims[3], dims[4], dims[5]), dims[6], handle, params)
    lock.take()
    try:
        commit_locked(book, _recheck(state, entries), handle, owner, state.eager, True, None, what)
    finally:
        lock.give()
    _launches += 1
    if log is not None:
        log.launched(op_id, t0, w0, e0, state.label, state.device, handle,
                     _uses_of(arrays, state.names))
    if book.races:  # found in check mode or by a race check; raised after the launch is queued
        state.rt.resource.tracker.report_races()
    return entries


@cython.cfunc
@cython.exceptval(-2)
def _call_libcuda(function: object, dims: cython.p_uint, handle: object,
                  params: cython.size_t) -> cython.int:
    """``cuLaunchKernel`` through libcuda, the GIL kept or released as
    :func:`release_gil` says: its error (0 when queued), or -1 when the build
    runs as Python or libcuda's entry point is not found (the driver layer
    then queues the kernel)."""
    global _release_left, _slow
    if not cython.compiled:
        return -1
    entry: cython.size_t = launch_entry()
    if entry == 0:
        return -1
    fn = cython.cast(launch_fn, entry)  # type: ignore[name-defined]  # noqa: F821
    f: cython.size_t = function
    hv: cython.size_t = handle
    err: cython.int
    if _release_always or _release_left > 0:
        if _release_left > 0:
            _release_left -= 1
        with cython.nogil:
            err = fn(cython.cast(cython.p_void, f), dims[0], dims[1], dims[2], dims[3], dims[4],
                     dims[5], dims[6], cython.cast(cython.p_void, hv),
                     cython.cast(cython.pp_void, params), cython.NULL)
        return err
    t0: cython.longlong = _now_ns()
    err = fn(cython.cast(cython.p_void, f), dims[0], dims[1], dims[2], dims[3], dims[4],
             dims[5], dims[6], cython.cast(cython.p_void, hv),
             cython.cast(cython.pp_void, params), cython.NULL)
    if _now_ns() - t0 > _slow_ns:
        _release_left = _after_slow
        _slow += 1
    return err


@cython.cfunc
@cython.exceptval(check=False)
def _now_ns() -> cython.longlong:
    """CLOCK_MONOTONIC in nanoseconds (compiled only)."""
    if not cython.compiled:
        return 0
    ts = cython.declare(timespec)  # noqa: F821 (launcher.pxd)
    clock_gettime(CLOCK_MONOTONIC, cython.address(ts))  # noqa: F821
    return ts.tv_sec * 1000000000 + ts.tv_nsec


@cython.cfunc
def _uses_of(arrays: list, names: tuple) -> tuple:
    """The launch's uses as a trace keeps them, flat: ``name, access, ptr,
    generation, device, lo, hi`` per span of a block, in argument order; the
    accesses of one span joined and its names joined with ``+``, as
    :class:`~numba_streamsafe.core.uses.Uses` joins them."""
    out: list = []
    f: ArgFields
    i: cython.Py_ssize_t
    j: cython.Py_ssize_t
    for i in range(0, len(arrays), 2):
        f = arrays[i]
        name = names[i // 2]
        access = arrays[i + 1]
        key = f.key
        for j in range(0, len(out), 7):
            if (out[j + 2] == key[0] and out[j + 3] == key[1] and out[j + 4] == key[2]
                    and out[j + 5] == f.lo and out[j + 6] == f.hi):
                out[j] = out[j] + "+" + name
                out[j + 1] = out[j + 1] | access
                break
        else:
            out.append(name)
            out.append(access)
            out.extend(key)
            out.append(f.lo)
            out.append(f.hi)
    return tuple(out)


@cython.cfunc
def _matches(argtypes: tuple, args: tuple, accesses: tuple, arrays: list) -> cython.bint:
    """Whether a plan's argument types are those of ``args``, by identity
    (Numba's types are interned): an array's cached Numba type (its
    :class:`ArgFields`, in order in ``arrays``), a Python scalar's type."""
    n: cython.Py_ssize_t = len(args)
    if len(argtypes) != n:
        return False
    i: cython.Py_ssize_t
    j: cython.Py_ssize_t = 0
    for i in range(n):
        if accesses[i] >= 0:
            if argtypes[i] is not cython.cast(ArgFields, arrays[j]).argtype:
                return False
            j += 2
        elif argtypes[i] is not type(args[i]):
            return False
    return True


@cython.cfunc
def _entries(state: LaunchState, arrays: list) -> list | None:
    """The entries of the launch's arrays (``[ArgFields, access, ...]``) with
    their spans, the accesses of one span of a block merged and an empty
    span left out, as :func:`~numba_streamsafe.resources.tracking.rules.resolve`
    gives them (``[entry, access, lo, hi, ...]``); None when an array's block
    is not the live one at its address. Caller holds the resource's lock."""
    live = state.live
    out: list = []
    f: ArgFields
    entry: Entry  # noqa: F821 (rules.pxd)
    i: cython.Py_ssize_t
    j: cython.Py_ssize_t
    for i in range(0, len(arrays), 2):
        f = arrays[i]
        if f.entry is None or f.entry.gone:
            found = live.get(f.ptr)
            if found is None:
                return None
            entry = found
            if entry.block is not f.block:
                return None
            f.entry = entry
        else:
            entry = f.entry
        if f.empty:
            continue  # an empty view touches no byte
        for j in range(0, len(out), 4):
            if out[j] is entry and out[j + 2] == f.lo and out[j + 3] == f.hi:
                out[j + 1] = out[j + 1] | arrays[i + 1]
                break
        else:
            out.append(entry)
            out.append(arrays[i + 1])
            out.append(f.lo)
            out.append(f.hi)
    return out


@cython.cfunc
def _live(arrays: list) -> cython.bint:
    """Whether the entry each of ``arrays`` (``[ArgFields, access, ...]``)
    found at its last launch is still its block's: an empty view's too,
    which the launch's entries leave out (the Python path refuses a view of
    a freed block, empty or not)."""
    f: ArgFields
    i: cython.Py_ssize_t
    for i in range(0, len(arrays), 2):
        f = arrays[i]
        if f.entry is None or f.entry.gone:
            return False
    return True


@cython.cfunc
def _recheck(state: LaunchState, entries: list) -> list:
    """``entries`` again at the commit, under the lock: a block freed by
    another thread since the preflight is refused here with the same error
    the Python path's commit raises (``BlockTable.entry``)."""
    entry: Entry  # noqa: F821 (rules.pxd)
    i: cython.Py_ssize_t
    for i in range(0, len(entries), 4):
        entry = entries[i]
        if entry.gone:
            state.table.entry(entry.block, "commit")
    return entries


# ------------------------------------------------------------------ launcher
@cython.cclass
class Kernel:
    """The base of a tracked kernel: ``kernel[config]`` is its configured
    launch, a :class:`Launcher`. ``launch_state`` is what :func:`launch`
    reads for the kernel (None until its first direct launch); a launch
    :func:`launch` hands back goes to the kernel's
    ``launch_python(launcher, args)``.

    Raises
    ------
    InvalidArgument
        ``config`` is not a tuple of 2 to 4 items.
    """

    def __getitem__(self, config: Any) -> Launcher:
        if not isinstance(config, tuple) or not 2 <= len(config) <= 4:
            raise InvalidArgument(
                f"launch configuration must be [grid, block], [grid, block, stream] or "
                f"[grid, block, stream, shmem]; got {config!r}"
            )
        out: Launcher = Launcher.__new__(Launcher)
        _bind(out, self, tuple(config))
        return out

    def launch_python(self, launcher: Launcher, args: tuple) -> None:
        """Launch what :func:`launch` handed back (the kernel's Python path)."""
        raise NotImplementedError


@cython.final
@cython.freelist(8)
@cython.cclass
class Launcher:
    """A configured launch ``kernel[config]`` (``kernel``, ``config``, and
    ``stream``: the configuration's stream, 0 when it names none). Calling it
    runs :func:`launch` with the kernel's ``launch_state``, or the kernel's
    ``launch_python`` when that hands the launch back."""

    kernel: Kernel
    config: tuple
    stream: Any

    def __init__(self, kernel: Kernel, config: tuple) -> None:
        _bind(self, kernel, config)

    def __call__(self, *args: Any) -> None:
        state = self.kernel.launch_state  # type: ignore[attr-defined]  # (launcher.pxd)
        if state is not None and launch(state, self.config, args):
            return
        self.kernel.launch_python(self, args)


@cython.cfunc
@cython.exceptval(-1)
def _bind(launcher: Launcher, kernel: Kernel, config: tuple) -> cython.int:
    """Set ``launcher``'s kernel, configuration and stream (the
    configuration's third item, 0 when it names none)."""
    launcher.kernel = kernel
    launcher.config = config
    launcher.stream = config[2] if len(config) > 2 else 0
    return 0
