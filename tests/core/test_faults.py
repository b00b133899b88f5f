"""Driver failures injected into the calls of every hot path (``SimDriver.inject_failure``).

Already covered elsewhere, and not repeated here: ``deallocate`` failing on
``cuStreamWaitEvent`` / ``cuMemFreeAsync`` (test_core_contract), ``reap`` failing on
``cuStreamSynchronize``, the out-of-memory retry paths and a non-OOM
``cuMemAllocAsync`` failure (test_core_accounting), a deferred free whose
``cuMemFreeAsync`` fails at ``flush`` and a reset over dead ``cuMemFree``
(test_core_lifecycle).

This file adds the failures those leave out:

* preflight: sealing a lazy mark (``cuEventCreate`` with an empty pool,
  ``cuEventRecord``) and the wait itself (``cuStreamWaitEvent``);
* commit with ``fences="eager"``: the launch's event cannot be recorded;
* an eager allocation whose allocation-ready event cannot be recorded;
* ``deallocate`` failing while it seals a lazy mark;
* a deferred (finalizer) free failing inside each safe point that drains it;
* ``reap_completed`` with a failing ``cuStreamQuery``; ``destroy_stream`` failing
  at each of its steps; a producer-stream wait failing;
* ``cuEventDestroy`` failing when a full pool destroys a released event.

Each test checks that the error names the call, that the accounting and the
dependency state of the blocks (:func:`programs.snapshot`) are as before, that
the next call works, and that the simulator's happens-before checker sees no
hazard afterwards: a failure never loses an ordering.
"""

from __future__ import annotations

import gc
import weakref

import pytest

from numba_streamsafe import Access, AsyncResource, DeviceRuntime, DriverError, StreamMisuse
from numba_streamsafe.core.blocks import BlockState
from numba_streamsafe.diagnostics.recorder import LaunchRecorder
from tests.helpers.programs import accounting, launch, snapshot

R, W, RW = Access.READ, Access.WRITE, Access.READ_WRITE
CODE = 999  # not a code the library reacts to


def _make(sim, fences="lazy", **kwargs):
    res = AsyncResource(sim, fences=fences, **kwargs)
    return res, DeviceRuntime(res)


def _deps(res, block, refs=True):
    """A block's dependency state: its marks by identity, with their stream and
    (unless ``refs`` is False: other blocks may share a mark) their count."""
    last_write, reads = res.block_events(block)
    return ((id(last_write), last_write.stream, last_write.refs if refs else None),
            tuple(sorted((s, id(m), m.refs if refs else None) for s, m in reads.items())))


def _state(res, *blocks):
    """:func:`programs.snapshot` with the events in use but not the idle ones (a
    failed ``cuEventRecord`` leaves its freshly created event in the pool)."""
    return snapshot(res, *blocks, events=False), res.events.in_use


def _finish(rt, res, sim, *blocks):
    """Free what is left and check that nothing leaked and no hazard was seen."""
    for block in blocks:
        if block.state is BlockState.LIVE:
            rt.deallocate(block)
    rt.reap()
    assert rt.bytes_outstanding() == 0
    assert res.events.in_use == 0
    assert sim.hazards == []


class _UserStream:
    """A stream object, as ``cuda.stream()`` returns, owning a driver stream."""

    def __init__(self, handle: int) -> None:
        self.handle_value = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle_value)


# ------------------------------------------------------------------ preflight
PREFLIGHT = [("lazy", "cuEventCreate"), ("lazy", "cuEventRecord"),
             ("lazy", "cuStreamWaitEvent"), ("eager", "cuStreamWaitEvent")]


@pytest.mark.parametrize("access", [R, W, RW], ids=["read", "write", "read_write"])
@pytest.mark.parametrize("fences, call", PREFLIGHT, ids=[f"{f}-{c}" for f, c in PREFLIGHT])
def test_preflight_failure_changes_nothing_and_can_be_retried(sim, fences, call, access):
    res, rt = _make(sim, fences)
    a, b = sim.create_stream(), sim.create_stream()
    x = rt.allocate(1000, a, "x")
    y = rt.allocate(256, b, "y")
    launch(rt, a, [(x, W)], label="write x on a")
    if fences == "lazy":
        assert res.events.idle == 0, "the seal must create an event: the pool is empty"
    # A lazy seal that succeeded before the wait failed keeps its event (its
    # users give it back); every other failure leaves the events in use as they
    # were (a failed record puts its new event in the idle pool).
    sealed = fences == "lazy" and call == "cuStreamWaitEvent"
    before = snapshot(res, x, y, events=False)
    in_use = res.events.in_use
    rec = LaunchRecorder(rt, b)
    rec.use(x, access)
    rec.write(y)
    sim.inject_failure(call, CODE)
    with pytest.raises(DriverError) as info:
        rec.preflight()
    assert (info.value.call, info.value.code) == (call, CODE)
    assert snapshot(res, x, y, events=False) == before
    assert res.events.in_use == in_use + sealed
    # The same recorder can be preflighted again, and the launch is ordered.
    rec.preflight()
    sim.trace_access(b, [(x.ptr, x.nbytes, access), (y.ptr, y.nbytes, W)], "launch on b")
    rec.commit()
    launch(rt, a, [(x, W)], label="write x on a again")  # waits for b's use
    _finish(rt, res, sim, x, y)


def test_a_recorder_whose_preflight_failed_can_be_abandoned(rt, res, sim, two_streams, recwarn):
    a, b = two_streams
    x = rt.allocate(1000, a, "x")
    launch(rt, a, [(x, W)])
    before = _state(res, x)
    rec = LaunchRecorder(rt, b)
    rec.read(x)
    sim.inject_failure("cuEventRecord", CODE)
    with pytest.raises(DriverError):
        rec.preflight()
    rec.abandon()  # the launch is not made: no warning, nothing recorded
    del rec
    gc.collect()
    assert not [w for w in recwarn if "without commit" in str(w.message)]
    assert _state(res, x) == before
    launch(rt, b, [(x, R)])
    _finish(rt, res, sim, x)


# ---------------------------------------------------------- eager commit
@pytest.mark.parametrize("access", [R, W, RW], ids=["read", "write", "read_write"])
@pytest.mark.parametrize("call", ["cuEventCreate", "cuEventRecord"])
def test_eager_commit_failure_keeps_the_use_recorded_and_ordered(sim, call, access):
    """The work is queued when commit fails, so the use must stay recorded: on
    the stream's open mark, which is sealed lazily when another stream waits."""
    # No idle events: every seal calls cuEventCreate.
    res, rt = _make(sim, "eager", max_idle_events=0)
    a, b, c = (sim.create_stream() for _ in range(3))
    x = rt.allocate(1000, a, "x")
    y = rt.allocate(256, a, "untouched")
    y_deps = _deps(res, y)
    before = accounting(res)
    rec = LaunchRecorder(rt, b)
    rec.use(x, access)
    rec.preflight()
    sim.trace_access(b, [(x.ptr, x.nbytes, access)], "launch on b")
    sim.inject_failure(call, CODE)
    with pytest.raises(DriverError) as info:
        rec.commit()
    assert (info.value.call, info.value.code) == (call, CODE)
    assert accounting(res) == before
    assert _deps(res, y) == y_deps
    last_write, reads = res.block_events(x)
    mark = last_write if access & W else reads[b]
    assert mark.stream == b and mark.handle is None, "recorded on b's open mark"
    if access & W:
        assert reads == {}
    deps = _deps(res, x)
    rec.commit()  # a retry records nothing twice; it seals the mark now
    assert _deps(res, x) == deps and mark.handle is not None
    launch(rt, c, [(x, W)], label="write x on c")  # must wait for the launch on b
    launch(rt, b, [(x, R)], label="read x on b")
    _finish(rt, res, sim, x, y)


@pytest.mark.filterwarnings("ignore::numba_streamsafe.UncommittedLaunchWarning")
@pytest.mark.parametrize("call", ["cuEventCreate", "cuEventRecord"])
def test_eager_commit_failure_then_a_wait_seals_the_open_mark(sim, call):
    res, rt = _make(sim, "eager", max_idle_events=0)
    a, b = sim.create_stream(), sim.create_stream()
    x = rt.allocate(1000, a, "x")
    sim.inject_failure(call, CODE)
    with pytest.raises(DriverError):
        launch(rt, b, [(x, W)], label="write x on b")
    records = sim.calls["cuEventRecord"]
    launch(rt, a, [(x, R)], label="read x on a")  # no retry of the commit: a must still wait
    assert sim.calls["cuEventRecord"] - records == 2, "b's mark sealed for the wait, a's commit"
    _finish(rt, res, sim, x)


# ------------------------------------------------------- eager allocation
@pytest.mark.parametrize("call", ["cuEventCreate", "cuEventRecord"])
def test_eager_allocation_whose_ready_event_fails_allocates_nothing(sim, call):
    res, rt = _make(sim, "eager", max_idle_events=0)
    a, b = sim.create_stream(), sim.create_stream()
    keep = rt.allocate(256, a, "keep")
    launch(rt, b, [(keep, R)])
    before = snapshot(res, keep)
    owner = _UserStream(a)
    alive = weakref.ref(owner)
    sim.inject_failure(call, CODE)
    with pytest.raises(DriverError) as info:
        rt.allocate(4096, owner, "x")
    assert (info.value.call, info.value.code) == (call, CODE)
    assert snapshot(res, keep) == before
    del owner, info  # the traceback holds the allocating frame
    gc.collect()
    assert alive() is None, "a failed allocation keeps no stream object alive"
    x = rt.allocate(4096, a, "x")  # the next call works
    launch(rt, b, [(x, W), (keep, R)])
    _finish(rt, res, sim, x, keep)


# ------------------------------------------------------------------ deallocate
@pytest.mark.parametrize("call", ["cuEventCreate", "cuEventRecord"])
def test_deallocate_failing_to_seal_a_lazy_mark_leaves_the_block_live(rt, res, sim, two_streams,
                                                                      call):
    a, b = two_streams
    x = rt.allocate(1000, a, "x")
    other = rt.allocate(256, b, "other")
    launch(rt, b, [(x, R), (other, W)], label="read x on b")  # b's open mark holds the read
    assert res.events.idle == 0
    before = _state(res, x, other)
    sim.inject_failure(call, CODE)
    with pytest.raises(DriverError) as info:
        rt.deallocate(x)
    assert (info.value.call, info.value.code) == (call, CODE)
    assert x.state is BlockState.LIVE and res.find(x.ptr) is x
    assert _state(res, x, other) == before
    assert res.pending_per_stream() == {}
    rt.deallocate(x)  # the retry
    y = rt.allocate(1000, a, "y")
    assert y.ptr == x.ptr, "the address is reused: only the free's wait orders the write"
    launch(rt, a, [(y, W)], label="write y on a")
    _finish(rt, res, sim, y, other)


# --------------------------------------------- deferred frees at safe points
DRAIN_CALLS = ["cuEventCreate", "cuEventRecord", "cuStreamWaitEvent", "cuMemFreeAsync"]


@pytest.mark.parametrize("safe_point", ["allocate", "launch", "reap", "flush"])
@pytest.mark.parametrize("call", DRAIN_CALLS)
def test_a_deferred_free_failing_inside_a_safe_point_is_kept(rt, res, sim, two_streams, caplog,
                                                            call, safe_point):
    if (call, safe_point) == ("cuMemFreeAsync", "flush"):
        pytest.skip("test_core_lifecycle covers it")
    a, b = two_streams
    x = rt.allocate(1000, a, "x")
    keep = rt.allocate(256, a, "keep")
    launch(rt, b, [(x, R)], label="read x on b")  # the free must seal b's mark and wait
    rt.defer_free(x)  # as a finalizer would
    x_deps = _deps(res, x, refs=False)
    outstanding = rt.bytes_outstanding()
    sim.inject_failure(call, CODE)
    if safe_point == "allocate":
        extra = rt.allocate(64, a, "extra")
    elif safe_point == "launch":
        launch(rt, a, [(keep, W)], label="write keep on a")
        extra = None
    elif safe_point == "reap":
        rt.reap()
        extra = None
    else:
        rt.flush()
        extra = None
    # The safe point itself worked; the free was put back for the next one.
    assert "will retry" in caplog.text and call in caplog.text
    assert x.state is BlockState.LIVE and res.find(x.ptr) is x
    assert res.stats().deferred == 1 and _deps(res, x, refs=False) == x_deps
    assert rt.bytes_outstanding() == outstanding + (extra.nbytes if extra else 0)
    rt.flush()
    assert x.state is BlockState.FREED and res.stats().deferred == 0
    y = rt.allocate(1000, a, "y")
    assert y.ptr == x.ptr
    launch(rt, a, [(y, W)], label="write y on a")  # after b's read of x: the free waited
    _finish(rt, res, sim, y, keep, *([extra] if extra else []))


# ------------------------------------------------------------------ reaping
def test_reap_completed_skips_a_stream_whose_query_fails(rt, res, sim, two_streams):
    a, b = two_streams
    rt.deallocate(rt.allocate(1000, a, "on a"))
    rt.deallocate(rt.allocate(500, b, "on b"))
    sim.synchronize()  # both frees have run
    sim.inject_failure("cuStreamQuery", CODE)
    res.reap_completed()  # never raises
    assert res.pending_per_stream() == {a: 1000}, "the failed query keeps a's bytes pending"
    assert rt.bytes_outstanding() == 1000
    res.reap_completed()
    assert res.pending_per_stream() == {} and rt.bytes_outstanding() == 0


# ------------------------------------------------------------ destroy_stream
@pytest.mark.parametrize("call", ["cuEventCreate", "cuEventRecord", "cuStreamSynchronize",
                                  "cuStreamDestroy"])
def test_destroy_stream_failure_keeps_the_stream_and_its_uses(rt, res, sim, four_streams, call):
    a, b, c, _ = four_streams
    x = rt.allocate(1000, a, "x")
    launch(rt, b, [(x, R)], label="read x on b")  # b's open mark: sealed before b goes
    rt.deallocate(rt.allocate(256, b, "freed on b"))  # a free queued on b: reaped before b goes
    assert res.events.idle == 0
    x_deps = _deps(res, x)
    sim.inject_failure(call, CODE)
    with pytest.raises(DriverError) as info:
        rt.destroy_stream(b)
    assert (info.value.call, info.value.code) == (call, CODE)
    sim.check_stream(b)  # still there
    assert _deps(res, x) == x_deps
    reaped = call == "cuStreamDestroy"  # the failure came after the reap
    assert res.pending_per_stream() == ({} if reaped else {b: 256})
    assert rt.bytes_outstanding() == 1000 + (0 if reaped else 256)
    rt.destroy_stream(b)  # the retry
    with pytest.raises(StreamMisuse):
        sim.check_stream(b)
    launch(rt, c, [(x, W)], label="write x on c")  # waits for b's read, recorded before b went
    _finish(rt, res, sim, x)


# ------------------------------------------------------- producer streams
@pytest.mark.parametrize("call", ["cuEventCreate", "cuEventRecord", "cuStreamWaitEvent"])
def test_a_failed_wait_for_a_producer_stream_leaks_no_event(rt, res, sim, two_streams, call):
    a, b = two_streams
    x = rt.allocate(256, b, "x")
    rec = LaunchRecorder(rt, b, mode="permissive")
    rec.write(x)
    rec.use(None, R, "foreign array produced on a")
    rec.wait_for_stream(a)
    sim.inject_failure(call, CODE)
    with pytest.raises(DriverError) as info:
        rec.preflight()
    assert info.value.call == call
    assert res.events.in_use == 0
    rec.preflight()  # the retry
    sim.trace_access(b, [(x.ptr, x.nbytes, W)], "launch on b")
    rec.commit()
    _finish(rt, res, sim, x)


# -------------------------------------------------------- event destruction
@pytest.mark.parametrize("where", ["deallocate", "commit", "reset"])
def test_an_event_that_cannot_be_destroyed_does_not_corrupt_the_accounting(sim, caplog, where):
    """With a full pool a released event is destroyed in the middle of a state
    update; a failing ``cuEventDestroy`` must not stop that update half-way."""
    res, rt = _make(sim, "eager", max_idle_events=0)
    a, b = sim.create_stream(), sim.create_stream()
    x = rt.allocate(1000, a, "x")
    keep = rt.allocate(256, b, "keep")
    launch(rt, b, [(x, R), (keep, W)], label="read x on b")
    sim.inject_failure("cuEventDestroy", CODE, times=4)
    if where == "deallocate":
        rt.deallocate(x)  # releases x's allocation event
        assert x.state is BlockState.FREED and res.find(x.ptr) is None
        assert (res.live_bytes, res.pending_bytes) == (256, 1000)
    elif where == "commit":
        launch(rt, a, [(x, W)], label="write x on a")  # releases the allocation event
        last_write, reads = res.block_events(x)
        assert last_write.stream == a and reads == {} and last_write.refs == 1
        assert res.bytes_outstanding() == 1256
    else:
        rt.reset()  # releases every event
        assert res.stats().live_blocks == 0 and rt.bytes_outstanding() == 0
        assert x.state is BlockState.FREED and keep.state is BlockState.FREED
    assert "cuEventDestroy" in caplog.text
    sim._faults.clear()
    if where != "reset":
        _finish(rt, res, sim, x, keep)
    y = rt.allocate(512, a, "after")  # the next call works
    launch(rt, b, [(y, W)])
    _finish(rt, res, sim, y)


# ------------------------------------------------------ destroyed stream handles
def test_a_destroyed_handle_is_refused_but_a_live_object_at_its_address_is_not(sim):
    """The CUDA driver does not check stream handles (a destroyed one crashes
    the process), so CudaDriver remembers the handles it destroyed and the
    runtime refuses them as ints; a stream object proves its stream is live,
    so one that got a destroyed stream's address is accepted."""
    sim.destroyed_streams = set()  # as CudaDriver keeps it
    res, rt = _make(sim)
    h = sim.create_stream()
    sim.destroyed_streams.add(h)
    before = snapshot(res)
    for attempt in (lambda: rt.allocate(64, h, "on a destroyed stream"),
                    lambda: LaunchRecorder(rt, h),
                    lambda: rt.destroy_stream(h)):
        with pytest.raises(StreamMisuse, match=f"stream {h:#x} was destroyed"):
            attempt()
    assert snapshot(res) == before
    owner = _UserStream(h)  # a new stream object at the same address
    x = rt.allocate(64, owner, "x")
    assert h not in sim.destroyed_streams
    y = rt.allocate(64, h, "y")  # the handle is live again
    launch(rt, h, [(x, W), (y, W)])
    _finish(rt, res, sim, x, y)
