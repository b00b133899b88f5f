"""The CUDA backend: :class:`CudaDriver` over ``cuda.bindings.driver``.

Every call checks its ``CUresult`` and raises
:class:`~numba_streamsafe.errors.DriverError` with the call's name, the code and
the driver's own message. The device's primary context (the one Numba uses) is
made current on each thread before its first call.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from numba_streamsafe._driver.base import CUDA_ERROR_INVALID_HANDLE
from numba_streamsafe.access import Access
from numba_streamsafe.errors import DriverError, StreamMisuse

__all__ = ["CudaDriver"]

_CUDA_ERROR_INVALID_CONTEXT = 201


def _bindings() -> Any:
    from cuda.bindings import driver

    return driver


class CudaDriver:
    """Driver backend for one CUDA device.

    Parameters
    ----------
    device : int
        Device ordinal. The device's primary context is retained for the
        lifetime of this object and made current on every calling thread.
    """

    traces_accesses = False
    supports_direct_launch = True

    def __init__(self, device: int = 0) -> None:
        drv = _bindings()
        self._drv = drv
        self.device = device
        self._check("cuInit", drv.cuInit(0))
        dev = self._check("cuDeviceGet", drv.cuDeviceGet(device))
        self._dev = dev
        self._ctx = self._check("cuDevicePrimaryCtxRetain", drv.cuDevicePrimaryCtxRetain(dev))
        self._pool = self._check("cuDeviceGetDefaultMemPool", drv.cuDeviceGetDefaultMemPool(dev))
        #: Handles of the streams this driver destroyed, refused until a new stream
        #: gets the same address: the driver does not check stream handles, so
        #: using a destroyed one would crash the process.
        self.destroyed_streams: set[int] = set()
        self._tls = threading.local()
        self._ensure_context()
        self._event_flags = drv.CUevent_flags.CU_EVENT_DISABLE_TIMING
        # Bound methods, looked up once: these sit on the launch path.
        self._record = drv.cuEventRecord
        self._wait = drv.cuStreamWaitEvent
        self._launch = drv.cuLaunchKernel
        self._alloc_async = drv.cuMemAllocAsync
        self._free_async = drv.cuMemFreeAsync

    def _check(self, call: str, result: Any) -> Any:
        if isinstance(result, tuple):
            err = result[0]
            value = result[1] if len(result) == 2 else result[1:]
        else:
            err, value = result, None
        if err:
            _, msg = self._drv.cuGetErrorString(err)
            text = msg.decode() if isinstance(msg, bytes) else str(msg)
            raise DriverError(call, int(err), text)
        return value

    def _retry_in_context(self, call: str, err: Any, fn: Any, *args: Any) -> Any:
        """The fast paths skip the context check; on a thread that has no
        context yet, make it current and try once more.

        Raises the call's error unless the retry succeeded; returns the
        retry's result tuple.
        """
        result = None
        if int(err) == _CUDA_ERROR_INVALID_CONTEXT and not getattr(self._tls, "ready", False):
            self._ensure_context()
            result = fn(*args)
            err = result[0]
        if err:
            self._check(call, (err,))
        return result

    def _ensure_context(self) -> None:
        if getattr(self._tls, "ready", False):
            return
        err, current = self._drv.cuCtxGetCurrent()
        if err or int(current) != int(self._ctx):
            self._check("cuCtxSetCurrent", self._drv.cuCtxSetCurrent(self._ctx))
        self._tls.ready = True

    # ----------------------------------------------------------------- memory
    def alloc_async(self, nbytes: int, stream: int) -> int:
        err, ptr = self._alloc_async(nbytes, stream)
        if err:
            ptr = self._retry_in_context("cuMemAllocAsync", err, self._alloc_async, nbytes,
                                         stream)[1]
        return int(ptr)

    def free_async(self, ptr: int, stream: int) -> None:
        err = self._free_async(ptr, stream)[0]
        if err:
            self._retry_in_context("cuMemFreeAsync", err, self._free_async, ptr, stream)

    def alloc(self, nbytes: int) -> int:
        self._ensure_context()
        return int(self._check("cuMemAlloc", self._drv.cuMemAlloc(nbytes)))

    def free(self, ptr: int) -> None:
        self._ensure_context()
        self._check("cuMemFree", self._drv.cuMemFree(ptr))

    def pool_trim(self, keep_bytes: int = 0) -> None:
        self._ensure_context()
        self._check("cuMemPoolTrimTo", self._drv.cuMemPoolTrimTo(self._pool, keep_bytes))

    def set_pool_attribute(self, name: str, value: int) -> None:
        """Set a ``CUmemPool_attribute`` of the device's default pool, by short name.

        ``name`` is the attribute without its prefix, for example
        ``"REUSE_ALLOW_INTERNAL_DEPENDENCIES"`` or ``"RELEASE_THRESHOLD"``.
        """
        drv = self._drv
        attr = getattr(drv.CUmemPool_attribute, "CU_MEMPOOL_ATTR_" + name)
        if name == "RELEASE_THRESHOLD" or name.startswith(("RESERVED", "USED")):
            val = drv.cuuint64_t(value)
        else:
            val = drv.cuuint32_t(value) if hasattr(drv, "cuuint32_t") else int(value)
        self._check("cuMemPoolSetAttribute", drv.cuMemPoolSetAttribute(self._pool, attr, val))

    def mem_info(self) -> tuple[int, int]:
        self._ensure_context()
        free, total = self._check("cuMemGetInfo", self._drv.cuMemGetInfo())
        return int(free), int(total)

    def memset_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        """Queue ``cuMemsetD8Async``: fill ``nbytes`` bytes at ``ptr`` with the byte ``value``.

        Raises
        ------
        DriverError
            ``value`` is not a byte (checked here, as ``CUDA_ERROR_INVALID_VALUE``),
            or the driver refused the call.
        """
        from numba_streamsafe._driver.base import CUDA_ERROR_INVALID_VALUE

        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 255:
            raise DriverError("cuMemsetD8Async", CUDA_ERROR_INVALID_VALUE,
                              f"fill value {value!r} is not a byte; pass an int from 0 to 255")
        self._ensure_context()
        self._check("cuMemsetD8Async", self._drv.cuMemsetD8Async(ptr, value, nbytes, stream))

    def copy_to_host(self, ptr: int, nbytes: int, stream: int) -> bytes:
        """``cuMemcpyDtoHAsync`` of ``nbytes`` bytes at ``ptr`` into a host buffer on
        ``stream``, then ``cuStreamSynchronize(stream)``; returns the bytes.

        Everything queued on ``stream`` before the call is complete when it returns.
        """
        import numpy as np

        from numba_streamsafe._driver.base import CUDA_ERROR_INVALID_VALUE

        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
            raise DriverError("cuMemcpyDtoHAsync", CUDA_ERROR_INVALID_VALUE,
                              f"size {nbytes!r} is not a non-negative int")
        host = np.empty(nbytes, dtype=np.uint8)
        self._ensure_context()
        if nbytes:
            self._check("cuMemcpyDtoHAsync",
                        self._drv.cuMemcpyDtoHAsync(host.ctypes.data, ptr, nbytes, stream))
        self._check("cuStreamSynchronize", self._drv.cuStreamSynchronize(stream))
        return host.tobytes()

    # ----------------------------------------------------------------- events
    def event_create(self) -> Any:
        self._ensure_context()
        return self._check("cuEventCreate", self._drv.cuEventCreate(self._event_flags))

    def event_destroy(self, event: Any) -> None:
        self._ensure_context()
        self._check("cuEventDestroy", self._drv.cuEventDestroy(event))

    def event_record(self, event: Any, stream: int) -> None:
        if self.destroyed_streams and stream in self.destroyed_streams:
            raise self._destroyed("cuEventRecord", stream)
        err = self._record(event, stream)[0]
        if err:
            self._retry_in_context("cuEventRecord", err, self._record, event, stream)

    def event_query(self, event: Any) -> bool:
        (err,) = self._drv.cuEventQuery(event)
        if err == self._drv.CUresult.CUDA_ERROR_NOT_READY:
            return False
        self._check("cuEventQuery", (err,))
        return True

    def event_synchronize(self, event: Any) -> None:
        self._check("cuEventSynchronize", self._drv.cuEventSynchronize(event))

    def stream_wait_event(self, stream: int, event: Any) -> None:
        err = self._wait(stream, event, 0)[0]
        if err:
            self._retry_in_context("cuStreamWaitEvent", err, self._wait, stream, event, 0)

    # ---------------------------------------------------------------- kernels
    def launch_kernel(self, function: int, grid: tuple[int, int, int],
                      block: tuple[int, int, int], shared_mem: int, stream: int,
                      params: int) -> None:
        """Queue ``cuLaunchKernel`` of ``function`` (a ``CUfunction`` or a
        ``CUkernel`` handle) on ``stream``; ``params`` is the address of the
        kernel's parameter pointer array.

        Not part of the :class:`~numba_streamsafe._driver.base.Driver`
        protocol: the Numba layer's direct launches use it where present.
        """
        if self.destroyed_streams and stream in self.destroyed_streams:
            raise self._destroyed("cuLaunchKernel", stream)
        err = self._launch(function, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                           shared_mem, stream, params, 0)[0]
        if err:
            self._retry_in_context("cuLaunchKernel", err, self._launch, function, grid[0],
                                   grid[1], grid[2], block[0], block[1], block[2], shared_mem,
                                   stream, params, 0)

    # ---------------------------------------------------------------- streams
    def _destroyed(self, call: str, stream: int) -> DriverError:
        return DriverError(call, CUDA_ERROR_INVALID_HANDLE,
                           f"stream {stream:#x} was destroyed; its handle names no stream any "
                           "more (the driver would crash on it). Use a live stream")

    def stream_synchronize(self, stream: int) -> None:
        if stream in self.destroyed_streams:
            raise self._destroyed("cuStreamSynchronize", stream)
        self._ensure_context()
        self._check("cuStreamSynchronize", self._drv.cuStreamSynchronize(stream))

    def stream_query(self, stream: int) -> bool:
        if stream in self.destroyed_streams:
            raise self._destroyed("cuStreamQuery", stream)
        self._ensure_context()
        (err,) = self._drv.cuStreamQuery(stream)
        if err == self._drv.CUresult.CUDA_ERROR_NOT_READY:
            return False
        self._check("cuStreamQuery", (err,))
        return True

    def synchronize(self) -> None:
        self._ensure_context()
        self._check("cuCtxSynchronize", self._drv.cuCtxSynchronize())

    def create_stream(self) -> int:
        self._ensure_context()
        flags = self._drv.CUstream_flags.CU_STREAM_NON_BLOCKING
        handle = int(self._check("cuStreamCreate", self._drv.cuStreamCreate(flags)))
        self.destroyed_streams.discard(handle)  # a new stream at a destroyed one's address
        return handle

    def destroy_stream(self, stream: int) -> None:
        if stream in self.destroyed_streams:
            raise self._destroyed("cuStreamDestroy", stream)
        self._ensure_context()
        self._check("cuStreamDestroy", self._drv.cuStreamDestroy(stream))
        self.destroyed_streams.add(stream)

    def check_stream(self, stream: int) -> None:
        if stream in (0, 1, 2):  # legacy, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
            return
        if stream in self.destroyed_streams:
            raise StreamMisuse(
                f"stream {stream:#x} was destroyed; its handle names no stream any more "
                "(the driver would crash on it). Pass a live stream"
            )
        self._ensure_context()
        err, ctx = self._drv.cuStreamGetCtx(stream)
        if err:
            raise StreamMisuse(
                f"stream {stream:#x} is not a usable stream on device {self.device} "
                f"(cuStreamGetCtx returned error {int(err)}); pass a live stream"
            )
        if int(ctx) != int(self._ctx):
            raise StreamMisuse(
                f"stream {stream:#x} belongs to another context than device {self.device}'s "
                "primary context; allocate on a stream of the same device"
            )

    def trace_access(self, stream: int, accesses: Iterable[tuple[int, int, Access]],
                     label: str) -> None:
        """No checking on real hardware; use the simulated driver in tests."""
        return None
