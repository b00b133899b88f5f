"""The compiled launch (``numba_streamsafe.numba.launch.launcher``, compiled) on a
real GPU: it takes repeated launches, queues exactly the waits and events the Python path
queues, orders racing kernels (with a negative control), and stays right
with several threads launching at once."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import numba_streamsafe as nss
from numba_streamsafe.numba.launch import launcher

pytestmark = pytest.mark.gpu  # both builds run the direct launch

N = 1 << 16
GRID, BLOCK = 256, 256
TRIALS = 100


def _counts():
    stats = nss.memory_stats()
    return (stats["waits_inserted"], stats["events_recorded"], stats["same_stream_uses"])


def test_repeat_launches_take_the_hot_path(gpu, kernels, fresh_runtime):
    s = gpu.stream()
    x = nss.device_array(N, np.int32, stream=s)
    for _ in range(2):  # the Python path: compiles (Numba's launch), then caches
        kernels.fill[GRID, BLOCK, s](x, 0)
    before = launcher.launches()
    for v in range(1, 21):
        kernels.fill[GRID, BLOCK, s](x, v)
    assert launcher.launches() - before == 20
    assert (nss.copy_to_host(x, stream=s) == 20).all()


def _program(kernels, streams, xs):
    """A fixed multi-stream program: writers and readers of three arrays on
    three streams."""
    fill, copy = kernels.fill, kernels.copy
    for step in range(30):
        s = streams[step % 3]
        t = streams[(step + 1) % 3]
        fill[GRID, BLOCK, s](xs[step % 3], step)
        copy[GRID, BLOCK, t](xs[step % 3], xs[(step + 1) % 3])
        copy[GRID, BLOCK, s](xs[(step + 2) % 3], xs[step % 3])


def test_same_waits_and_events_as_the_python_path(gpu, kernels, fresh_runtime, monkeypatch):
    streams = [gpu.stream() for _ in range(3)]
    results = {}
    for use_hot in (True, False, True):
        xs = [nss.device_array(N, np.int32, stream=streams[0]) for _ in range(3)]
        for x in xs:
            kernels.fill[GRID, BLOCK, streams[0]](x, -1)
        _program(kernels, streams, xs)  # warm: the arrays' fields cached
        gpu.synchronize()
        fast0, c0 = launcher.launches(), _counts()
        if not use_hot:  # the Python path only: no state for the hot path
            from numba_streamsafe.numba.launch.launch_plan import DirectLaunches

            monkeypatch.setattr(DirectLaunches, "_remember", lambda *a, **kw: None)
            for k in (kernels.fill, kernels.copy):
                monkeypatch.setattr(k, "launch_state", None)
        _program(kernels, streams, xs)
        gpu.synchronize()
        monkeypatch.undo()
        taken = launcher.launches() - fast0
        delta = tuple(b - a for a, b in zip(c0, _counts(), strict=True))
        out = [nss.copy_to_host(x, stream=streams[0]) for x in xs]
        results.setdefault(use_hot, []).append((delta, taken, out))
    (hot_delta, hot_taken, hot_out), _ = results[True]
    ((py_delta, py_taken, py_out),) = results[False]
    assert hot_taken == 90 and py_taken == 0
    assert hot_delta == py_delta, (hot_delta, py_delta)
    assert hot_delta[0] > 0  # the program does need waits
    for a, b in zip(hot_out, py_out, strict=True):
        np.testing.assert_array_equal(a, b)


def _trace_view(t):
    """The trace's operations, waits and events, with op ids and addresses
    replaced by their positions (they differ between runs)."""
    ids = {o.id: i for i, o in enumerate(t.ops)}
    ptrs = {p: i for i, p in enumerate(dict.fromkeys(u[2] for o in t.ops for u in o.uses))}
    ops = [(o.label, o.stream, tuple((n, a, ptrs[p], size) for n, a, p, size in o.uses))
           for o in t.ops]
    waits = sorted((ids[w.op], w.param, w.access, w.on_stream, ids.get(w.after, -1), w.hazard,
                    w.inserted, w.same_stream) for w in t.waits)
    events = sorted((ids[e.op], e.stream) for e in t.events)
    return ops, waits, events


def test_a_trace_records_the_compiled_launches_as_the_python_path_does(
        gpu, kernels, fresh_runtime, monkeypatch):
    """A recording trace keeps launches on the compiled path, and the trace
    reads the same operations, waits and events as one of the Python path."""
    streams = [gpu.stream() for _ in range(3)]
    views = {}
    for use_hot in (True, False):
        xs = [nss.device_array(N, np.int32, stream=streams[0]) for _ in range(3)]
        for x in xs:
            kernels.fill[GRID, BLOCK, streams[0]](x, -1)
        _program(kernels, streams, xs)  # warm: the arrays' fields cached
        gpu.synchronize()
        if not use_hot:
            from numba_streamsafe.numba.launch.launch_plan import DirectLaunches

            monkeypatch.setattr(DirectLaunches, "_remember", lambda *a, **kw: None)
            for k in (kernels.fill, kernels.copy):
                monkeypatch.setattr(k, "launch_state", None)
        fast0 = launcher.launches()
        with nss.trace() as t:
            kernels.copy[GRID, BLOCK, streams[1]](xs[0], xs[0])  # one block, merged
            _program(kernels, streams, xs)
        gpu.synchronize()
        monkeypatch.undo()
        views[use_hot] = (launcher.launches() - fast0, *_trace_view(t))
    hot, py = views[True], views[False]
    assert hot[0] == 91 and py[0] == 0
    assert hot[1][0][2] == (("src+dst", "READ_WRITE", 0, N * 4),), hot[1][0]
    assert hot[1:] == py[1:]
    assert any(w[6] for w in hot[2])  # the program does need waits


@pytest.mark.parametrize("renew", [False, True], ids=["same arrays", "new arrays and streams"])
def test_hot_path_orders_a_race(gpu, kernels, fresh_runtime, renew):
    """slow_fill on a, then copy on b: b must wait. Every trial after the
    first launches through the hot path, with the same arrays and streams (the
    copy's arguments a recent launch's, its plan and entries reused), or
    (``renew``) with arrays and streams made anew every trial, as a program
    that makes them every step does. Untracked, most trials read the array
    early (the negative control)."""
    a, b = gpu.stream(), gpu.stream()
    x = nss.device_array(N, np.int32, stream=a)
    y = nss.device_array(N, np.int32, stream=a)
    spins = 1000
    for k, args in ((kernels.slow_fill, (x, 0, 1)), (kernels.copy, (x, y))):
        k[GRID, BLOCK, a](*args)
        k[GRID, BLOCK, b](*args)
    gpu.synchronize()
    wrong = {True: 0, False: 0}
    fast0, recalled0 = launcher.launches(), launcher.recalled()
    for trial in range(TRIALS):
        for tracking in (True, False):
            value = 2 * trial + (1 if tracking else 2)
            if renew:
                # The old arrays go first: their frees are queued and the next
                # allocation runs them, so no launch finds frees to run (which
                # sends it to the Python path).
                del x, y
                a, b = gpu.stream(), gpu.stream()
                x = nss.device_array(N, np.int32, stream=a)
                y = nss.device_array(N, np.int32, stream=b)
            with nss.tracking(tracking):
                kernels.slow_fill[GRID, BLOCK, a](x, value, spins)
                kernels.copy[GRID, BLOCK, b](x, y)
            b.synchronize()
            a.synchronize()
            if not (nss.copy_to_host(y, stream=b) == value).all():
                wrong[tracking] += 1
    # The tracked trials took the hot path (a launch that finds frees queued goes to
    # the Python path, which runs them).
    fast = launcher.launches() - fast0
    assert wrong[True] == 0, f"tracked: {wrong[True]}/{TRIALS} wrong"
    assert fast >= 2 * TRIALS - 2, f"{fast} of {2 * TRIALS} tracked launches took the hot path"
    if not renew:  # the copy's arguments are the same every trial: a recent launch's, reused
        recalled = launcher.recalled() - recalled0
        assert recalled >= TRIALS - 2, f"{recalled} of {TRIALS} copies reused a recent launch"
    assert wrong[False] >= 0.7 * TRIALS, f"untracked: only {wrong[False]}/{TRIALS} wrong"


def test_threads_launch_through_the_hot_path(gpu, kernels, fresh_runtime):
    """8 threads, each with a stream and arrays of its own, launch a chain of
    dependent kernels at once; every result is right."""
    nthreads, steps = 8, 200
    errors: list[BaseException] = []
    outs: list[np.ndarray | None] = [None] * nthreads
    fast0 = launcher.launches()

    def work(t: int) -> None:
        try:
            gpu.current_context()
            s1, s2 = gpu.stream(), gpu.stream()
            x = nss.device_array(N, np.int32, stream=s1)
            y = nss.device_array(N, np.int32, stream=s1)
            for i in range(steps):
                kernels.fill[GRID, BLOCK, s1](x, t * 1000 + i)
                kernels.copy[GRID, BLOCK, s2](x, y)  # waits for the fill
            outs[t] = nss.copy_to_host(y, stream=s2)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(nthreads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[0]
    for t, out in enumerate(outs):
        assert out is not None and (out == t * 1000 + steps - 1).all(), t
    assert launcher.launches() - fast0 > nthreads * steps  # most launches took the hot path
