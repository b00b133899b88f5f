"""CUDA graphs of tracked work on a GPU: a replay computes what the eager
launches compute, and a replay racing outside work on another stream is
ordered (0 wrong in ``NSS_RACE_TRIALS`` trials, default 100), while with the
ordering off the same program is wrong in most trials (negative control)."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import numba_streamsafe as nss

pytestmark = pytest.mark.gpu

TRIALS = int(os.environ.get("NSS_RACE_TRIALS", "100"))
N = 1 << 16
GRID, BLOCK = 256, 256
SPINS = 1000


def test_replays_compute_what_eager_launches_compute(gpu, kernels, fresh_runtime):
    s = gpu.stream()
    x = nss.device_array(N, np.int32, stream=s)
    y = nss.device_array(N, np.int32, stream=s)
    kernels.fill[GRID, BLOCK, s](x, 0)
    kernels.copy[GRID, BLOCK, s](x, y)         # compiled before the capture
    gpu.synchronize()
    with nss.graph(s) as g:
        kernels.copy[GRID, BLOCK, s](x, y)
    assert g.operations == 1
    for v in (3, 4, 5):
        nss.memset(x, 0, stream=s)
        kernels.fill[GRID, BLOCK, s](x, v)     # eager, then the replay reads x
        g.launch()
        assert (nss.copy_to_host(y, stream=s) == v).all()


def test_a_replay_racing_outside_work(gpu, kernels, fresh_runtime, race_report):
    """Outside: slow_fill of x on stream b. The graph (on a) copies x to y.
    With the ordering the replay waits for the fill; without it, it reads x early."""
    a, b = gpu.stream(), gpu.stream()
    x = nss.device_array(N, np.int32, stream=a)
    y = nss.device_array(N, np.int32, stream=a)
    kernels.slow_fill[GRID, BLOCK, b](x, 0, 1)
    kernels.copy[GRID, BLOCK, a](x, y)
    gpu.synchronize()
    with nss.graph(a) as g:
        kernels.copy[GRID, BLOCK, a](x, y)
    wrong = {True: 0, False: 0}
    for i in range(TRIALS):
        for tracking in (True, False):
            value = 2 * i + (1 if tracking else 2)
            with nss.tracking(tracking):
                kernels.slow_fill[GRID, BLOCK, b](x, value, SPINS)
                g.launch()
            gpu.synchronize()
            wrong[tracking] += not bool((nss.copy_to_host(y, stream=a) == value).all())
    race_report(f"graph-replay tracked_wrong={wrong[True]}/{TRIALS} "
            f"untracked_wrong={wrong[False]}/{TRIALS}")
    assert wrong[True] == 0
    assert wrong[False] >= 0.7 * TRIALS, "the race did not show without the ordering"


def test_allocation_inside_a_capture_is_refused(gpu, kernels, fresh_runtime):
    s = gpu.stream()
    x = nss.device_array(N, np.int32, stream=s)
    kernels.fill[GRID, BLOCK, s](x, 1)
    with pytest.raises(nss.GraphCaptureError), nss.graph(s):
        kernels.fill[GRID, BLOCK, s](x, 2)
        nss.device_array(N, np.int32, stream=s)
    kernels.fill[GRID, BLOCK, s](x, 3)         # the stream works on after the failed capture
    assert (nss.copy_to_host(x, stream=s) == 3).all()


def test_the_graph_keeps_its_arrays_on_the_direct_path(gpu, kernels, fresh_runtime):
    """A direct launch's packed parameters hold only addresses, and CUDA keeps no
    Python object: the graph itself must keep the arrays. x is dropped after the
    capture; it stays allocated (nothing reuses its memory), the replay reads
    it, and closing the graph frees it."""
    from numba_streamsafe.numba.launch.policy import launch_policy

    assert launch_policy(fresh_runtime).direct_launch, "direct launches are on by default"
    s = gpu.stream()
    x = nss.device_array(N, np.int32, stream=s)
    y = nss.device_array(N, np.int32, stream=s)
    kernels.fill[GRID, BLOCK, s](x, 0)
    kernels.copy[GRID, BLOCK, s](x, y)         # compiled, and its direct plan made
    gpu.synchronize()
    with nss.graph(s) as g:
        kernels.copy[GRID, BLOCK, s](x, y)
    kernels.fill[GRID, BLOCK, s](x, 7)
    block = nss.block_of(x)
    del x
    gc.collect()
    fresh_runtime.flush()
    assert block.state is nss.BlockState.LIVE
    z = nss.device_array(N, np.int32, stream=s)   # would take x's memory, were it freed
    kernels.fill[GRID, BLOCK, s](z, -1)
    g.launch()
    assert (nss.copy_to_host(y, stream=s) == 7).all()
    g.close()
    gc.collect()
    fresh_runtime.flush()
    assert block.state is nss.BlockState.FREED
    del z


def test_host_copies_and_legacy_stream_work_in_a_capture_are_refused(gpu, kernels,
                                                                     fresh_runtime):
    """Refused before anything reaches CUDA, so the capture goes on and replays."""
    s = gpu.stream()
    x = nss.device_array(N, np.int32, stream=s)
    y = nss.device_array(N, np.int32, stream=0)
    kernels.fill[GRID, BLOCK, s](x, 0)
    kernels.fill[GRID, BLOCK, 0](y, 0)
    gpu.synchronize()
    with nss.graph(s) as g:
        with pytest.raises(nss.GraphCaptureError, match="host and device"):
            nss.to_device(np.ones(N, np.int32), stream=s, to=x)
        with pytest.raises(nss.GraphCaptureError, match="host and device"):
            nss.copy_to_host(x, stream=s)
        with pytest.raises(nss.GraphCaptureError, match="legacy default stream"):
            kernels.fill[GRID, BLOCK, 0](y, 1)
        kernels.fill[GRID, BLOCK, s](x, 5)
    g.launch()
    assert (nss.copy_to_host(x, stream=s) == 5).all()


def test_a_replay_on_another_stream(gpu, kernels, fresh_runtime):
    """Captured on a, replayed on b after a slow writer on c: ordered after it,
    and a reader on a is ordered after the replay."""
    a, b, c = gpu.stream(), gpu.stream(), gpu.stream()
    x = nss.device_array(N, np.int32, stream=a)
    y = nss.device_array(N, np.int32, stream=a)
    z = nss.device_array(N, np.int32, stream=a)
    kernels.slow_fill[GRID, BLOCK, c](x, 0, 1)
    kernels.copy[GRID, BLOCK, a](x, y)
    gpu.synchronize()
    with nss.graph(a) as g:
        kernels.copy[GRID, BLOCK, a](x, y)
    for v in (11, 12, 13):
        kernels.slow_fill[GRID, BLOCK, c](x, v, SPINS)
        g.launch(b)
        kernels.copy[GRID, BLOCK, a](y, z)
        assert (nss.copy_to_host(z, stream=a) == v).all()


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "numba-path"])
def test_captured_launches_of_either_launch_path(gpu, kernels, fresh_runtime, direct):
    """Launches through Numba's launcher (direct launches off) are captured
    like direct ones, and the graph keeps their arrays either way."""
    from numba_streamsafe.numba.launch.policy import launch_policy

    policy = launch_policy(fresh_runtime)
    before = policy.direct_launch
    policy.direct_launch = direct
    try:
        s = gpu.stream()
        x = nss.device_array(N, np.int32, stream=s)
        y = nss.device_array(N, np.int32, stream=s)
        kernels.fill[GRID, BLOCK, s](x, 0)
        kernels.copy[GRID, BLOCK, s](x, y)
        gpu.synchronize()
        with nss.graph(s) as g:
            kernels.fill[GRID, BLOCK, s](x, 9)
            kernels.copy[GRID, BLOCK, s](x, y)
        assert g.operations == 2
        block = nss.block_of(x)
        del x
        gc.collect()
        fresh_runtime.flush()
        assert block.state is nss.BlockState.LIVE
        kernels.fill[GRID, BLOCK, s](y, 0)
        gpu.synchronize()
        assert (nss.copy_to_host(y, stream=s) == 0).all()   # nothing ran at capture
        g.launch()
        assert (nss.copy_to_host(y, stream=s) == 9).all()
    finally:
        policy.direct_launch = before
