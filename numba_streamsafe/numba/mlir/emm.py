"""The memory-manager plugin on numba-cuda-mlir's classes.

numba-cuda-mlir vendors numba-cuda's driver, EMM hook included, as classes of
its own: its contexts take a memory manager derived from its
``HostOnlyCUDAMemoryManager`` and its arrays hold its ``MemoryPointer``.
:class:`~numba_streamsafe.StreamSafeMemoryManager` makes this plugin when
such a context asks (:func:`numba_streamsafe.numba.mlir.memory_manager`,
which refuses the settings numba-cuda-mlir cannot work with first). It
allocates as the numba-cuda plugin does, from the device's runtime; nothing
orders numba-cuda-mlir's launches and copies (:mod:`numba_streamsafe.numba.mlir`).

Importing this module imports numba-cuda-mlir.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from numba_cuda_mlir.numba_cuda.cudadrv.driver import (
    HostOnlyCUDAMemoryManager,
    MemoryInfo,
    MemoryPointer,
    binding,
)

from numba_streamsafe.core.errors import StreamSafeError
from numba_streamsafe.numba.scope import current_stream
from numba_streamsafe.runtime import DeviceRuntime, get_runtime, installed_runtime

__all__ = ["MlirMemoryManager"]


class MlirMemoryManager(HostOnlyCUDAMemoryManager):  # type: ignore[misc]
    """numba-cuda-mlir's memory manager over the numba_streamsafe runtime of
    the context's device: one per context, as numba-cuda's plugin.

    Device allocations are blocks of the runtime, ordered on the stream of
    the innermost :func:`~numba_streamsafe.stream_scope` (else the default
    stream) and freed in stream order on that stream once dropped (after the
    uses the runtime knows of: under numba-cuda-mlir, none of its launches).
    Host (pinned, mapped) allocations are left to numba-cuda-mlir's
    ``HostOnlyCUDAMemoryManager``.
    """

    @property
    def device(self) -> int:
        """The ordinal of the context's device (0 without a context)."""
        return int(self.context.device.id) if self.context is not None else 0

    @property
    def runtime(self) -> DeviceRuntime:
        """The runtime of the context's device."""
        return get_runtime(self.device)

    def initialize(self) -> None:
        """Build (or find) the device's runtime."""
        self.runtime  # noqa: B018 - built on first access

    def memalloc(self, size: int) -> Any:
        """A block of ``size`` bytes on the current scope's stream (or the
        default stream), as a numba-cuda-mlir ``MemoryPointer`` whose death
        frees it (queued, finalizer-safe)."""
        if size == 0:
            return MemoryPointer(self.context, binding.CUdeviceptr(0), 0)
        rt = self.runtime
        block = rt.allocate(size, current_stream(), "numba")
        return MemoryPointer(self.context, binding.CUdeviceptr(block.ptr), block.nbytes,
                             finalizer=functools.partial(rt.defer_free, block))

    def get_memory_info(self) -> Any:
        """``(free, total)`` bytes of the device, as the driver reports them."""
        free, total = self.runtime.driver.mem_info()
        return MemoryInfo(free=free, total=total)

    def get_ipc_handle(self, memory: Any) -> Any:
        """Refused: the plugin exports no memory under numba-cuda-mlir.

        Raises
        ------
        StreamSafeError
            Always.
        """
        raise StreamSafeError(
            "CUDA IPC of numba_streamsafe's memory is not supported under numba-cuda-mlir: "
            "allocate the arrays to share with numba-cuda-mlir's default memory manager "
            "(NUMBA_CUDA_MEMORY_MANAGER=default)")

    def reset(self) -> None:
        """Forget every block of the context; arrays from before are refused afterwards."""
        super().reset()
        rt = installed_runtime(self.device)
        if rt is not None:
            rt.reset()

    @contextlib.contextmanager
    def defer_cleanup(self) -> Iterator[None]:
        """Hold queued frees (and numba-cuda-mlir's host frees) until the block exits."""
        with super().defer_cleanup(), self.runtime.resource.hold_frees():
            yield

    @property
    def interface_version(self) -> int:
        return 1
