"""A ``distributed`` worker plugin that sets numba_streamsafe up on every Dask worker.

Dask-CUDA gives each worker one GPU (it rotates ``CUDA_VISIBLE_DEVICES``, so a
worker's GPU is its device 0) and installs RMM on every worker with a worker
plugin (``RMMSetup``, from ``LocalCUDACluster(rmm_pool_size=...)``).
:class:`StreamSafePlugin` is the same for this library: registered once on the
client, it runs on every worker, present and future, and

* sets the library's runtime options (the ``NUMBA_STREAMSAFE_*`` settings:
  driver, resource, fences, direct launches) in the worker's environment and
  reloads them,
* installs the memory manager (``numba.cuda.set_memory_manager``) so that
  every Numba allocation on the worker comes from the device's runtime
  (Numba's CUDA simulator has no memory managers: it is skipped there),
* builds the runtimes of the worker's devices, with peer access among them
  when asked.

:func:`worker_stats` reports a worker's runtimes; ``client.run(worker_stats)``
brings every worker's back to the client::

    from distributed import Client, LocalCluster
    from numba_streamsafe.dask import StreamSafePlugin, worker_stats

    client = Client(LocalCluster(n_workers=2))
    client.register_plugin(StreamSafePlugin(fences="lazy"))
    ...                                   # tasks use tracked kernels and nss arrays
    client.run(worker_stats)              # {worker address: {device: memory_stats}}

``distributed`` is an optional dependency (``pip install numba-streamsafe[dask]``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from numba_streamsafe.core.errors import InvalidArgument
from numba_streamsafe.core.settings import reload_settings
from numba_streamsafe.diagnostics.memstats import memory_stats
from numba_streamsafe.runtime import (
    enable_peer_access,
    get_runtime,
    installed_devices,
    installed_runtime,
)

try:
    from distributed import WorkerPlugin
except ImportError as exc:  # pragma: no cover - exercised when distributed is missing
    raise ImportError(
        "numba_streamsafe.dask needs the 'distributed' package: pip install "
        "'numba-streamsafe[dask]' (or pip install distributed)"
    ) from exc

__all__ = ["StreamSafePlugin", "worker_stats"]

#: Plugin options and the settings variables they set.
_OPTIONS = {
    "driver": ("NUMBA_STREAMSAFE_DRIVER", ("cuda", "sim")),
    "resource": ("NUMBA_STREAMSAFE_RESOURCE", ("async", "direct")),
    "fences": ("NUMBA_STREAMSAFE_FENCES", ("lazy", "eager")),
    "upstream": ("NUMBA_STREAMSAFE_UPSTREAM", ("driver", "rmm")),
}


class StreamSafePlugin(WorkerPlugin):
    """Install numba_streamsafe on every worker (``client.register_plugin(...)``).

    Parameters
    ----------
    driver, resource, fences : str, optional
        The runtime options ``NUMBA_STREAMSAFE_DRIVER`` (``"cuda"``, ``"sim"``),
        ``NUMBA_STREAMSAFE_RESOURCE`` (``"async"``, ``"direct"``) and
        ``NUMBA_STREAMSAFE_FENCES`` (``"lazy"``, ``"eager"``); None leaves the
        worker's setting.
    upstream : str, optional
        ``NUMBA_STREAMSAFE_UPSTREAM``: ``"rmm"`` builds each worker's layer over
        the worker's current RMM resource (with dask-cuda's
        ``LocalCUDACluster(rmm_pool_size=...)``, the worker's RMM pool, set up
        when the worker starts, before a plugin registered on the client runs);
        ``"driver"`` over the device's own pool; None leaves the worker's setting.
    direct_launch : bool, optional
        ``NUMBA_STREAMSAFE_DIRECT_LAUNCH``; None leaves the worker's setting.
    memory_manager : bool
        Install :class:`~numba_streamsafe.StreamSafeMemoryManager` as Numba's
        memory manager (before the worker's first CUDA context, as Numba
        requires). Default True.
    devices : sequence of int
        Devices whose runtimes are built at setup (default ``(0,)``: a
        Dask-CUDA worker's GPU is its device 0).
    peer_access : bool
        Enable peer access between every pair of ``devices``.

    Raises
    ------
    InvalidArgument
        An option outside its values (checked on the client, at construction).
    """

    name = "numba-streamsafe"
    idempotent = True

    def __init__(self, *, driver: str | None = None, resource: str | None = None,
                 fences: str | None = None, upstream: str | None = None,
                 direct_launch: bool | None = None,
                 memory_manager: bool = True, devices: Sequence[int] = (0,),
                 peer_access: bool = False) -> None:
        env: dict[str, str] = {}
        for option, value in (("driver", driver), ("resource", resource), ("fences", fences),
                              ("upstream", upstream)):
            if value is None:
                continue
            variable, allowed = _OPTIONS[option]
            if value not in allowed:
                raise InvalidArgument(f"StreamSafePlugin: {option} must be one of {allowed} "
                                      f"(or None for the worker's setting), got {value!r}")
            env[variable] = value
        if direct_launch is not None:
            env["NUMBA_STREAMSAFE_DIRECT_LAUNCH"] = "1" if direct_launch else "0"
        devices = tuple(devices)
        if any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in devices):
            raise InvalidArgument(f"StreamSafePlugin: devices must be device ordinals (ints "
                                  f">= 0), got {devices!r}")
        self.env = env
        self.memory_manager = memory_manager
        self.devices = devices
        self.peer_access = peer_access

    def setup(self, worker: Any = None) -> None:
        """On the worker: the settings, the memory manager, the runtimes."""
        os.environ.update(self.env)
        reload_settings()
        if self.memory_manager:
            from numba import config, cuda

            if not config.ENABLE_CUDASIM:  # type: ignore[attr-defined]
                from numba_streamsafe.numba.emm import StreamSafeMemoryManager

                cuda.set_memory_manager(StreamSafeMemoryManager)
        for device in self.devices:
            get_runtime(device)
        if self.peer_access:
            for device in self.devices:
                for peer in self.devices:
                    if peer != device:
                        enable_peer_access(device, peer)

    def teardown(self, worker: Any = None) -> None:
        """Run the queued frees of the worker's runtimes and wait for pending ones."""
        for device in self.devices:
            rt = installed_runtime(device)
            if rt is not None:
                rt.flush()
                rt.reap()


def worker_stats(devices: Sequence[int] | None = None) -> dict[int, dict[str, Any]]:
    """The :func:`~numba_streamsafe.memory_stats` of this process's runtimes
    (of ``devices``; default: every installed one), by device.
    ``client.run(worker_stats)`` collects every worker's."""
    if devices is None:
        devices = installed_devices()
    return {device: memory_stats(device) for device in devices
            if installed_runtime(device) is not None}
