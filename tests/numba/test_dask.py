"""``numba_streamsafe.dask.StreamSafePlugin`` on a ``distributed`` LocalCluster,
on Numba's CUDA simulator over the simulated driver.

The workers are threads of this process (``processes=False``), so they run
with the simulator this test run chose. Skipped when ``distributed`` is not
installed (it is an optional extra).
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from numba import cuda

import numba_streamsafe as nss
from numba_streamsafe import InvalidArgument, Read, Write, tracked_kernel
from numba_streamsafe.core.settings import reload_settings
from numba_streamsafe.diagnostics.memstats import STAT_KEYS
from numba_streamsafe.runtime import (
    clear_runtimes,
    installed_runtime,
    set_runtime,
)

distributed = pytest.importorskip("distributed")

from numba_streamsafe.dask import StreamSafePlugin, worker_stats  # noqa: E402

N = 256
GRID, BLOCK = 8, 32  # one thread per element


@tracked_kernel
def fill(out: Write, value):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = value


@tracked_kernel
def add(src: Read, dst: Write, k):
    i = cuda.grid(1)
    if i < src.size:
        dst[i] = src[i] + k


#: Numba's CUDA simulator swaps the kernels' ``cuda`` module while one runs, so
#: kernels of two worker threads must not run at once (on a GPU they may).
_SIMULATOR_LOCK = threading.Lock()


def work(value: int) -> tuple[np.ndarray, int]:
    """A producer and a consumer on two streams of the worker's device."""
    with _SIMULATOR_LOCK:
        return _work(value)


def _work(value: int) -> tuple[np.ndarray, int]:
    a, b = cuda.stream(), cuda.stream()
    x = nss.device_array(N, np.int64, stream=a)
    y = nss.device_array(N, np.int64, stream=b)
    fill[GRID, BLOCK, a](x, value)
    add[GRID, BLOCK, b](x, y, 1)
    out = nss.copy_to_host(y, stream=b)
    return out, len(nss.get_runtime(0).driver.hazards)


@pytest.fixture
def process_runtimes(monkeypatch):
    """The plugin installs process-wide runtimes and settings: start without
    any, put back the ones before and the environment afterwards."""
    old = installed_runtime(0)
    clear_runtimes()
    names = ("NUMBA_STREAMSAFE_DRIVER", "NUMBA_STREAMSAFE_FENCES",
             "NUMBA_STREAMSAFE_RESOURCE", "NUMBA_STREAMSAFE_DIRECT_LAUNCH")
    # The plugin sets them in this process (threads, not worker processes):
    # monkeypatch restores only the ones that were set, so the rest by hand,
    # lest later tests' child processes inherit them.
    before = {name: os.environ.get(name) for name in names}
    for name in names:
        monkeypatch.delenv(name, raising=False)
    try:
        yield
    finally:
        clear_runtimes()
        monkeypatch.undo()
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
        reload_settings()
        if old is not None:
            set_runtime(old, 0)


def test_the_plugin_sets_up_every_worker_and_stats_come_back(process_runtimes):
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        client.register_plugin(StreamSafePlugin(driver="sim", fences="eager"))
        futures = [client.submit(work, v, pure=False) for v in range(1, 7)]
        results = client.gather(futures)
        stats = client.run(worker_stats)
    for v, (out, hazards) in zip(range(1, 7), results, strict=True):
        np.testing.assert_array_equal(out, np.full(N, v + 1))
        assert hazards == 0
    assert len(stats) == 2, stats
    for per_device in stats.values():
        assert list(per_device) == [0]
        s = per_device[0]
        assert set(s) == set(STAT_KEYS)
        # every task's arrays, on the device the worker threads share
        assert s["allocation.all.allocated"] >= 12
        assert s["waits_inserted"] >= 6  # each task's add on b waits for its fill on a
    rt = installed_runtime(0)
    assert rt is not None and rt.resource.fences == "eager", "the plugin's option reached it"


def test_the_plugin_refuses_bad_options():
    with pytest.raises(InvalidArgument, match="fences"):
        StreamSafePlugin(fences="sometimes")
    with pytest.raises(InvalidArgument, match="devices"):
        StreamSafePlugin(devices=(-1,))
    with pytest.raises(InvalidArgument, match="upstream"):
        StreamSafePlugin(upstream="cupy")
    assert StreamSafePlugin(upstream="rmm").env == {"NUMBA_STREAMSAFE_UPSTREAM": "rmm"}
    plugin = StreamSafePlugin(driver="sim", direct_launch=False)
    assert plugin.env == {"NUMBA_STREAMSAFE_DRIVER": "sim", "NUMBA_STREAMSAFE_DIRECT_LAUNCH": "0"}
    assert plugin.name == "numba-streamsafe"
