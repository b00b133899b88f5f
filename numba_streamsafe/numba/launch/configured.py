"""Configured launches of a tracked kernel on the Python path:
``k[grid, block, stream, shmem]`` (:func:`slow_launch`, for what the compiled
:class:`~.launcher.Launcher` hands back) and ``k.forall(n)`` (:class:`ForAll`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from numba_streamsafe.numba import target
from numba_streamsafe.numba.launch import launch_plan

if TYPE_CHECKING:
    from numba_streamsafe.numba.launch.kernel import TrackedKernel

__all__ = ["ForAll", "slow_launch"]


def slow_launch(kernel: TrackedKernel, config: tuple[Any, ...], stream: Any,
                args: tuple[Any, ...]) -> None:
    """``kernel[config](*args)`` on the Python path (``stream``: the
    configuration's, 0 when it names none): direct when the configuration's
    dimensions are plain, else through Numba. What CUDA refuses is refused
    here, before anything is queued."""
    shmem = config[3] if len(config) > 3 else 0
    if kernel.kind.checks_config:
        dims = kernel.check_config(config[0], config[1], shmem)
    else:
        dims = None
        grid = launch_plan.normalize_dims(config[0])
        if grid is not None:
            block = launch_plan.normalize_dims(config[1])
            if block is not None and type(shmem) is int:
                dims = (grid, block, shmem)
    kernel.run(stream, args, dims, functools.partial(_numba_launch, kernel, config))


def _numba_launch(kernel: TrackedKernel, config: tuple[Any, ...]) -> Callable[..., Any]:
    """Numba's configured launch of ``kernel[config]`` (its stream as Numba's)."""
    if len(config) > 2:
        config = (config[0], config[1], target.numba_stream(config[2]), *config[3:])
    return kernel.configure(config)


class ForAll:
    """A configured ``k.forall(n, tpb, stream, sharedmem)``."""

    __slots__ = ("kernel", "ntasks", "tpb", "stream", "sharedmem")

    def __init__(self, kernel: TrackedKernel, ntasks: int, tpb: int, stream: Any,
                 sharedmem: int) -> None:
        self.kernel = kernel
        self.ntasks = ntasks
        self.tpb = tpb
        self.stream = stream
        self.sharedmem = sharedmem

    def _numba(self) -> Callable[..., Any]:
        return self.kernel.dispatcher.forall(self.ntasks, self.tpb,
                                             target.numba_stream(self.stream), self.sharedmem)

    def __call__(self, *args: Any) -> None:
        dims = None
        tpb, ntasks = self.tpb, self.ntasks
        # With no threads per block given Numba asks the occupancy calculator.
        if (type(tpb) is int and tpb > 0 and type(ntasks) is int and ntasks > 0
                and type(self.sharedmem) is int):
            dims = self.kernel.check_config((ntasks + tpb - 1) // tpb, tpb, self.sharedmem)
        self.kernel.run(self.stream, args, dims, self._numba)
