"""Threads: one runtime shared by many threads, and race-free runtime creation."""

from __future__ import annotations

import random
import sys
import threading
import time

import pytest

import numba_streamsafe.runtime as runtime_module
from numba_streamsafe import Access, AsyncResource, DeviceRuntime
from numba_streamsafe._driver.sim import SimDriver
from numba_streamsafe.runtime import clear_runtimes, get_runtime
from tests.helpers.programs import SIZES, launch

R, W, RW = Access.READ, Access.WRITE, Access.READ_WRITE

N_THREADS = 8
N_STREAMS = 4
STEPS_PER_STREAM = 10_000  # per thread and stream: 8 x 4 x 10,000 steps in all
FAST_STEPS_PER_STREAM = 1_000  # the default run's variant (the full one is marked slow)


@pytest.fixture
def fast_switching():
    """Switch threads often, so that their steps interleave finely."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    yield
    sys.setswitchinterval(old)


@pytest.mark.parametrize("steps", [pytest.param(STEPS_PER_STREAM, marks=pytest.mark.slow),
                                   FAST_STEPS_PER_STREAM])
def test_threads_share_one_runtime_without_hazards_or_leaks(fast_switching, steps):
    sim = SimDriver(backing=False)
    res = AsyncResource(sim)
    rt = DeviceRuntime(res)
    streams = [sim.create_stream() for _ in range(N_STREAMS)]
    # Blocks every thread reads (written once, before the threads start).
    shared = [rt.allocate(256, s, f"shared{i}") for i, s in enumerate(streams)]
    for blk in shared:
        launch(rt, blk.stream, [(blk, W)], label="init shared")

    errors: list[BaseException] = []
    counts = {"launches": 0, "allocations": 0, "deallocate": 0, "defer_free": 0, "reaps": 0}
    counts_lock = threading.Lock()
    barrier = threading.Barrier(N_THREADS)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        mine: list = []
        local = dict.fromkeys(counts, 0)

        def free(blk) -> None:
            if rng.random() < 0.5:
                rt.deallocate(blk)
                local["deallocate"] += 1
            else:
                rt.defer_free(blk)  # as a finalizer would
                local["defer_free"] += 1

        try:
            barrier.wait()
            for i in range(N_STREAMS * steps):
                stream = streams[i % N_STREAMS]  # each stream gets ``steps`` steps
                r = rng.random()
                if not mine or (r < 0.2 and len(mine) < 8):
                    mine.append(rt.allocate(rng.choice(SIZES), stream, f"t{seed}"))
                    local["allocations"] += 1
                elif r < 0.35:
                    free(mine.pop(rng.randrange(len(mine))))
                elif r < 0.36:
                    rt.reap()
                    local["reaps"] += 1
                else:
                    picked = rng.sample(mine, min(len(mine), rng.randint(1, 3)))
                    uses = [(blk, rng.choice((R, W, RW))) for blk in picked]
                    if rng.random() < 0.5:
                        uses.append((rng.choice(shared), R))
                    launch(rt, stream, uses, label=f"t{seed}#{i}")
                    local["launches"] += 1
            for blk in mine:
                free(blk)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        with counts_lock:
            for k, v in local.items():
                counts[k] += v

    threads = [threading.Thread(target=worker, args=(seed,), daemon=True)
               for seed in range(N_THREADS)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    elapsed = time.perf_counter() - start
    assert not any(t.is_alive() for t in threads), "a worker hung (deadlock?)"
    assert errors == [], errors[:3]
    for blk in shared:
        rt.deallocate(blk)
    rt.flush()
    rt.reap()

    assert rt.bytes_outstanding() == 0
    stats = rt.stats()
    assert stats.live_blocks == 0 and stats.deferred == 0
    assert stats.allocations == stats.frees == counts["allocations"] + len(shared)
    assert counts["deallocate"] > 1000 and counts["defer_free"] > 1000 and counts["reaps"] > 100
    assert counts["launches"] > N_THREADS * N_STREAMS * steps // 2
    assert res.events.in_use == 0
    assert sim.live_events == res.events.idle
    assert sim.hazards == [], "\n".join(str(h) for h in sim.hazards[:10])
    print(f"\n{N_THREADS} threads x {N_STREAMS} streams x {steps} steps: "
          f"{elapsed:.1f} s, {counts}")


def test_get_runtime_is_built_once_under_a_race(monkeypatch):
    built: list[int] = []
    built_lock = threading.Lock()

    def slow_driver(device: int = 0) -> SimDriver:
        with built_lock:
            built.append(device)
        time.sleep(0.05)  # wide window for a second builder
        return SimDriver(device, backing=False)

    monkeypatch.setattr(runtime_module, "default_driver", slow_driver)
    # A private registry: the process-wide runtimes of other tests are left alone.
    monkeypatch.setattr(runtime_module, "RUNTIMES", runtime_module.Runtimes())
    barrier = threading.Barrier(16)
    got: list = [None] * 16

    def worker(i: int) -> None:
        barrier.wait()
        got[i] = get_runtime(7)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(16)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
        assert built == [7], "the driver factory ran exactly once"
        first = got[0]
        assert isinstance(first, DeviceRuntime) and first.device == 7
        assert all(r is first for r in got)
        assert get_runtime(7) is first
    finally:
        clear_runtimes()
    assert get_runtime(7) is not first, "clear_runtimes forgets the runtime"
    assert built == [7, 7]
    clear_runtimes()
