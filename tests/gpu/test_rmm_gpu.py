"""RMM as the upstream on a real GPU: the race suite's hazards with the
library's blocks taken from RMM's pool and async resources (tracked: 0 wrong;
untracked, the negative control: wrong in most trials), and one pool shared
with CuPy (RMM's statistics adaptor counts the library's arrays and CuPy's,
and the device's own pool hands out nothing); and dask-cuda's
``LocalCUDACluster(rmm_pool_size=...)`` with ``StreamSafePlugin(upstream="rmm")``:
each worker's layer over that worker's RMM pool, every task right.

Needs RMM (``rmm-cu13`` or ``rmm-cu12`` wheels); skipped without it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

import numba_streamsafe as nss
from tests.gpu.conftest import installed
from tests.gpu.test_races import HAZARDS, TRIALS, Race, run_trials

pytestmark = pytest.mark.gpu


def _resource(kind: str):
    import rmm.mr

    if kind == "pool":
        return rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=1 << 28)
    return rmm.mr.CudaAsyncMemoryResource()


@pytest.fixture(params=["pool", "async", "pool-no-reuse"])
def rmm_runtime(gpu, request):
    """Device 0's runtime over an RMM resource (statistics adaptor on top);
    ``pool-no-reuse`` keeps no freed block, so every free goes back to RMM."""
    pytest.importorskip("rmm", reason="RMM is not installed (the rmm-cu13/rmm-cu12 extra)")
    import rmm.mr

    from numba_streamsafe._driver.cuda import CudaDriver
    from numba_streamsafe.resources import POOL_KEEP_ALL, AsyncResource
    from numba_streamsafe.runtime import DeviceRuntime

    kind = request.param
    mr = rmm.mr.StatisticsResourceAdaptor(_resource(kind.split("-")[0]))
    previous = rmm.mr.get_current_device_resource()
    rmm.mr.set_current_device_resource(mr)
    rt = DeviceRuntime(AsyncResource(CudaDriver(0), upstream=nss.RmmUpstream(mr),
                                     release_threshold=POOL_KEEP_ALL,
                                     reuse_bytes=0 if kind.endswith("no-reuse") else 64 << 20))
    try:
        with installed(rt, gpu):
            yield kind, mr, rt
    finally:
        rmm.mr.set_current_device_resource(previous)


@pytest.mark.parametrize("hazard", HAZARDS)
def test_races_with_rmm_upstream(gpu, rmm_runtime, kernels, hazard):
    kind, mr, _ = rmm_runtime
    race = Race(gpu, kernels)
    race.warm_up()
    race.calibrate()
    wrong, line = run_trials(race, hazard, label=f"rmm-{kind} ")
    assert nss.memory_stats()["upstream"].startswith("rmm")
    if kind.endswith("no-reuse"):  # every free went back to RMM, ordered
        assert mr.allocation_counts.total_count >= TRIALS, mr.allocation_counts
    assert wrong[True] == 0, line
    assert wrong[False] >= 0.7 * TRIALS, (
        "the race did not show without the library, so this run proves nothing: " + line)


def test_one_pool_with_cupy(rmm_runtime, cupy):
    """The library's arrays and CuPy's (through rmm_cupy_allocator) come from
    one RMM resource: its statistics count both, and the device's own
    stream-ordered pool hands out nothing."""
    from rmm.allocators.cupy import rmm_cupy_allocator

    _, mr, _ = rmm_runtime
    before = mr.allocation_counts
    used_before = nss.memory_stats()["pool_used_bytes.current"]
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    try:
        x = nss.device_array(1 << 20, np.float32)          # 4 MiB from the library
        y = cupy.zeros(1 << 19, dtype=cupy.float32)         # 2 MiB from CuPy
        counts = mr.allocation_counts
        assert counts.current_bytes - before.current_bytes >= (4 << 20) + (2 << 20), counts
        assert nss.memory_stats()["pool_used_bytes.current"] == used_before
        del x, y
    finally:
        cupy.cuda.set_allocator(None)


def test_dask_cuda_rmm_pool(gpu, race_report):
    """dask-cuda's recipe: ``LocalCUDACluster(rmm_pool_size=...)`` sets up an
    RMM pool on each worker; ``StreamSafePlugin(upstream="rmm")`` builds the
    worker's layer over it. Every task (a slow producer and a consumer on two
    streams) is right, the worker's layer names RMM as its upstream, and
    RMM's tracking adaptor counts the library's arrays."""
    pytest.importorskip("rmm", reason="RMM is not installed (the rmm-cu13/rmm-cu12 extra)")
    pytest.importorskip("dask_cuda")
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    from numba_streamsafe.dask import StreamSafePlugin, worker_stats

    here = str(Path(__file__).resolve().parent)
    sys.path.insert(0, here)  # the workers import dask_tasks by name
    import dask_tasks

    tasks, n = 32, 1 << 16
    os.environ["PYTHONPATH"] = os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])
    with LocalCUDACluster(n_workers=1, threads_per_worker=1, rmm_pool_size="512MiB",
                          rmm_track_allocations=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.register_plugin(StreamSafePlugin(upstream="rmm"))
        results = client.gather([client.submit(dask_tasks.work_over_rmm, v, n, 20_000,
                                               pure=False) for v in range(tasks)])
        stats = client.run(worker_stats)
    right = sum(ok for ok, _, _ in results)
    held = min(allocated for _, allocated, _ in results)
    upstreams = sorted({name for _, _, name in results})
    (per_device,) = stats.values()
    line = (f"dask-cuda rmm_pool_size tasks={tasks} right={right}/{tasks} upstream={upstreams} "
            f"rmm_bytes_while_held_min={held} waits={per_device[0]['waits_inserted']}")
    race_report(line)
    assert right == tasks, line
    assert upstreams == ["rmm (TrackingResourceAdaptor)"], line
    assert per_device[0]["upstream"] == "rmm (TrackingResourceAdaptor)", per_device
    assert held >= 3 * n * 8, line  # the held array and the task's two, all from RMM
    assert per_device[0]["waits_inserted"] >= tasks, line
