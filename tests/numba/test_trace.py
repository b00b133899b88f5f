"""``numba_streamsafe.trace``, its Chrome trace export and plot, and
``memory_stats`` on the simulated driver.

The waits of a known program are checked exactly: every wait the trace
reports must be one the program needs (with the right reason), and every
needed one must be there. The simulated driver's own count of
``cuStreamWaitEvent`` calls must match the trace's inserted waits.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from numba import cuda

import numba_streamsafe as nss
from numba_streamsafe import Read, ReadWrite, StreamMisuse, Write, tracked_kernel
from numba_streamsafe.diagnostics.memstats import STAT_KEYS

N = 64
GRID, BLOCK = 2, 32


@tracked_kernel
def fill(out: Write, value):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = value


@tracked_kernel
def add(src: Read, dst: Write, k):
    i = cuda.grid(1)
    if i < src.size:
        dst[i] = src[i] + k


@tracked_kernel
def bump(x: ReadWrite):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1


def _program(a, b):
    """x filled on a; y = x + 1 on b (waits for fill); x bumped on a (waits
    for b's read of x); y read back on b (same stream as its writer)."""
    x = nss.device_array(N, np.int64, stream=a)
    y = nss.device_array(N, np.int64, stream=b)
    fill[GRID, BLOCK, a](x, 3)
    add[GRID, BLOCK, b](x, y, 1)
    bump[GRID, BLOCK, a](x)
    out = nss.copy_to_host(y, stream=b)
    return x, y, out


def _key(w):
    return (w.label, w.param, w.after_label, w.after_param, w.hazard)


def test_the_waits_and_their_reasons_are_exactly_the_needed_ones(rt, streams):
    a, b = streams
    ha, hb = rt.stream_handle(a), rt.stream_handle(b)
    waits_before = rt.driver.calls["cuStreamWaitEvent"]
    with nss.trace() as t:
        x, y, out = _program(a, b)
    np.testing.assert_array_equal(out, np.full(N, 4))
    assert not rt.driver.hazards

    inserted = t.inserted_waits()
    assert sorted(_key(w) for w in inserted) == sorted([
        # add reads x on b: x's last write (fill) was on a
        ("add", "src", "fill", "out", "read-after-write"),
        # bump writes x on a: b read it (add)
        ("bump", "x", "add", "src", "write-after-read"),
    ]), inserted
    by_label = {w.label: w for w in inserted}
    assert (by_label["add"].stream, by_label["add"].on_stream) == (hb, ha)
    assert (by_label["bump"].stream, by_label["bump"].on_stream) == (ha, hb)
    # The driver queued exactly the waits the trace reports.
    assert rt.driver.calls["cuStreamWaitEvent"] - waits_before == len(inserted)

    same = {(w.label, w.param, w.after_label) for w in t.waits if w.same_stream}
    assert ("add", "dst", "allocation") in same      # y allocated on b, written on b
    assert ("fill", "out", "allocation") in same     # x allocated on a, written on a
    assert ("bump", "x", "fill") in same             # bump's write after fill, both on a
    assert ("copy to host", "array", "add") in same  # y read back on b after add on b

    ops = [(op.kind, op.label) for op in t.ops]
    assert ops == [("launch", "fill"), ("launch", "add"), ("launch", "bump"),
                   ("copy", "copy to host")]
    assert [m.what for m in t.memory[:2]] == ["alloc", "alloc"]
    # One event recorded per wait (lazy fences seal a mark when it is first waited for).
    assert len(t.events) == len(inserted)
    assert {e.stream for e in t.events} == {ha, hb}


def test_a_second_wait_on_the_same_point_is_reported_as_covered(rt, streams):
    a, b = streams
    x = nss.device_array(N, np.int64, stream=a)
    z = nss.device_array(N, np.int64, stream=a)
    y = nss.device_array(N, np.int64, stream=b)
    fill[GRID, BLOCK, a](x, 1)
    fill[GRID, BLOCK, a](z, 2)
    with nss.trace() as t:
        add[GRID, BLOCK, b](x, y, 1)   # waits for a (fill x, fill z: one mark)
        add[GRID, BLOCK, b](z, y, 1)   # z's fill is in the mark b already waited for
    keys = [(w.label, w.param, w.after_label, w.inserted) for w in t.waits if not w.same_stream]
    assert keys == [("add", "src", "(before the trace)", True),
                    ("add", "src", "(before the trace)", False)], keys
    assert t.summary()["waits_inserted"] == 1
    assert t.summary()["waits_covered"] == 1
    assert not rt.driver.hazards


def test_untracked_launches_are_recorded_without_waits(rt, streams):
    a, b = streams
    x = nss.device_array(N, np.int64, stream=a)
    y = nss.device_array(N, np.int64, stream=b)
    with nss.trace() as t, nss.tracking(False):
        fill[GRID, BLOCK, a](x, 1)
        add[GRID, BLOCK, b](x, y, 1)
    assert [op.tracked for op in t.ops] == [False, False]
    assert t.waits == []
    assert rt.driver.hazards  # the negative control: the race is there


def test_frees_are_recorded_with_the_counters(rt, streams):
    a, b = streams
    with nss.trace() as t:
        x = nss.device_array(N, np.int64, stream=a)
        fill[GRID, BLOCK, a](x, 1)
        y = nss.device_array(N, np.int64, stream=b)
        add[GRID, BLOCK, b](x, y, 1)
        del x
        nss.get_runtime(0).flush()
    kinds = [m.what for m in t.memory]
    assert kinds[:2] == ["alloc", "alloc"]
    assert set(kinds[2:]) <= {"deferred", "free", "kept"} and any(
        k in ("free", "kept") for k in kinds[2:]), kinds
    last = t.memory[-1]
    assert last.live_bytes == N * 8  # y is live
    del y


def test_save_writes_valid_chrome_trace_json(rt, streams, tmp_path):
    a, b = streams
    with nss.trace() as t:
        _program(a, b)
    path = tmp_path / "run.json"
    t.save(str(path))
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    assert events
    required = {"X": {"name", "ts", "dur", "pid", "tid"}, "i": {"name", "ts", "pid", "tid", "s"},
                "s": {"id", "ts", "pid", "tid"}, "f": {"id", "ts", "pid", "tid", "bp"},
                "C": {"name", "ts", "pid", "args"}, "M": {"name", "pid", "args"}}
    for e in events:
        assert e["ph"] in required, e
        missing = required[e["ph"]] - set(e)
        assert not missing, (e, missing)
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
    starts = [e for e in events if e["ph"] == "s"]
    ends = [e for e in events if e["ph"] == "f"]
    assert len(starts) == len(ends) == 2  # one flow arrow per inserted wait
    assert {e["id"] for e in starts} == {e["id"] for e in ends}
    lanes = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert len(lanes) == 2  # one lane per stream
    counters = [e for e in events if e["ph"] == "C"]
    assert counters and all({"live_bytes", "pending_bytes"} <= set(e["args"]) for e in counters)
    assert doc["otherData"]["summary"]["waits_inserted"] == 2


def test_plot_draws_the_timeline(rt, streams, tmp_path):
    pytest.importorskip("matplotlib")
    a, b = streams
    with nss.trace() as t:
        _program(a, b)
    path = tmp_path / "run.png"
    fig = t.plot(str(path))
    assert path.stat().st_size > 10_000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    arrows = [c for c in fig.axes[0].texts if getattr(c, "arrow_patch", None) is not None]
    assert len(arrows) == 2


def test_traces_do_not_nest_and_the_slot_is_cleared(rt):
    from numba_streamsafe.core import tracehook

    with nss.trace() as t:
        # One slot: the trace, its engine log and the launch switch change together.
        assert tracehook.active is t and tracehook.current_log() is not None
        assert tracehook.keep_names
        with pytest.raises(StreamMisuse, match="already recording"), nss.trace():
            pass
    assert tracehook.active is None and tracehook.current_log() is None
    assert tracehook.launches_direct()
    with pytest.raises(RuntimeError), nss.trace(nvtx=True):
        assert not tracehook.launches_direct()
        raise RuntimeError("boom")
    assert tracehook.active is None and tracehook.current_log() is None
    assert tracehook.launches_direct()


def test_a_trace_records_one_block(rt, streams):
    a, b = streams
    t = nss.trace()
    with t as entered:
        _program(a, b)
    assert entered is t and t.ops
    recorded = len(t.ops)
    with pytest.raises(StreamMisuse, match="recorded already"), t:
        _program(a, b)
    assert len(t.ops) == recorded  # nothing more was recorded


def test_device_times_fall_back_to_host_times_on_the_simulator(rt, streams):
    a, b = streams
    with nss.trace(device_times=True) as t:
        _program(a, b)
    assert not t.device_times_measured
    assert all(op.device_t0 is None for op in t.ops)
    assert all(op.t1 >= op.t0 for op in t.ops)


def test_nvtx_ranges_wrap_each_operation(rt, streams, monkeypatch):
    ranges = []

    class FakeNvtx:
        @staticmethod
        def push_range(name):
            ranges.append(("push", name))

        @staticmethod
        def pop_range():
            ranges.append(("pop", None))

    monkeypatch.setattr("numba_streamsafe.diagnostics.tracing._load_nvtx", lambda: FakeNvtx)
    a, b = streams
    with nss.trace(nvtx=True, record=False) as t:
        _program(a, b)
    assert t.ops == []
    assert [n for kind, n in ranges if kind == "push"] == ["fill", "add", "bump", "copy to host"]
    assert [k for k, _ in ranges] == ["push", "pop"] * 4


# ------------------------------------------------------------- memory_stats
def test_memory_stats_keys_and_values(rt, streams):
    a, b = streams
    stats = nss.memory_stats()
    assert set(stats) == set(STAT_KEYS)
    assert stats["upstream"] == "cuMemAllocAsync"
    x = nss.device_array(N, np.int64, stream=a)
    y = nss.device_array(2 * N, np.int64, stream=b)
    fill[GRID, BLOCK, a](x, 1)
    add[GRID, BLOCK, b](x, y, 1)
    s = nss.memory_stats()
    assert s["allocated_bytes.all.current"] == 3 * N * 8
    assert s["allocated_bytes.all.peak"] == 3 * N * 8
    assert s["allocation.all.current"] == 2
    assert s["allocation.all.allocated"] == 2
    assert s["waits_inserted"] == 1           # add on b waits for fill on a
    assert s["events_recorded"] == 1
    assert s["same_stream_uses"] == 2         # fill's x on a, add's y on b
    assert s["reserved_bytes.all.current"] >= 3 * N * 8
    assert s["pool_used_bytes.current"] >= 3 * N * 8
    del y
    rt.flush()
    s = nss.memory_stats()
    assert s["allocated_bytes.all.current"] == N * 8
    assert s["allocated_bytes.all.peak"] == 3 * N * 8
    assert s["allocated_bytes.all.freed"] == 2 * N * 8
    assert s["allocation.all.freed"] == 1
    assert s["pending_bytes.current"] + s["kept_bytes.current"] == 2 * N * 8
    del x


def test_memory_stats_name_the_direct_resources_allocator(rt):
    from numba_streamsafe._driver.sim import SimDriver
    from numba_streamsafe.resources import DirectResource
    from numba_streamsafe.runtime import DeviceRuntime, set_runtime

    previous = set_runtime(DeviceRuntime(DirectResource(SimDriver())), 0)
    try:
        assert nss.memory_stats()["upstream"] == "cuMemAlloc (untracked)"
    finally:
        set_runtime(previous, 0)


def test_reset_peak_stats_starts_the_peaks_from_now(rt, streams):
    a, _ = streams
    x = nss.device_array(4 * N, np.int64, stream=a)
    del x
    rt.flush()
    rt.reap()
    rt.trim()
    before = nss.memory_stats()
    assert before["allocated_bytes.all.peak"] == 4 * N * 8
    assert before["reserved_bytes.all.peak"] >= 4 * N * 8
    nss.reset_peak_stats()
    after = nss.memory_stats()
    assert after["allocated_bytes.all.peak"] == after["allocated_bytes.all.current"] == 0
    assert after["reserved_bytes.all.peak"] == after["reserved_bytes.all.current"]
    y = nss.device_array(N, np.int64, stream=a)
    assert nss.memory_stats()["allocated_bytes.all.peak"] == N * 8
    del y


def test_waits_of_frees_inside_a_launch_are_not_counted_as_the_launchs(rt, streams):
    """A free drained at a launch's preflight waits for other streams' uses;
    those waits are the free's, not the launch's: here the free of x (read on
    b) makes a wait for b's work, which then also covers the launch's uses of
    w1 and w2 (written on b), so the launch itself queues no wait."""
    a, b = streams
    w1 = nss.device_array(N, np.int64, stream=b)
    w2 = nss.device_array(N, np.int64, stream=b)
    x = nss.device_array(N, np.int64, stream=a)
    fill[GRID, BLOCK, b](w1, 1)
    fill[GRID, BLOCK, b](w2, 1)
    fill[GRID, BLOCK, a](x, 1)
    add[GRID, BLOCK, b](x, w2, 0)          # b reads x (and writes w2)
    with nss.trace() as t:
        before = rt.driver.calls["cuStreamWaitEvent"]
        del x                              # queued; drained by the next launch's preflight
        add[GRID, BLOCK, a](w1, w2, 1)     # on a: after b's writes of w1 and w2
        driver_waits = rt.driver.calls["cuStreamWaitEvent"] - before
    assert not rt.driver.hazards
    assert driver_waits == 1, driver_waits  # the free's wait, which also orders the launch
    assert t.inserted_waits() == [], t.inserted_waits()
    covered = [(w.param, w.on_stream) for w in t.waits if not w.same_stream]
    hb = rt.stream_handle(b)
    assert sorted(covered) == [("dst", hb), ("src", hb)], covered
    del w1, w2
