"""Where an :class:`~.async_resource.AsyncResource`'s blocks come from.

By default the device's stream-ordered pool (``cuMemAllocAsync`` /
``cuMemFreeAsync`` through the driver). An *upstream* replaces those two calls
with another stream-ordered allocator, such as an RMM device memory resource
(:class:`RmmUpstream`), so that the library's arrays and those of RAPIDS
libraries come from one pool. Everything else the resource does (marks,
waits, generations, kept-block reuse, the checker, statistics, tracing) is
unchanged: the upstream is asked for memory when the resource needs new
memory, and given it back, in stream order, once every use has been ordered
before the free.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from numba_streamsafe._driver.base import CUDA_ERROR_OUT_OF_MEMORY, Driver
from numba_streamsafe.core.errors import DriverError, InvalidArgument, StreamMisuse

_log = logging.getLogger("numba_streamsafe")

__all__ = ["Upstream", "RmmUpstream", "rmm_upstream", "MemorySource", "memory_source"]


@runtime_checkable
class Upstream(Protocol):
    """A stream-ordered allocator an :class:`~.async_resource.AsyncResource`
    takes its memory from.

    ``allocate(nbytes, stream)`` returns the address of ``nbytes`` bytes usable
    by work queued on ``stream`` after the call; ``deallocate(ptr, stream)``
    gives them back once the work queued on ``stream`` so far is done (the
    resource has ordered every use of the block before that point). Running
    out of memory is a :class:`~numba_streamsafe.core.errors.DriverError`
    with ``CUDA_ERROR_OUT_OF_MEMORY``, which the resource answers by handing
    back what it keeps and trying once more. ``name`` says what it is
    (``memory_stats()["upstream"]``).
    """

    name: str

    def allocate(self, nbytes: int, stream: int) -> int: ...

    def deallocate(self, ptr: int, stream: int) -> None: ...


class _StreamHandle:
    """A raw stream handle under the CUDA stream protocol (what RMM's
    ``Stream`` wraps)."""

    __slots__ = ("handle",)

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def _rmm_stream(handle: int) -> Any:
    from rmm.pylibrmm.stream import Stream

    return Stream(_StreamHandle(handle))


class RmmUpstream:
    """An RMM device memory resource as the upstream of an
    :class:`~.async_resource.AsyncResource`.

    Any RMM resource works under it: the pool, arena, async and managed
    resources, and RMM's statistics and logging adaptors over them. The
    resource's blocks are then RMM allocations, counted by RMM's adaptors,
    and the library orders every use before RMM gets them back.

    Parameters
    ----------
    mr : rmm.mr.DeviceMemoryResource
        The resource (``allocate(nbytes, stream)`` and ``deallocate(ptr,
        nbytes, stream)``, as RMM's Python resources take them).
    stream_of : callable, optional
        ``stream_of(handle)``: the stream object ``mr`` takes for a driver
        stream handle. Default: RMM's ``Stream`` over the handle (made once
        per handle).

    Raises
    ------
    InvalidArgument
        ``mr`` has no ``allocate`` or ``deallocate`` method.

    Notes
    -----
    RMM's deallocation takes the size of the allocation; the upstream keeps
    the size of each allocation it made until it is given back. Thread-safe.
    """

    def __init__(self, mr: Any, stream_of: Callable[[int], Any] | None = None) -> None:
        if not callable(getattr(mr, "allocate", None)) or \
                not callable(getattr(mr, "deallocate", None)):
            raise InvalidArgument(
                f"RmmUpstream: {mr!r} is not a device memory resource (it needs allocate and "
                "deallocate methods); pass an rmm.mr resource, e.g. "
                "rmm.mr.get_current_device_resource()")
        self.mr = mr
        self.name = f"rmm ({type(mr).__name__})"
        self._stream_of = stream_of or _rmm_stream
        self._streams: dict[int, Any] = {}
        self._sizes: dict[int, int] = {}
        self._lock = threading.Lock()

    def _stream(self, handle: int) -> Any:
        stream = self._streams.get(handle)
        if stream is None:
            stream = self._streams[handle] = self._stream_of(handle)
        return stream

    def allocate(self, nbytes: int, stream: int) -> int:
        """``nbytes`` bytes from the RMM resource on ``stream``.

        Raises
        ------
        DriverError
            ``CUDA_ERROR_OUT_OF_MEMORY``: RMM raised ``MemoryError``.
        """
        try:
            ptr = int(self.mr.allocate(nbytes, self._stream(stream)))
        except MemoryError as exc:
            raise DriverError("rmm allocate", CUDA_ERROR_OUT_OF_MEMORY,
                              f"{nbytes} bytes: {exc}") from None
        with self._lock:
            self._sizes[ptr] = nbytes
        return ptr

    def deallocate(self, ptr: int, stream: int) -> None:
        """Give the allocation at ``ptr`` back to the RMM resource on ``stream``.

        Raises
        ------
        StreamMisuse
            ``ptr`` is no allocation of this upstream.
        """
        with self._lock:
            nbytes = self._sizes.get(ptr)
        if nbytes is None:
            raise StreamMisuse(f"{ptr:#x} is not an allocation of {self.name}")
        self.mr.deallocate(ptr, nbytes, self._stream(stream))
        with self._lock:  # given back: forgotten (kept where RMM refused, to try again)
            self._sizes.pop(ptr, None)

    def __repr__(self) -> str:
        return f"RmmUpstream({self.mr!r})"


def rmm_upstream(device: int) -> RmmUpstream:
    """RMM's current resource of ``device`` (``rmm.mr.get_per_device_resource``)
    as an upstream: what ``NUMBA_STREAMSAFE_UPSTREAM=rmm`` uses.

    Raises
    ------
    InvalidArgument
        RMM is not installed (install ``numba-streamsafe[rmm-cu13]`` or
        ``[rmm-cu12]``, matching the CUDA of numba-cuda).

    Warns
    -----
    RuntimeWarning
        The device's resource is RMM's default ``CudaMemoryResource``: correct,
        but not stream-ordered (each free synchronises the device).
    """
    try:
        import rmm.mr  # type: ignore[import-not-found]
    except ImportError as exc:
        raise InvalidArgument(
            f"NUMBA_STREAMSAFE_UPSTREAM=rmm, but RMM cannot be imported ({exc}): install "
            "numba-streamsafe[rmm-cu13] (or [rmm-cu12], matching numba-cuda's CUDA), or unset "
            "the variable to allocate from the device's own pool") from None
    mr = rmm.mr.get_per_device_resource(device)
    if type(mr).__name__ == "CudaMemoryResource":
        warnings.warn(
            f"NUMBA_STREAMSAFE_UPSTREAM=rmm: device {device}'s RMM resource is RMM's default "
            "CudaMemoryResource (cudaMalloc / cudaFree: not stream-ordered, and every free "
            "synchronises the device). Set a pool or async resource first, e.g. "
            "rmm.reinitialize(pool_allocator=True) or rmm.mr.set_current_device_resource("
            "rmm.mr.CudaAsyncMemoryResource())", RuntimeWarning, stacklevel=2)
    return RmmUpstream(mr)


class MemorySource:
    """Where one resource's new memory comes from, and how it goes back.

    ``alloc(nbytes, stream)`` and ``free(ptr, stream)`` are the resource's two
    calls (plain callables, so the allocation path makes no extra call); the
    device's stream-ordered pool by default. Made by :func:`memory_source`.

    Attributes
    ----------
    name : str
        What it is (``memory_stats()["upstream"]``).
    alloc, free : callable
        ``alloc(nbytes, stream) -> ptr`` and ``free(ptr, stream)``, in stream order.
    """

    def __init__(self, name: str, alloc: Callable[[int, int], int],
                 free: Callable[[int, int], None], give_back_now: Callable[[int], None]
                 ) -> None:
        self.name = name
        self.alloc = alloc
        self.free = free
        self._give_back_now = give_back_now

    def give_back_now(self, ptr: int) -> None:
        """Give ``ptr`` back at a context reset (no stream order is left); an
        error is logged and dropped (the context, and its memory, is gone)."""
        try:
            self._give_back_now(ptr)
        except DriverError:
            pass
        except Exception as exc:  # an upstream's own error: its context is gone too
            _log.warning("%s: giving back %#x at a context reset failed: %s", self.name,
                         ptr, exc)


def memory_source(driver: Driver, upstream: Upstream | None = None, ipc: bool = False
                  ) -> MemorySource:
    """The memory source of a resource on ``driver``: the device's
    stream-ordered pool (``cuMemAllocAsync`` / ``cuMemFreeAsync``); with
    ``upstream``, that allocator, called with the device's context current (an
    RMM resource of one device allocates on the current device); with
    ``ipc``, exportable ``cuMemAlloc`` memory, freed by ``cuMemFree`` once the
    block's stream has completed everything queued before the free (which the
    free's waits ordered there: ``cuMemFree`` is not stream-ordered)."""
    if ipc:
        def alloc_legacy(nbytes: int, stream: int) -> int:
            return driver.alloc(nbytes)

        def free_legacy(ptr: int, stream: int) -> None:
            driver.stream_synchronize(stream)
            driver.free(ptr)

        return MemorySource("cuMemAlloc (IPC)", alloc_legacy, free_legacy, driver.free)
    if upstream is not None:
        up = upstream

        def alloc_upstream(nbytes: int, stream: int) -> int:
            with driver.activate():
                return up.allocate(nbytes, stream)

        def free_upstream(ptr: int, stream: int) -> None:
            with driver.activate():
                up.deallocate(ptr, stream)

        return MemorySource(up.name, alloc_upstream, free_upstream,
                            lambda ptr: up.deallocate(ptr, 0))
    return MemorySource("cuMemAllocAsync", driver.alloc_async, driver.free_async, driver.free)
