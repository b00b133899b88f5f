"""CUDA graphs of tracked work (``numba_streamsafe.graph``) on the simulated
driver: replays compute what the eager launches compute, a replay is ordered
against outside work both ways (and races without the ordering: the negative
control), new inputs go in by tracked copies, and what a capture cannot hold
is refused."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
from numba import cuda

import numba_streamsafe as nss
from numba_streamsafe import GraphCaptureError, Read, ReadWrite, Write, tracked_kernel

N = 64


@tracked_kernel
def fill(out: Write, value):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = value


@tracked_kernel
def axpy(x: Read, y: ReadWrite, a):
    i = cuda.grid(1)
    if i < y.size:
        y[i] = a * x[i] + y[i]


@tracked_kernel
def copy(src: Read, dst: Write):
    i = cuda.grid(1)
    if i < dst.size:
        dst[i] = src[i]


def _host(x):
    return nss.copy_to_host(x, stream=0)


def test_a_replay_computes_what_the_eager_launches_compute(rt, streams):
    s, _ = streams
    x = nss.to_device(np.arange(N, dtype=np.float64), stream=s)
    y = nss.device_array(N, np.float64, stream=s)
    z = nss.device_array(N, np.float64, stream=s)
    fill[2, 32, s](y, 1.0)
    with nss.graph(s) as g:
        axpy[2, 32, s](x, y, 2.0)
        copy[2, 32, s](y, z)
    assert g.operations == 2 and len(g.uses) == 3
    # Nothing ran while capturing.
    np.testing.assert_array_equal(_host(y), np.ones(N))
    for k in range(1, 4):
        g.launch()
        np.testing.assert_array_equal(_host(z), 1.0 + 2.0 * k * np.arange(N))
    assert g.replays == 3
    assert rt.driver.hazards == []


def test_a_replay_is_ordered_after_and_before_outside_work(rt, streams):
    s, t = streams
    x = nss.device_array(N, np.float64, stream=s)
    y = nss.device_array(N, np.float64, stream=s)
    fill[2, 32, s](y, 0.0)
    with nss.graph(s) as g:
        axpy[2, 32, s](x, y, 1.0)
    waits = rt.resource.marks.waits
    fill[2, 32, t](x, 5.0)          # the replay reads x: it must wait for this
    g.launch()
    copy[2, 32, t](y, x)            # reads what the replay wrote: waits for it
    assert rt.resource.marks.waits >= waits + 2
    np.testing.assert_array_equal(_host(x), np.full(N, 5.0))
    assert rt.driver.hazards == []


def test_without_the_ordering_a_replay_races(rt, streams):
    """The negative control: the same program with tracking off."""
    s, t = streams
    x = nss.device_array(N, np.float64, stream=s)
    y = nss.device_array(N, np.float64, stream=s)
    fill[2, 32, s](y, 0.0)
    with nss.graph(s) as g:
        axpy[2, 32, s](x, y, 1.0)
    with nss.tracking(False):
        fill[2, 32, t](x, 5.0)
        g.launch()
    kinds = {h.kind for h in rt.driver.hazards}
    assert "read-after-write" in kinds


def test_new_inputs_by_a_tracked_copy(rt, streams):
    s, t = streams
    x = nss.device_array(N, np.float64, stream=s)
    out = nss.device_array(N, np.float64, stream=s)
    with nss.graph(s) as g:
        copy[2, 32, s](x, out)
    for k in range(3):
        nss.to_device(np.full(N, float(k)), stream=t, to=x)   # on another stream
        g.launch()
        np.testing.assert_array_equal(_host(out), np.full(N, float(k)))
    assert rt.driver.hazards == []


def test_a_replay_on_another_stream(rt, streams):
    s, t = streams
    x = nss.device_array(N, np.float64, stream=s)
    with nss.graph(s) as g:
        fill[2, 32, s](x, 3.0)
    g.launch(t)
    copy_out = nss.device_array(N, np.float64, stream=t)
    copy[2, 32, t](x, copy_out)
    np.testing.assert_array_equal(_host(copy_out), np.full(N, 3.0))
    assert rt.driver.hazards == []


def test_allocations_in_a_capture_are_refused(rt, streams):
    s, t = streams
    x = nss.device_array(N, np.float64, stream=s)
    with pytest.raises(GraphCaptureError, match="holds no allocations"), nss.graph(s):
        fill[2, 32, s](x, 1.0)
        nss.device_array(N, np.float64, stream=s)
    with pytest.raises(GraphCaptureError, match="legacy default stream"), nss.graph(s):
        nss.device_array(N, np.float64, stream=0)
    with nss.graph(s) as g:               # another stream may allocate
        y = nss.device_array(N, np.float64, stream=t)
        fill[2, 32, s](x, 2.0)
    fill[2, 32, t](y, 1.0)
    g.launch()
    np.testing.assert_array_equal(_host(x), np.full(N, 2.0))
    assert rt.capture is None


def test_host_inputs_in_a_capture_are_refused(rt, streams):
    """A Read host argument is uploaded by an allocation on the launch stream."""
    s, _ = streams
    out = nss.device_array(N, np.float64, stream=s)
    with pytest.raises(GraphCaptureError), nss.graph(s):
        copy[2, 32, s](np.ones(N), out)


def test_refusals(rt, streams):
    s, t = streams
    with pytest.raises(GraphCaptureError, match="default stream"):
        nss.graph(0)
    with nss.graph(s):
        with pytest.raises(GraphCaptureError, match="do not nest"), nss.graph(t):
            pass
    g = nss.graph(s)
    with pytest.raises(GraphCaptureError, match="no instantiated capture"):
        g.launch()
    x = nss.device_array(N, np.float64, stream=s)
    errors = []
    with nss.graph(s):
        def other():
            try:
                fill[2, 32, s](x, 1.0)
            except GraphCaptureError as exc:
                errors.append(exc)

        th = threading.Thread(target=other)
        th.start()
        th.join()
    assert errors and "another thread" in str(errors[0])


def test_a_failed_capture_leaves_nothing_behind(rt, streams):
    s, _ = streams
    x = nss.device_array(N, np.float64, stream=s)
    with pytest.raises(ZeroDivisionError), nss.graph(s) as g:
        fill[2, 32, s](x, 1.0)
        raise ZeroDivisionError("the user's code failed inside the capture")
    assert rt.capture is None
    with pytest.raises(GraphCaptureError):
        g.launch()
    fill[2, 32, s](x, 4.0)                   # eager work goes on
    np.testing.assert_array_equal(_host(x), np.full(N, 4.0))


def test_the_graph_keeps_its_arrays(rt, streams):
    s, _ = streams
    x = nss.device_array(N, np.float64, stream=s)
    with nss.graph(s) as g:
        fill[2, 32, s](x, 7.0)
    block = nss.block_of(x)
    del x
    gc.collect()
    rt.flush()
    assert block.state is nss.BlockState.LIVE   # held by the graph
    g.launch()
    g.close()
    gc.collect()
    rt.flush()
    assert block.state is nss.BlockState.FREED
    with pytest.raises(GraphCaptureError):
        g.launch()


def test_frees_are_held_while_capturing(rt, streams):
    s, _ = streams
    x = nss.device_array(N, np.float64, stream=s)
    y = nss.device_array(N, np.float64, stream=s)
    block = nss.block_of(y)
    with nss.graph(s) as g:
        fill[2, 32, s](x, 1.0)
        del y
        gc.collect()
        fill[2, 32, s](x, 2.0)                 # a safe point: the free stays queued
        assert block.state is nss.BlockState.LIVE
    rt.flush()
    assert block.state is nss.BlockState.FREED
    g.launch()
    assert rt.driver.hazards == []


def test_the_graph_itself_keeps_every_captured_array(rt, streams, monkeypatch):
    """CUDA keeps no Python object of captured work (a direct launch's packed
    parameters, a copy's addresses): the graph must keep the arrays. Here the
    simulated driver is made to record nothing, as CUDA, so only the graph's
    own references can keep them: a kernel's arrays, a copy's source and
    destination, a fill's array."""
    s, _ = streams
    monkeypatch.setattr(rt.driver, "capture_work", lambda *args: None)
    arrays = {name: nss.device_array(N, np.float64, stream=s) for name in "xyzuv"}
    blocks = {name: nss.block_of(a) for name, a in arrays.items()}
    with nss.graph(s) as g:
        axpy[2, 32, s](arrays["x"], arrays["y"], 2.0)
        nss.copy(arrays["u"], arrays["z"], stream=s)
        nss.memset(arrays["v"], 0, stream=s)
    assert g.operations == 3
    arrays.clear()
    gc.collect()
    rt.flush()
    assert {n: b.state for n, b in blocks.items()} == dict.fromkeys(blocks, nss.BlockState.LIVE)
    g.close()
    gc.collect()
    rt.flush()
    assert {n: b.state for n, b in blocks.items()} == dict.fromkeys(blocks, nss.BlockState.FREED)


def test_collecting_the_graph_destroys_it_and_frees_its_arrays(rt, streams):
    s, _ = streams
    x = nss.device_array(N, np.float64, stream=s)
    with nss.graph(s) as g:
        fill[2, 32, s](x, 1.0)
    assert rt.driver.live_graphs == 2          # the graph and its executable
    block = nss.block_of(x)
    del x, g
    gc.collect()
    rt.flush()
    assert rt.driver.live_graphs == 0
    assert rt.driver.calls["cuGraphDestroy"] == 1
    assert block.state is nss.BlockState.FREED
    assert rt.driver.hazards == []


def test_close_is_idempotent_and_a_closed_graph_is_refused(rt, streams):
    s, _ = streams
    x = nss.device_array(N, np.float64, stream=s)
    with nss.graph(s) as g:
        fill[2, 32, s](x, 1.0)
    g.close()
    g.close()
    assert rt.driver.live_graphs == 0
    with pytest.raises(GraphCaptureError, match="no instantiated capture"):
        g.launch()


def test_an_explicitly_freed_array_makes_the_replay_raise_use_after_free(rt, streams):
    s, _ = streams
    x = nss.device_array(N, np.float64, stream=s)
    with nss.graph(s) as g:
        fill[2, 32, s](x, 1.0)
    rt.deallocate(nss.block_of(x))
    launches = rt.driver.calls["cuGraphLaunch"]
    with pytest.raises(nss.UseAfterFree):
        g.launch()
    assert rt.driver.calls["cuGraphLaunch"] == launches   # nothing queued
    assert rt.driver.hazards == []


def test_a_replay_on_another_stream_is_ordered_on_that_stream_only(rt, streams):
    """A graph captured on s and launched on t runs on t: CUDA orders it with
    nothing on s. With tracking the protocol orders s after it (and it after
    s); without (the negative control), the checker sees both races."""
    s, t = streams
    x = nss.device_array(N, np.float64, stream=s)
    y = nss.device_array(N, np.float64, stream=s)
    fill[2, 32, s](y, 0.0)
    with nss.graph(s) as g:
        fill[2, 32, s](x, 3.0)
    fill[2, 32, s](x, 1.0)          # outside writer on s, before the replay on t
    g.launch(t)
    copy[2, 32, s](x, y)            # outside reader on s, after it
    np.testing.assert_array_equal(_host(y), np.full(N, 3.0))
    assert rt.driver.hazards == []
    with nss.tracking(False):
        fill[2, 32, s](x, 1.0)
        g.launch(t)
        copy[2, 32, s](x, y)
    on_t = rt.stream_handle(t)   # the replay's accesses are checked on t
    replay = [h for h in rt.driver.hazards if on_t in (h.first.stream, h.second.stream)]
    kinds = {h.kind for h in replay}
    assert {"read-after-write", "write-after-write"} <= kinds, rt.driver.hazards


def test_device_copies_and_fills_are_captured(rt, streams):
    s, t = streams
    src = nss.to_device(np.arange(N, dtype=np.float64), stream=s)
    dst = nss.device_array(N, np.float64, stream=s)
    acc = nss.device_array(N, np.float64, stream=s)
    with nss.graph(s) as g:
        nss.memset(acc, 0, stream=s)
        nss.copy(dst, src, stream=s)
        axpy[2, 32, s](dst, acc, 3.0)
    assert g.operations == 3
    for k in range(2):
        nss.to_device(np.full(N, float(k)), stream=t, to=src)
        g.launch()
        np.testing.assert_array_equal(_host(acc), np.full(N, 3.0 * k))
    assert rt.driver.hazards == []


def test_host_copies_on_the_captured_stream_are_refused(rt, streams):
    s, t = streams
    x = nss.device_array(N, np.float64, stream=s)
    y = nss.device_array(N, np.float64, stream=t)
    with nss.graph(s) as g:
        with pytest.raises(GraphCaptureError, match="host and device"):
            nss.to_device(np.ones(N), stream=s, to=x)
        with pytest.raises(GraphCaptureError, match="host and device"):
            nss.copy_to_host(x, stream=s)
        nss.to_device(np.full(N, 2.0), stream=t, to=y)   # another stream: not captured
        copy[2, 32, s](y, x)
    assert g.operations == 1
    g.launch()
    np.testing.assert_array_equal(_host(x), np.full(N, 2.0))
    assert rt.driver.hazards == []


def test_legacy_stream_work_during_a_capture_is_refused(rt, streams):
    """Work on the legacy default stream depends on every blocking stream, the
    captured one too: CUDA refuses it and loses the capture. The library
    refuses it first (tracking or not), and the capture goes on."""
    s, _ = streams
    x = nss.device_array(N, np.float64, stream=s)
    y = nss.device_array(N, np.float64, stream=0)
    with nss.graph(s) as g:
        fill[2, 32, s](x, 4.0)
        with pytest.raises(GraphCaptureError, match="legacy default stream"):
            fill[2, 32, 0](y, 1.0)
        with nss.tracking(False), pytest.raises(GraphCaptureError, match="legacy default"):
            fill[2, 32, 0](y, 1.0)
        with pytest.raises(GraphCaptureError, match="free of"):
            rt.deallocate(nss.block_of(y))
    g.launch()
    np.testing.assert_array_equal(_host(x), np.full(N, 4.0))


def test_a_capture_broken_below_the_library_is_reported(rt, streams):
    """A driver call that CUDA refuses during a capture (here a synchronise of
    the capturing stream, made behind the library's back) invalidates it: the
    ``with`` block ends with GraphCaptureError and nothing is replayable."""
    s, _ = streams
    x = nss.device_array(N, np.float64, stream=s)
    handle = rt.stream_handle(s)
    with pytest.raises(GraphCaptureError, match="failed") as info:  # noqa: PT012
        with nss.graph(s) as g:
            fill[2, 32, s](x, 1.0)
            with pytest.raises(nss.DriverError):
                rt.driver.stream_synchronize(handle)
    assert isinstance(info.value.__cause__, nss.DriverError)
    assert rt.capture is None
    with pytest.raises(GraphCaptureError):
        g.launch()
    fill[2, 32, s](x, 2.0)                   # the stream works on
    np.testing.assert_array_equal(_host(x), np.full(N, 2.0))


def test_a_trace_records_the_replay_as_one_operation(rt, streams):
    s, t = streams
    x = nss.device_array(N, np.float64, stream=s)
    y = nss.device_array(N, np.float64, stream=s)
    with nss.trace() as tr:
        with nss.graph(s) as g:
            fill[2, 32, s](x, 1.0)
            copy[2, 32, s](x, y)
        fill[2, 32, t](x, 2.0)
        g.launch()
    labels = [op.label for op in tr.ops]
    assert labels == ["fill", "graph replay"]
    assert tr.ops[1].stream == rt.stream_handle(s)
    np.testing.assert_array_equal(_host(y), np.full(N, 1.0))   # the replay's fill came last
    assert rt.driver.hazards == []
