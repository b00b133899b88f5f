"""The Driver protocol: what the resources need from CUDA, and nothing else.

Two backends implement it: :class:`~numba_streamsafe._driver.cuda.CudaDriver`
over ``cuda.bindings.driver`` and :class:`~numba_streamsafe._driver.sim.SimDriver`,
a CPU model with a happens-before hazard checker. Streams are integer handles
(``CUstream`` values; 0 is the legacy default stream); events are opaque.
Every method raises :class:`~numba_streamsafe.core.errors.DriverError` on failure.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from numba_streamsafe._driver.limits import LaunchLimits

__all__ = ["Driver", "CUDA_ERROR_OUT_OF_MEMORY", "CUDA_ERROR_INVALID_HANDLE"]

#: ``CUresult`` values the library reacts to.
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_NOT_READY = 600

Event = Any


@runtime_checkable
class Driver(Protocol):
    """Operations the memory resources perform on one device."""

    #: Device ordinal this driver allocates on.
    device: int
    #: True when :meth:`trace_access` checks accesses (the simulated driver).
    traces_accesses: bool
    #: True when :meth:`launch_kernel` launches (the CUDA driver).
    supports_direct_launch: bool
    #: Handles of streams this driver destroyed and has not handed out again.
    destroyed_streams: set[int]

    def create_stream(self, blocking: bool = False) -> int:
        """Create a stream and return its handle (``cuStreamCreate``): non-blocking,
        or, with ``blocking``, one that the legacy default stream and it wait for
        each other's earlier work on (as ``numba.cuda.stream()`` makes them).
        The handle of a destroyed stream may be handed out again."""
        ...

    def destroy_stream(self, stream: int) -> None:
        """Destroy ``stream`` (``cuStreamDestroy``); work queued on it still completes."""
        ...

    def synchronize(self) -> None:
        """Wait for all work on the device, destroyed streams' included (``cuCtxSynchronize``)."""
        ...

    def launch_kernel(self, function: int, grid: tuple[int, int, int],
                      block: tuple[int, int, int], shmem: int, stream: int, params: Any) -> None:
        """Queue one kernel on ``stream`` (``cuLaunchKernel``); only when
        :attr:`supports_direct_launch` is True."""
        ...

    def launch_limits(self) -> LaunchLimits:
        """The device's limits on one launch (threads per block, block and grid
        dimensions, dynamic shared memory)."""
        ...

    def alloc_async(self, nbytes: int, stream: int) -> int:
        """Allocate ``nbytes`` ordered on ``stream`` (``cuMemAllocAsync``)."""
        ...

    def free_async(self, ptr: int, stream: int) -> None:
        """Queue the free of ``ptr`` on ``stream`` (``cuMemFreeAsync``)."""
        ...

    def alloc(self, nbytes: int) -> int:
        """Allocate synchronously (``cuMemAlloc``)."""
        ...

    def free(self, ptr: int) -> None:
        """Free synchronously (``cuMemFree``)."""
        ...

    def event_create(self) -> Event:
        """Create an event without timing."""
        ...

    def event_destroy(self, event: Event) -> None: ...

    def event_record(self, event: Event, stream: int) -> None: ...

    def event_query(self, event: Event) -> bool:
        """True when all work captured by the event has completed."""
        ...

    def stream_wait_event(self, stream: int, event: Event) -> None:
        """Make future work on ``stream`` wait for ``event`` (``cuStreamWaitEvent``)."""
        ...

    def stream_synchronize(self, stream: int) -> None: ...

    def stream_blocking(self, stream: int) -> bool:
        """Whether ``stream`` (a stream of the device, made by anyone) and the
        legacy default stream wait for each other's work (``cuStreamGetFlags``)."""
        ...

    def stream_query(self, stream: int) -> bool:
        """True when all work queued on ``stream`` has completed (``cuStreamQuery``)."""
        ...

    def check_stream(self, stream: int) -> None:
        """Raise :class:`~numba_streamsafe.core.errors.StreamMisuse` if ``stream`` is not usable."""
        ...

    def pool_trim(self, keep_bytes: int = 0) -> None:
        """Return pooled memory above ``keep_bytes`` to the system."""
        ...

    def set_pool_attribute(self, name: str, value: int) -> None:
        """Set an attribute of the device's stream-ordered pool, by its short name
        (``"RELEASE_THRESHOLD"``: pooled bytes kept at a synchronize)."""
        ...

    def get_pool_attribute(self, name: str) -> int:
        """An attribute of the device's stream-ordered pool, by its short name:
        ``"RESERVED_MEM_CURRENT"`` / ``"RESERVED_MEM_HIGH"`` (bytes the pool
        holds from the system), ``"USED_MEM_CURRENT"`` / ``"USED_MEM_HIGH"``
        (bytes of it handed out). Setting a ``*_HIGH`` attribute to 0 resets it."""
        ...

    def mem_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes of the device."""
        ...

    def memset_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        """Queue on ``stream`` the fill of ``nbytes`` bytes at ``ptr`` with ``value``
        (``cuMemsetD8Async``).

        ``value`` is a byte (0 to 255). The fill is a write of the range, ordered
        like a kernel on ``stream``; the simulated backend checks it as one.
        """
        ...

    def copy_to_host(self, ptr: int, nbytes: int, stream: int) -> bytes:
        """Copy ``nbytes`` bytes at ``ptr`` to the host, ordered on ``stream``, and
        return them once they have arrived.

        Queues ``cuMemcpyDtoHAsync`` on ``stream``, then synchronises ``stream``
        (``cuStreamSynchronize``), so everything queued on ``stream`` before the
        call is complete when it returns. The copy is a read of the range,
        ordered like a kernel on ``stream``; the simulated backend checks it as one.
        """
        ...

    def copy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """Queue on ``stream`` the copy of ``nbytes`` bytes from ``src`` to ``dst``
        (``cuMemcpyAsync``); either may be memory of another device (no peer
        access needed). The simulated backend checks it as a read and a write."""
        ...

    def enable_peer_access(self, peer: int) -> None:
        """Let kernels of this device access device ``peer``'s memory
        (``cuCtxEnablePeerAccess``); idempotent."""
        ...

    def activate(self) -> AbstractContextManager[None]:
        """A context manager that makes this device's context current inside it
        (for calls made for this device while another device's is current)."""
        ...

    def begin_capture(self, stream: int) -> None:
        """Start capturing the work queued on ``stream`` into a graph
        (``cuStreamBeginCapture``, thread-local mode)."""
        ...

    def capture_work(self, stream: int, work: Any, args: tuple[Any, ...],
                     accesses: list[tuple[int, int, Any]], label: str, copy: bool) -> Any:
        """Queue ``work(*args)`` (one launch, copy or fill on ``stream``) into the
        capture: the CUDA backend runs it (the driver captures what it queues);
        the simulated backend records it to run at each replay."""
        ...

    def end_capture(self, stream: int) -> Any:
        """End the capture of ``stream``; the captured graph."""
        ...

    def graph_instantiate(self, graph: Any) -> Any:
        """An executable of ``graph`` (``cuGraphInstantiate``)."""
        ...

    def graph_launch(self, graph_exec: Any, stream: int) -> None:
        """Queue one replay of ``graph_exec`` on ``stream`` (``cuGraphLaunch``)."""
        ...

    def graph_destroy(self, graph: Any, graph_exec: Any) -> None:
        """Destroy a graph and its executable (either may be None)."""
        ...

    def register_foreign(self, ptr: int, nbytes: int, stream: int) -> None:
        """Tell a checking backend that ``nbytes`` at ``ptr`` are device memory
        another library allocated, handed over on ``stream`` (a borrowed block):
        its accesses are checked from now on. The CUDA backend does nothing."""
        ...

    def release_foreign(self, ptr: int, stream: int) -> None:
        """Tell a checking backend that the borrowed memory at ``ptr`` is released
        on ``stream`` (every use ordered before it there). The CUDA backend does
        nothing."""
        ...

    def observe(self) -> Any | None:
        """Start noting the calls other code makes on this device's context
        (event records and waits, synchronises, copies and fills, streams made
        and destroyed) and return where they are drained: an object with
        ``pending()``, ``drain()``, ``lost`` and ``whole_process`` (see
        :class:`~numba_streamsafe.resources.observed.ObservedCalls`); None
        where they cannot be observed (:meth:`observe_failure` says why). The
        CUDA backend uses the driver observer (CUPTI's callbacks: every call of
        the process); the simulated one, the calls made through its
        ``observer`` (a stand-in for another library)."""
        ...

    def observe_failure(self) -> str | None:
        """Why :meth:`observe` returned None (None before it was called)."""
        ...

    def trace_access(self, stream: int, accesses: Any, label: str, *,
                     copy: bool = False, stack: tuple = (),
                     library: str | None = None) -> None:
        """Tell a checking backend that work on ``stream`` touches ``accesses``.

        ``accesses`` is a sequence of ``(ptr, nbytes, Access)`` (or with the
        argument's name fourth). ``stack`` is the user's stack where the work
        was queued and ``library`` who queued it, for the reports. The CUDA
        backend does nothing; the simulated backend checks happens-before, and
        that a kernel (``copy`` False) touches memory of another device only
        with peer access.
        """
        ...

    def trace_sites(self, ptr: int, *, allocated: tuple | None = None,
                    freed: tuple | None = None) -> None:
        """Tell a checking backend where the user's code allocated (or freed)
        the memory at ``ptr``, as stacks, for the reports of its hazards. The
        CUDA backend does nothing."""
        ...
