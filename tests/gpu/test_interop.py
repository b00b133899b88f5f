"""Tracked arrays handed to CuPy and PyTorch on a GPU, each with a slow tracked
writer on another stream, ``NSS_INTEROP_TRIALS`` times (default 100) ordered
and, interleaved, with tracking off (the negative control).

- ``cupy-cai``: the array is written on stream b (allocated on a); CuPy takes
  it through ``__cuda_array_interface__`` and reads it on a non-blocking CuPy
  stream. CuPy synchronises with the stream the interface names; the export
  made that stream wait for b's write.
- ``torch-lend``: the same read by PyTorch on a ``torch.cuda.Stream``, inside
  ``nss.lend(x, stream=torch_stream, access="r")``.

Each case prints a summary line and appends it to ``$NSS_RACE_REPORT``.
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



def _run(gpu, kernels, read) -> tuple[int, int]:
    a, b = gpu.stream(), gpu.stream()
    wrong = {True: 0, False: 0}
    for i in range(TRIALS):
        for tracked in (True, False):
            value = (0 if tracked else 1 << 20) + i + 2
            with nss.tracking(tracked):
                x = nss.device_array(N, np.int32, stream=a)
                kernels.slow_fill[GRID, BLOCK, b](x, value, SPINS)
                ok = read(x, value, tracked)
            gpu.synchronize()
            wrong[tracked] += not ok
    return wrong[True], wrong[False]


def test_cupy_reads_a_tracked_array_through_the_interface(gpu, kernels, race_report, cupy):
    consumer = cupy.cuda.Stream(non_blocking=True)

    def read(x, value, tracked):
        with consumer:
            xc = cupy.asarray(x)          # syncs with the stream the interface names
            return bool((xc == value).all())

    read(nss.device_array(N, np.int32), 0, True)  # warm up CuPy's kernels
    tracked, untracked = _run(gpu, kernels, read)
    race_report(f"cupy-cai tracked_wrong={tracked}/{TRIALS} "
                f"untracked_wrong={untracked}/{TRIALS}")
    assert tracked == 0
    assert untracked >= 0.7 * TRIALS, "the race did not show without the ordering"


def test_pytorch_reads_a_lent_tracked_array(gpu, kernels, race_report):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA here")
    ts = torch.cuda.Stream()

    def read(x, value, tracked):
        if tracked:
            with nss.lend(x, stream=ts, access="r"), torch.cuda.stream(ts):
                t = torch.as_tensor(x, device="cuda")
                return bool((t == value).all().item())
        with torch.cuda.stream(ts):
            t = torch.as_tensor(x, device="cuda")
            return bool((t == value).all().item())

    read(nss.device_array(N, np.int32), 0, True)  # warm up
    tracked, untracked = _run(gpu, kernels, read)
    race_report(f"torch-lend tracked_wrong={tracked}/{TRIALS} "
                f"untracked_wrong={untracked}/{TRIALS}")
    assert tracked == 0
    assert untracked >= 0.7 * TRIALS, "the race did not show without the ordering"
