"""docs/architecture.md section 4: the resource and recorder contract, item by item.

Every refused call must raise a typed error that says what to do, and leave
the accounting (``bytes_outstanding``, ``stats``) and the dependency state of
the blocks (``block_events``) exactly as they were.
"""

from __future__ import annotations

import collections
import gc
import logging
import warnings

import pytest

from numba_streamsafe import (
    Access,
    AsyncResource,
    Block,
    BudgetResource,
    DeviceRuntime,
    DirectResource,
    DriverError,
    InvalidArgument,
    LoggingResource,
    OutOfBudget,
    RecorderMode,
    StreamMisuse,
    UncommittedLaunchWarning,
    UseAfterFree,
)
from numba_streamsafe.core.blocks import BlockState, next_generation
from numba_streamsafe.diagnostics.recorder import LaunchRecorder
from tests.helpers.programs import accounting, launch, snapshot

R, W, RW = Access.READ, Access.WRITE, Access.READ_WRITE

STACKS = {
    "async": lambda sim: AsyncResource(sim),
    "logging": lambda sim: LoggingResource(AsyncResource(sim)),
    "budget": lambda sim: BudgetResource(AsyncResource(sim), 1 << 20),
}


def calls(sim) -> collections.Counter:
    return collections.Counter(sim.calls)


def use(res, sim, block, stream, access) -> int:
    """preflight, the kernel, commit; return how many waits preflight queued."""
    before = sim.calls["cuStreamWaitEvent"]
    res.preflight([(block, access)], stream)
    queued = sim.calls["cuStreamWaitEvent"] - before
    sim.trace_access(stream, [(block.ptr, block.nbytes, access)], f"{access.name}@{stream:#x}")
    res.commit([(block, access)], stream)
    return queued


# ------------------------------------------------------------------ 1. allocate
@pytest.mark.parametrize("fences", ["lazy", "eager"])
def test_allocate_returns_a_live_block_ordered_on_its_stream(sim, fences):
    res = AsyncResource(sim, fences=fences)
    a, b = sim.create_stream(), sim.create_stream()
    records = sim.calls["cuEventRecord"]
    x = res.allocate(300, a, "x")
    y = res.allocate(300, a, "y")
    # Eager: an allocation-ready event per allocation; lazy: recorded when first needed.
    assert sim.calls["cuEventRecord"] - records == (2 if fences == "eager" else 0)
    assert x.state is BlockState.LIVE and (x.stream, x.tag, x.nbytes) == (a, "x", 300)
    assert y.generation > x.generation and x.epoch == res.epoch == 0
    assert res.find(x.ptr) is x and res.find(x.ptr + 299) is x and res.find(x.ptr + 300) is None
    assert res.block_events(x)[0].stream == a
    assert use(res, sim, x, b, R) == 1, "a use on another stream waits for the allocation"
    assert sim.hazards == []
    z = res.allocate(300, a, "z")
    sim.trace_access(b, [(z.ptr, 300, R)], "unfenced read of z")
    assert [h.kind for h in sim.hazards] == ["read-after-write"], "the control: unordered"


@pytest.mark.parametrize("stack", sorted(STACKS))
@pytest.mark.parametrize("nbytes", [0, -1, -4096, 1.5, 64.0, "64", None, True, [64]])
def test_allocate_bad_size_is_invalid_argument_and_changes_nothing(sim, stack, nbytes):
    res = STACKS[stack](sim)
    s = sim.create_stream()
    keep = res.allocate(64, s, "keep")
    before, driver_calls = snapshot(res, keep), calls(sim)
    with pytest.raises(InvalidArgument, match="must be a positive int") as info:
        res.allocate(nbytes, s, "bad")
    assert isinstance(info.value, ValueError)
    assert snapshot(res, keep) == before
    assert calls(sim) == driver_calls, "nothing may reach the driver"


@pytest.mark.parametrize("nbytes", [0, -8, 2.5, "8"])
def test_direct_resource_bad_size_is_invalid_argument(sim, nbytes):
    res = DirectResource(sim)
    with pytest.raises(InvalidArgument, match="positive int"):
        res.allocate(nbytes, 0, "bad")
    assert res.bytes_outstanding() == 0 and res.stats().allocations == 0
    assert sim.calls["cuMemAlloc"] == 0


def test_allocate_on_unknown_stream_is_stream_misuse(rt, res, sim):
    s = sim.create_stream()
    keep = rt.allocate(64, s, "keep")
    gone = sim.create_stream()
    sim.destroy_stream(gone)
    before, allocs = snapshot(res, keep), sim.calls["cuMemAllocAsync"]
    for bad in (0xBAD0, gone):
        with pytest.raises(StreamMisuse, match="create_stream|was destroyed"):
            rt.allocate(64, bad, "bad")
    assert snapshot(res, keep) == before
    assert sim.calls["cuMemAllocAsync"] == allocs


def test_block_of_another_device_is_invalid_argument(rt, res, sim, two_streams):
    a, b = two_streams
    real = rt.allocate(256, a, "real")
    launch(rt, b, [(real, R)])
    alien = Block(real.ptr, real.nbytes, 1, a, "alien", real.generation)
    before, driver_calls = snapshot(res, real), calls(sim)

    def preflight():
        rec = LaunchRecorder(rt, b)
        rec.write(alien)
        try:
            rec.preflight()
        finally:
            rec.abandon()

    for call in (lambda: rt.deallocate(alien),
                 lambda: res.preflight([(alien, W)], b),
                 lambda: res.commit([(alien, W)], b),
                 lambda: res.block_events(alien),
                 preflight):
        with pytest.raises(InvalidArgument, match="device 1.*device 0.*runtime"):
            call()
    assert snapshot(res, real) == before
    assert calls(sim) == driver_calls
    assert alien.state is BlockState.LIVE and real.state is BlockState.LIVE


def test_a_live_block_of_another_resource_is_named_so_not_freed(res, sim, two_streams):
    """A block another resource of the same device made (the runtime a
    ``set_runtime`` replaced) is live: the refusal says another resource made
    it, not that it was freed."""
    a, b = two_streams
    other = AsyncResource(sim)
    theirs = other.allocate(256, a, "theirs")
    before, driver_calls = snapshot(res), calls(sim)
    for call in (lambda: res.preflight([(theirs, R)], b), lambda: res.commit([(theirs, W)], b)):
        with pytest.raises(UseAfterFree, match="not live here, and no free of it was asked for: "
                                               "another resource made it") as info:
            call()
        assert "already freed" not in str(info.value)
    assert snapshot(res) == before and calls(sim) == driver_calls
    assert theirs.state is BlockState.LIVE
    other.deallocate(theirs)


# ------------------------------------------------------ 4. stale / unknown / double
def test_double_free_is_use_after_free(rt, res, sim, two_streams):
    a, b = two_streams
    keep = rt.allocate(64, b, "keep")
    x = rt.allocate(512, a, "x")
    rt.deallocate(x)
    assert x.state is BlockState.FREED
    before, driver_calls = snapshot(res, keep), calls(sim)
    with pytest.raises(UseAfterFree, match="already freed.*Do not use a block after deallocate"):
        rt.deallocate(x)
    assert snapshot(res, keep) == before
    assert calls(sim) == driver_calls
    assert res.pending_bytes == 512


def test_stale_generation_is_use_after_free_and_spares_the_new_owner(rt, res, sim, two_streams):
    a, b = two_streams
    old = rt.allocate(256, a, "old")
    rt.deallocate(old)
    new = rt.allocate(256, a, "new")
    assert new.ptr == old.ptr and new.generation != old.generation  # the pool reused it
    launch(rt, b, [(new, R)])
    before, driver_calls = snapshot(res, new), calls(sim)
    for call in (lambda: rt.deallocate(old),
                 lambda: res.preflight([(old, W)], b),
                 lambda: res.commit([(old, W)], b),
                 lambda: res.preflight([(new, R), (old, R)], b)):
        with pytest.raises(UseAfterFree, match=f"now holds generation {new.generation}"):
            call()
    assert snapshot(res, new) == before
    assert calls(sim) == driver_calls, "a refused launch queues no wait, even for valid uses"
    assert res.find(new.ptr) is new and new.state is BlockState.LIVE


def test_unknown_pointer_is_use_after_free(rt, res, sim, two_streams):
    a, b = two_streams
    keep = rt.allocate(64, a, "keep")
    ghost = Block(0xDEAD000, 64, 0, a, "ghost", next_generation())
    before, driver_calls = snapshot(res, keep), calls(sim)
    for call in (lambda: rt.deallocate(ghost),
                 lambda: res.preflight([(ghost, R)], b),
                 lambda: res.commit([(keep, W), (ghost, W)], b)):
        with pytest.raises(UseAfterFree, match="'ghost'.*not live"):
            call()
    assert snapshot(res, keep) == before, "a refused commit records nothing, even for valid uses"
    assert calls(sim) == driver_calls


# --------------------------------------------------------------- 2. preflight
def test_read_waits_only_on_a_cross_stream_last_write(res, sim, four_streams):
    a, b, c, d = four_streams
    x = res.allocate(256, a, "x")  # the allocation is the first "write", on a
    assert use(res, sim, x, a, R) == 0
    assert use(res, sim, x, b, R) == 1
    assert use(res, sim, x, c, R) == 1
    assert use(res, sim, x, a, R) == 0, "outstanding reads never make a read wait"
    assert use(res, sim, x, d, R) == 1, "only the last write, not the reads of b and c"
    assert sim.hazards == []


@pytest.mark.parametrize("access", [W, RW], ids=["write", "read_write"])
def test_write_waits_on_last_write_and_every_cross_stream_read(res, sim, four_streams, access):
    a, b, c, d = four_streams
    x = res.allocate(256, a, "x")
    use(res, sim, x, b, R)
    use(res, sim, x, c, R)
    assert use(res, sim, x, a, access) == 2, "reads of b and c (the last write is on a)"
    use(res, sim, x, c, R)
    use(res, sim, x, d, R)
    # d already waited for a's write when it read x, so stream order covers it:
    # only c's read is left (and never d's own read).
    assert use(res, sim, x, d, access) == 1, "c's read; a's write is already waited for by d"
    assert use(res, sim, x, b, access) == 1, "the last write, on d"
    assert sim.hazards == []


def test_same_stream_events_are_never_waited(res, sim, two_streams):
    a, b = two_streams
    x = res.allocate(256, a, "x")
    for access in (W, R, R, RW, W, R):
        assert use(res, sim, x, a, access) == 0
    assert use(res, sim, x, b, W) == 1
    for access in (R, W, RW, R, R, W):
        assert use(res, sim, x, b, access) == 0
    assert sim.hazards == []


# ------------------------------------------------------------------ 3. commit
def test_commit_write_replaces_last_write_and_read_adds_itself(res, sim, four_streams):
    a, b, c, d = four_streams
    x = res.allocate(256, a, "x")
    alloc_mark, reads = res.block_events(x)
    assert alloc_mark.stream == a and reads == {}
    use(res, sim, x, b, R)
    use(res, sim, x, c, R)
    last, reads = res.block_events(x)
    assert last is alloc_mark and set(reads) == {b, c}
    use(res, sim, x, b, R)
    assert set(res.block_events(x)[1]) == {b, c}, "one read entry per stream"
    use(res, sim, x, c, W)
    last, reads = res.block_events(x)
    assert last is not alloc_mark and last.stream == c and reads == {}
    use(res, sim, x, a, R)
    assert set(res.block_events(x)[1]) == {a}
    use(res, sim, x, d, RW)
    last, reads = res.block_events(x)
    assert last.stream == d and reads == {}
    assert sim.hazards == []


# --------------------------------------------------------------- 4. deallocate
def test_deallocate_waits_for_every_cross_stream_use_then_frees(rt, res, sim, four_streams):
    a, b, c, _ = four_streams
    x = rt.allocate(256, a, "x")
    launch(rt, b, [(x, R)], label="long read on b")
    launch(rt, c, [(x, R)], label="read on c")
    launch(rt, a, [(x, R)], label="read on a")
    waits, frees = sim.calls["cuStreamWaitEvent"], sim.calls["cuMemFreeAsync"]
    rt.deallocate(x)
    assert sim.calls["cuStreamWaitEvent"] - waits == 2, "b's and c's reads; a's is same-stream"
    assert sim.calls["cuMemFreeAsync"] - frees == 1
    assert res.pending_per_stream() == {a: 256}
    y = rt.allocate(200, a, "y")
    assert y.ptr == x.ptr, "the pool hands the address straight back on the alloc stream"
    launch(rt, a, [(y, W)], label="write of y")
    assert sim.hazards == []


def test_deallocate_after_a_cross_stream_write_waits_for_it(rt, res, sim, two_streams):
    a, b = two_streams
    x = rt.allocate(256, a, "x")
    launch(rt, b, [(x, W)])
    waits = sim.calls["cuStreamWaitEvent"]
    rt.deallocate(x)
    assert sim.calls["cuStreamWaitEvent"] - waits == 1
    y = rt.allocate(256, a, "y")
    assert y.ptr == x.ptr
    launch(rt, a, [(y, R)])
    assert sim.hazards == []


def test_free_after_unrecorded_read_is_a_hazard(rt, sim, two_streams):
    """Negative control: the same reuse without the library's fence is caught."""
    a, b = two_streams
    x = rt.allocate(256, a, "x")
    sim.stream_synchronize(a)  # the allocation is ordered before b's read by the host
    launch(rt, b, [(x, R)], fenced=False, label="long read on b")
    assert sim.hazards == []
    rt.deallocate(x)  # no use recorded: nothing to wait for
    y = rt.allocate(200, a, "y")
    assert y.ptr == x.ptr
    launch(rt, a, [(y, W)], fenced=False, label="write of y")
    assert any(h.kind == "write-after-read" and "long read on b" in h.earlier
               for h in sim.hazards), sim.hazards


@pytest.mark.parametrize("fences", ["lazy", "eager"])
@pytest.mark.parametrize("call, skip", [("cuStreamWaitEvent", 0), ("cuStreamWaitEvent", 1),
                                        ("cuMemFreeAsync", 0)])
def test_deallocate_failure_part_way_leaves_the_block_live(sim, fences, call, skip):
    res = AsyncResource(sim, fences=fences)
    rt = DeviceRuntime(res)
    a, b, c = (sim.create_stream() for _ in range(3))
    x = rt.allocate(1000, a, "x")
    keep = rt.allocate(256, b, "keep")
    launch(rt, b, [(x, R), (keep, W)])
    launch(rt, c, [(x, R)])
    # Eager marks are sealed already, so even the event figures must not move;
    # a lazy mark may be sealed by the failing call (its users still hold it).
    eager = fences == "eager"
    before = snapshot(res, x, keep, events=eager)
    sim.inject_failure(call, 999, skip=skip)
    with pytest.raises(DriverError) as info:
        rt.deallocate(x)
    assert info.value.call == call and info.value.code == 999
    assert x.state is BlockState.LIVE and res.find(x.ptr) is x
    assert snapshot(res, x, keep, events=eager) == before
    assert res.pending_per_stream() == {} and res.pending_bytes == 0
    rt.deallocate(x)  # the retry
    assert x.state is BlockState.FREED
    assert res.live_bytes == 256 and res.pending_bytes == 1000
    with pytest.raises(UseAfterFree):
        res.block_events(x)
    y = rt.allocate(1000, a, "y")
    assert y.ptr == x.ptr
    launch(rt, a, [(y, W)])
    assert sim.hazards == []


# ----------------------------------------------------------- 6. non-tracking
def _refuses_tracking(res, block, stream):
    assert res.supports_tracking() is False
    for call in (lambda: res.preflight([(block, R)], stream),
                 lambda: res.commit([(block, W)], stream),
                 lambda: res.preflight([(block, R)], stream),
                 lambda: res.commit([(block, W)], stream)):
        with pytest.raises(StreamMisuse, match="does not track.*AsyncResource"):
            call()


@pytest.mark.parametrize("wrap", [None, "logging", "budget"])
def test_non_tracking_stacks_refuse_tracking_calls(sim, wrap):
    direct = DirectResource(sim)
    res = {None: direct, "logging": LoggingResource(direct),
           "budget": BudgetResource(direct, 1 << 20)}[wrap]
    s = sim.create_stream()
    x = res.allocate(256, s, "x")
    before = accounting(res)
    _refuses_tracking(res, x, s)
    assert accounting(res) == before
    # A runtime over it refuses at preflight, before the launch.
    rt = DeviceRuntime(res)
    rec = LaunchRecorder(rt, s)
    rec.read(x)
    with pytest.raises(StreamMisuse, match="does not track"):
        rec.preflight()
    rec.abandon()
    res.deallocate(x)
    assert res.bytes_outstanding() == 0


@pytest.mark.parametrize("wrap", ["logging", "budget"])
def test_decorators_forward_tracking_calls(sim, wrap):
    inner = AsyncResource(sim)
    res = LoggingResource(inner) if wrap == "logging" else BudgetResource(inner, 1 << 20)
    assert res.supports_tracking() is True
    a, b = sim.create_stream(), sim.create_stream()
    x = res.allocate(256, a, "x")
    assert use(res, sim, x, b, R) == 1
    assert set(inner.block_events(x)[1]) == {b}
    assert use(res, sim, x, a, W) == 1
    assert inner.block_events(x)[0].stream == a and inner.block_events(x)[1] == {}
    assert res.tracker is inner  # diagnostics reach through the tracker
    assert sim.hazards == []


# ------------------------------------------------------------ LoggingResource
def _alloc_records(caplog):
    return [r for r in caplog.records if r.name == "numba_streamsafe.alloc"]


def test_logging_resource_one_record_per_allocate_free_and_error(sim, caplog):
    caplog.set_level(logging.DEBUG, logger="numba_streamsafe.alloc")
    res = LoggingResource(AsyncResource(sim))
    s = sim.create_stream()

    x = res.allocate(300, s, "alpha")
    (rec,) = _alloc_records(caplog)
    assert rec.levelno == logging.DEBUG and "allocate" in rec.getMessage()
    assert (rec.tag, rec.nbytes, rec.stream, rec.generation, rec.ptr) == (
        "alpha", 300, s, x.generation, x.ptr)
    caplog.clear()

    res.deallocate(x)
    (rec,) = _alloc_records(caplog)
    assert rec.levelno == logging.DEBUG and rec.getMessage().startswith("free")
    assert (rec.tag, rec.nbytes, rec.stream, rec.generation) == ("alpha", 300, s, x.generation)
    caplog.clear()

    with pytest.raises(UseAfterFree):
        res.deallocate(x)
    (rec,) = _alloc_records(caplog)
    assert rec.levelno == logging.ERROR and "failed" in rec.getMessage()
    assert (rec.tag, rec.nbytes, rec.generation) == ("alpha", 300, x.generation)
    caplog.clear()

    with pytest.raises(InvalidArgument):
        res.allocate(0, s, "zero")
    (rec,) = _alloc_records(caplog)
    assert rec.levelno == logging.ERROR
    assert (rec.tag, rec.nbytes, rec.stream, rec.generation) == ("zero", 0, s, None)


def test_logging_resource_level_and_logger(sim, caplog):
    logger = logging.getLogger("tests.core.alloc")
    caplog.set_level(logging.INFO, logger="tests.core.alloc")
    res = LoggingResource(AsyncResource(sim), logger=logger, level=logging.INFO)
    res.deallocate(res.allocate(64, 0, "t"))
    recs = [r for r in caplog.records if r.name == "tests.core.alloc"]
    assert [r.levelno for r in recs] == [logging.INFO, logging.INFO]


def test_logging_resource_logs_finalizer_frees_at_the_next_safe_point(sim, caplog):
    caplog.set_level(logging.DEBUG, logger="numba_streamsafe.alloc")
    res = LoggingResource(AsyncResource(sim))
    s = sim.create_stream()
    x, y, z = (res.allocate(256, s, tag) for tag in ("x", "y", "z"))
    caplog.clear()

    res.defer_free(x)  # what a finalizer calls: no record, no driver call, still live
    assert _alloc_records(caplog) == [] and res.find(x.ptr) is x
    res.allocate(64, s, "next")  # a safe point: x is freed and logged first
    (rec, after) = _alloc_records(caplog)
    assert rec.getMessage().startswith("free (finalizer)") and rec.tag == "x"
    assert after.getMessage().startswith("allocate") and res.find(x.ptr) is not x
    caplog.clear()

    with res.hold_frees():  # Numba's defer_cleanup: queued frees wait
        res.defer_free(y)
        res.flush()
        assert res.find(y.ptr) is y and _alloc_records(caplog) == []
    res.reap_pending()
    (rec,) = _alloc_records(caplog)
    assert rec.tag == "y" and res.find(y.ptr) is not y
    caplog.clear()

    res.deallocate(z)  # freed explicitly, then its finalizer runs: dropped quietly
    caplog.clear()
    res.defer_free(z)
    res.flush()
    assert _alloc_records(caplog) == []
    res.reap_pending()
    assert res.bytes_outstanding() == 64
    assert sim.hazards == []


# ------------------------------------------------------------- BudgetResource
def test_budget_refuses_with_requested_and_remaining(sim):
    res = BudgetResource(AsyncResource(sim), 1000)
    s = sim.create_stream()
    x = res.allocate(600, s, "x")
    assert res.remaining == 400
    before, driver_calls = snapshot(res, x), calls(sim)
    with pytest.raises(OutOfBudget, match="budget of 1000.*Free blocks first") as info:
        res.allocate(500, s, "too big")
    assert (info.value.requested, info.value.remaining, info.value.limit) == (500, 400, 1000)
    assert snapshot(res, x) == before
    assert calls(sim)["cuMemAllocAsync"] == driver_calls["cuMemAllocAsync"]
    res.allocate(400, s, "fits")
    assert res.remaining == 0


def test_budget_reaps_before_refusing(sim):
    res = BudgetResource(AsyncResource(sim), 1000)
    s = sim.create_stream()
    res.deallocate(res.allocate(600, s, "x"))
    assert res.bytes_outstanding() == 600 and res.tracker.pending_bytes == 600
    syncs = sim.calls["cuStreamSynchronize"]
    y = res.allocate(600, s, "y")  # only fits once the queued free is reaped
    assert sim.calls["cuStreamSynchronize"] == syncs + 1
    assert res.tracker.pending_bytes == 0 and res.bytes_outstanding() == 600
    res.deallocate(y)
    with pytest.raises(OutOfBudget) as info:
        res.allocate(1001, s, "never fits")
    assert info.value.remaining == 1000, "remaining is counted after the reap"


def test_budget_limit_must_be_positive(sim):
    with pytest.raises(InvalidArgument, match="positive"):
        BudgetResource(AsyncResource(sim), 0)


# ---------------------------------------------------------------- 7. recorder
def test_recorder_merges_registrations_of_one_block(rt, res, sim, two_streams):
    a, b = two_streams
    x = rt.allocate(256, a, "x")
    y = rt.allocate(256, a, "y")
    alias = Block(x.ptr, x.nbytes, x.device, x.stream, "alias of x", x.generation)
    rec = LaunchRecorder(rt, b)
    rec.read(x)
    rec.write(alias)  # same (ptr, generation, device)
    rec.read(y)
    rec.use(y, "r")
    assert sorted((blk.ptr, acc) for blk, acc in rec.uses) == sorted([(x.ptr, RW), (y.ptr, R)])
    waits = sim.calls["cuStreamWaitEvent"]
    rec.preflight()
    assert sim.calls["cuStreamWaitEvent"] - waits == 1, "x and y share one allocation mark on a"
    sim.trace_access(b, [(x.ptr, 256, RW), (y.ptr, 256, R)], "k")
    rec.commit()
    assert res.block_events(x)[0].stream == b and res.block_events(x)[1] == {}
    assert set(res.block_events(y)[1]) == {b}
    assert sim.hazards == []


def test_recorder_registration_after_preflight_is_stream_misuse(rt, res, sim, two_streams):
    a, b = two_streams
    x = rt.allocate(256, a, "x")
    y = rt.allocate(256, a, "y")
    rec = LaunchRecorder(rt, b)
    rec.read(x)
    rec.preflight()
    before, driver_calls = snapshot(res, x, y), calls(sim)
    with pytest.raises(StreamMisuse, match="after preflight.*before calling preflight"):
        rec.write(y, "output")
    with pytest.raises(StreamMisuse, match="after preflight"):
        rec.wait_for_stream(a)
    with pytest.raises(StreamMisuse, match="already called"):
        rec.preflight()
    assert [(blk, acc) for blk, acc in rec.uses] == [(x, R)]
    assert snapshot(res, x, y) == before and calls(sim) == driver_calls
    rec.commit()
    with pytest.raises(StreamMisuse, match="already called"):
        rec.commit()


def test_commit_without_preflight_is_stream_misuse(rt, res, sim, two_streams):
    a, b = two_streams
    x = rt.allocate(256, a, "x")
    rec = LaunchRecorder(rt, b)
    rec.write(x)
    before, driver_calls = snapshot(res, x), calls(sim)
    with pytest.raises(StreamMisuse, match=r"without preflight\(\).*Call preflight\(\)"):
        rec.commit()
    assert snapshot(res, x) == before and calls(sim) == driver_calls
    rec.preflight()
    rec.commit()
    assert res.block_events(x)[0].stream == b
    empty = LaunchRecorder(rt, b)
    empty.commit()  # nothing registered: nothing to order


def test_strict_recorder_refuses_untracked_memory_at_preflight(rt, res, sim, two_streams):
    a, b = two_streams
    x = rt.allocate(256, a, "x")
    rec = LaunchRecorder(rt, b)
    assert rec.mode is RecorderMode.STRICT
    rec.read(x)
    rec.write(None, "foreign output")  # accepted until preflight
    before, driver_calls = snapshot(res, x), calls(sim)
    with pytest.raises(StreamMisuse, match="foreign output.*strict mode.*Allocate it"):
        rec.preflight()
    assert snapshot(res, x) == before and calls(sim) == driver_calls
    rec.abandon()


@pytest.mark.parametrize("where", ["recorder", "runtime"])
def test_permissive_recorder_skips_untracked_memory(res, sim, two_streams, where):
    a, b = two_streams
    if where == "runtime":
        rt = DeviceRuntime(res, mode="permissive")
        rec = LaunchRecorder(rt, b)
    else:
        rt = DeviceRuntime(res)
        rec = LaunchRecorder(rt, b, mode="permissive")
    assert rec.mode is RecorderMode.PERMISSIVE
    x = rt.allocate(256, a, "x")
    rec.read(x)
    rec.write(None, "foreign output")
    waits = sim.calls["cuStreamWaitEvent"]
    rec.preflight()
    assert sim.calls["cuStreamWaitEvent"] - waits == 1, "the tracked block is still ordered"
    sim.trace_access(b, [(x.ptr, 256, R)], "k")
    rec.commit()
    assert set(res.block_events(x)[1]) == {b}
    assert sim.hazards == []


def test_dropping_an_uncommitted_recorder_warns(rt, two_streams):
    a, b = two_streams
    x = rt.allocate(256, a, "x")
    with pytest.warns(UncommittedLaunchWarning, match="1 use.*without commit"):
        rec = LaunchRecorder(rt, b)
        rec.read(x)
        rec.preflight()
        del rec
        gc.collect()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        done = LaunchRecorder(rt, b)
        done.read(x)
        done.preflight()
        done.commit()
        dropped = LaunchRecorder(rt, b)
        dropped.read(x)
        dropped.abandon()
        empty = LaunchRecorder(rt, b)
        del done, dropped, empty
        gc.collect()
    assert not [w for w in seen if issubclass(w.category, UncommittedLaunchWarning)]


def test_a_non_tracking_resource_the_environment_chose_says_so(sim, monkeypatch):
    """Chosen by ``NUMBA_STREAMSAFE_RESOURCE=direct``, the refusal names the
    variable and the two ways out, not a runtime the user never built."""
    from numba_streamsafe.core.settings import reload_settings

    res = DirectResource(sim)
    s = sim.create_stream()
    block = res.allocate(256, s, "x")
    monkeypatch.setenv("NUMBA_STREAMSAFE_RESOURCE", "direct")
    reload_settings()
    try:
        with pytest.raises(StreamMisuse, match=r"NUMBA_STREAMSAFE_RESOURCE=direct chose it.*"
                                               r"unset it.*tracking\(False\)") as info:
            res.preflight([(block, R)], s)
        assert "build the runtime" not in str(info.value)
    finally:
        monkeypatch.delenv("NUMBA_STREAMSAFE_RESOURCE")
        reload_settings()
    res.deallocate(block)
