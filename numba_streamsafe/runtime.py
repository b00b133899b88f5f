"""DeviceRuntime: one resource stack, one driver and one policy per device.

Each device has its own runtime (its pool, events and marks):
:func:`get_runtime` gives the process-wide one of a device. Runtimes of
several devices installed at once know of each other (``multi_device``), so
the launch protocol can order a launch on one device after uses of another
device's blocks (see ``docs/architecture.md``, section 7).
"""

from __future__ import annotations

import operator
import threading
import warnings
from dataclasses import asdict, dataclass, fields
from typing import Any

from numba_streamsafe._driver.base import Driver
from numba_streamsafe.core.access import Access
from numba_streamsafe.core.blocks import Block, check_block, check_int
from numba_streamsafe.core.errors import GraphCaptureError, InvalidArgument
from numba_streamsafe.core.modes import RecorderMode, recorder_mode
from numba_streamsafe.core.settings import settings
from numba_streamsafe.core.streams import StreamRef, default_stream_handle
from numba_streamsafe.resources import (
    POOL_KEEP_ALL,
    AsyncOptions,
    AsyncResource,
    DirectResource,
    MemoryResource,
    ResourceStats,
    rmm_upstream,
)
from numba_streamsafe.stream_registry import StreamRegistry

__all__ = [
    "DeviceRuntime",
    "RuntimeStats",
    "Runtimes",
    "RUNTIMES",
    "get_runtime",
    "set_runtime",
    "clear_runtimes",
    "installed_runtime",
    "installed_devices",
    "sole_runtime",
    "enable_peer_access",
    "default_driver",
    "default_stack",
    "device_ordinal",
]


@dataclass(frozen=True)
class RuntimeStats(ResourceStats):
    """Accounting of a runtime: its resource's figures plus its context epoch."""

    epoch: int = 0

    @property
    def resource(self) -> ResourceStats:
        """The resource's figures alone."""
        return ResourceStats(**{f.name: getattr(self, f.name) for f in fields(ResourceStats)})


def default_driver(device: int = 0) -> Driver:
    """The driver a runtime uses when none is given: ``NUMBA_STREAMSAFE_DRIVER``
    (:mod:`numba_streamsafe.core.settings`) picks the CUDA or the simulated one."""
    if settings().driver == "sim":
        from numba_streamsafe._driver.sim import SimDriver

        # Simulated devices of one process share a system (one happens-before
        # model): that of an installed simulated runtime, else a new one.
        system = next((rt.driver.system for rt in RUNTIMES.runtimes()
                       if isinstance(rt.driver, SimDriver)), None)
        return SimDriver(device, system=system)
    from numba_streamsafe._driver.cuda import CudaDriver

    return CudaDriver(device)


class DeviceRuntime:
    """The library's state for one device: a resource stack and its policy.

    Parameters
    ----------
    resource : MemoryResource
        Top of the resource stack (decorators around a tracking resource).
    driver : Driver, optional
        The backend under ``resource``; found on the stack when omitted.
    mode : RecorderMode or str
        Default policy of the runtime's recorders for untracked memory:
        ``"strict"`` or ``"permissive"``.

    Raises
    ------
    InvalidArgument
        ``mode`` is not one of those.

    Notes
    -----
    :func:`get_runtime` returns the process-wide runtime of a device, built on
    first use. Constructing a ``DeviceRuntime`` directly gives an *owned*
    runtime that nothing else sees, composed around any stack (tests do this).
    """

    def __init__(self, resource: MemoryResource, driver: Driver | None = None, *,
                 mode: RecorderMode | str = RecorderMode.STRICT) -> None:
        self.resource = resource
        self.driver: Driver = driver if driver is not None else _driver_of(resource)
        self.device = resource.device
        self.mode = recorder_mode(mode, "DeviceRuntime(mode=...)")
        #: The streams this runtime has seen (handles, destruction, keys).
        self.streams = StreamRegistry(self.driver, resource)
        #: True while runtimes of other devices are installed beside this one:
        #: the launch protocol then looks for blocks of other devices.
        self.multi_device = False
        #: Devices whose memory this device's kernels may access
        #: (:meth:`enable_peer_access`).
        self.peers: set[int] = set()
        #: A graph being captured on this device (:meth:`start_capture`), else None.
        self.capture: Any = None
        #: Check mode: the tracking resource reports races instead of ordering.
        self.checking: bool = resource.checking

    @property
    def observing(self) -> bool:
        """Whether the work is named for race reports: check mode, or a race
        check watching the tracking resource in ordering mode."""
        return self.checking or bool(getattr(self.resource.tracker, "reporting", False))

    # ----------------------------------------------------------------- streams
    def stream_ref(self, stream: Any) -> StreamRef:
        """``(handle, owner)`` of ``stream`` (:meth:`StreamRegistry.ref`)."""
        return self.streams.ref(stream)

    def stream_handle(self, stream: Any) -> int:
        """The driver handle of ``stream`` (:meth:`StreamRegistry.handle`)."""
        return self.streams.handle(stream)

    def stream_key(self, handle: int) -> int:
        """The key other devices know the stream ``handle`` by
        (:meth:`StreamRegistry.key`)."""
        return self.streams.key(handle)

    def destroy_stream(self, stream: Any) -> None:
        """Destroy a stream, refusing while blocks live on it
        (:meth:`StreamRegistry.destroy`)."""
        self.streams.destroy(stream)

    def order_after_stream(self, stream: int, producer: int) -> None:
        """Make ``stream`` wait for everything queued so far on ``producer``."""
        self.streams.order_after(stream, producer)

    # ------------------------------------------------------------ other devices
    def enable_peer_access(self, peer: DeviceRuntime) -> None:
        """Let this device's kernels use ``peer``'s blocks: the driver enables
        peer access (``cuCtxEnablePeerAccess``) and the runtime records it, so
        launches here accept arrays of ``peer``, ordered across the devices.

        Raises
        ------
        InvalidArgument
            ``peer`` serves this same device.
        DriverError
            The driver refused (no peer-to-peer path between the GPUs).
        """
        if peer.device == self.device:
            raise InvalidArgument(
                f"peer access from device {self.device} to itself: pass another device's runtime"
            )
        self.driver.enable_peer_access(peer.device)
        self.peers.add(peer.device)

    def runtime_of(self, device: int) -> DeviceRuntime | None:
        """The installed runtime of ``device`` (this one for its own), or None."""
        if device == self.device:
            return self
        return RUNTIMES.installed(device)

    def activate(self) -> Any:
        """A context manager making this device's context current inside it (on
        a GPU, when another device's is current; nothing on the simulator)."""
        return self.driver.activate()

    # ------------------------------------------------------------------ blocks
    def allocate(self, nbytes: int, stream: Any = None, tag: str = "") -> Block:
        """Allocate ``nbytes`` ordered on ``stream`` (default: the default stream).

        Raises
        ------
        StreamMisuse
            A graph is being captured on ``stream``, or ``stream`` is the legacy
            default stream while one is (see :meth:`check_capture`).
        """
        if stream is None:
            handle = default_stream_handle()
            if self.capture is not None:
                self.check_capture(handle, tag)
            return self.resource.allocate(nbytes, handle, tag)
        handle, owner = self.stream_ref(stream)
        if self.capture is not None:
            self.check_capture(handle, tag)
        return self.resource.allocate(nbytes, handle, tag, stream_owner=owner)

    def borrow(self, ptr: int, nbytes: int, stream: Any, tag: str = "borrowed", *,
               keep: Any = None) -> Block:
        """Track ``nbytes`` of another library's device memory at ``ptr``, handed
        over on ``stream`` (its producer's work ordered before it), as a borrowed
        block of the tracking resource (``AsyncResource.borrow``: its uses are
        ordered as any block's; the library never frees it). Release it with
        ``rt.resource.tracker.defer_free(block)`` (or ``deallocate``): ``keep``,
        what keeps the memory alive, is then held until ``stream`` has
        completed every use.

        Raises
        ------
        StreamMisuse
            The resource does not track uses (``NUMBA_STREAMSAFE_RESOURCE=direct``),
            or a graph is being captured on ``stream``.
        InvalidArgument
            A bad address or size, or a range that overlaps a live block.
        """
        handle, owner = self.stream_ref(stream)
        if self.capture is not None:
            self.check_capture(handle, tag)
        with self.driver.activate():
            return self.resource.tracker.borrow(ptr, nbytes, handle, tag, stream_owner=owner,
                                                keep=keep)

    def start_capture(self, graph: Any) -> None:
        """Note that ``graph`` is being captured on this device: allocations and
        frees that would land in it are refused (:meth:`check_capture`) until
        :meth:`end_capture`.

        Raises
        ------
        GraphCaptureError
            Another graph is being captured on this device.
        """
        if self.capture is not None and self.capture is not graph:
            raise GraphCaptureError("a graph is already being captured on this device; end "
                                    "that capture first (captures do not nest)")
        self.capture = graph

    def end_capture(self, graph: Any) -> None:
        """Note that ``graph``'s capture on this device has ended."""
        if self.capture is graph:
            self.capture = None

    def check_capture(self, handle: int, what: str, free: bool = False) -> None:
        """Refuse an allocation (or, with ``free``, a free) on ``handle`` while a
        graph is being captured when it would land in the capture (its stream)
        or break it (the legacy default stream, which synchronises with the
        capturing stream).

        Raises
        ------
        StreamMisuse
            The allocation or free cannot be made during the capture; nothing is
            queued.
        """
        capture = self.capture
        if capture is not None and (handle == capture.handle or handle <= 1):
            where = "the stream being captured" if handle == capture.handle else \
                "the legacy default stream, which would break the capture"
            if free:
                raise GraphCaptureError(
                    f"free of {what!r}, allocated on {where} ({handle:#x}): a graph capture "
                    "holds no frees (the free would run again at every replay). Free it after "
                    "the capture")
            raise GraphCaptureError(
                f"allocation {what!r} on {where} ({handle:#x}): a graph capture holds no "
                "allocations. Allocate the graph's arrays (and upload its host inputs) before "
                "the capture, or on another stream")

    def deallocate(self, block: Block) -> None:
        """Free ``block``: its free is queued on its allocation stream after every
        use on other streams.

        Raises
        ------
        InvalidArgument
            ``block`` is not a :class:`~numba_streamsafe.core.blocks.Block`.
        UseAfterFree
            ``block`` was already freed.
        StreamMisuse
            A graph is being captured on ``block``'s stream, or the block's
            stream is the legacy default stream while one is
            (:class:`~numba_streamsafe.core.errors.GraphCaptureError`).
        """
        if block.__class__ is not Block:
            check_block(block, "deallocate")
        if self.capture is not None:
            self.check_capture(block.stream, block.tag, free=True)
        self.resource.deallocate(block)

    def defer_free(self, block: Block) -> None:
        """Finalizer-safe free: queued, done at the next safe point.

        Raises
        ------
        InvalidArgument
            ``block`` is not a :class:`~numba_streamsafe.core.blocks.Block` (checked
            now, not when the queue runs).
        """
        if block.__class__ is not Block:
            check_block(block, "defer_free")
        self.resource.defer_free(block)

    def flush(self) -> None:
        with self.driver.activate():
            self.resource.flush()

    def reap(self) -> None:
        with self.driver.activate():
            self.resource.reap_pending()

    def trim(self, keep_bytes: int = 0) -> None:
        """Run queued frees, wait for pending ones, then hand the pool's unused
        memory above ``keep_bytes`` back to the system (``cuMemPoolTrimTo``).

        Raises
        ------
        InvalidArgument
            ``keep_bytes`` is not an int >= 0.
        """
        check_int("keep_bytes", keep_bytes, 0, what=" (pooled bytes to keep)")
        with self.driver.activate():
            self.resource.reap_pending()
            self.driver.pool_trim(keep_bytes)

    def bytes_outstanding(self) -> int:
        return self.resource.bytes_outstanding()

    def find(self, address: int) -> Block | None:
        return self.resource.find(address)

    def fence(self, uses: list[tuple[Block, Access]], stream: Any) -> None:
        """Queue on ``stream`` the waits that ``uses`` need (a preflight with no
        commit: the caller's work is not recorded)."""
        handle, owner = self.stream_ref(stream)
        self.resource.preflight(uses, handle, owner)

    # --------------------------------------------------------------- lifecycle
    @property
    def epoch(self) -> int:
        return self.resource.epoch

    def reset(self) -> None:
        """The CUDA context was reset: forget every block and advance the epoch.

        Handles from before are refused with
        :class:`~numba_streamsafe.core.errors.StaleContext`; their finalizers do nothing.
        """
        self.resource.reset_context()
        self.streams.reset()

    def stats(self) -> RuntimeStats:
        return RuntimeStats(**asdict(self.resource.stats()), epoch=self.epoch)


def device_ordinal(device: Any) -> int:
    """``device`` as a device ordinal: an int >= 0.

    Parameters
    ----------
    device : int
        A device ordinal: an ``int`` or a NumPy integer, not a bool.

    Returns
    -------
    int
        The ordinal, as an ``int``.

    Raises
    ------
    InvalidArgument
        ``device`` is not an integer (a str, a float, a bool), or is negative.
    """
    if not isinstance(device, bool):
        try:
            ordinal = operator.index(device)
        except TypeError:
            ordinal = -1
        if ordinal >= 0:
            return ordinal
    raise InvalidArgument(
        f"device must be a device ordinal, an int >= 0 (0 for the first GPU, as in "
        f"numba.cuda.gpus[0]), got {device!r}")


def _driver_of(resource: MemoryResource) -> Driver:
    r: Any = resource
    while r is not None:
        drv = r.__dict__.get("driver")
        if drv is not None:
            return drv
        r = r.__dict__.get("upstream")
    raise InvalidArgument(f"no driver found under {type(resource).__name__}; pass driver=")


class Runtimes:
    """The process-wide runtimes, one per device: the registry behind
    :func:`get_runtime`, :func:`set_runtime` and :func:`clear_runtimes`.

    Attributes
    ----------
    sole : DeviceRuntime or None
        The installed runtime while there is exactly one, else None: the Numba
        layer's launches take it without asking which device is current (the
        compiled launch reads the attribute itself: a call into Python code
        there could hand the GIL to another thread mid-launch).
    generation : int
        Advanced whenever the installed runtimes change: holders of a runtime
        (the memory-manager plugin) compare it to know theirs is still the
        installed one.

    Notes
    -----
    Thread-safe: threads racing on a device's first :meth:`get` all get the
    same runtime, and exactly one is built.
    """

    def __init__(self) -> None:
        self._by_device: dict[int, DeviceRuntime] = {}
        self._lock = threading.Lock()
        self.sole: DeviceRuntime | None = None
        self.generation = 0

    def get(self, device: int) -> DeviceRuntime:
        """The runtime of ``device``, built by :func:`default_stack` over
        :func:`default_driver` on first use.

        Raises
        ------
        InvalidArgument
            ``device`` is not a device ordinal (:func:`device_ordinal`).
        """
        if device.__class__ is not int:
            device = device_ordinal(device)
        rt = self._by_device.get(device)
        if rt is not None:
            return rt
        device = device_ordinal(device)
        with self._lock:
            rt = self._by_device.get(device)
            if rt is None:
                rt = DeviceRuntime(default_stack(default_driver(device)))
                self._by_device[device] = rt
                self._changed()
            return rt

    def installed(self, device: int) -> DeviceRuntime | None:
        """The runtime of ``device`` if one is installed (none is built)."""
        return self._by_device.get(device)

    def devices(self) -> list[int]:
        """The devices that have a runtime, in order."""
        return sorted(self._by_device)

    def runtimes(self) -> list[DeviceRuntime]:
        """The installed runtimes, in device order."""
        by_device = dict(self._by_device)
        return [by_device[d] for d in sorted(by_device)]

    def install(self, runtime: DeviceRuntime, device: int) -> DeviceRuntime | None:
        """Install ``runtime`` for ``device``; the one installed before, if any.

        Raises
        ------
        InvalidArgument
            ``device`` is not a device ordinal (:func:`device_ordinal`).
        """
        device = device_ordinal(device)
        with self._lock:
            old = self._by_device.get(device)
            self._by_device[device] = runtime
            self._changed()
            return old

    def clear(self) -> None:
        """Forget every runtime (the next :meth:`get` builds anew)."""
        with self._lock:
            for rt in self._by_device.values():
                rt.multi_device = False
            self._by_device.clear()
            self._changed()

    def _changed(self) -> None:
        """Caller holds the lock: refresh :attr:`sole`, :attr:`generation` and
        every runtime's ``multi_device``."""
        self.generation += 1
        several = len(self._by_device) > 1
        self.sole = None if several or not self._by_device else \
            next(iter(self._by_device.values()))
        for rt in self._by_device.values():
            rt.multi_device = several


#: This process's runtimes.
RUNTIMES = Runtimes()


def get_runtime(device: int = 0) -> DeviceRuntime:
    """The process-wide runtime of ``device``, built once on first use.

    Threads racing on the first call all get the same runtime; exactly one is
    built, by :func:`default_stack` over :func:`default_driver`.

    Parameters
    ----------
    device : int
        The device ordinal (default 0).

    Returns
    -------
    DeviceRuntime
        The runtime installed for ``device``.

    Raises
    ------
    InvalidArgument
        ``device`` is not a device ordinal: an int >= 0 (a NumPy integer
        will do; a bool, a str or a float will not).
    DriverError
        On a GPU, no device of this machine has that ordinal. (On Numba's
        CUDA simulator every ordinal names a simulated device.)
    """
    return RUNTIMES.get(device)


def installed_runtime(device: int) -> DeviceRuntime | None:
    """The process-wide runtime of ``device`` if one is installed (none is built)."""
    return RUNTIMES.installed(device)


def installed_devices() -> list[int]:
    """The devices that have a process-wide runtime, in order."""
    return RUNTIMES.devices()


def sole_runtime() -> DeviceRuntime | None:
    """The process-wide runtime while exactly one device has one, else None."""
    return RUNTIMES.sole


def enable_peer_access(device: int, peer: int) -> None:
    """Let kernels on ``device`` use arrays of ``peer`` (one direction; call it
    both ways for both). The driver enables peer access, and the runtime of
    ``device`` records it: a launch there then accepts arrays of ``peer``,
    ordered after their uses on ``peer``'s streams (and ``peer``'s later uses
    and frees after the launch). Both devices' runtimes are built if needed.

    Parameters
    ----------
    device : int
        The device whose kernels may use ``peer``'s arrays.
    peer : int
        The device whose arrays they use.

    Raises
    ------
    InvalidArgument
        ``device == peer``, or either is not a device ordinal.
    DriverError
        The GPUs have no peer-to-peer path (copy the arrays instead).
    """
    if device_ordinal(device) == device_ordinal(peer):
        raise InvalidArgument(
            f"enable_peer_access({device!r}, {peer!r}): a device needs no peer access to its "
            "own arrays; pass two different devices")
    get_runtime(device).enable_peer_access(get_runtime(peer))


def default_stack(driver: Driver) -> MemoryResource:
    """The resource stack of a process-wide runtime, chosen by the settings
    (:mod:`numba_streamsafe.core.settings`).

    ``NUMBA_STREAMSAFE_RESOURCE``: ``async`` (default, stream-ordered and
    tracked) or ``direct`` (``cuMemAlloc`` / ``cuMemFree``, untracked: for
    compute-sanitizer runs, where a pool hides out-of-bounds accesses).
    ``NUMBA_STREAMSAFE_FENCES``: ``lazy`` (default) or ``eager``, see
    :class:`~numba_streamsafe.resources.AsyncResource`.
    ``NUMBA_STREAMSAFE_UPSTREAM``: ``driver`` (default, the device's pool) or
    ``rmm`` (RMM's current resource of the device, a
    :class:`~numba_streamsafe.resources.RmmUpstream`). The async stack keeps
    freed memory in the device's pool across synchronizes
    (``release_threshold=POOL_KEEP_ALL``); :meth:`DeviceRuntime.trim` hands it back.
    """
    config = settings()
    if config.resource == "direct":
        if config.upstream != "driver":
            raise InvalidArgument(
                "NUMBA_STREAMSAFE_RESOURCE=direct allocates with cuMemAlloc and takes no "
                f"upstream, but NUMBA_STREAMSAFE_UPSTREAM={config.upstream}: unset one of them")
        _warn_direct()
        return DirectResource(driver)
    upstream = None
    if config.upstream == "rmm":
        if config.ipc:
            raise InvalidArgument(
                "NUMBA_STREAMSAFE_IPC=1 allocates with cuMemAlloc (what CUDA IPC exports) and "
                "takes no upstream, but NUMBA_STREAMSAFE_UPSTREAM=rmm: unset one of them")
        if driver.traces_accesses:
            raise InvalidArgument(
                "NUMBA_STREAMSAFE_UPSTREAM=rmm needs a GPU: the simulated driver (Numba's CUDA "
                "simulator) allocates from its own pool; unset the variable there")
        upstream = rmm_upstream(driver.device)
    # Check mode frees every block at once, on its stream: each free is checked.
    check = config.mode == "check"
    return AsyncResource(driver, fences=config.fences, release_threshold=POOL_KEEP_ALL,
                         ipc=config.ipc, upstream=upstream, check=check,
                         observe=config.observing,
                         reuse_bytes=0 if check else AsyncOptions.reuse_bytes)


_warned_direct = False


def _warn_direct() -> None:
    global _warned_direct
    if not _warned_direct:
        _warned_direct = True
        warnings.warn("NUMBA_STREAMSAFE_RESOURCE=direct: allocations use cuMemAlloc/cuMemFree and "
                      "nothing is tracked, so tracked launches and copies on different streams "
                      "are NOT ordered. Use it for compute-sanitizer runs only; unset it to get "
                      "the ordering back", RuntimeWarning, stacklevel=4)


def set_runtime(runtime: DeviceRuntime, device: int | None = None) -> DeviceRuntime | None:
    """Install ``runtime`` as the process-wide runtime of its device; return the old one.

    Parameters
    ----------
    runtime : DeviceRuntime
        The runtime to install.
    device : int, optional
        The device it serves (default: its driver's device).

    Returns
    -------
    DeviceRuntime or None
        The runtime installed for that device before, if any.

    Raises
    ------
    InvalidArgument
        ``device`` is not a device ordinal (an int >= 0)."""
    return RUNTIMES.install(runtime, runtime.device if device is None else device)


def clear_runtimes() -> None:
    """Forget every process-wide runtime (the next :func:`get_runtime` builds anew)."""
    RUNTIMES.clear()
