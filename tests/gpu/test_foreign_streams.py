"""Streams of PyTorch, CuPy and cuda.core given to tracked kernels on a GPU:
a slow tracked writer on one library's stream and a tracked reader on another
library's stream are ordered by the library (0 wrong), and wrong without the
ordering (the negative control), ``NSS_INTEROP_TRIALS`` times (default 100).
The reused arrays make every trial after the first go through the compiled
hot path where it is built (the stream objects that take attributes cache
their handles)."""

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



def _torch_stream():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA here")
    return torch.cuda.Stream()


def _cupy_stream():
    cupy = pytest.importorskip("cupy")
    return cupy.cuda.Stream(non_blocking=True)


def _core_stream():
    core = pytest.importorskip("cuda.core")
    device_cls = getattr(core, "Device", None)
    if device_cls is None:
        device_cls = pytest.importorskip("cuda.core.experimental").Device
    dev = device_cls(0)
    dev.set_current()
    return dev.create_stream()


MAKERS = {"torch": _torch_stream, "cupy": _cupy_stream, "cuda.core": _core_stream}


@pytest.mark.parametrize("writer, reader", [("torch", "cupy"), ("cupy", "cuda.core"),
                                            ("cuda.core", "torch")])
def test_tracked_kernels_on_foreign_streams(gpu, kernels, writer, reader, race_report):
    gpu.current_context()
    ws, rs = MAKERS[writer](), MAKERS[reader]()
    x = nss.device_array(N, np.int32, stream=0)
    y = nss.device_array(N, np.int32, stream=0)
    kernels.slow_fill[GRID, BLOCK, ws](x, 0, 1)  # compile and warm up on both streams
    kernels.copy[GRID, BLOCK, rs](x, y)
    gpu.synchronize()
    wrong = {True: 0, False: 0}
    for i in range(TRIALS):
        for tracking in (True, False):
            value = 2 * i + (1 if tracking else 2)
            with nss.tracking(tracking):
                kernels.slow_fill[GRID, BLOCK, ws](x, value, SPINS)
                kernels.copy[GRID, BLOCK, rs](x, y)
            gpu.synchronize()
            wrong[tracking] += not bool((nss.copy_to_host(y) == value).all())
    race_report(f"streams {writer}->{reader} tracked_wrong={wrong[True]}/{TRIALS} "
            f"untracked_wrong={wrong[False]}/{TRIALS}")
    assert wrong[True] == 0
    assert wrong[False] >= 0.7 * TRIALS, "the race did not show without the ordering"
