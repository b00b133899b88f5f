"""Check mode (``NUMBA_STREAMSAFE_MODE=check``) on the simulator: the program
runs as written (no wait queued, no free delayed) over a checking
:class:`~numba_streamsafe.resources.AsyncResource`, which reports each use
the program's own ordering (events, synchronises, the legacy default stream)
does not order after the uses it conflicts with.

The simulated driver's own happens-before checker sees the same program: its
hazards are the oracle the reports are held against. Each race is shown once
unordered (reported, with this file's line) and once ordered by the program
(nothing reported).
"""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
from numba import cuda

import numba_streamsafe as nss
from numba_streamsafe.numba import emm, sim_plugin  # noqa: F401 - emm: companion
from tests.helpers.sim_kernels import copy, fill, tracked_copy, tracked_fill

N = 64
HERE = os.path.basename(__file__)


def _found(rt):
    """The races the checking resource reported, after checking them against
    the simulator's own checker: the same kinds, in the same order (the
    pool's stream-ordered allocations are ordered by the library's waits, so
    the simulator finds no hazard of theirs)."""
    found = list(rt.resource.race_log.hazards)
    oracle = [h.kind for h in rt.driver.system.hazards]
    assert [h.kind for h in found] == oracle, (found, rt.driver.system.hazards)
    return found


def _program(kind, order):
    """A producer on stream a, a consumer of its output on stream b, ordered
    by ``order(a, b)`` (None: not at all). ``kind``: plain or tracked kernels."""
    a, b = cuda.stream(), cuda.stream()
    x = cuda.device_array(N, np.float32, stream=a)
    y = cuda.device_array(N, np.float32, stream=b)
    if kind == "plain":
        fill[1, N, a](x, 1.0)
    else:
        tracked_fill[1, N, a](x, 1.0)
    if order is not None:
        order(a, b)
    if kind == "plain":
        copy[1, N, b](x, y)  # the consumer's line
    else:
        tracked_copy[1, N, b](x, y)  # the consumer's line
    return a, b, x, y


def _event(a, b):
    done = cuda.event()
    done.record(a)
    done.wait(b)


def _stream_sync(a, b):
    a.synchronize()


def _device_sync(a, b):
    cuda.synchronize()


def _event_sync(a, b):
    done = cuda.event()
    done.record(a)
    done.synchronize()


@pytest.mark.parametrize("kind", ["plain", "tracked"])
def test_an_unordered_consumer_is_reported_and_nothing_is_ordered(checked, kind):
    _program(kind, None)
    found = _found(checked)
    assert [h.kind for h in found] == ["read-after-write"], found
    text = str(found[0])
    assert "copy" in text and "src" in text and f"{HERE}:" in text, text
    # The program ran as written: the library queued no wait, and recorded an event
    # only where each array was allocated (new memory's own order, which no use
    # on another stream needed here: b's read of x waits for a's fill, a race).
    assert checked.driver.calls["cuStreamWaitEvent"] == 0
    assert checked.driver.calls["cuEventRecord"] == 2
    assert nss.memory_stats()["waits_inserted"] == 0


def test_new_memory_used_on_another_stream_waits_for_its_allocation(checked):
    """Memory freed on ``a`` while ``a`` still writes it, allocated again
    there at the same address and written on ``b``: check mode queues the
    wait for the allocation (the pool hands the memory out in ``a``'s order;
    Numba's own allocator would not) and reports nothing, and the simulator
    finds no hazard."""
    a, b = cuda.stream(), cuda.stream()
    x = cuda.device_array(N, np.float32, stream=a)
    tracked_fill[1, N, a](x, 1.0)
    ptr = nss.block_of(x).ptr
    del x
    gc.collect()
    checked.flush()
    y = cuda.device_array(N, np.float32, stream=a)
    assert nss.block_of(y).ptr == ptr
    tracked_fill[1, N, b](y, 2.0)
    assert _found(checked) == []
    assert checked.driver.calls["cuStreamWaitEvent"] == 1


@pytest.mark.parametrize("kind", ["plain", "tracked"])
@pytest.mark.parametrize("order", [_event, _stream_sync, _device_sync, _event_sync],
                         ids=["event", "stream-sync", "device-sync", "event-sync"])
def test_a_program_that_orders_itself_is_not_reported(checked, kind, order):
    _program(kind, order)
    assert _found(checked) == []


def test_a_free_while_another_stream_reads_is_reported(checked):
    a, b = cuda.stream(), cuda.stream()
    x = cuda.device_array(N, np.float32, stream=a)
    y = cuda.device_array(N, np.float32, stream=b)
    fill[1, N, a](x, 1.0)
    a.synchronize()
    copy[1, N, b](x, y)   # reads x on b
    del x                 # freed on a at once, while b may still read it
    gc.collect()
    checked.flush()       # Numba's finalizer queued the free: it is made now
    found = _found(checked)
    assert [h.kind for h in found] == ["write-after-read"], found
    assert "cuMemFreeAsync" in str(found[0]) and "copy" in str(found[0])


def test_a_free_after_the_reader_is_waited_for_is_not_reported(checked):
    a, b = cuda.stream(), cuda.stream()
    x = cuda.device_array(N, np.float32, stream=a)
    y = cuda.device_array(N, np.float32, stream=b)
    fill[1, N, a](x, 1.0)
    a.synchronize()
    copy[1, N, b](x, y)
    b.synchronize()
    del x
    gc.collect()
    checked.flush()
    assert _found(checked) == []


def test_a_copy_after_an_unordered_write_is_reported(checked):
    a, b = cuda.stream(), cuda.stream()
    x = cuda.device_array(N, np.float32, stream=a)
    fill[1, N, a](x, 2.0)
    x.copy_to_host(stream=b)  # the copy reads x on b: not ordered after the fill
    found = _found(checked)
    assert [h.kind for h in found] == ["read-after-write"], found
    assert "copy to host" in str(found[0])


@pytest.mark.parametrize("synchronous", [True, False], ids=["sync-copy", "async-copy"])
def test_a_synchronous_copy_orders_the_host(checked, synchronous):
    """A copy to the host on the default stream is synchronous: the host waits
    for it, so work queued afterwards on a non-blocking stream is ordered after
    its read. The same copy queued asynchronously is not (the negative control)."""
    a = cuda.stream()
    free_running = checked.driver.create_stream(blocking=False)
    x = nss.device_array(N, np.float32, stream=a)
    tracked_fill[1, N, a](x, 3.0)
    a.synchronize()
    if synchronous:
        host = x.copy_to_host()              # the default stream; the host waits
    else:
        host = x.copy_to_host(stream=a)      # queued on a; the host goes on
    tracked_fill[1, N, free_running](x, 4.0)  # overwrites what the copy reads
    found = _found(checked)
    if synchronous:
        assert found == [] and host[0] == 3.0
    else:
        assert [h.kind for h in found] == ["write-after-read"], found


def test_the_legacy_default_stream_orders_blocking_streams(checked):
    """Numba's streams are blocking: work on the legacy default stream waits for
    their earlier work, and they wait for its work (no report); a non-blocking
    stream is ordered by nothing (the negative control)."""
    a = cuda.stream()
    x = cuda.device_array(N, np.float32, stream=a)
    y = cuda.device_array(N, np.float32)
    fill[1, N, a](x, 1.0)
    copy[1, N, 0](x, y)               # the legacy default stream
    a2 = cuda.stream()
    copy[1, N, a2](y, x)              # after the legacy stream's copy
    assert _found(checked) == []
    driver = checked.driver
    free_running = driver.create_stream(blocking=False)
    z = nss.device_array(N, np.float32, stream=free_running)
    tracked_fill[1, N, free_running](z, 1.0)
    tracked_copy[1, N, 0](z, x)       # not ordered after the non-blocking stream
    assert [h.kind for h in _found(checked)] == ["read-after-write"]


def test_race_check_raises_at_the_racing_launch(checked):
    with pytest.raises(nss.RaceDetected, match="read-after-write"):
        with nss.race_check():
            _program("plain", None)


def test_new_memory_is_ready_for_every_stream(checked):
    """An allocation is ready for every stream, as Numba's own allocator makes
    it: first use on a non-blocking stream, not ordered after the allocating
    stream, is not the program's race (numba-cuda's event test does this with
    a cuda.core stream). A use of the same memory by two unordered streams is."""
    free_running = checked.driver.create_stream(blocking=False)
    z = nss.device_array(N, np.float32, stream=0)
    tracked_fill[1, N, free_running](z, 1.0)
    assert _found(checked) == []
    tracked_fill[1, N, 0](z, 2.0)
    assert [h.kind for h in _found(checked)] == ["write-after-write"]


@pytest.mark.parametrize("recorded_on", ["legacy", "non-blocking"])
def test_an_event_recorded_on_the_legacy_stream_covers_the_blocking_streams(checked,
                                                                            recorded_on):
    """Recording an event is an operation of its stream: on the legacy default
    stream it comes after the blocking streams' earlier work, so a non-blocking
    stream that waits for it is ordered after a blocking stream's write. Recorded
    on another non-blocking stream it covers nothing (the negative control)."""
    blocking = cuda.stream()
    free_running = checked.driver.create_stream(blocking=False)
    other = checked.driver.create_stream(blocking=False)
    x = nss.device_array(N, np.float32, stream=blocking)
    y = nss.device_array(N, np.float32, stream=free_running)
    tracked_fill[1, N, blocking](x, 1.0)
    done = cuda.event()
    done.record(0 if recorded_on == "legacy" else other)
    done.wait(free_running)
    tracked_copy[1, N, free_running](x, y)
    found = [h.kind for h in _found(checked)]
    assert found == ([] if recorded_on == "legacy" else ["read-after-write"]), found


def test_the_per_thread_default_stream_and_the_legacy_stream_order_each_other(checked):
    """The per-thread default stream is not a non-blocking stream: it and the
    legacy default stream wait for each other's work (numba-cuda's own array
    assignment launches on it after a copy on the legacy stream). A
    non-blocking stream is not ordered so (the negative control)."""
    per_thread = cuda.per_thread_default_stream()
    x = nss.device_array(N, np.float32, stream=0)
    y = nss.device_array(N, np.float32, stream=0)
    tracked_fill[1, N, 0](x, 1.0)             # the legacy default stream
    tracked_copy[1, N, per_thread](x, y)      # after it
    tracked_fill[1, N, 0](y, 2.0)             # and it after the per-thread stream's read
    assert _found(checked) == []
    free_running = checked.driver.create_stream(blocking=False)
    tracked_fill[1, N, free_running](x, 3.0)  # after nothing: the legacy write, the read
    assert [h.kind for h in _found(checked)] == ["write-after-write", "write-after-read"]


def _example(*args: str, mode: str, status: int = 0) -> str:
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(NUMBA_ENABLE_CUDASIM="1", NUMBA_CUDA_MEMORY_MANAGER="numba_streamsafe",
               NUMBA_STREAMSAFE_MODE=mode, NUMBA_STREAMSAFE_CHECK_REPORT="exit")
    proc = subprocess.run([sys.executable, "plain_numba_pipeline.py", "--repeat", "2", *args],
                          cwd=os.path.join(os.path.dirname(__file__), "..", "..", "examples"),
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == status, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


@pytest.mark.slow
def test_the_plain_example_ordered_by_its_own_events_has_no_race():
    """``examples/plain_numba_pipeline.py`` as written races (stages 3 and 4,
    reported in check mode with the example's lines, and the process exits
    with 1); with ``--events`` it orders itself, check mode finds nothing
    (exit status 0), and ordering mode skips more of its waits than without."""
    racy = _example(mode="check", status=1)  # NUMBA_STREAMSAFE_CHECK_REPORT=exit: races, 1
    assert "4 race(s) found" in racy and "'square' argument 'src'" in racy, racy
    assert "plain_numba_pipeline.py:" in racy
    assert "no race found" in _example("--events", mode="check")

    def waits(out: str) -> tuple[int, int]:
        line = next(x for x in out.splitlines() if x.startswith("the library's waits"))
        queued, skipped = (int(w) for w in line.split() if w.isdigit())
        return queued, skipped

    alone, ordered = waits(_example(mode="order")), waits(_example("--events", mode="order"))
    assert ordered[0] < alone[0] and ordered[1] > alone[1], (alone, ordered)


def test_a_graph_captured_after_the_programs_event_is_captured_whole(rt):
    """Ordering mode: the program records an event on ``s`` (a point, which
    closes ``s``'s open mark), then captures a graph on ``s`` while ``t``
    reads what ``s`` wrote before. The mark's event was recorded at the
    point, so ``t``'s wait records nothing on the captured stream."""
    sim_plugin.install()
    try:
        s, t = cuda.stream(), cuda.stream()
        x = nss.device_array(N, np.float32, stream=s)
        y = nss.device_array(N, np.float32, stream=s)
        z = nss.device_array(N, np.float32, stream=t)
        tracked_fill[1, N, s](x, 1.0)
        cuda.event().record(s)  # nobody waits for it
        with nss.graph(s) as g:
            tracked_fill[1, N, s](y, 2.0)
            tracked_copy[1, N, t](x, z)  # outside the capture: after s's fill of x
        assert g.operations == 1
        assert rt.driver.hazards == []
    finally:
        sim_plugin.uninstall()
