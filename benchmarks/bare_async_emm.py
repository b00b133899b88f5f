"""The floor of stream-ordered allocation: a bare Numba memory manager
(``NUMBA_CUDA_MEMORY_MANAGER=bare_async_emm``, with ``benchmarks/`` on the
import path) that allocates with ``cuMemAllocAsync`` and frees with
``cuMemFreeAsync``, both on the default stream, from the device's default pool,
with nothing else: no tracking, no pool, no accounting. ``alloc_free.py`` uses
it as the floor column. For benchmarks only (it orders nothing).
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from typing import Any

from cuda.bindings import driver as drv
from numba import cuda
from numba.cuda.cudadrv.driver import MemoryPointer


class BareAsyncManager(cuda.HostOnlyCUDAMemoryManager):
    """``cuMemAllocAsync`` / ``cuMemFreeAsync`` on stream 0, nothing more."""

    def initialize(self) -> None:
        self._alloc = drv.cuMemAllocAsync
        self._free = drv.cuMemFreeAsync

    def memalloc(self, size: int) -> Any:
        err, ptr = self._alloc(size, 0)
        if err:
            raise RuntimeError(f"cuMemAllocAsync({size}) failed: {err}")
        free = self._free
        address = int(ptr)

        def finalizer() -> None:
            free(address, 0)

        return MemoryPointer(self.context, ctypes.c_void_p(address), size, finalizer=finalizer)

    def get_ipc_handle(self, memory: Any) -> Any:
        raise NotImplementedError("the bare benchmark manager has no IPC")

    def get_memory_info(self) -> Any:
        err, free, total = drv.cuMemGetInfo()
        return cuda.MemoryInfo(free=free, total=total)

    def reset(self) -> None:
        super().reset()

    @contextlib.contextmanager
    def defer_cleanup(self) -> Iterator[None]:
        with super().defer_cleanup():
            yield

    @property
    def interface_version(self) -> int:
        return 1


_numba_memory_manager = BareAsyncManager
