"""Finalizer safety, context reset and stream lifetime (docs/architecture.md section 5)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading
import weakref
from pathlib import Path

import pytest

from numba_streamsafe import Access, StaleContext, StreamMisuse, UseAfterFree
from numba_streamsafe.core.blocks import BlockState
from numba_streamsafe.diagnostics.recorder import LaunchRecorder
from tests.helpers.programs import launch, snapshot

R, W, RW = Access.READ, Access.WRITE, Access.READ_WRITE
REPO = Path(__file__).resolve().parents[2]


class _Owner:
    """Stands for a Numba device array: its finalizer frees the block."""


# ------------------------------------------------------------ 5. finalizers
@pytest.mark.parametrize("lock", ["resource", "event pool"])
def test_finalizer_inside_a_locked_section_does_not_deadlock(rt, res, sim, two_streams, lock):
    a, b = two_streams
    block = rt.allocate(512, a, "finalized")
    launch(rt, b, [(block, R)])
    the_lock = res._lock if lock == "resource" else res.events.lock
    held: list[bool] = []

    def finalizer() -> None:
        held.append(the_lock.locked())
        rt.defer_free(block)

    finished = threading.Event()
    errors: list[BaseException] = []

    def body() -> None:
        try:
            with the_lock:
                gc.collect()  # runs the finalizer on this thread, under the lock
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finished.set()

    gc.disable()  # no automatic collection may run the finalizer outside the lock
    try:
        owner = _Owner()
        owner.cycle = owner  # only the cycle collector can reclaim it
        weakref.finalize(owner, finalizer)
        del owner
        worker = threading.Thread(target=body, daemon=True)
        worker.start()
        worker.join(10)
    finally:
        gc.enable()
    assert finished.is_set(), "the finalizer deadlocked on a lock its own thread held"
    assert errors == []
    assert held == [True], "the finalizer ran inside the locked section"
    assert block.state is BlockState.LIVE and res.stats().deferred == 1
    rt.flush()
    assert block.state is BlockState.FREED and res.stats().deferred == 0
    assert res.pending_bytes == 512 and res.live_bytes == 0
    again = rt.allocate(512, a, "reuse")
    assert again.ptr == block.ptr
    launch(rt, a, [(again, W)])
    assert sim.hazards == [], "the deferred free still waited for b's read"


@pytest.mark.parametrize("safe_point", ["allocate", "launch", "reap", "flush"])
def test_deferred_frees_run_at_the_next_safe_point(rt, res, sim, two_streams, safe_point):
    a, b = two_streams
    other = rt.allocate(64, b, "other")
    blocks = [rt.allocate(256, a, f"d{i}") for i in range(3)]
    for blk in blocks:
        rt.defer_free(blk)
    assert res.stats().deferred == 3 and res.live_bytes == 64 + 3 * 256
    {"allocate": lambda: rt.allocate(64, b, "trigger"),
     "launch": lambda: launch(rt, b, [(other, R)]),
     "reap": rt.reap,
     "flush": rt.flush}[safe_point]()
    assert all(blk.state is BlockState.FREED for blk in blocks)
    assert res.stats().deferred == 0 and res.stats().frees == 3


def test_deferred_free_of_an_already_freed_block_is_ignored(rt, res, two_streams):
    a, _ = two_streams
    blk = rt.allocate(256, a, "x")
    rt.deallocate(blk)
    rt.defer_free(blk)  # a finalizer that runs after an explicit free
    rt.flush()
    assert res.stats().frees == 1 and res.stats().deferred == 0


def test_hold_frees_keeps_deferred_frees_queued(rt, res, two_streams):
    a, _ = two_streams
    blk = rt.allocate(256, a, "x")
    with res.hold_frees():
        rt.defer_free(blk)
        rt.flush()
        assert blk.state is BlockState.LIVE and res.live_bytes == 256
    rt.flush()
    assert blk.state is BlockState.FREED


def test_deferred_free_whose_free_fails_is_kept_for_the_next_safe_point(rt, res, sim, caplog):
    res.reuse_bytes = 0  # the free must reach the driver, not the reuse list
    blk = rt.allocate(256, 0, "x")
    rt.defer_free(blk)
    sim.inject_failure("cuMemFreeAsync")
    rt.flush()  # never raises: a finalizer's free is retried later
    assert blk.state is BlockState.LIVE and res.stats().deferred == 1
    assert "will retry" in caplog.text
    rt.flush()
    assert blk.state is BlockState.FREED and res.stats().deferred == 0


def test_finalizers_at_interpreter_shutdown_do_not_crash():
    code = textwrap.dedent("""
        import weakref
        from numba_streamsafe._driver.sim import SimDriver
        from numba_streamsafe.resources import AsyncResource
        from numba_streamsafe.runtime import DeviceRuntime

        rt = DeviceRuntime(AsyncResource(SimDriver(backing=False)))
        s = rt.driver.create_stream()

        class Owner:
            pass

        owners = []
        for i in range(20):
            o = Owner()
            o.me = o
            weakref.finalize(o, rt.defer_free, rt.allocate(256, s, f"b{i}"))
            owners.append(o)
        rt.reset()  # the context is gone before the finalizers run
        print("done", flush=True)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_STREAMSAFE")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "done"
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr


# ---------------------------------------------------------- 7. context reset
def test_reset_makes_old_blocks_stale(rt, res, sim, two_streams):
    a, b = two_streams
    old = rt.allocate(256, a, "old")
    launch(rt, b, [(old, R)])
    rt.deallocate(rt.allocate(128, a, "queued"))
    rt.defer_free(rt.allocate(64, a, "deferred"))
    epoch = rt.epoch
    rt.reset()
    assert rt.epoch == epoch + 1 and rt.stats().epoch == epoch + 1
    assert rt.bytes_outstanding() == 0 and res.stats().live_blocks == 0
    assert res.stats().deferred == 0
    assert res.events.in_use == 0 and sim.live_events == res.events.idle
    assert old.state is BlockState.FREED
    assert issubclass(StaleContext, UseAfterFree)

    def preflight():
        rec = LaunchRecorder(rt, b)
        rec.read(old)
        try:
            rec.preflight()
        finally:
            rec.abandon()

    for call in (lambda: rt.deallocate(old),
                 lambda: res.preflight([(old, R)], b),
                 lambda: res.commit([(old, W)], b),
                 lambda: res.block_events(old),
                 preflight):
        with pytest.raises(StaleContext, match="context was reset.*Allocate it again"):
            call()

    new = rt.allocate(256, a, "new")
    assert new.epoch == epoch + 1
    launch(rt, b, [(new, W)])
    before = snapshot(res, new)
    rt.defer_free(old)  # the finalizer of a block of the old context
    rt.flush()  # does nothing and raises nothing
    assert snapshot(res, new) == before
    rt.defer_free(old)
    rt.allocate(64, a, "drains")  # a drain point too
    assert res.stats().frees == before[1].frees and res.stats().deferred == 0
    assert new.state is BlockState.LIVE and res.find(new.ptr) is new
    assert sim.hazards == []


def test_reset_ignores_driver_errors_of_a_dead_context(rt, res, sim):
    blocks = [rt.allocate(256, 0, f"b{i}") for i in range(3)]
    sim.inject_failure("cuMemFree", times=3)
    rt.reset()
    assert rt.bytes_outstanding() == 0
    assert all(blk.state is BlockState.FREED for blk in blocks)
    with pytest.raises(StaleContext):
        rt.deallocate(blocks[0])


# -------------------------------------------------------- 8. stream lifetime
def test_destroy_stream_with_a_live_block_names_the_block(rt, res, sim, two_streams):
    a, b = two_streams
    x = rt.allocate(256, a, "precious")
    rt.allocate(64, b, "elsewhere")
    before = snapshot(res, x)
    with pytest.raises(StreamMisuse, match=r"1 live block.*'precious'.*Free them"):
        rt.destroy_stream(a)
    assert snapshot(res, x) == before
    sim.check_stream(a)  # still there
    launch(rt, a, [(x, W)])
    rt.deallocate(x)
    rt.reap()
    rt.destroy_stream(a)
    with pytest.raises(StreamMisuse):
        rt.allocate(64, a, "on a destroyed stream")
    assert sim.hazards == []


def test_destroy_stream_with_queued_frees_reaps_them(rt, res, sim, two_streams):
    """A free queued on a stream must be reaped before the stream goes: a
    destroyed stream can no longer be synchronised, so every later reap failed."""
    a, b = two_streams
    rt.deallocate(rt.allocate(256, a, "x"))
    rt.deallocate(rt.allocate(512, b, "y"))
    rt.destroy_stream(a)
    assert a not in res.pending_per_stream()
    rt.reap()
    assert rt.bytes_outstanding() == 0 and res.pending_per_stream() == {}


def test_destroy_stream_keeps_its_recorded_uses_orderable(rt, res, sim, four_streams):
    """A read recorded on a stream (lazily, with no event yet) must still be
    waited for after that stream is destroyed."""
    a, b, c, _ = four_streams
    x = rt.allocate(256, a, "x")
    y = rt.allocate(256, a, "y")
    launch(rt, b, [(x, R), (y, R)], label="read on b")
    launch(rt, c, [(y, R)], label="read on c")
    rt.destroy_stream(b)
    launch(rt, a, [(x, W)], label="write after b's read")
    rt.deallocate(y)
    rt.deallocate(x)
    rt.reap()
    assert sim.hazards == []
    assert rt.bytes_outstanding() == 0
    assert res.events.in_use == 0 and sim.live_events == res.events.idle


class _UserStream:
    """A stream object, as ``cuda.stream()`` returns, owning a driver stream."""

    def __init__(self, handle: int) -> None:
        self.handle_value = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle_value)


@pytest.mark.parametrize("cross_stream", [False, True], ids=["one stream", "two streams"])
def test_a_block_keeps_its_stream_object_alive_until_its_free_is_reaped(rt, res, sim,
                                                                        cross_stream):
    obj = _UserStream(sim.create_stream())
    alive = weakref.ref(obj)
    x = rt.allocate(256, obj, "x")
    launch(rt, obj, [(x, W)])
    if cross_stream:  # the allocation's mark gets an event; on one stream it stays open
        launch(rt, sim.create_stream(), [(x, R)])
    del obj
    gc.collect()
    assert alive() is not None, "a live block keeps its alloc stream alive"
    rt.deallocate(x)
    gc.collect()
    assert alive() is not None, "a queued free keeps it alive until reaped"
    rt.reap()
    gc.collect()
    assert alive() is None, "after the reap nothing may keep the stream object alive"
    assert sim.hazards == []


def test_runtime_makes_one_driver_stream_per_handleless_stream_object(rt, sim):
    Fake = type("Stream", (), {"__module__": "numba.cuda.simulator.fake"})
    s1, s2 = Fake(), Fake()
    h1 = rt.stream_handle(s1)
    assert rt.stream_handle(s1) == h1 != rt.stream_handle(s2)
    sim.check_stream(h1)
    assert rt.stream_handle(None) == 0 and rt.stream_handle(h1) == h1


def test_a_recorded_use_keeps_its_stream_object_alive_while_referenced(rt, res, sim):
    a = sim.create_stream()
    obj = _UserStream(sim.create_stream())
    t = obj.handle_value
    alive = weakref.ref(obj)
    x = rt.allocate(256, a, "x")
    for access, owner in ((R, obj), (W, None)):  # one open mark on t: read, then write
        res.preflight([(x, access)], t)
        sim.trace_access(t, [(x.ptr, x.nbytes, access)], f"{access.name} on t")
        res.commit([(x, access)], t, owner)
    del obj
    gc.collect()
    assert alive() is not None, "x's last write is recorded on the object's stream"
    rt.deallocate(x)  # a waits for t's mark: its event is recorded while t exists
    gc.collect()
    assert alive() is None
    assert sim.hazards == []
