"""DLPack on a GPU, ``NSS_INTEROP_TRIALS`` times (default 100) ordered and,
interleaved, with tracking off (the negative control), with
``NUMBA_CUDA_ARRAY_INTERFACE_SYNC`` off so only the library orders:

- ``torch-dlpack`` / ``cupy-dlpack``: a tracked array written by a slow
  tracked kernel on stream b (allocated on a) is taken by
  ``torch.from_dlpack`` / ``cupy.from_dlpack`` on a consumer stream of that
  library, which passes its stream to ``__dlpack__``;
- ``torch-import`` / ``cupy-import``: a tensor or array written on a stream
  of that library after a long sleep comes in through ``nss.import_array``
  on a Numba stream and is read there by a tracked kernel. The import runs
  with the producer's stream current in its library, as DLPack producers
  order their current stream before the consumer's.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import numba_streamsafe as nss

pytestmark = pytest.mark.gpu

TRIALS = int(os.environ.get("NSS_INTEROP_TRIALS", "100"))
N = 1 << 16
GRID, BLOCK = 256, 256
SPINS = 1000


@pytest.fixture(autouse=True)
def _no_interface_sync(monkeypatch):
    from numba.cuda.core import config

    monkeypatch.setattr(config, "CUDA_ARRAY_INTERFACE_SYNC", False, raising=False)


def _export_trials(gpu, kernels, read) -> tuple[int, int]:
    """A slow tracked writer of a fresh array on b (allocated on a), then
    ``read(x, value)`` by the consumer; wrong counts (tracked, untracked)."""
    a, b = gpu.stream(), gpu.stream()
    wrong = {True: 0, False: 0}
    for i in range(TRIALS):
        for tracked in (True, False):
            value = (0 if tracked else 1 << 20) + i + 2
            with nss.tracking(tracked):
                x = nss.device_array(N, np.int32, stream=a)
                kernels.slow_fill[GRID, BLOCK, b](x, value, SPINS)
                ok = read(x, value)
            gpu.synchronize()
            wrong[tracked] += not ok
    return wrong[True], wrong[False]


def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA here")
    return torch


def test_torch_from_dlpack_is_ordered(gpu, kernels, race_report):
    torch = _torch()
    ts = torch.cuda.Stream()

    def read(x, value):
        with torch.cuda.stream(ts):
            t = torch.from_dlpack(x)          # passes ts to __dlpack__
            return bool((t == value).all().item())

    read(nss.device_array(N, np.int32), 0)
    tracked, untracked = _export_trials(gpu, kernels, read)
    race_report(f"torch-dlpack tracked_wrong={tracked}/{TRIALS} "
                f"untracked_wrong={untracked}/{TRIALS}")
    assert tracked == 0
    assert untracked >= 0.7 * TRIALS, "the race did not show without the ordering"


def test_cupy_from_dlpack_is_ordered(gpu, kernels, race_report):
    cupy = pytest.importorskip("cupy")
    consumer = cupy.cuda.Stream(non_blocking=True)

    def read(x, value):
        with consumer:
            xc = cupy.from_dlpack(x)          # passes the consumer stream to __dlpack__
            return bool((xc == value).all())

    read(nss.device_array(N, np.int32), 0)
    tracked, untracked = _export_trials(gpu, kernels, read)
    race_report(f"cupy-dlpack tracked_wrong={tracked}/{TRIALS} "
                f"untracked_wrong={untracked}/{TRIALS}")
    assert tracked == 0
    assert untracked >= 0.7 * TRIALS, "the race did not show without the ordering"


def _import_trials(gpu, kernels, produce, current) -> tuple[int, int]:
    """``produce(value)`` returns a foreign array written late on a foreign
    stream; ``current()`` makes that stream current in its library."""
    s = gpu.stream()
    out = nss.device_array(N, np.int32, stream=s)
    wrong = {True: 0, False: 0}
    for i in range(TRIALS):
        for tracked in (True, False):
            value = (0 if tracked else 1 << 20) + i + 2
            foreign = produce(value)
            with nss.tracking(tracked), current():
                x = nss.import_array(foreign, stream=s)
                kernels.copy[GRID, BLOCK, s](x, out)
            gpu.synchronize()
            wrong[tracked] += not bool((nss.copy_to_host(out, stream=s) == value).all())
    return wrong[True], wrong[False]


def test_a_torch_tensor_comes_in_ordered(gpu, kernels, race_report):
    torch = _torch()
    ts = torch.cuda.Stream()

    def produce(value):
        with torch.cuda.stream(ts):
            t = torch.empty(N, dtype=torch.int32, device="cuda")
            torch.cuda._sleep(2_000_000)      # about 1 ms before the write
            t.fill_(value)
        return t

    produce(0)
    tracked, untracked = _import_trials(gpu, kernels, produce, lambda: torch.cuda.stream(ts))
    race_report(f"torch-import tracked_wrong={tracked}/{TRIALS} "
                f"untracked_wrong={untracked}/{TRIALS}")
    assert tracked == 0
    assert untracked >= 0.7 * TRIALS, "the race did not show without the ordering"


def test_a_cupy_array_comes_in_ordered(gpu, kernels, race_report):
    cupy = pytest.importorskip("cupy")
    cs = cupy.cuda.Stream(non_blocking=True)
    spin = cupy.RawKernel(r"""
    extern "C" __global__ void spin(int *x, int n, int value, long long cycles) {
        long long t0 = clock64();
        while (clock64() - t0 < cycles) {}
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) x[i] = value;
    }""", "spin")

    def produce(value):
        with cs:
            x = cupy.empty(N, dtype=cupy.int32)
            spin((N // 256,), (256,), (x, np.int32(N), np.int32(value), np.int64(2_000_000)))
        return x

    produce(0)
    tracked, untracked = _import_trials(gpu, kernels, produce, lambda: cs)
    race_report(f"cupy-import tracked_wrong={tracked}/{TRIALS} "
                f"untracked_wrong={untracked}/{TRIALS}")
    assert tracked == 0
    assert untracked >= 0.7 * TRIALS, "the race did not show without the ordering"
