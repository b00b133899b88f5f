"""Races across two GPUs (docs/architecture.md section 7), on a machine with 2 or more.

Each case runs ``NSS_MULTI_GPU_TRIALS`` times (default 100) tracked and,
interleaved, with tracking off on both devices (the negative control). A slow
kernel (it sleeps about ``spins`` microseconds before touching memory) leaves
a wide window for unordered work on the other GPU, so untracked the result is
wrong in most trials; tracked it must never be.

- ``peer-producer-consumer``: a slow producer on GPU 0 writes ``x0``; a
  consumer kernel on GPU 1 reads ``x0`` through peer access. It must wait
  for the producer (GPU 1's stream waits for GPU 0's event).
- ``copy-between-gpus``: a slow producer on GPU 0 writes ``x0``; a tracked
  copy on GPU 1 (``nss.copy``) moves it into ``y1``. No peer access needed.
- ``free-after-peer-use``: a slow kernel on GPU 0 reads GPU 1's ``x1``
  through peer access; ``x1`` is dropped, and GPU 1 allocates ``z1`` (which
  may take ``x1``'s address) and fills it. The free must wait for GPU 0's read.

Per-device switches: inside ``with use_device(1), tracking(False):`` a
two-stream race on GPU 1 shows (untracked) while the same race on GPU 0 stays
ordered. The exit: a two-GPU program (slow producers, several cases, arrays
alive at exit, ``two_gpu_exit.py``) exits 0 in five child processes, where
the same kernels under Numba alone crash at exit (the negative control).

The peer cases skip when the GPUs cannot access each other's memory. Every
case prints one summary line and appends it to ``$NSS_RACE_REPORT`` when set
(the ``race_report`` fixture);
``NSS_RACE_SPINS`` fixes the sleep length instead of calibrating it. With
fewer than two GPUs every test skips.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
import weakref
from pathlib import Path

import numpy as np
import pytest

import numba_streamsafe as nss

pytestmark = pytest.mark.gpu

HERE = Path(__file__).resolve().parent

TRIALS = int(os.environ.get("NSS_MULTI_GPU_TRIALS", "100"))
N = 1 << 16
GRID, BLOCK = 256, 256
#: The slow kernels should last at least this long (milliseconds).
MIN_SLOW_MS = 1.0
#: Untracked runs must be wrong in at least this share of trials.
UNTRACKED_MIN_SHARE = 0.7


class MultiRace:
    """Streams of both GPUs, the kernels and the calibrated sleep."""

    def __init__(self, cuda, kernels) -> None:
        self.cuda = cuda
        self.k = kernels
        with nss.use_device(0):
            self.a0 = cuda.stream()
        with nss.use_device(1):
            self.b1 = cuda.stream()
        self.ones = np.ones(N, dtype=np.int32)
        self.spins = int(os.environ.get("NSS_RACE_SPINS", "1000"))
        self.slow_ms = 0.0
        self.gc_calls = 0
        self.peer = self._enable_peer()

    def _enable_peer(self) -> str | None:
        """Enable peer access both ways; None when done, else why not."""
        try:
            nss.enable_peer_access(0, 1)
            nss.enable_peer_access(1, 0)
        except nss.DriverError as exc:
            return str(exc)
        return None

    def synchronize(self) -> None:
        for device in (0, 1):
            with nss.use_device(device):
                self.cuda.synchronize()

    def warm_up(self) -> None:
        """Compile every kernel on both GPUs for the argument types of the trials."""
        k = self.k
        for device, stream in ((0, self.a0), (1, self.b1)):
            with nss.use_device(device):
                x = nss.device_array(N, np.int32, stream=stream)
                y = nss.device_array(N, np.int32, stream=stream)
                k.fill[GRID, BLOCK, stream](x, 1)
                k.copy[GRID, BLOCK, stream](x, y)
                k.slow_fill[GRID, BLOCK, stream](x, 1, 1)
                k.slow_copy[GRID, BLOCK, stream](x, y, 1)
                nss.copy(y, x, stream=stream)
                nss.copy_to_host(y, stream=stream)
        self.synchronize()

    def time_slow(self, spins: int) -> float:
        cuda, a = self.cuda, self.a0
        with nss.use_device(0):
            x = nss.device_array(N, np.int32, stream=a)
            start, end = cuda.event(), cuda.event()
            start.record(a)
            self.k.slow_fill[GRID, BLOCK, a](x, 1, spins)
            end.record(a)
            end.synchronize()
            return cuda.event_elapsed_time(start, end)

    def calibrate(self) -> None:
        """Lengthen the sleep until a slow kernel lasts ``MIN_SLOW_MS``."""
        fixed = "NSS_RACE_SPINS" in os.environ
        self.slow_ms = self.time_slow(self.spins)
        while not fixed and self.slow_ms < MIN_SLOW_MS and self.spins < 64_000:
            self.spins *= 2
            self.slow_ms = self.time_slow(self.spins)

    def collect_if_alive(self, ref: weakref.ref) -> None:
        """A dropped array frees at once unless a cycle holds it: then collect."""
        if ref() is not None:
            gc.collect()
            self.gc_calls += 1

    # -------------------------------------------------------------- the cases
    def peer_producer_consumer(self, value: int) -> tuple[bool, bool]:
        """Slow writer of x0 on GPU 0; reader of x0 on GPU 1 (peer access)."""
        k, a0, b1 = self.k, self.a0, self.b1
        with nss.use_device(0):
            x0 = nss.device_array(N, np.int32, stream=a0)
            k.slow_fill[GRID, BLOCK, a0](x0, value, self.spins)
        with nss.use_device(1):
            y1 = nss.device_array(N, np.int32, stream=b1)
            k.copy[GRID, BLOCK, b1](x0, y1)  # must wait for GPU 0's write
            out = nss.copy_to_host(y1, stream=b1)
            b1.synchronize()
        return bool((out != value).any()), False

    def copy_between_gpus(self, value: int) -> tuple[bool, bool]:
        """Slow writer of x0 on GPU 0; tracked copy x0 -> y1 on GPU 1."""
        k, a0, b1 = self.k, self.a0, self.b1
        with nss.use_device(0):
            x0 = nss.device_array(N, np.int32, stream=a0)
            k.slow_fill[GRID, BLOCK, a0](x0, value, self.spins)
        with nss.use_device(1):
            y1 = nss.device_array(N, np.int32, stream=b1)
            nss.copy(y1, x0, stream=b1)  # must wait for GPU 0's write
            out = nss.copy_to_host(y1, stream=b1)
            b1.synchronize()
        return bool((out != value).any()), False

    def free_after_peer_use(self, value: int) -> tuple[bool, bool]:
        """Slow reader (GPU 0) of GPU 1's x1; x1 dropped; z1 allocated on GPU 1
        (same stream and size: it may take x1's address at once) and written."""
        k, a0, b1 = self.k, self.a0, self.b1
        with nss.use_device(1):
            x1 = nss.to_device(self.ones, stream=b1)
            b1.synchronize()
        with nss.use_device(0):
            y0 = nss.device_array(N, np.int32, stream=a0)
            k.slow_copy[GRID, BLOCK, a0](x1, y0, self.spins)  # reads x1 late
        old_ptr = nss.block_of(x1).ptr
        ref = weakref.ref(x1.gpu_data)
        del x1  # the finalizer queues the free; GPU 1's next allocation drains it
        self.collect_if_alive(ref)
        with nss.use_device(1):
            z1 = nss.device_array(N, np.int32, stream=b1)
            reused = nss.block_of(z1).ptr == old_ptr
            k.fill[GRID, BLOCK, b1](z1, value)  # must not land before GPU 0's read
        with nss.use_device(0):
            out = nss.copy_to_host(y0, stream=a0)
            a0.synchronize()
        return bool((out != 1).any()), reused


CASES = ["peer-producer-consumer", "copy-between-gpus", "free-after-peer-use"]
NEEDS_PEER = {"peer-producer-consumer", "free-after-peer-use"}


@pytest.fixture(scope="module")
def race(gpu, kernels):
    if len(gpu.gpus) < 2:
        pytest.skip(f"needs 2 GPUs, found {len(gpu.gpus)}")
    r = MultiRace(gpu, kernels)
    r.warm_up()
    r.calibrate()
    print(f"\nslow kernel: spins={r.spins} lasts {r.slow_ms:.2f} ms; peer access: "
          f"{'yes' if r.peer is None else 'no (' + r.peer + ')'}")
    return r


@pytest.mark.parametrize("case", CASES)
def test_multi_gpu_race(race, race_report, case):
    if case in NEEDS_PEER and race.peer is not None:
        pytest.skip(f"the GPUs have no peer access to each other: {race.peer}")
    trial = getattr(race, case.replace("-", "_"))
    wrong = {True: 0, False: 0}
    reused = {True: 0, False: 0}
    started = time.perf_counter()
    for i in range(TRIALS):
        for tracked in (True, False):
            value = (0 if tracked else 1 << 20) + i + 2  # never a value of an earlier trial
            with nss.tracking(tracked, 0), nss.tracking(tracked, 1):
                bad, same = trial(value)
            race.synchronize()  # the next trial starts with every stream idle
            wrong[tracked] += bad
            reused[tracked] += same
    seconds = time.perf_counter() - started
    line = (f"{case} tracked_wrong={wrong[True]}/{TRIALS} "
            f"untracked_wrong={wrong[False]}/{TRIALS} spins={race.spins} "
            f"slow_ms={race.slow_ms:.2f} seconds={seconds:.1f}")
    if case == "free-after-peer-use":
        line += (f" address_reused_tracked={reused[True]}/{TRIALS}"
                 f" address_reused_untracked={reused[False]}/{TRIALS} gc_calls={race.gc_calls}")
    race_report(line)
    assert wrong[True] == 0, line
    assert wrong[False] >= UNTRACKED_MIN_SHARE * TRIALS, (
        "the race did not show without tracking, so this run proves nothing: " + line)


# ------------------------------------------------------ per-device switches
def _two_stream_race(race, device: int, streams, value: int) -> bool:
    """On ``device``: a slow write of x on one stream, a read of x on another.
    True when the read saw the old contents (the race)."""
    k = race.k
    s, t = streams
    with nss.use_device(device):
        x = nss.device_array(N, np.int32, stream=s)
        y = nss.device_array(N, np.int32, stream=s)
        k.fill[GRID, BLOCK, s](x, 1)
        s.synchronize()
        k.slow_fill[GRID, BLOCK, s](x, value, race.spins)
        k.copy[GRID, BLOCK, t](x, y)
        out = nss.copy_to_host(y, stream=t)
        t.synchronize()
        s.synchronize()
    return bool((out != value).any())


def test_tracking_switches_only_the_device_of_the_current_context(race, race_report):
    """``with use_device(1), tracking(False):`` leaves GPU 1 untracked (its race
    shows) and GPU 0 tracked (never wrong), for GPU 0's work inside the block."""
    streams = {}
    for device in (0, 1):
        with nss.use_device(device):
            streams[device] = (race.cuda.stream(), race.cuda.stream())
    wrong = {0: 0, 1: 0}
    for i in range(TRIALS):
        with nss.use_device(1), nss.tracking(False):
            wrong[1] += _two_stream_race(race, 1, streams[1], i + 2)
            with nss.use_device(0):
                wrong[0] += _two_stream_race(race, 0, streams[0], i + 2)
    line = (f"per-device-tracking gpu0_tracked_wrong={wrong[0]}/{TRIALS} "
            f"gpu1_untracked_wrong={wrong[1]}/{TRIALS} spins={race.spins}")
    race_report(line)
    assert wrong[0] == 0, line
    assert wrong[1] >= UNTRACKED_MIN_SHARE * TRIALS, (
        "the race did not show on the untracked device, so this run proves nothing: " + line)


# ------------------------------------------------------------ interpreter exit
EXIT_RUNS = 5


def _exit_run(child_env, mode: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-X", "faulthandler", str(HERE / "two_gpu_exit.py"), mode, "30", "5"],
        env=child_env(NUMBA_DISABLE_PERFORMANCE_WARNINGS="1", **env), capture_output=True,
        text=True, timeout=300)


def test_a_two_gpu_program_exits_cleanly(race, child_env, race_report):
    """Slow producers, four cross-device cases, plain kernels on both GPUs and
    arrays alive at exit: exit status 0 in each of five runs. Under Numba
    alone the same plain kernels crash at exit (negative control), while
    numba-cuda unloads a library shared by two contexts twice."""
    from numba_streamsafe.numba import shared_libraries

    runs = [_exit_run(child_env, str(HERE / "kernels.py"),
                      NUMBA_CUDA_MEMORY_MANAGER="numba_streamsafe") for _ in range(EXIT_RUNS)]
    control = _exit_run(child_env, "numba-only")
    codes = [p.returncode for p in runs]
    line = (f"two-gpu-exit library_exit_codes={codes} numba_only_exit_code={control.returncode} "
            f"guard={'on' if shared_libraries.install() is not None else 'not needed'}")
    race_report(line)
    for p in runs:
        out = f"--- exit {p.returncode}\n{p.stdout}\n--- stderr\n{p.stderr[-4000:]}"
        assert p.returncode == 0, out
        assert p.stdout.splitlines()[-1:] == ["done"], out
        assert "Fatal Python error" not in p.stderr, out
        wrong = [ln for ln in p.stdout.splitlines() if "wrong=" in ln]
        assert len(wrong) == 4 and all(" wrong=0/" in ln for ln in wrong), out
    assert control.stdout.splitlines()[-1:] == ["done"], control.stderr[-4000:]
    if shared_libraries.install() is not None:
        assert control.returncode != 0, (
            "Numba alone exited cleanly: this numba-cuda may no longer unload a shared "
            "library twice, and the control proves nothing: " + line)
