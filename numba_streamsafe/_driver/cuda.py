"""The CUDA backend: :class:`CudaDriver` over ``cuda.bindings.driver``.

Every call checks its ``CUresult`` and raises
:class:`~numba_streamsafe.core.errors.DriverError` with the call's name, the code and
the driver's own message. The device's primary context (the one Numba uses) is
made current on a thread that has no current context before its first call.

More than one device: a thread's current context is left as it is (Numba's
``with cuda.gpus[d]:`` chooses it). The calls that act on "the current
context" (creating streams and events, synchronous allocation, ``cuCtx*``,
the default streams) push the driver's own context around themselves once a
second device's context is in use in the process, and :meth:`CudaDriver.activate`
does so around a group of calls; the launch-path calls (``cuMemAllocAsync``,
``cuMemFreeAsync``, ``cuEventRecord``, ``cuStreamWaitEvent``, ``cuLaunchKernel``)
take their stream as given and expect the device's context to be current when
that stream is a default one.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from numba_streamsafe._driver import observer
from numba_streamsafe._driver.base import CUDA_ERROR_INVALID_HANDLE
from numba_streamsafe._driver.limits import LaunchLimits, check_launch
from numba_streamsafe.core.errors import DriverError, StreamMisuse
from numba_streamsafe.core.streams import MAX_DEFAULT_STREAM

__all__ = ["CudaDriver", "context_device", "driver_version", "runtime_version",
           "pools_supported"]

_CUDA_ERROR_INVALID_CONTEXT = 201
_CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704


def _bindings() -> Any:
    from cuda.bindings import driver

    return driver


def context_device() -> int:
    """The device of the calling thread's current context (``cuCtxGetDevice``),
    0 when none is current."""
    err, ordinal = _bindings().cuCtxGetDevice()
    return 0 if err else int(ordinal)


def driver_version() -> int | None:
    """The CUDA driver's version (``cuDriverGetVersion``: 1000 * major + 10 *
    minor), None when the driver cannot say."""
    err, version = _bindings().cuDriverGetVersion()
    return None if err else int(version)


def runtime_version() -> int | None:
    """The CUDA runtime's version (``cudaRuntimeGetVersion``), None when the
    runtime library cannot be loaded."""
    from cuda.bindings import runtime

    err, version = runtime.cudaRuntimeGetVersion()
    return None if err else int(version)


def pools_supported(device: int) -> bool | None:
    """Whether ``device`` has stream-ordered memory pools, None when unknown."""
    driver = _bindings()
    attribute = driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED
    err, supported = driver.cuDeviceGetAttribute(attribute, device)
    return None if err else bool(supported)


#: No stream handle the driver makes lies below this address.
_LOWEST_HANDLE = 1 << 16


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
    #: Devices whose driver was built in this process.
    _devices: set[int] = set()
    #: True once a second device's context is in use: context-dependent calls
    #: then make their own context current around themselves.
    _several = False

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
        CudaDriver._devices.add(device)
        if len(CudaDriver._devices) > 1:
            CudaDriver._several = True
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
        """Before a thread's first call: make the device's context current when
        the thread has none. Another device's current context is left current
        (the calls that depend on it push their own, see :meth:`_push`)."""
        if getattr(self._tls, "ready", False):
            return
        err, current = self._drv.cuCtxGetCurrent()
        if err or not int(current):
            self._check("cuCtxSetCurrent", self._drv.cuCtxSetCurrent(self._ctx))
        elif int(current) != int(self._ctx):
            CudaDriver._several = True
        self._tls.ready = True

    def _push(self) -> bool:
        """Make the device's context current for one call: True when it was
        pushed (:meth:`_pop` then). With one device's context in use this is
        :meth:`_ensure_context` (no driver call once the thread is ready)."""
        self._ensure_context()
        if not CudaDriver._several:
            return False
        err, current = self._drv.cuCtxGetCurrent()
        if not err and int(current) == int(self._ctx):
            return False
        self._check("cuCtxPushCurrent", self._drv.cuCtxPushCurrent(self._ctx))
        return True

    def _pop(self, pushed: bool) -> None:
        if pushed:
            self._check("cuCtxPopCurrent", self._drv.cuCtxPopCurrent())

    def _call(self, call: str, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` with the device's context current, checked."""
        pushed = self._push()
        try:
            return self._check(call, fn(*args))
        finally:
            self._pop(pushed)

    @contextlib.contextmanager
    def activate(self) -> Iterator[None]:
        """Make the device's context current inside the block (pushed when another
        is current, popped on exit): for a group of calls made for this device
        from another device's context."""
        pushed = self._push()
        try:
            yield
        finally:
            self._pop(pushed)

    # ---------------------------------------------------------------- peers
    def enable_peer_access(self, peer: int) -> None:
        """Let this device's kernels access ``peer``'s memory: its ``cuMemAlloc``
        memory (``cuCtxEnablePeerAccess`` of ``peer``'s primary context, from
        this device's) and its stream-ordered pool's (``cuMemPoolSetAccess`` on
        ``peer``'s default pool, for this device, read-write: peer access of
        the contexts does not reach pool memory). Idempotent."""
        drv = self._drv
        dev = self._check("cuDeviceGet", drv.cuDeviceGet(peer))
        ok = self._check("cuDeviceCanAccessPeer", drv.cuDeviceCanAccessPeer(self._dev, dev))
        if not ok:
            raise DriverError("cuDeviceCanAccessPeer", 0,
                              f"device {self.device} cannot access device {peer}'s memory "
                              "(no peer-to-peer path); copy the arrays between the devices")
        peer_ctx = self._check("cuDevicePrimaryCtxRetain", drv.cuDevicePrimaryCtxRetain(dev))
        CudaDriver._several = True
        pushed = self._push()
        try:
            (err,) = drv.cuCtxEnablePeerAccess(peer_ctx, 0)
            if err and int(err) != _CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED:
                self._check("cuCtxEnablePeerAccess", (err,))
        finally:
            self._pop(pushed)
        peer_pool = self._check("cuDeviceGetDefaultMemPool", drv.cuDeviceGetDefaultMemPool(dev))
        desc = drv.CUmemAccessDesc()
        desc.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = self.device
        desc.flags = drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self._check("cuMemPoolSetAccess", drv.cuMemPoolSetAccess(peer_pool, [desc], 1))

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
        return int(self._call("cuMemAlloc", self._drv.cuMemAlloc, nbytes))

    def free(self, ptr: int) -> None:
        self._call("cuMemFree", self._drv.cuMemFree, ptr)

    def pool_trim(self, keep_bytes: int = 0) -> None:
        self._call("cuMemPoolTrimTo", self._drv.cuMemPoolTrimTo, self._pool, keep_bytes)

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

    def timing_event(self) -> Any:
        """A new event that measures time (for traces with device times);
        destroy it with :meth:`event_destroy`."""
        return self._call("cuEventCreate", self._drv.cuEventCreate,
                          self._drv.CUevent_flags.CU_EVENT_DEFAULT)

    def event_elapsed_ms(self, start: Any, end: Any) -> float:
        """Milliseconds between two recorded timing events (waits for ``end``)."""
        self._call("cuEventSynchronize", self._drv.cuEventSynchronize, end)
        return float(self._call("cuEventElapsedTime", self._drv.cuEventElapsedTime, start, end))

    def get_pool_attribute(self, name: str) -> int:
        """A ``CUmemPool_attribute`` of the device's default pool, by short name."""
        drv = self._drv
        attr = getattr(drv.CUmemPool_attribute, "CU_MEMPOOL_ATTR_" + name)
        value = self._check("cuMemPoolGetAttribute", drv.cuMemPoolGetAttribute(self._pool, attr))
        return int(value)

    def mem_info(self) -> tuple[int, int]:
        free, total = self._call("cuMemGetInfo", self._drv.cuMemGetInfo)
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
        self._call("cuMemsetD8Async", self._drv.cuMemsetD8Async, ptr, value, nbytes, stream)

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
        pushed = self._push()
        try:
            if nbytes:
                self._check("cuMemcpyDtoHAsync",
                            self._drv.cuMemcpyDtoHAsync(host.ctypes.data, ptr, nbytes, stream))
            self._check("cuStreamSynchronize", self._drv.cuStreamSynchronize(stream))
        finally:
            self._pop(pushed)
        return host.tobytes()

    def copy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """Queue ``cuMemcpyAsync`` of ``nbytes`` bytes from ``src`` to ``dst`` on
        ``stream``; the two may be memory of different devices (unified
        addressing; no peer access needed)."""
        self._call("cuMemcpyAsync", self._drv.cuMemcpyAsync, dst, src, nbytes, stream)

    # ----------------------------------------------------------------- events
    def event_create(self) -> Any:
        return self._call("cuEventCreate", self._drv.cuEventCreate, self._event_flags)

    def event_destroy(self, event: Any) -> None:
        self._call("cuEventDestroy", self._drv.cuEventDestroy, event)

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

    # ---------------------------------------------------------------- graphs
    def begin_capture(self, stream: int) -> None:
        # Thread-local mode: only this thread's calls that are unsafe during a
        # capture fail; other threads go on (their work is not captured).
        mode = self._drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        self._check("cuStreamBeginCapture", self._drv.cuStreamBeginCapture(stream, mode))

    def capture_work(self, stream: int, work: Any, args: tuple[Any, ...],
                     accesses: list[tuple[int, int, Any]], label: str, copy: bool) -> Any:
        return work(*args)  # queued on the capturing stream: the driver captures it

    def end_capture(self, stream: int) -> Any:
        return self._check("cuStreamEndCapture", self._drv.cuStreamEndCapture(stream))

    def graph_instantiate(self, graph: Any) -> Any:
        return self._check("cuGraphInstantiate", self._drv.cuGraphInstantiate(graph, 0))

    def graph_launch(self, graph_exec: Any, stream: int) -> None:
        if self.destroyed_streams and stream in self.destroyed_streams:
            raise self._destroyed("cuGraphLaunch", stream)
        self._check("cuGraphLaunch", self._drv.cuGraphLaunch(graph_exec, stream))

    def graph_destroy(self, graph: Any, graph_exec: Any) -> None:
        if graph_exec is not None:
            self._check("cuGraphExecDestroy", self._drv.cuGraphExecDestroy(graph_exec))
        if graph is not None:
            self._check("cuGraphDestroy", self._drv.cuGraphDestroy(graph))

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
            try:
                self._retry_in_context("cuLaunchKernel", err, self._launch, function, grid[0],
                                       grid[1], grid[2], block[0], block[1], block[2],
                                       shared_mem, stream, params, 0)
            except DriverError:
                # A configuration the device refuses gets the error the Numba layer
                # gives before a launch (the same on the simulator).
                check_launch(grid, block, shared_mem, self.launch_limits())
                raise

    def launch_limits(self) -> LaunchLimits:
        """The device's limits on one launch, read once."""
        limits = self.__dict__.get("_limits")
        if limits is None:
            attr = self._drv.CUdevice_attribute

            def get(name: str) -> int:
                value = self._drv.cuDeviceGetAttribute(getattr(attr, name), self._dev)
                return int(self._check("cuDeviceGetAttribute", value))

            limits = self._limits = LaunchLimits(
                max_threads_per_block=get("CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK"),
                max_block_dim=tuple(get(f"CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_{a}")  # type: ignore[arg-type]
                                    for a in "XYZ"),
                max_grid_dim=tuple(get(f"CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_{a}")  # type: ignore[arg-type]
                                   for a in "XYZ"),
                max_shared_memory_per_block=get(
                    "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK"),
            )
        return limits  # type: ignore[no-any-return]

    # ---------------------------------------------------------------- streams
    def _destroyed(self, call: str, stream: int) -> DriverError:
        return DriverError(call, CUDA_ERROR_INVALID_HANDLE,
                           f"stream {stream:#x} was destroyed; its handle names no stream any "
                           "more (the driver would crash on it). Use a live stream, e.g. one "
                           "from numba.cuda.stream()")

    def observe(self) -> Any | None:
        if observer.start() is not None:
            return None
        return observer.slot_for(int(self._ctx))

    def observe_failure(self) -> str | None:
        return observer.reason()

    def stream_synchronize(self, stream: int) -> None:
        if stream in self.destroyed_streams:
            raise self._destroyed("cuStreamSynchronize", stream)
        self._call("cuStreamSynchronize", self._drv.cuStreamSynchronize, stream)

    def stream_blocking(self, stream: int) -> bool:
        if 0 <= stream <= MAX_DEFAULT_STREAM:
            # The legacy stream; the per-thread default stream is not a
            # non-blocking stream: it and the legacy stream wait for each other.
            return True
        flags = self._call("cuStreamGetFlags", self._drv.cuStreamGetFlags, stream)
        return not int(flags) & int(self._drv.CUstream_flags.CU_STREAM_NON_BLOCKING)

    def stream_query(self, stream: int) -> bool:
        if stream in self.destroyed_streams:
            raise self._destroyed("cuStreamQuery", stream)
        pushed = self._push()
        try:
            (err,) = self._drv.cuStreamQuery(stream)
        finally:
            self._pop(pushed)
        if err == self._drv.CUresult.CUDA_ERROR_NOT_READY:
            return False
        self._check("cuStreamQuery", (err,))
        return True

    def synchronize(self) -> None:
        self._call("cuCtxSynchronize", self._drv.cuCtxSynchronize)

    def create_stream(self, blocking: bool = False) -> int:
        flags = (self._drv.CUstream_flags.CU_STREAM_DEFAULT if blocking
                 else self._drv.CUstream_flags.CU_STREAM_NON_BLOCKING)
        handle = int(self._call("cuStreamCreate", self._drv.cuStreamCreate, flags))
        self.destroyed_streams.discard(handle)  # a new stream at a destroyed one's address
        return handle

    def destroy_stream(self, stream: int) -> None:
        if stream in self.destroyed_streams:
            raise self._destroyed("cuStreamDestroy", stream)
        self._call("cuStreamDestroy", self._drv.cuStreamDestroy, stream)
        self.destroyed_streams.add(stream)

    def check_stream(self, stream: int) -> None:
        if 0 <= stream <= MAX_DEFAULT_STREAM:  # legacy, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
            return
        if stream in self.destroyed_streams:
            raise StreamMisuse(
                f"stream {stream:#x} was destroyed; its handle names no stream any more "
                "(the driver would crash on it). Pass a live stream, e.g. one from "
                "numba.cuda.stream()"
            )
        if stream < _LOWEST_HANDLE or stream % 8:
            # The driver does not check a handle: cuStreamGetCtx on one it never
            # made crashes the process. A handle is the address of the driver's
            # stream object, so a small or unaligned number is none.
            raise StreamMisuse(
                f"stream {stream:#x} is not a stream CUDA made (a stream handle is the "
                "address of the driver's stream object): it was never created. Pass a live "
                "stream, e.g. one from numba.cuda.stream()"
            )
        pushed = self._push()
        try:
            err, ctx = self._drv.cuStreamGetCtx(stream)
        finally:
            self._pop(pushed)
        if err:
            raise StreamMisuse(
                f"stream {stream:#x} is not a usable stream on device {self.device} "
                f"(cuStreamGetCtx returned error {int(err)}): it was never created, or was "
                "destroyed. Pass a live stream, e.g. one from numba.cuda.stream()"
            )
        if int(ctx) != int(self._ctx):
            raise StreamMisuse(
                f"stream {stream:#x} belongs to another context than device {self.device}'s "
                "primary context; allocate on a stream of the same device"
            )

    def trace_access(self, stream: int, accesses: Iterable[tuple[Any, ...]],
                     label: str, *, copy: bool = False, stack: tuple = (),
                     library: str | None = None) -> None:
        """No checking on real hardware; use the simulated driver in tests."""
        return None

    def trace_sites(self, ptr: int, *, allocated: tuple | None = None,
                    freed: tuple | None = None) -> None:
        """No checking on real hardware (the tracking resource keeps the sites)."""
        return None

    def register_foreign(self, ptr: int, nbytes: int, stream: int) -> None:
        """Nothing to do on real hardware (the memory is the producer's)."""
        return None

    def release_foreign(self, ptr: int, stream: int) -> None:
        """Nothing to do on real hardware (the memory is the producer's)."""
        return None
