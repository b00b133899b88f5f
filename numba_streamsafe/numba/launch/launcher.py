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
           "by_driver", "retried", "available", "release_gil", "releases_gil", "slow_launches",
           "SLOW_LAUNCH_NS", "RELEASE_AFTER_SLOW", "COMPILED"]

#: Whether this module runs compiled (else it runs as Python source).
COMPILED: bool = cython.compiled

_MAX_ARGS = 64

_MAX_PARAMS = 512  # MAX_PARAM_BYTES / 8

_launches = cython.declare(cython.ulonglong, 0)
_by_driver = cython.declare(cython.ulonglong, 0)
_retried = cython.declare(cython.ulonglong, 0)
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
    keeps to this launch."""

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

    Returns
    -------
    bool
        True when launched; False, with nothing queued and no tracking state
        changed (an array's fields or a stream's handle may have been cached,
        as the Python path caches them), when the Python path must do the
        launch.
    """
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
    fields: list = [None] * len(args)
    arrays: list = [None] * (2 * state.narrays)
    plan = _plan_for(state, args, fields, arrays)
    if plan is None:
        if not _new_arrays(state, args):
            return False
        plan = _plan_for(state, args, fields, arrays)
        if plan is None:
            return False
        resolved = True
    if resolved and not _takes(state):
        return False
    if cython.compiled:
        buf = cython.declare(cython.uchar[4096])
        address: cython.size_t = cython.cast(cython.size_t, cython.address(buf[0]))
        buffer = None
    else:
        address = _scratch.base
        buffer = _scratch.buffer
    nparams: cython.Py_ssize_t = pack_into(plan.codes, args, fields, buffer, address,
                                           MAX_PARAM_BYTES)
    if nparams < 0:
        return False
    return _queue(state, plan, dims, stream[0], stream[1], arrays, address, nparams)


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
def _plan_for(state: LaunchState, args: tuple, fields: list, arrays: list) -> Plan | None:
    """The known plan of the arguments' types. Sets each argument's launch
    fields in ``fields`` (None for a scalar; one item per argument) and each
    array's ``ArgFields, access`` in ``arrays`` (two items per array). None
    when an argument is not covered or no plan is known (or its module was
    unloaded)."""
    accesses = state.accesses
    nargs: cython.Py_ssize_t = len(args)
    if nargs != len(accesses) or nargs > _MAX_ARGS:
        return None
    i: cython.Py_ssize_t
    j: cython.Py_ssize_t = 0
    for i in range(nargs):
        arg = args[i]
        access = accesses[i]
        if access >= 0:
            f = getattr(arg, "_nss_fast", None)
            if type(f) is not ArgFields:
                return None
            fields[i] = cython.cast(ArgFields, f).fields
            arrays[j] = f
            arrays[j + 1] = access
            j += 2
        else:
            t = type(arg)
            if t is not int and t is not float and t is not bool and t is not complex:
                return None
    plan: Plan
    for known in state.plans:
        plan = known
        if _matches(plan.argtypes, args, accesses, arrays):
            cache = plan.cache
            if type(cache) is dict:  # Numba's per-device function cache
                loaded = cython.cast(dict, cache).get(plan.device)
            else:
                loaded = cache.get(plan.device)
            return plan if loaded is plan.cufunc else None
    return None


@cython.cfunc
def _queue(state: LaunchState, plan: Plan, dims: cython.p_uint, handle: object, owner: object,
           arrays: list, address: cython.size_t, nparams: cython.Py_ssize_t) -> cython.bint:
    """Preflight, ``cuLaunchKernel`` (:func:`_call_libcuda`), commit; False
    (nothing queued) when a check under the lock sends the launch to the
    Python path."""
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
            return False  # the Python path raises the driver layer's error
        entries = _entries(state, arrays)
        if entries is None:
            return False  # a block freed or replaced: the Python path decides
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
    return True


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
