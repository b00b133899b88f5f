"""Threaded stress of the library on a GPU, for a set time: random tracked
programs on several threads, every result checked against NumPy.

Each thread runs, until the time is up, random steps over arrays it owns
(int32, 1 to 2**20 elements, each with its expected value as a NumPy array):

- allocate and fill (a tracked kernel), upload from the host, copy into a new
  array (a tracked kernel or ``nss.copy``), add one array into another
  (``y += x``, read-write), on the thread's own stream or one shared by all;
- read back (``nss.copy_to_host``) and compare with the expected values;
- drop arrays (``del``, now and then ``gc.collect()``), reap, destroy a
  stream of its own after launching on it;
- hand arrays to other threads through a queue (the receiver uses them on its
  own streams, so the library must order them after the giver's work);
- export to CuPy (``cupy.asarray`` reads through the CUDA Array Interface; a
  lent array is incremented by CuPy on a CuPy stream) and to PyTorch (a lent
  array incremented by ``add_`` on a ``torch.cuda.Stream``), where installed.

Some kernels sleep before they touch memory, so that a missing wait lets
later work overtake them. At the end every array left is checked and dropped,
and the run must leave 0 wrong values, 0 errors in threads, 0 bytes
outstanding and 0 events in use. Run it with ``-X faulthandler`` so that a
crash leaves a stack.

    python3 -X faulthandler scripts/stress_threads.py --seconds 300 [--threads 8]

Prints one line of figures; exit status 1 when any check failed.
"""

from __future__ import annotations

import argparse
import gc
import os
import queue
import random
import sys
import threading
import time
import traceback
from collections import Counter
from typing import Any

import numpy as np

np.seterr(over="ignore")  # int32 sums wrap, on the device as in the expected values

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")

from numba import cuda  # noqa: E402

import numba_streamsafe as nss  # noqa: E402
from numba_streamsafe import compiled  # noqa: E402

MAX_LIVE = 10
#: Microseconds a slow kernel sleeps first (the simulator has no nanosleep).
SPINS = 0 if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" else 200


@nss.tracked_kernel(access={"out": "w"})
def fill(out, value, spins):
    for _ in range(spins):
        cuda.nanosleep(1000)
    i = cuda.grid(1)
    while i < out.size:
        out[i] = value
        i += cuda.gridsize(1)


@nss.tracked_kernel(access={"src": "r", "dst": "w"})
def copy_kernel(src, dst, spins):
    for _ in range(spins):
        cuda.nanosleep(1000)
    i = cuda.grid(1)
    while i < dst.size:
        dst[i] = src[i]
        i += cuda.gridsize(1)


@nss.tracked_kernel(access={"x": "r", "y": "rw"})
def add_into(x, y, spins):
    for _ in range(spins):
        cuda.nanosleep(1000)
    i = cuda.grid(1)
    while i < y.size:
        y[i] += x[i % x.size]
        i += cuda.gridsize(1)


def _grid(n: int) -> int:
    return min(1024, (n + 127) // 128)


def _optional(name: str) -> Any:
    try:
        module = __import__(name)
    except Exception:  # noqa: BLE001 - any import failure leaves the export out
        return None
    if name == "torch" and not module.cuda.is_available():
        return None
    return module


class Shared:
    """What the threads share: streams, the hand-over queue, counters, errors."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.deadline = time.monotonic() + args.seconds
        self.max_log2 = args.max_log2
        self.streams = [cuda.stream() for _ in range(args.shared_streams)]
        self.handover: queue.Queue[tuple[Any, np.ndarray]] = queue.Queue()
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.errors: list[str] = []
        self.cupy = _optional("cupy") if args.exports else None
        self.torch = _optional("torch") if args.exports else None

    def count(self, what: str, n: int = 1) -> None:
        with self.lock:
            self.counts[what] += n

    def compare(self, got: np.ndarray, expected: np.ndarray, how: str) -> None:
        """Count a check of ``got`` (read back ``how``) against ``expected``,
        and a wrong one, with its first reports, when they differ."""
        self.count("checks")
        if not np.array_equal(got, expected):
            bad = int(np.count_nonzero(got != expected))
            with self.lock:
                self.counts["wrong"] += 1
                if len(self.errors) < 20:
                    self.errors.append(f"wrong values ({how}): {bad} of {expected.size}")


class Worker:
    """One thread's random program."""

    def __init__(self, shared: Shared, seed: int) -> None:
        self.sh = shared
        self.rng = random.Random(seed)
        self.own = cuda.stream()
        self.mine: list[tuple[Any, np.ndarray]] = []
        self.cupy_stream: Any = None
        self.torch_stream: Any = None

    # ------------------------------------------------------------ helpers
    def stream(self) -> Any:
        return self.own if self.rng.random() < 0.5 else self.rng.choice(self.sh.streams)

    def spins(self) -> int:
        return SPINS if self.rng.random() < 0.1 else 0

    def size(self) -> int:
        return max(1, int(2 ** self.rng.uniform(0, self.sh.max_log2)))

    def pick(self) -> tuple[Any, np.ndarray] | None:
        return self.rng.choice(self.mine) if self.mine else None

    def keep(self, x: Any, expected: np.ndarray) -> None:
        self.mine.append((x, expected))
        if len(self.mine) > MAX_LIVE:
            self.mine.pop(self.rng.randrange(len(self.mine)))

    def check(self, x: Any, expected: np.ndarray, stream: Any) -> None:
        self.sh.compare(nss.copy_to_host(x, stream=stream), expected, "copy_to_host")

    # -------------------------------------------------------------- steps
    def step_new(self) -> None:
        n, s, v = self.size(), self.stream(), self.rng.randrange(-2**31, 2**31)
        x = nss.device_array(n, np.int32, stream=s)
        fill[_grid(n), 128, self.stream()](x, v, self.spins())
        self.keep(x, np.full(n, v, np.int32))

    def step_upload(self) -> None:
        n = self.size()
        h = np.frombuffer(self.rng.randbytes(4 * n), np.int32).copy()
        self.keep(nss.to_device(h, stream=self.stream()), h)

    def step_copy(self) -> None:
        got = self.pick()
        if got is None:
            return
        x, e = got
        y = nss.device_array(e.size, np.int32, stream=self.stream())
        if self.rng.random() < 0.5:
            copy_kernel[_grid(e.size), 128, self.stream()](x, y, self.spins())
        else:
            nss.copy(y, x, stream=self.stream())
        self.keep(y, e.copy())

    def step_add(self) -> None:
        a, b = self.pick(), self.pick()
        if a is None or b is None:
            return
        (x, ex), (y, ey) = a, b
        add_into[_grid(ey.size), 128, self.stream()](x, y, self.spins())
        if x is y:
            ey += ey.copy()
        else:
            ey += ex[np.arange(ey.size) % ex.size]

    def step_read(self) -> None:
        got = self.pick()
        if got is not None:
            self.check(*got, self.stream())

    def step_drop(self) -> None:
        if self.mine:
            self.mine.pop(self.rng.randrange(len(self.mine)))
            if self.rng.random() < 0.2:
                gc.collect()
                self.sh.count("gc")

    def step_reap(self) -> None:
        nss.get_runtime().reap()
        self.sh.count("reaps")

    def step_destroy(self) -> None:
        got = self.pick()
        if got is None:
            return
        x, e = got
        s = cuda.stream()
        v = self.rng.randrange(1 << 20)
        fill[_grid(e.size), 128, s](x, v, self.spins())
        e[:] = v
        nss.get_runtime().destroy_stream(s)
        self.sh.count("destroyed")

    def step_give(self) -> None:
        if self.mine:
            self.sh.handover.put(self.mine.pop(self.rng.randrange(len(self.mine))))
            self.sh.count("given")

    def step_take(self) -> None:
        try:
            x, e = self.sh.handover.get_nowait()
        except queue.Empty:
            return
        self.sh.count("taken")
        if self.rng.random() < 0.5:
            self.check(x, e, self.stream())
        self.keep(x, e)

    def step_cupy(self) -> None:
        cp, got = self.sh.cupy, self.pick()
        if cp is None or got is None:
            return
        x, e = got
        if self.cupy_stream is None:
            self.cupy_stream = cp.cuda.Stream(non_blocking=True)
        cs = self.cupy_stream
        if self.rng.random() < 0.5:
            with cs:
                got_host = cp.asnumpy(cp.asarray(x), stream=cs)  # reads after x's writes
            cs.synchronize()
            self.sh.compare(got_host, e, "cupy.asarray")
        else:
            with nss.lend(x, stream=cs, access="rw"), cs:
                xc = cp.asarray(x)
                xc += 3
            e += 3
        self.sh.count("cupy")

    def step_torch(self) -> None:
        torch, got = self.sh.torch, self.pick()
        if torch is None or got is None:
            return
        x, e = got
        if self.torch_stream is None:
            self.torch_stream = torch.cuda.Stream()
        ts = self.torch_stream
        with nss.lend(x, stream=ts, access="rw"), torch.cuda.stream(ts):
            t = torch.as_tensor(x, device="cuda")
            t.add_(5)
        e += 5
        self.sh.count("torch")

    STEPS = (("new", 14), ("upload", 6), ("copy", 10), ("add", 16), ("read", 14),
             ("drop", 10), ("reap", 1), ("destroy", 3), ("give", 4), ("take", 5),
             ("cupy", 4), ("torch", 4))

    def run(self) -> None:
        names = [n for n, _ in self.STEPS]
        weights = [w for _, w in self.STEPS]
        steps = {n: getattr(self, f"step_{n}") for n in names}
        done = 0
        try:
            while time.monotonic() < self.sh.deadline:
                steps[self.rng.choices(names, weights)[0]]()
                done += 1
            for x, e in self.mine:
                self.check(x, e, self.own)
        except BaseException:  # noqa: BLE001 - every error is reported by the main thread
            with self.sh.lock:
                self.sh.errors.append(traceback.format_exc())
        finally:
            self.mine.clear()
            self.sh.count("steps", done)


def _check_left(sh: Shared) -> None:
    """Check (then drop) the arrays left in the hand-over queue."""
    while not sh.handover.empty():
        x, e = sh.handover.get_nowait()
        sh.compare(nss.copy_to_host(x), e, "left in the queue")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--shared-streams", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-log2", type=float, default=20,
                        help="arrays of up to 2**N elements (small on the simulator)")
    parser.add_argument("--no-exports", dest="exports", action="store_false",
                        help="leave CuPy and PyTorch out")
    args = parser.parse_args()
    sh = Shared(args)
    for w in (Worker(sh, args.seed + 1000 + i) for i in range(1)):  # compile the kernels first
        w.step_new()
        w.step_copy()
        w.step_add()
        w.mine.clear()
    workers = [Worker(sh, args.seed + i) for i in range(args.threads)]
    threads = [threading.Thread(target=w.run, name=f"stress-{i}") for i, w in enumerate(workers)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _check_left(sh)
    workers.clear()
    cuda.synchronize()
    gc.collect()
    rt = nss.get_runtime()
    rt.flush()
    rt.reap()
    cuda.synchronize()
    rt.reap()
    c = sh.counts
    outstanding = rt.bytes_outstanding()
    events = rt.resource.events.in_use
    build = "compiled" if all(v.startswith("compiled")
                              for v in compiled.engine_builds(load=True).values()) else "python"
    print(f"stress build={build} threads={args.threads} seconds={time.monotonic() - t0:.0f} "
          f"steps={c['steps']} checks={c['checks']} wrong={c['wrong']} errors={len(sh.errors)} "
          f"given={c['given']} taken={c['taken']} destroyed={c['destroyed']} gc={c['gc']} "
          f"reaps={c['reaps']} cupy={c['cupy']} torch={c['torch']} "
          f"outstanding_bytes={outstanding} events_in_use={events}", flush=True)
    for err in sh.errors[:5]:
        print(err, file=sys.stderr)
    ok = c["wrong"] == 0 and not sh.errors and outstanding == 0 and events == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
