"""Stress: K threads x S streams x N random steps on a real GPU, every result checked.

Each thread keeps its own arrays (uint8, 1 B to ``NSS_STRESS_MAX_BYTES``,
log-uniform) and, step by step, allocates on a random stream, writes a fresh
value with a tracked kernel, a tracked memset or a tracked host-to-device copy
on another random stream, copies arrays into new ones (tracked kernel or
tracked device copy), reads slices back, drops arrays (their frees go through
Numba's finalizers) and now and then reaps. The streams are shared by all
threads.

Every write is followed by a tracked ``check`` kernel on a *different* stream
that sets an error flag if any element differs from the value written, so a
missing wait (read before the write landed), a missing write-after-read wait
(a later write landing before the check) or a free that did not wait for its
readers (the next owner of the address overwriting the bytes) all show as a
flag. The flags (one int32 array per stream and batch, written only on that
stream) and the slices read back are verified after every batch of steps.

At the end: no wrong result, no exception in any thread, every byte and every
event back (``bytes_outstanding() == 0``, ``events.in_use == 0``) and no growth
of the device memory in use over the second half of the run (sampled after a
reap and a pool trim at 50 % and 100 %).

Environment: ``NSS_STRESS_THREADS`` (8), ``NSS_STRESS_STREAMS`` (8),
``NSS_STRESS_STEPS`` per thread (2000), ``NSS_STRESS_MAX_BYTES`` (64 MiB),
``NSS_STRESS_SEED`` (0), ``NSS_STRESS_REPORT`` (a file to append the figures to).
"""

from __future__ import annotations

import gc
import math
import os
import random
import threading
import time
import traceback
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import numba_streamsafe as nss

pytestmark = pytest.mark.gpu

MiB = 1 << 20
THREADS = int(os.environ.get("NSS_STRESS_THREADS", "8"))
STREAMS = int(os.environ.get("NSS_STRESS_STREAMS", "8"))
STEPS = int(os.environ.get("NSS_STRESS_STEPS", "2000"))
MAX_BYTES = int(os.environ.get("NSS_STRESS_MAX_BYTES", str(64 * MiB)))
SEED = int(os.environ.get("NSS_STRESS_SEED", "0"))
#: Steps between two verifications of the flags and read-backs.
BATCH = 25
#: Arrays a thread keeps alive at most.
MAX_LIVE = 12
#: Largest host-to-device fill and largest slice read back.
HOST_MAX = 256 * 1024
#: Device memory the second half of the run may add (allocator granularity, not a leak).
TOLERANCE = 64 * MiB
#: Share of kernels that sleep ``SLOW_SPINS`` microseconds before touching
#: memory, so that an unordered kernel on another stream would overtake them.
SLOW_SHARE = float(os.environ.get("NSS_STRESS_SLOW", "0.1"))
SLOW_SPINS = 300
#: The figures of the issue this test scales to.
ISSUE_THREADS, ISSUE_STREAMS, ISSUE_STEPS = 8, 8, 100_000

#: Set by :func:`make_kernels` before the first launch compiles the kernels.
cuda: Any = None


# Kernels: plain functions here, decorated with tracked_kernel in make_kernels,
# so that nothing imports numba.cuda at collection (see conftest.py).
def _fill(out, value, spins):
    for _ in range(spins):
        cuda.nanosleep(1000)
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < out.size:
        out[i] = value
        i += step


def _copy(src, dst, spins):
    for _ in range(spins):
        cuda.nanosleep(1000)
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < src.size:
        dst[i] = src[i]
        i += step


def _check(a, value, flags, slot, spins):
    """``flags[slot] = 1`` if any element of ``a`` is not ``value``."""
    for _ in range(spins):
        cuda.nanosleep(1000)
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < a.size:
        if a[i] != value:
            flags[slot] = 1
        i += step


def make_kernels(numba_cuda: Any) -> SimpleNamespace:
    global cuda
    cuda = numba_cuda
    tk = nss.tracked_kernel
    return SimpleNamespace(
        fill=tk(access={"out": "w"})(_fill),
        copy=tk(access={"src": "r", "dst": "w"})(_copy),
        check=tk(access={"a": "r", "flags": "w"})(_check),
    )


class Stress:
    """Shared state of one run: streams, kernels, counters and failures."""

    #: Threads per block and most blocks per launch (a simulator run lowers them).
    tpb = 256
    max_blocks = 1024

    def __init__(self, cuda_mod: Any, rt: Any, kernels: SimpleNamespace, streams: list[Any],
                 *, max_bytes: int = MAX_BYTES, seed: int = SEED,
                 slow_share: float = SLOW_SHARE) -> None:
        self.cuda = cuda_mod
        self.rt = rt
        self.k = kernels
        self.streams = streams
        self.max_bytes = max_bytes
        self.seed = seed
        self.slow_share = slow_share
        self.lock = threading.Lock()
        self.counts: dict[str, int] = dict.fromkeys(
            ("steps", "allocations", "kernels", "copies", "frees", "checks", "readbacks",
             "reaps", "wrong"), 0)
        self.wrong: list[str] = []
        self.errors: list[str] = []
        self.seconds = 0.0

    def grid(self, n: int) -> int:
        return min(self.max_blocks, max(1, (n + self.tpb - 1) // self.tpb))

    def add(self, counts: dict[str, int], wrong: list[str]) -> None:
        with self.lock:
            for key, value in counts.items():
                self.counts[key] += value
            self.wrong.extend(wrong[: max(0, 20 - len(self.wrong))])

    def warm_up(self) -> None:
        """Compile every kernel and touch every copy path on this thread."""
        k, s, t = self.k, self.streams[0], self.streams[-1]
        x = nss.device_array(1000, np.uint8, stream=s)
        y = nss.device_array(1000, np.uint8, stream=t)
        flags = nss.device_array(4, np.int32, stream=t)
        nss.memset(flags, 0, stream=t)
        k.fill[self.grid(1000), self.tpb, s](x, 3, 0)
        nss.memset(y, 3, stream=t)
        k.copy[self.grid(1000), self.tpb, t](x, y, 0)
        nss.copy(x, y, stream=s)
        nss.to_device(np.full(1000, 3, np.uint8), stream=s, to=x)
        k.check[self.grid(1000), self.tpb, t](x, 3, flags, 0, 0)
        out = nss.copy_to_host(flags, stream=t)
        part = nss.copy_to_host(x[10:20], stream=t)
        t.synchronize()
        assert not out.any() and (part == 3).all()

    def run_threads(self, threads: int, steps: int, phase: int) -> None:
        workers = [Worker(self, i, steps, self.seed * 7919 + phase * 104729 + i)
                   for i in range(threads)]
        started = time.perf_counter()
        pool = [threading.Thread(target=w.run, name=f"stress-{phase}-{i}")
                for i, w in enumerate(workers)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
        self.seconds += time.perf_counter() - started

    def quiesce(self) -> dict[str, int]:
        """Everything idle, reaped and trimmed: the figures to compare."""
        self.cuda.synchronize()
        gc.collect()
        rt = self.rt
        rt.flush()
        rt.reap()
        ctx = self.cuda.current_context()
        deallocs = getattr(ctx, "deallocations", None)
        if deallocs is not None:
            deallocs.clear()  # Numba's own queued frees (streams, modules)
        self.cuda.synchronize()
        rt.driver.pool_trim(0)
        free, total = rt.driver.mem_info()
        return {"used": total - free, "outstanding": rt.bytes_outstanding(),
                "events_in_use": rt.resource.events.in_use,
                "live_blocks": rt.stats().live_blocks}


class Worker:
    """One thread's random walk over its own arrays."""

    def __init__(self, st: Stress, index: int, steps: int, seed: int) -> None:
        self.st = st
        self.index = index
        self.steps = steps
        self.rng = random.Random(seed)
        self.live: dict[int, list[Any]] = {}  # key -> [array, value]
        self.next_key = 0
        self.counter = index * 37
        self.counts = dict.fromkeys(st.counts, 0)
        #: stream index -> [[flags array, used slots, [what each slot checks]], ...]
        self.flags: dict[int, list[list[Any]]] = {}
        self.readbacks: list[tuple[Any, int, str]] = []
        self.touched: set[int] = set()
        self.wrong: list[str] = []

    # ---------------------------------------------------------------- helpers
    def stream(self, avoid: int | None = None) -> int:
        n = len(self.st.streams)
        i = self.rng.randrange(n)
        if avoid is not None and n > 1 and i == avoid:
            i = (i + 1 + self.rng.randrange(n - 1)) % n
        return i

    def size(self) -> int:
        top = math.log2(self.st.max_bytes)
        return max(1, min(self.st.max_bytes, int(2 ** self.rng.uniform(0, top))))

    def spins(self) -> int:
        return SLOW_SPINS if self.rng.random() < self.st.slow_share else 0

    def value(self, old: int | None) -> int:
        self.counter += 1
        v = 1 + self.counter % 255
        return v if v != old else 1 + (v % 255)

    def remember(self, array: Any, value: int) -> int:
        key = self.next_key
        self.next_key += 1
        self.live[key] = [array, value]
        return key

    def write(self, array: Any, value: int, how: int) -> int:
        """Write ``value`` into every element on a random stream; its index."""
        st, k = self.st, self.st.k
        x = self.stream()
        s = st.streams[x]
        n = array.size
        if how == 0:
            k.fill[st.grid(n), st.tpb, s](array, value, self.spins())
            self.counts["kernels"] += 1
        elif how == 1 or n > HOST_MAX:
            nss.memset(array, value, stream=s)
            self.counts["copies"] += 1
        else:
            nss.to_device(np.full(n, value, np.uint8), stream=s, to=array)
            self.counts["copies"] += 1
        return x

    def check(self, array: Any, value: int, what: str, avoid: int | None) -> None:
        """Queue the check of ``array == value`` on a stream other than ``avoid``."""
        st = self.st
        y = self.stream(avoid)
        s = st.streams[y]
        slots = self.flags.setdefault(y, [])
        if not slots or slots[-1][1] == len(slots[-1][0]):
            flags = nss.device_array(2 * BATCH, np.int32, stream=s, tag="flags")
            nss.memset(flags, 0, stream=s)
            slots.append([flags, 0, []])
        entry = slots[-1]
        st.k.check[st.grid(array.size), st.tpb, s](array, value, entry[0], entry[1],
                                                    self.spins())
        entry[1] += 1
        entry[2].append(what)
        self.counts["checks"] += 1
        self.counts["kernels"] += 1

    # ------------------------------------------------------------------ steps
    def step(self, i: int) -> None:
        rng = self.rng
        r = rng.random()
        if not self.live or (r < 0.22 and len(self.live) < MAX_LIVE):
            self.op_alloc(i)
        elif len(self.live) >= MAX_LIVE or r < 0.40:
            self.op_free()
        elif r < 0.62:
            self.op_write(i)
        elif r < 0.78:
            self.op_copy(i)
        elif r < 0.88:
            key = rng.choice(list(self.live))
            array, value = self.live[key]
            self.check(array, value, f"recheck of #{key} == {value}", None)
        elif r < 0.995:
            self.op_readback()
        else:
            self.st.rt.reap()
            self.counts["reaps"] += 1

    def op_alloc(self, i: int) -> None:
        n = self.size()
        s = self.st.streams[self.stream()]
        array = nss.device_array(n, np.uint8, stream=s, tag=f"t{self.index}s{i}")
        self.counts["allocations"] += 1
        value = self.value(None)
        x = self.write(array, value, self.rng.randrange(3))
        key = self.remember(array, value)
        self.check(array, value, f"step {i}: new #{key} ({n} B) == {value}", x)

    def op_write(self, i: int) -> None:
        key = self.rng.choice(list(self.live))
        slot = self.live[key]
        value = self.value(slot[1])
        x = self.write(slot[0], value, self.rng.randrange(3))
        slot[1] = value
        self.check(slot[0], value, f"step {i}: write of #{key} ({slot[0].size} B) == {value}", x)

    def op_copy(self, i: int) -> None:
        st = self.st
        key = self.rng.choice(list(self.live))
        src, value = self.live[key]
        dst = nss.device_array(src.size, np.uint8, stream=st.streams[self.stream()],
                               tag=f"t{self.index}s{i}copy")
        self.counts["allocations"] += 1
        z = self.stream()
        s = st.streams[z]
        if self.rng.random() < 0.5:
            st.k.copy[st.grid(src.size), st.tpb, s](src, dst, self.spins())
            self.counts["kernels"] += 1
        else:
            nss.copy(dst, src, stream=s)
            self.counts["copies"] += 1
        new = self.remember(dst, value)
        self.check(dst, value, f"step {i}: copy #{key} -> #{new} ({src.size} B) == {value}", z)

    def op_free(self) -> None:
        key = self.rng.choice(list(self.live))
        del self.live[key]  # the last reference: Numba's finalizer queues the free
        self.counts["frees"] += 1

    def op_readback(self) -> None:
        key = self.rng.choice(list(self.live))
        array, value = self.live[key]
        n = array.size
        if n > HOST_MAX:
            lo = self.rng.randrange(n - HOST_MAX)
            view, what = array[lo:lo + HOST_MAX], f"#{key}[{lo}:{lo + HOST_MAX}]"
        else:
            view, what = array, f"#{key}"
        y = self.stream()
        out = nss.copy_to_host(view, stream=self.st.streams[y])
        self.touched.add(y)
        self.readbacks.append((out, value, f"read-back of {what} == {value}"))
        self.counts["readbacks"] += 1

    def settle(self) -> None:
        """Read the flags of this batch, wait, and verify flags and read-backs."""
        streams = self.st.streams
        results = []
        for y, slots in self.flags.items():
            for flags, used, whats in slots:
                results.append((nss.copy_to_host(flags, stream=streams[y]), used, whats))
            self.touched.add(y)
        for y in self.touched:
            streams[y].synchronize()
        for host, used, whats in results:
            for slot in np.flatnonzero(host[:used]):
                self.wrong.append(whats[slot])
            self.counts["wrong"] += int(np.count_nonzero(host[:used]))
        for out, value, what in self.readbacks:
            if (out != value).any():
                self.wrong.append(what)
                self.counts["wrong"] += 1
        self.flags.clear()
        self.readbacks.clear()
        self.touched.clear()

    def run(self) -> None:
        try:
            for i in range(self.steps):
                self.step(i)
                self.counts["steps"] += 1
                if (i + 1) % BATCH == 0:
                    self.settle()
            self.settle()
        except BaseException:
            with self.st.lock:
                self.st.errors.append(f"thread {self.index}:\n{traceback.format_exc()}")
        finally:
            self.live.clear()
            self.flags.clear()
            self.readbacks.clear()
            self.st.add(self.counts, self.wrong)


def _fmt(nbytes: int) -> str:
    return f"{nbytes / MiB:.1f} MiB"


def report(st: Stress, threads: int, steps: int, mid: dict[str, int], end: dict[str, int]
           ) -> str:
    c = st.counts
    rate = c["steps"] / st.seconds if st.seconds else 0.0
    issue = ISSUE_THREADS * ISSUE_STEPS
    line = (f"stress threads={threads} streams={len(st.streams)} steps/thread={steps} "
            f"max_bytes={st.max_bytes} slow_share={st.slow_share} "
            f"steps={c['steps']} seconds={st.seconds:.1f} steps/s={rate:.0f} "
            f"allocations={c['allocations']} kernels={c['kernels']} copies={c['copies']} "
            f"frees={c['frees']} checks={c['checks']} readbacks={c['readbacks']} "
            f"reaps={c['reaps']} wrong={c['wrong']} errors={len(st.errors)} "
            f"peak={_fmt(st.rt.stats().peak_bytes)} used_mid={_fmt(mid['used'])} "
            f"used_end={_fmt(end['used'])} growth={_fmt(end['used'] - mid['used'])} "
            f"outstanding_end={end['outstanding']} events_in_use_end={end['events_in_use']}")
    if rate:
        line += (f" | {ISSUE_THREADS}x{ISSUE_STREAMS}x{ISSUE_STEPS} = {issue} steps at this "
                 f"rate: {issue / rate / 60:.1f} min")
    return line


@pytest.fixture(scope="module")
def stress_kernels(gpu):
    return make_kernels(gpu)


def test_stress_threads_streams_random_steps(gpu, fresh_runtime, stress_kernels):
    rt = fresh_runtime
    streams = [gpu.stream() for _ in range(STREAMS)]
    st = Stress(gpu, rt, stress_kernels, streams)
    st.warm_up()
    half = STEPS // 2
    st.run_threads(THREADS, half, phase=0)
    mid = st.quiesce()
    path = os.environ.get("NSS_STRESS_REPORT")
    if path:  # the first half's figures, in case the second half never ends
        with open(path, "a") as f:
            f.write("half: " + report(st, THREADS, half, mid, mid) + "\n")
    st.run_threads(THREADS, STEPS - half, phase=1)
    end = st.quiesce()
    line = report(st, THREADS, STEPS, mid, end)
    print("\n" + line)
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")
            for what in st.wrong:
                f.write(f"  wrong: {what}\n")
            for err in st.errors[:3]:
                f.write(err + "\n")
    assert st.errors == [], st.errors[0]
    assert st.counts["steps"] == THREADS * STEPS
    assert st.counts["wrong"] == 0, f"{line}\nfirst wrong results: {st.wrong}"
    for figures in (mid, end):
        assert figures["outstanding"] == 0 and figures["live_blocks"] == 0, line
        assert figures["events_in_use"] == 0, line
    assert end["used"] - mid["used"] <= TOLERANCE, line


def test_stress_without_tracking_shows_wrong_results(gpu, fresh_runtime, stress_kernels):
    """Negative control: the same random walk with tracking off (half the
    kernels slow) must give wrong results, or the checks above prove nothing."""
    rt = fresh_runtime
    streams = [gpu.stream() for _ in range(4)]
    st = Stress(gpu, rt, stress_kernels, streams, slow_share=0.5)
    st.warm_up()
    with nss.tracking(False):
        st.run_threads(2, 400, phase=0)
    end = st.quiesce()
    line = report(st, 2, 400, end, end)
    print("\nuntracked " + line)
    assert st.errors == [], st.errors[0]
    assert st.counts["wrong"] > 0, "no wrong result without fences: " + line
    assert end["outstanding"] == 0 and end["events_in_use"] == 0, line
