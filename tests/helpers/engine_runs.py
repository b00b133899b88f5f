"""What :mod:`test_engine_builds` runs in its child processes: random
multi-stream programs on the simulated driver, reported as plain values, with
the engine's build the child imported (``NUMBA_STREAMSAFE_PURE_PYTHON`` set by
the parent decides it)."""

from __future__ import annotations

import random
import sys
import threading
from typing import Any

from numba_streamsafe._driver.sim import SimDriver
from numba_streamsafe.compiled import engine_builds
from numba_streamsafe.core.access import Access
from numba_streamsafe.resources import AsyncResource
from numba_streamsafe.runtime import DeviceRuntime
from tests.helpers import programs as P

R, W, RW = Access.READ, Access.WRITE, Access.READ_WRITE


def builds() -> dict[str, str]:
    """The engine's build in this process (every module imported)."""
    return engine_builds(load=True)


def at_once(work: Any, args: list[tuple[Any, ...]]) -> None:
    """``work(*a)`` for each ``a`` of ``args``, one thread each, all at once,
    with the interpreter switching threads as often as it can meanwhile."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    threads = [threading.Thread(target=work, args=a) for a in args]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(old)


def sequential(program: P.Program, fenced: bool, fences: str) -> tuple[Any, ...]:
    """Every figure a program leaves: driver calls, hazards, accounting,
    counters, waits and events."""
    run = P.execute(program, fenced=fenced, fences=fences)
    res = run.res
    outcome = (dict(run.sim.calls), len(run.sim.hazards), P.accounting(res), res.counters(),
               res.marks.waits, res.events.recorded, res.events.in_use)
    P.cleanup(run)
    return outcome


def concurrent(programs: list[P.Program], fences: str, seed: int) -> dict[str, int]:
    """``programs`` run at once, one per thread, on one runtime: each thread
    on streams and blocks of its own, and every launch also reading one of
    the blocks the threads share (written before they start). Returns what must hold whatever the
    interleaving: the hazards, the bytes and events left once everything is
    freed and reaped, the errors; and the work done (launches, waits)."""
    sim = SimDriver(backing=False)
    res = AsyncResource(sim, fences=fences)
    rt = DeviceRuntime(res)
    home = sim.create_stream()
    shared = [res.allocate(256, home, f"shared{i}") for i in range(3)]
    P.launch(rt, home, [(b, W) for b in shared], label="init")
    errors: list[BaseException] = []
    launches = [0] * len(programs)
    barrier = threading.Barrier(len(programs))

    def work(t: int, program: P.Program) -> None:
        rng = random.Random(seed + t)
        try:
            streams = [sim.create_stream() for _ in range(program.n_streams)]
            blocks: list[Any] = [res.allocate(n, streams[h], f"t{t}b{i}")
                                 for i, (n, h) in enumerate(zip(program.sizes, program.homes,
                                                                strict=True))]
            barrier.wait()
            for step in program.steps:
                if isinstance(step, P.Launch):
                    uses = [(blocks[i], a) for i, a in step.uses if blocks[i] is not None]
                    # Shared blocks are only read: two threads that write one
                    # buffer with nothing ordering them on the host race in
                    # the program itself (neither launch comes first).
                    uses.append((rng.choice(shared), R))
                    P.launch(rt, streams[step.stream], uses, label=f"t{t}")
                    launches[t] += 1
                elif isinstance(step, (P.Free, P.Realloc, P.Renew)):
                    old_block = blocks[step.buf]
                    if old_block is not None:
                        res.deallocate(old_block)
                        blocks[step.buf] = res.allocate(old_block.nbytes, old_block.stream,
                                                        f"t{t}b{step.buf}")
                elif isinstance(step, P.HostSync):
                    sim.stream_synchronize(streams[step.stream])
                elif isinstance(step, P.Reap):
                    rt.reap()
            for blk in blocks:
                if blk is not None:
                    res.deallocate(blk)
        except BaseException as exc:  # reported to the parent, not lost in the thread
            errors.append(exc)
            barrier.abort()

    at_once(work, list(enumerate(programs)))
    for blk in shared:
        res.deallocate(blk)
    rt.reap()
    return {"hazards": len(sim.hazards), "outstanding": res.bytes_outstanding(),
            "events_in_use": res.events.in_use, "errors": len(errors),
            "first_error": repr(errors[0]) if errors else "", "launches": sum(launches),
            "waits": res.marks.waits}


class _Array:
    """What the direct launch reads of a device array: its cached fields."""

    def __init__(self, fields: Any) -> None:
        self._nss_fast = fields


class _Stream:
    """A stream object of another kind (its handle by ``__cuda_stream__``)."""

    def __init__(self, handle: int) -> None:
        self.handle_ = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle_)


class _NewArray:
    """A device array no launch met: no cached fields."""

    def __init__(self, fields: Any) -> None:
        self.fields = fields


def direct_launch(new: bool = False, refuse: bool = False) -> dict[str, Any]:
    """One launch through the direct launch (:func:`launcher.launch`) on the
    simulated driver, which is told it launches compiled code: ``x`` written on
    stream ``a`` (its allocation), then a kernel on stream ``b`` that reads
    ``x``, writes ``y`` and takes an int. Returns what the launch did: whether
    it was taken, the driver's launch call (function, grid, block, shared
    memory, stream, the parameter slots as bytes), the waits it queued, and
    the launch counters' steps.

    ``new``: the arrays carry no cached fields (the state's ``fields_of``
    makes them, counted in ``"made"``) and the stream is an object no launch
    cached its handle on; a second launch with them follows (``"again"``:
    taken, and ``"made"`` counts no more; ``"stream_cached"``: the stream's
    handle was cached on it for the next launches). ``refuse``: ``fields_of`` answers
    None (the launch is handed back)."""
    import ctypes
    import struct

    from numba_streamsafe.numba.launch import launcher
    from numba_streamsafe.numba.launch.policy import launch_policy
    from numba_streamsafe.runtime import clear_runtimes, set_runtime

    sim = SimDriver(backing=False)
    sim.supports_direct_launch = True  # type: ignore[misc]
    called: list[Any] = []

    def launch_kernel(function, grid, block, shmem, stream, params):
        slots = (ctypes.c_void_p * 5).from_address(params)
        called.append((function, grid, block, shmem, stream,
                       [ctypes.string_at(p, 8) for p in slots]))

    sim.launch_kernel = launch_kernel  # type: ignore[method-assign]
    rt = DeviceRuntime(AsyncResource(sim))
    set_runtime(rt)
    try:
        a, b = sim.create_stream(), sim.create_stream()
        x, y = rt.allocate(64, a, "x"), rt.allocate(64, b, "y")
        array_type = object()  # matched by identity, as Numba's interned types are
        fx = launcher.ArgFields(x, array_type, struct.pack("=QQ", x.ptr, 64), 0, 64)
        fy = launcher.ArgFields(y, array_type, struct.pack("=QQ", y.ptr, 64), 0, 64)
        cufunc = object()
        made: list[Any] = []

        def fields_of(arg: Any) -> Any:
            made.append(arg)
            if refuse or not isinstance(arg, _NewArray):
                return None
            arg._nss_fast = arg.fields
            return arg.fields

        state = launcher.LaunchState(rt, launch_policy(rt), (int(R), int(W), -1), set(), True,
                                     "kernel", ("x", "y"), "numba_streamsafe", fields_of)
        state.add_plan(launcher.Plan((array_type, array_type, int), 0x1234, b"AAq",
                                     {0: cufunc}, cufunc, 0))
        waits0, launches0, by_driver0 = sim.calls["cuStreamWaitEvent"], \
            launcher.launches(), launcher.by_driver()
        if new:
            args = (_NewArray(fx), _NewArray(fy), -7)
            config = (2, 32, _Stream(b))
        else:
            args, config = (_Array(fx), _Array(fy), -7), (2, 32, b)
        taken = launcher.launch(state, config, args)
        again = None
        if new and taken:
            first = len(made)
            again = launcher.launch(state, config, args) and len(made) == first
        out = {"taken": taken, "called": called, "made": len(made), "again": again,
               "stream_cached": getattr(config[2], "_nss_stream", (None,))[0] is rt,
               "waits": sim.calls["cuStreamWaitEvent"] - waits0,
               "launches": launcher.launches() - launches0,
               "by_driver": launcher.by_driver() - by_driver0,
               "compiled": launcher.COMPILED,
               "x_read_on_b": b in rt.resource.block_events(x)[1],
               "expect": [struct.pack("=Q", x.ptr), struct.pack("=Q", 64),
                          struct.pack("=Q", y.ptr), struct.pack("=Q", 64),
                          struct.pack("=q", -7)], "stream": b}
        rt.deallocate(x)
        rt.deallocate(y)
        return out
    finally:
        clear_runtimes()


def recalled_launches() -> dict[str, Any]:
    """Launches through the direct launch (:func:`launcher.launch`) that
    repeat a recent launch's arguments (kept the second time they are met,
    reused from the third), on the simulated driver told it launches
    compiled code. A kernel ``k(x: read, y: write, n: int)`` on
    stream ``b`` and a kernel ``w(x: write)`` on stream ``a``. Returns, per
    step, whether the launch was taken, the parameter slots the driver got
    (as bytes), the waits it queued and whether it reused a recent launch
    (``launcher.recalled()``), with the slots each step must pass
    (``"expect"``). Then four threads launch ``k`` at once, each with
    arrays of its own and the shared ``x``, two argument lists in turn:
    ``"threads_wrong"`` counts the launches whose slots were not their own
    arguments'."""
    import ctypes
    import struct

    from numba_streamsafe.numba.launch import launcher
    from numba_streamsafe.numba.launch.policy import launch_policy
    from numba_streamsafe.runtime import clear_runtimes, set_runtime

    sim = SimDriver(backing=False)
    sim.supports_direct_launch = True  # type: ignore[misc]
    called: list[Any] = []
    functions: list[int] = []

    def launch_kernel(function, grid, block, shmem, stream, params):
        n = 2 if function == 0x2222 else 5
        slots = (ctypes.c_void_p * n).from_address(params)
        called.append([ctypes.string_at(p, 8) for p in slots])
        functions.append(function)

    sim.launch_kernel = launch_kernel  # type: ignore[method-assign]
    rt = DeviceRuntime(AsyncResource(sim))
    set_runtime(rt)
    q = struct.Struct("=Q").pack
    try:
        a, b = sim.create_stream(), sim.create_stream()
        x, y = rt.allocate(64, a, "x"), rt.allocate(64, b, "y")
        array_type = object()  # matched by identity, as Numba's interned types are

        def fields(block: Any, lo: int = 0, hi: int = 64) -> Any:
            data = q(block.ptr + lo) + q(hi - lo)
            return launcher.ArgFields(block, array_type, data, lo, hi)

        def slots(fx: Any, fy: Any, n: int) -> list[bytes]:
            return [fx.fields[:8], fx.fields[8:], fy.fields[:8], fy.fields[8:],
                    struct.pack("=q", n)]

        cufunc, wfunc = object(), object()
        k = launcher.LaunchState(rt, launch_policy(rt), (int(R), int(W), -1), set(), True,
                                 "k", ("x", "y"))
        plan = launcher.Plan((array_type, array_type, int), 0x1111, b"AAq", {0: cufunc},
                             cufunc, 0)
        k.add_plan(plan)
        w = launcher.LaunchState(rt, launch_policy(rt), (int(W),), set(), True, "w", ("x",))
        w.add_plan(launcher.Plan((array_type,), 0x2222, b"A", {0: wfunc}, wfunc, 0))
        fx, fy = fields(x), fields(y)
        X, Y = _Array(fx), _Array(fy)
        steps: dict[str, Any] = {}

        def step(name: str, state: Any, config: tuple, args: tuple, expect: Any) -> None:
            n0, w0, r0 = len(called), sim.calls["cuStreamWaitEvent"], launcher.recalled()
            taken = launcher.launch(state, config, args)
            steps[name] = {"taken": taken, "slots": called[n0:], "functions": functions[n0:],
                           "waits": sim.calls["cuStreamWaitEvent"] - w0,
                           "recalled": launcher.recalled() - r0, "expect": expect}

        minus7 = int("-7")  # an int object of its own (not one of CPython's small ints)
        step("first", k, (1, 32, b), (X, Y, -7), [slots(fx, fy, -7)])
        step("same", k, (1, 32, b), (X, Y, -7), [slots(fx, fy, -7)])
        step("third", k, (1, 32, b), (X, Y, -7), [slots(fx, fy, -7)])
        step("other_int", k, (1, 32, b), (X, Y, -8), [slots(fx, fy, -8)])
        step("equal_int", k, (1, 32, b), (X, Y, minus7), [slots(fx, fy, -7)])
        step("writer", w, (1, 32, a), (X,), [slots(fx, fy, 0)[:2]])
        step("after_write", k, (1, 32, b), (X, Y, -7), [slots(fx, fy, -7)])
        view = fields(y, 16, 48)
        step("view", k, (1, 32, b), (X, _Array(view), -7), [slots(fx, view, -7)])
        step("view_again", k, (1, 32, b), (X, _Array(view), -7), [slots(fx, view, -7)])
        step("view_third", k, (1, 32, b), (X, _Array(view), -7), [slots(fx, view, -7)])
        plan.cache[0] = object()  # the module unloaded (a context reset): its slot dropped
        step("unloaded", k, (1, 32, b), (X, Y, -7), [])
        cufunc2 = object()  # Numba's new function: its plan takes the unloaded one's place
        k.add_plan(launcher.Plan((array_type, array_type, int), 0x3333, b"AAq", {0: cufunc2},
                                 cufunc2, 0))
        step("replanned", k, (1, 32, b), (X, Y, -7), [slots(fx, fy, -7)])
        step("before_free", k, (1, 32, b), (X, Y, -7), [slots(fx, fy, -7)])
        empty = fields(y, 8, 8)  # an empty view of y
        for name in ("empty", "empty_again", "empty_third"):
            step(name, k, (1, 32, b), (X, _Array(empty), -7), [slots(fx, empty, -7)])
        rt.deallocate(y)  # the block freed: a launch naming it is handed back
        step("freed", k, (1, 32, b), (X, Y, -7), [])
        step("freed_empty", k, (1, 32, b), (X, _Array(empty), -7), [])
        steps["slots_left"] = len(k.recent)

        # Threads: each its own arrays and the shared x, two argument lists in turn.
        wrong = [0]
        mine: list[Any] = []
        for t in range(4):
            blocks = [rt.allocate(64, b, f"t{t}y{i}") for i in range(2)]
            mine.append(blocks)
        barrier = threading.Barrier(4)
        lock = threading.Lock()

        def work(t: int) -> None:
            s = sim.create_stream()
            lists = [(X, _Array(fields(blk)), 100 + t) for blk in mine[t]]
            barrier.wait()
            for i in range(200):
                args = lists[i & 1]
                n0 = len(called)
                # The driver's call is appended by this thread during its launch;
                # another thread's may land in between: find this one by its n.
                launcher.launch(k, (1, 32, s), args)
                with lock:
                    ours = [c for c in called[n0:] if c[4] == struct.pack("=q", 100 + t)]
                    if not ours or ours[-1] != slots(args[0]._nss_fast, args[1]._nss_fast,
                                                     100 + t):
                        wrong[0] += 1

        at_once(work, [(t,) for t in range(4)])
        steps["threads_wrong"] = wrong[0]
        rt.deallocate(x)
        for blocks in mine:
            for blk in blocks:
                rt.deallocate(blk)
        steps["compiled"] = launcher.COMPILED
        return steps
    finally:
        clear_runtimes()
