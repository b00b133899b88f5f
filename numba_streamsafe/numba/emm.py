"""The Numba External Memory Management plugin.

Select it with ``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe`` or
``numba.cuda.set_memory_manager(numba_streamsafe.StreamSafeMemoryManager)``.
Every device allocation Numba makes then comes from the device's runtime:
ordered on the stream of the innermost :func:`~numba_streamsafe.stream_scope`
(else Numba's default stream), tracked by tracked kernels and copies, and
freed through the finalizer-safe deferred path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from numba_streamsafe.numba.target import SIMULATOR

if TYPE_CHECKING or not SIMULATOR:
    from numba.core import config as _config
    from numba.cuda import HostOnlyCUDAMemoryManager, MemoryInfo
    from numba.cuda.cudadrv.driver import MemoryPointer, binding
else:  # Numba's simulator has no memory managers: stand-ins, so imports work there
    from collections import namedtuple

    MemoryInfo = namedtuple("MemoryInfo", ["free", "total"])
    MemoryPointer = binding = _config = None

    class HostOnlyCUDAMemoryManager:
        """Stand-in base under the simulator (which never instantiates plugins)."""

        def __init__(self, *args: Any, context: Any = None, **kwargs: Any) -> None:
            self.context = context

        def reset(self) -> None:
            pass

        @contextlib.contextmanager
        def defer_cleanup(self) -> Iterator[None]:
            yield

from numba_streamsafe.core.errors import StreamSafeError
from numba_streamsafe.core.streams import LEGACY_DEFAULT, PER_THREAD_DEFAULT
from numba_streamsafe.numba import mlir, sim_plugin, target
from numba_streamsafe.numba import transparent as _transparent
from numba_streamsafe.numba.scope import per_thread as _scopes
from numba_streamsafe.runtime import RUNTIMES, DeviceRuntime, get_runtime

__all__ = ["StreamSafeMemoryManager", "_numba_memory_manager"]


class StreamSafeMemoryManager(HostOnlyCUDAMemoryManager):
    """Numba memory manager over the numba_streamsafe runtime of the context's device.

    Numba makes one per context, so each device's allocations come from that
    device's runtime (its own pool, events and marks).

    Host (pinned, mapped) allocations are left to
    :class:`numba.cuda.HostOnlyCUDAMemoryManager`.

    Given a numba-cuda-mlir context (``from numba_cuda_mlir import cuda``,
    which loads the plugin through the same hook), it makes the plugin on
    numba-cuda-mlir's classes instead, which allocates the same way; the
    settings that cannot work there (transparent mode, check mode, the
    simulated driver) are refused (:mod:`numba_streamsafe.numba.mlir`).
    """

    #: Marks the plugin for the simulator's ``set_memory_manager`` stand-in.
    _nss_plugin = True

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        context = kwargs.get("context")
        if mlir.is_mlir_context(context):  # numba-cuda-mlir's driver asks: its own plugin
            return mlir.memory_manager(*args, **kwargs)
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Numba makes one per context once the plugin is selected: from then on
        # its own launches, copies and fills are ordered (transparent mode).
        _transparent.install()
        self._runtime: DeviceRuntime | None = None
        #: The runtime's resource methods, bound once: (allocate, defer_free).
        self._resource_calls: tuple[Any, Any] | None = None
        #: ``RUNTIMES.generation`` when the two were taken: a
        #: ``set_runtime`` since makes the next allocation take the new runtime.
        self._generation = -1

    @property
    def runtime(self) -> DeviceRuntime:
        rt = self._runtime
        if rt is None or self._generation != RUNTIMES.generation:
            device = target.device_id(self.context.device) if self.context is not None else 0
            rt = self._runtime = get_runtime(device)  # may install it: generation moves
            self._generation = RUNTIMES.generation
            self._resource_calls = None
        return rt

    def initialize(self) -> None:
        """Build (or find) the device's runtime."""
        self.runtime  # noqa: B018 - built on first access

    def memalloc(self, size: int) -> MemoryPointer:
        """A block of ``size`` bytes on the current scope's stream (or the default stream)."""
        if size == 0:
            # A null CUdeviceptr: ctypes.c_void_p(0).value is None, which
            # MemoryPointer cannot convert.
            return MemoryPointer(self.context, binding.CUdeviceptr(0), 0)
        calls = self._resource_calls
        if calls is None or self._generation != RUNTIMES.generation:
            resource = self.runtime.resource
            calls = self._resource_calls = (resource.allocate, resource.defer_free)
        rt = self._runtime  # current: the calls above were refreshed with it
        stack = _scopes.stack  # current_stream(), inline
        if stack:
            # DeviceRuntime.allocate refuses an allocation a graph capture would hold.
            block = rt.allocate(size, stack[-1], "numba")  # type: ignore[union-attr]
        else:
            # default_stream_handle(), inline: Numba's configuration is loaded.
            ptds = _config.CUDA_PER_THREAD_DEFAULT_STREAM  # type: ignore[attr-defined]
            handle = PER_THREAD_DEFAULT if ptds else LEGACY_DEFAULT
            if rt.capture is not None:  # type: ignore[union-attr]  # no allocation in a capture
                rt.check_capture(handle, "numba")  # type: ignore[union-attr]
            block = calls[0](size, handle, "numba")
        return target.BlockPointer(self.context, block, calls[1])

    def get_memory_info(self) -> MemoryInfo:
        """``(free, total)`` bytes of the device, as the driver reports them."""
        free, total = self.runtime.driver.mem_info()
        return MemoryInfo(free=free, total=total)

    def get_ipc_handle(self, memory: Any) -> Any:
        """An IPC handle of ``memory`` (Numba's ``cuIpcGetMemHandle`` handle),
        when the runtime allocates exportable memory (``NUMBA_STREAMSAFE_IPC=1``).

        The handle's memory stays allocated while the exporting array lives;
        the importing process must close it before the exporter frees it.

        Raises
        ------
        StreamSafeError
            IPC is not enabled: the default stream-ordered pool's memory
            cannot be opened with ``cuIpcOpenMemHandle``.
        """
        resource = self.runtime.resource
        if not getattr(resource, "ipc", False):
            raise StreamSafeError(
                "numba_streamsafe allocates from CUDA's default stream-ordered memory pool, "
                "whose memory CUDA IPC cannot export. Set NUMBA_STREAMSAFE_IPC=1 before the "
                "first allocation to allocate exportable (cuMemAlloc) memory, still tracked, or "
                "allocate the arrays to share with Numba's default memory manager "
                "(NUMBA_CUDA_MEMORY_MANAGER=default)"
            )
        from numba.cuda.cudadrv.driver import GetIpcHandleMixin

        return GetIpcHandleMixin.get_ipc_handle(self, memory)  # type: ignore[arg-type]

    def reset(self) -> None:
        """Forget every block of the context; arrays from before are refused afterwards."""
        super().reset()
        if self._runtime is not None:
            self._runtime.reset()

    @contextlib.contextmanager
    def defer_cleanup(self) -> Iterator[None]:
        """Hold queued frees (and Numba's host frees) until the block exits."""
        with super().defer_cleanup(), self.runtime.resource.hold_frees():
            yield

    @property
    def interface_version(self) -> int:
        return 1


#: Read by Numba when ``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe``.
_numba_memory_manager = StreamSafeMemoryManager

if SIMULATOR:
    # The simulator makes no plugin: transparent mode comes with the routing of
    # its allocation calls (selected by the environment or set_memory_manager).
    sim_plugin.add_companion(_transparent.install, _transparent.uninstall)
