"""The simulated driver's stream capture and graphs (the model the CPU tests
of ``numba_streamsafe.graphs`` rely on): captured work is recorded, not run;
a replay runs it again and checks its accesses as work of the launch stream
at replay time; what CUDA refuses during a capture is refused and loses the
capture; graphs are counted and a destroyed one cannot be launched."""

from __future__ import annotations

import threading

import pytest

from numba_streamsafe._driver.sim import (
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
    LEGACY_STREAM,
)
from numba_streamsafe.core.access import Access
from numba_streamsafe.core.errors import DriverError

R, W = Access.READ, Access.WRITE


def _capture(sim, stream, ops):
    """A graph of ``ops`` (``(label, [(ptr, nbytes, access)])``) captured on ``stream``,
    and the list each op appends its label to when it runs."""
    ran: list[str] = []
    sim.begin_capture(stream)
    for label, accesses in ops:
        sim.capture_work(stream, ran.append, (label,), accesses, label, False)
    graph = sim.end_capture(stream)
    return graph, sim.graph_instantiate(graph), ran


def test_captured_work_runs_at_each_replay_in_order(sim, two_streams):
    s, _ = two_streams
    x = sim.alloc_async(1024, s)
    graph, ex, ran = _capture(sim, s, [("a", [(x, 1024, W)]), ("b", [(x, 1024, R)])])
    assert ran == []
    sim.graph_launch(ex, s)
    sim.graph_launch(ex, s)
    assert ran == ["a", "b", "a", "b"]
    assert sim.hazards == []
    assert sim.live_graphs == 2
    sim.graph_destroy(graph, ex)
    assert sim.live_graphs == 0
    with pytest.raises(DriverError):
        sim.graph_launch(ex, s)
    with pytest.raises(DriverError):
        sim.graph_destroy(graph, None)


def test_a_replay_is_checked_on_the_launch_stream_at_replay_time(sim, two_streams):
    """Captured on s, launched on t: unordered with s's work before and after
    it (hazards), ordered once t waits for s and s for t."""
    s, t = two_streams
    x = sim.alloc_async(1024, s)
    sim.synchronize()
    _, ex, _ = _capture(sim, s, [("replay write", [(x, 1024, W)])])
    sim.trace_access(s, [(x, 1024, W)], "writer on s")
    sim.graph_launch(ex, t)
    sim.trace_access(s, [(x, 1024, R)], "reader on s")
    assert [h.kind for h in sim.hazards] == ["write-after-write", "read-after-write"]
    del sim.hazards[:]
    sim.synchronize()                           # the host, and so what follows, after all
    ev = sim.event_create()
    sim.trace_access(s, [(x, 1024, W)], "writer on s")
    sim.event_record(ev, s)
    sim.stream_wait_event(t, ev)
    sim.graph_launch(ex, t)
    sim.event_record(ev, t)
    sim.stream_wait_event(s, ev)
    sim.trace_access(s, [(x, 1024, R)], "reader on s")
    assert sim.hazards == []


@pytest.mark.parametrize("call", ["work", "record", "wait", "sync", "query"])
def test_other_work_on_the_capturing_stream_loses_the_capture(sim, two_streams, call):
    s, _ = two_streams
    x = sim.alloc_async(256, s)
    ev = sim.event_create()
    sim.event_record(ev, s)
    sim.begin_capture(s)
    do = {"work": lambda: sim.memset_async(x, 0, 256, s),
          "record": lambda: sim.event_record(ev, s),
          "wait": lambda: sim.stream_wait_event(s, ev),
          "sync": lambda: sim.stream_synchronize(s),
          "query": lambda: sim.stream_query(s)}[call]
    with pytest.raises(DriverError) as info:
        do()
    assert info.value.code == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    with pytest.raises(DriverError) as info:
        sim.end_capture(s)
    assert info.value.code == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
    sim.memset_async(x, 0, 256, s)             # the stream works on after the capture


def test_legacy_stream_work_from_any_thread_loses_the_capture(sim, two_streams):
    s, t = two_streams
    x = sim.alloc_async(256, t)
    sim.begin_capture(s)
    sim.memset_async(x, 0, 256, t)             # another stream: not captured, allowed
    errors: list[DriverError] = []

    def other() -> None:
        try:
            sim.memset_async(x, 0, 256, LEGACY_STREAM)
        except DriverError as exc:
            errors.append(exc)

    th = threading.Thread(target=other)
    th.start()
    th.join()
    assert errors and errors[0].code == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
    with pytest.raises(DriverError):
        sim.end_capture(s)


def test_a_device_synchronise_is_refused_to_the_capturing_thread_only(sim, two_streams):
    s, _ = two_streams
    sim.begin_capture(s)
    done: list[bool] = []
    th = threading.Thread(target=lambda: (sim.synchronize(), done.append(True)))
    th.start()
    th.join()
    assert done == [True]                       # thread-local mode: other threads may
    sim.end_capture(s)                          # still valid
    sim.begin_capture(s)
    with pytest.raises(DriverError):
        sim.synchronize()
    with pytest.raises(DriverError):
        sim.end_capture(s)


def test_default_streams_and_nested_captures_are_refused(sim, two_streams):
    s, _ = two_streams
    for default in (LEGACY_STREAM, 2):
        with pytest.raises(DriverError):
            sim.begin_capture(default)
    sim.begin_capture(s)
    with pytest.raises(DriverError):
        sim.begin_capture(s)
    sim.end_capture(s)
    with pytest.raises(DriverError):
        sim.end_capture(s)
