"""``numba_streamsafe.dask.StreamSafePlugin`` on real GPUs: one Dask worker per GPU.

The cluster is built the way Dask-CUDA builds ``LocalCUDACluster``: one
``Nanny`` (a worker process) per GPU, each with ``CUDA_VISIBLE_DEVICES``
naming its GPU, so every worker's GPU is its device 0. The plugin installs
the memory manager and the runtime on every worker. Each task runs a slow
producer and a consumer on two streams of its worker's GPU (tracked, no
host synchronisation between them); every result must be right, each worker
must report a GPU of its own, and the workers' statistics come back to the
client with ``client.run(worker_stats)``.

``NSS_DASK_TASKS`` sets the number of tasks (default 64). Skipped when
``distributed`` is not installed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

HERE = Path(__file__).resolve().parent
TASKS = int(os.environ.get("NSS_DASK_TASKS", "64"))
N = 1 << 16


def test_one_worker_per_gpu(gpu, race_report):
    pytest.importorskip("distributed")
    from distributed import Client, Nanny, Scheduler, SpecCluster

    from numba_streamsafe.dask import StreamSafePlugin, worker_stats

    sys.path.insert(0, str(HERE))  # the workers import dask_tasks by name
    import dask_tasks

    ngpus = len(gpu.gpus)
    path = os.pathsep.join([str(HERE), *sys.path])
    workers = {
        f"gpu{i}": {"cls": Nanny, "options": {
            "nthreads": 1,
            "env": {"CUDA_VISIBLE_DEVICES": str(i), "PYTHONPATH": path}}}
        for i in range(ngpus)
    }
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": None}}
    with SpecCluster(workers=workers, scheduler=scheduler) as cluster, \
            Client(cluster) as client:
        client.register_plugin(StreamSafePlugin())
        client.wait_for_workers(ngpus)
        futures = [client.submit(dask_tasks.work, v, N, 20_000, pure=False)
                   for v in range(TASKS)]
        results = client.gather(futures)
        who = client.run(lambda: os.environ["CUDA_VISIBLE_DEVICES"])
        stats = client.run(worker_stats)
    right = sum(ok for ok, _ in results)
    gpus = sorted({uuid for _, uuid in results})
    line = (f"dask workers={ngpus} tasks={TASKS} right={right}/{TASKS} "
            f"gpus_used={len(gpus)} visible={sorted(who.values())}")
    for address, per_device in stats.items():
        s = per_device[0]
        line += (f" | gpu {who[address]}: allocations={s['allocation.all.allocated']}"
                 f" waits={s['waits_inserted']} peak_bytes={s['allocated_bytes.all.peak']}")
    race_report(line)
    assert right == TASKS, line
    assert sorted(who.values()) == [str(i) for i in range(ngpus)], line
    assert len(gpus) == ngpus, "the workers did not each get a GPU of their own: " + line
    assert len(stats) == ngpus, line
    for per_device in stats.values():
        assert list(per_device) == [0], per_device
        assert per_device[0]["allocation.all.allocated"] >= 2, per_device
        assert per_device[0]["waits_inserted"] >= 1, per_device
