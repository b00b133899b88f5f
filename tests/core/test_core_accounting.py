"""Accounting under failure, bounded tracking state, one event per launch, out of memory.

docs/architecture.md section 4 item 5 and section 5 (bounded state, one event per
launch, out of memory).
"""

from __future__ import annotations

import pytest

from numba_streamsafe import (
    Access,
    AsyncResource,
    DeviceRuntime,
    DriverError,
    OutOfMemory,
    StreamSafeError,
)
from numba_streamsafe._driver.base import CUDA_ERROR_OUT_OF_MEMORY
from numba_streamsafe._driver.sim import SimDriver
from numba_streamsafe.diagnostics.recorder import LaunchRecorder
from tests.helpers.programs import launch, snapshot

R, W, RW = Access.READ, Access.WRITE, Access.READ_WRITE


# ------------------------------------------------------------------ 2. reap
def _queue_frees(rt, streams, sizes):
    for s, n in zip(streams, sizes, strict=True):
        rt.deallocate(rt.allocate(n, s, f"free on {s:#x}"))


def test_bytes_outstanding_is_live_plus_pending(rt, res, four_streams):
    a, b, c, d = four_streams
    live = [rt.allocate(n, s) for n, s in ((100, a), (200, b))]
    _queue_frees(rt, (a, a, c), (1000, 24, 500))
    assert res.live_bytes == 300 and res.pending_bytes == 1524
    assert res.pending_per_stream() == {a: 1024, c: 500}
    assert rt.bytes_outstanding() == 1824 == rt.stats().outstanding_bytes
    rt.reap()
    assert rt.bytes_outstanding() == 300 and res.pending_per_stream() == {}
    for blk in live:
        rt.deallocate(blk)
    rt.reap()
    assert rt.bytes_outstanding() == 0


def test_reap_failure_releases_only_what_it_synchronised(rt, res, sim, four_streams):
    sizes = dict(zip(four_streams, (256, 512, 1024, 2048), strict=True))
    keep = rt.allocate(4000, four_streams[0], "keep")
    _queue_frees(rt, sizes, sizes.values())
    total = sum(sizes.values())
    assert res.pending_bytes == total == sum(res.pending_per_stream().values())
    sim.inject_failure("cuStreamSynchronize", 700, skip=1)
    with pytest.raises(DriverError) as info:
        rt.reap()
    assert info.value.call == "cuStreamSynchronize" and info.value.code == 700
    per_stream = res.pending_per_stream()
    assert res.pending_bytes == sum(per_stream.values())
    released = total - res.pending_bytes
    assert 0 < released < total
    synced = [s for s in sizes if s not in per_stream]
    assert len(synced) == 1 and sizes[synced[0]] == released, "exactly the synchronised stream"
    assert all(per_stream[s] == sizes[s] for s in per_stream), "the others restored whole"
    assert rt.bytes_outstanding() == res.live_bytes + res.pending_bytes == 4000 + total - released
    rt.reap()
    assert res.pending_bytes == 0 and res.pending_per_stream() == {}
    assert rt.bytes_outstanding() == keep.nbytes


def test_reap_failure_on_the_first_stream_releases_nothing(rt, res, sim, four_streams):
    _queue_frees(rt, four_streams, (256, 256, 256, 256))
    before = res.pending_per_stream()
    sim.inject_failure("cuStreamSynchronize")
    with pytest.raises(DriverError):
        rt.reap()
    assert res.pending_per_stream() == before and res.pending_bytes == 1024
    rt.reap()
    assert rt.bytes_outstanding() == 0


# --------------------------------------------------------- 3. bounded state
@pytest.mark.parametrize("fences", ["lazy", "eager"])
def test_reads_keep_at_most_one_event_per_stream(sim, fences):
    res = AsyncResource(sim, fences=fences)
    streams = [sim.create_stream() for _ in range(4)]
    x = res.allocate(256, streams[0], "x")
    records = sim.calls["cuEventRecord"]
    peak = 0
    for i in range(100_000):
        res.commit([(x, R)], streams[i % 4])
        if res.events.in_use > peak:
            peak = res.events.in_use
    last_write, reads = res.block_events(x)
    assert set(reads) == set(streams) and len(reads) <= 4
    assert last_write.stream == streams[0]
    assert peak <= 5, "one read event per stream plus the last write"
    assert sim.live_events <= 6, "events are recycled through the pool, not created per read"
    if fences == "eager":  # every read really recorded an event, and they were given back
        assert sim.calls["cuEventRecord"] - records == 100_000
    res.deallocate(x)
    assert res.events.in_use == 0 and sim.live_events == res.events.idle


def test_launch_loop_state_stays_bounded(rt, res, sim, four_streams):
    """Full recorder steps: reads from four streams, a write now and then."""
    x = rt.allocate(256, four_streams[0], "x")
    y = rt.allocate(256, four_streams[1], "y")
    peak_events = peak_reads = 0
    for i in range(8_000):
        s = four_streams[i % 4]
        if i % 500 == 499:
            launch(rt, s, [(x, W), (y, R)])
        else:
            launch(rt, s, [(x, R), (y, R)])
        peak_events = max(peak_events, res.events.in_use)
        peak_reads = max(peak_reads, len(res.block_events(x)[1]), len(res.block_events(y)[1]))
    assert peak_reads <= 4
    assert peak_events <= 10
    assert sim.live_events <= 12
    assert sim.hazards == []


# ---------------------------------------------------- 4. one event per launch
def _three_blocks(rt, stream):
    return [rt.allocate(256, stream, f"x{i}") for i in range(3)]


def test_eager_commit_records_one_event_for_all_blocks(sim):
    res = AsyncResource(sim, fences="eager")
    rt = DeviceRuntime(res)
    a, b = sim.create_stream(), sim.create_stream()
    blocks = _three_blocks(rt, a)
    rec = LaunchRecorder(rt, a)
    for blk in blocks:
        rec.write(blk)
    rec.preflight()
    sim.trace_access(a, [(blk.ptr, blk.nbytes, W) for blk in blocks], "producer")
    records = sim.calls["cuEventRecord"]
    rec.commit()
    assert sim.calls["cuEventRecord"] - records == 1
    marks = {id(res.block_events(blk)[0]) for blk in blocks}
    assert len(marks) == 1, "the three blocks share the launch's mark"
    mark = res.block_events(blocks[0])[0]
    assert mark.refs == 3 and mark.handle is not None

    waits, records = sim.calls["cuStreamWaitEvent"], sim.calls["cuEventRecord"]
    launch(rt, b, [(blk, W) for blk in blocks], label="consumer")
    assert sim.calls["cuStreamWaitEvent"] - waits == 1, "one wait for the shared event"
    assert sim.calls["cuEventRecord"] - records == 1, "the consumer's own commit"
    assert mark.refs == 0 and mark.handle is None, "the producer's event went back to the pool"
    assert sim.hazards == []


def test_lazy_commit_records_the_shared_event_when_first_waited_for(rt, res, sim, two_streams):
    a, b = two_streams
    blocks = _three_blocks(rt, a)
    records = sim.calls["cuEventRecord"]
    launch(rt, a, [(blk, W) for blk in blocks], label="producer")
    assert sim.calls["cuEventRecord"] == records, "nothing to record until a stream must wait"
    waits = sim.calls["cuStreamWaitEvent"]
    rec = LaunchRecorder(rt, b)
    for blk in blocks:
        rec.write(blk)
    rec.preflight()
    assert sim.calls["cuEventRecord"] - records == 1
    assert sim.calls["cuStreamWaitEvent"] - waits == 1
    sim.trace_access(b, [(blk.ptr, blk.nbytes, W) for blk in blocks], "consumer")
    rec.commit()
    assert sim.calls["cuEventRecord"] - records == 1
    assert sim.hazards == []
    for blk in blocks:
        rt.deallocate(blk)
    assert res.events.in_use == 0


# -------------------------------------------------------------- 6. out of memory
@pytest.fixture
def small():
    sim = SimDriver(capacity=4096, backing=False)
    res = AsyncResource(sim)
    return sim, res, DeviceRuntime(res), sim.create_stream(), sim.create_stream()


def test_oom_is_retried_after_draining_reaping_and_trimming(small):
    sim, res, rt, a, b = small
    blocks = [rt.allocate(1024, a, f"fill{i}") for i in range(4)]
    launch(rt, b, [(blocks[0], R), (blocks[1], W)])
    assert sim.reserved_bytes == 4096
    rt.deallocate(blocks[0])
    rt.defer_free(blocks[1])  # as a finalizer would: queued, not yet freed
    assert res.pending_bytes == 1024 and res.live_bytes == 3072
    allocs, syncs, trims = (sim.calls[c] for c in
                            ("cuMemAllocAsync", "cuStreamSynchronize", "cuMemPoolTrimTo"))
    # b is not ordered after a's frees, so the pool cannot hand their chunks to
    # b: only the retry path (flush, reap, trim) makes room.
    x = rt.allocate(1024, b, "x")
    y = rt.allocate(1024, b, "y")
    assert blocks[1].state.value == "freed"
    assert sim.calls["cuMemAllocAsync"] - allocs == 3, "the first attempt failed and was retried"
    assert sim.calls["cuStreamSynchronize"] > syncs and sim.calls["cuMemPoolTrimTo"] > trims
    assert res.pending_bytes == 0 and res.live_bytes == 4096
    launch(rt, b, [(x, W), (y, W)])
    launch(rt, a, [(blocks[2], RW), (x, R)])
    assert sim.hazards == []


def test_oom_when_truly_full_raises_with_the_figures(small):
    sim, res, rt, a, b = small
    blocks = [rt.allocate(1024, a, f"fill{i}") for i in range(4)]
    before = snapshot(res, *blocks)
    with pytest.raises(OutOfMemory, match="1024 bytes.*4096 live and 0 pending.*Free arrays") as e:
        rt.allocate(1024, b, "one too many")
    assert isinstance(e.value, StreamSafeError) and not isinstance(e.value, DriverError)
    assert (e.value.requested, e.value.live, e.value.pending) == (1024, 4096, 0)
    assert snapshot(res, *blocks) == before
    rt.deallocate(blocks[0])
    rt.allocate(1024, a, "fits again")  # same stream: the pool reuses the freed chunk


def test_oom_reports_pending_bytes_when_the_reap_fails(small):
    sim, res, rt, a, b = small
    blocks = [rt.allocate(1024, a, f"fill{i}") for i in range(4)]
    rt.deallocate(blocks[0])
    before = snapshot(res, *blocks[1:])
    sim.inject_failure("cuStreamSynchronize")
    with pytest.raises(OutOfMemory) as e:
        rt.allocate(1024, b, "x")
    assert (e.value.requested, e.value.live, e.value.pending) == (1024, 3072, 1024)
    assert snapshot(res, *blocks[1:]) == before
    assert res.pending_per_stream() == {a: 1024}, "the failed reap kept the queued free"
    rt.allocate(1024, b, "x")  # the reap works now
    assert res.pending_bytes == 0


def test_other_driver_errors_are_not_retried(small):
    sim, res, rt, a, b = small
    keep = rt.allocate(256, a, "keep")
    before, allocs = snapshot(res, keep), sim.calls["cuMemAllocAsync"]
    sim.inject_failure("cuMemAllocAsync", 1)
    with pytest.raises(DriverError) as e:
        rt.allocate(256, a, "x")
    assert e.value.code == 1 and sim.calls["cuMemAllocAsync"] - allocs == 1
    assert snapshot(res, keep) == before
    sim.inject_failure("cuMemAllocAsync", CUDA_ERROR_OUT_OF_MEMORY, times=2)
    with pytest.raises(OutOfMemory):
        rt.allocate(256, a, "x")
    assert snapshot(res, keep) == before


def test_oom_trims_the_pool_again_before_raising(small):
    sim, res, rt, a, b = small
    blocks = [rt.allocate(1024, a, f"fill{i}") for i in range(4)]
    trims = sim.calls["cuMemPoolTrimTo"]
    with pytest.raises(OutOfMemory):
        rt.allocate(1024, b, "one too many")
    assert sim.calls["cuMemPoolTrimTo"] - trims == 2, "once before the retry, once before raising"
    sim.inject_failure("cuMemPoolTrimTo")
    sim.inject_failure("cuMemPoolTrimTo")
    with pytest.raises(OutOfMemory):  # a failing trim does not hide the out-of-memory
        rt.allocate(1024, b, "still too many")
    del blocks


# ------------------------------------------------------- bounded pending bytes
def test_idle_streams_release_their_pending_bytes_without_a_reap(rt, res, sim, four_streams):
    a, b, c, d = four_streams
    _queue_frees(rt, (a, b, c), (1000, 2000, 3000))
    res.reap_completed()
    assert res.pending_bytes == 6000, "nothing completed: the host observed no stream"
    sim.stream_synchronize(b)  # b is idle now, so its free has run
    res.reap_completed()
    assert res.pending_per_stream() == {a: 1000, c: 3000} and res.pending_bytes == 4000
    assert sim.calls["cuStreamSynchronize"] == 1, "reap_completed never blocks"


def test_allocations_reap_completed_streams_now_and_then(rt, res, sim, two_streams):
    a, b = two_streams
    for _ in range(200):
        rt.deallocate(rt.allocate(512, b))
        sim.stream_synchronize(b)
    assert res.pending_bytes <= 64 * 512, "pending bytes stay bounded with no explicit reap"


# ------------------------------------------------------ waits are never repeated
def test_a_stream_waits_for_a_mark_once(rt, res, sim, two_streams):
    a, b = two_streams
    x = rt.allocate(256, a, "x")
    launch(rt, a, [(x, W)])
    waits = sim.calls["cuStreamWaitEvent"]
    for _ in range(5):
        launch(rt, b, [(x, R)])
    assert sim.calls["cuStreamWaitEvent"] - waits == 1, "stream order covers the later reads"
    launch(rt, a, [(x, W)])
    launch(rt, b, [(x, R)])
    assert sim.calls["cuStreamWaitEvent"] - waits == 3, "a new write: b waits for it (a for b)"
    assert sim.hazards == []


def test_reap_forgets_marks_of_streams_no_block_uses(rt, res, sim):
    streams = [sim.create_stream() for _ in range(20)]
    for s in streams:
        rt.deallocate(rt.allocate(256, s))
    assert len(res.marks.open) >= 20
    rt.reap()
    assert res.marks.open == {}, "no per-stream state is left once nothing refers to a stream"


# ------------------------------------------------------- the pool's release threshold
def test_release_threshold_sets_the_pool_attribute(sim):
    from numba_streamsafe import POOL_KEEP_ALL, InvalidArgument
    from numba_streamsafe.runtime import default_stack

    AsyncResource(sim)
    assert "RELEASE_THRESHOLD" not in sim.pool_attributes  # None: the pool is left alone
    AsyncResource(sim, release_threshold=1 << 30)
    assert sim.pool_attributes["RELEASE_THRESHOLD"] == 1 << 30
    default_stack(sim)
    assert sim.pool_attributes["RELEASE_THRESHOLD"] == POOL_KEEP_ALL
    for bad in (-1, POOL_KEEP_ALL + 1, 1.5, True, "all"):
        with pytest.raises(InvalidArgument, match="release_threshold"):
            AsyncResource(sim, release_threshold=bad)
    assert sim.pool_attributes["RELEASE_THRESHOLD"] == POOL_KEEP_ALL


def test_trim_runs_queued_frees_and_hands_the_pool_back(rt, sim):
    free0, _ = sim.mem_info()
    s = sim.create_stream()
    blocks = [rt.allocate(1 << 20, 0, "kept"), rt.allocate(3 << 20, s, "queued")]
    rt.deallocate(blocks[0])  # kept for reuse on the default stream
    rt.defer_free(blocks[1])  # queued, as a finalizer would
    assert sim.mem_info()[0] < free0
    rt.trim(keep_bytes=0)
    assert rt.bytes_outstanding() == 0
    assert sim.mem_info()[0] == free0
    assert sim.calls["cuMemPoolTrimTo"] == 1
