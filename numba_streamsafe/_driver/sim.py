"""A CPU model of the CUDA driver with a happens-before hazard checker.

Streams are FIFO queues identified by integer handles; nothing runs
asynchronously, but every operation is stamped with a vector clock when it is
queued, so the model knows exactly which earlier operations are ordered before
it: those earlier on the same stream, those captured by an event the stream
waited on, and those the host had synchronised with before queueing it.

Memory comes from a pool that, like CUDA's, hands a freed address back at once
to an allocation that is ordered after the free (same stream, or through an
event dependency). Each address range keeps a shadow of its last write and of
the last read per stream, across owners, so the checker sees accesses of a
previous owner of a reused address.

A **hazard** is reported when

* a read's bytes were last written by an operation not ordered before it,
* a write (allocation and free count as writes) overlaps an earlier read or
  write not ordered before it, or
* an access touches an address that is not allocated (use after free) or runs
  past the end of its allocation.

Like CUDA, the model may hand a destroyed stream's handle to the next stream
created (``recycle_streams``); the checker keeps the two apart (each stream
has a serial of its own), so a reused handle inherits no ordering. Work queued
on a destroyed stream still completes: a device-wide synchronize (and so
``cuMemFree``) orders the host after it, and until something orders it, it
races with later work. Once the host has waited for its last operation the
stream leaves the clocks (:meth:`SimSystem.retire`): the clocks, and the cost
of a launch and of a synchronise, do not grow with the streams made over a run.

Several simulated devices share one :class:`SimSystem`: one lock, one host
clock, one counter of stream serials and handles, and events any device's
streams may wait for (as ``cuStreamWaitEvent`` allows across contexts; an event
is recorded only on a stream of its own device, as ``cuEventRecord`` requires).
Each device keeps its own streams, memory and pool. A kernel's access to
memory of another device is a hazard (``no-peer-access``) unless that device
enabled peer access to it (:meth:`SimDriver.enable_peer_access`); copies
between devices need none. Happens-before is checked across devices.

Faults can be injected per call name with :meth:`SimDriver.inject_failure`.
"""
from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np

from numba_streamsafe._driver.base import (
    CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_INVALID_VALUE,
)
from numba_streamsafe._driver.limits import SIMULATED, LaunchLimits
from numba_streamsafe._driver.sim_capture import (  # noqa: F401 - the capture errors, re-exported
    CUDA_ERROR_ILLEGAL_STATE,
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
    Captures,
)
from numba_streamsafe._driver.sim_checker import HappensBefore
from numba_streamsafe._driver.sim_memory import SimPool
from numba_streamsafe._driver.sim_model import (
    HOST,
    INVALID_DEVICE,
    LEGACY_STREAM,
    PER_THREAD_STREAM,
    Chunk,
    Hazard,
    Op,
    SimStream,
    SimSystem,
    check_fill_args,
    join_clocks,
    tell_watchers,
    watchers,
)
from numba_streamsafe._driver.sim_observer import SimObserver
from numba_streamsafe.core import tracehook
from numba_streamsafe.core.access import Access
from numba_streamsafe.core.errors import DriverError, StreamMisuse
from numba_streamsafe.core.streams import CU_STREAM_LEGACY

__all__ = ["SimDriver", "SimSystem", "Hazard", "HOST", "LEGACY_STREAM", "PER_THREAD_STREAM"]


class SimDriver:
    """Simulated driver for one device: streams, events, graphs and faults,
    and the memory calls, each ordered by the driver's clocks. It holds the
    device's memory (``memory``, a :class:`~.sim_memory.SimPool`), the
    hazard checker (``checker``, a :class:`~.sim_checker.HappensBefore`)
    and the captures under way (``captures``).

    Parameters
    ----------
    device : int
        Ordinal reported by this driver.
    capacity : int
        Bytes the simulated device holds; allocations beyond it fail with
        ``CUDA_ERROR_OUT_OF_MEMORY`` unless completed frees can be trimmed.
    backing : bool
        Back every chunk with real host memory (a NumPy buffer) whose address
        is the device address, so Numba's CUDA simulator can run kernels on it.
    recycle_streams : bool
        Give the handle of the most recently destroyed stream to the next
        stream created, as CUDA may (a handle is an address the driver reuses).
    system : SimSystem, optional
        The machine this device belongs to, shared with the other devices'
        drivers (one happens-before model across them); a system of its own
        when omitted. ``hazards`` is the system's list.
    """

    traces_accesses = True
    supports_direct_launch = False

    def __init__(self, device: int = 0, capacity: int = 1 << 34, backing: bool = True, *,
                 recycle_streams: bool = True, system: SimSystem | None = None) -> None:
        if system is None:
            system = SimSystem()
        system.drivers[device] = self  # a later driver of the same ordinal replaces it
        # Launches keep their argument names from now on: the reports name them.
        tracehook.name_arguments_for_good()
        self.system = system
        self.device = device
        self.recycle_streams = recycle_streams
        self._lock = system.lock
        self._streams: dict[int, SimStream] = {
            LEGACY_STREAM: SimStream(LEGACY_STREAM, system.new_serial()),
            PER_THREAD_STREAM: SimStream(PER_THREAD_STREAM, system.new_serial(), blocking=True),
        }
        #: Serial -> stream, for the live streams.
        self._by_serial: dict[int, SimStream] = {s.serial: s for s in self._streams.values()}
        #: Handles of destroyed streams, handed out again newest first.
        self._free_handles: list[int] = []
        #: What the destroyed streams' work is ordered after (the join of their
        #: clocks), until a device-wide synchronise waits for it.
        self._retired: dict[int, int] = {}
        #: Handles of destroyed streams not yet handed out again.
        self.destroyed_streams: set[int] = set()
        #: Streams created and destroyed over the driver's life.
        self.streams_created = 0
        self.streams_destroyed = 0
        self._host_clock = system.host_clock
        self._events = system.events
        #: The device's memory: its chunks, pool and figures.
        self.memory = SimPool(system, capacity, backing)
        #: The happens-before checker (its hazards are the system's).
        self.checker = HappensBefore(system.hazards, self._ordered)
        self._faults: dict[str, collections.deque[int]] = {}
        self.calls: collections.Counter[str] = collections.Counter()
        self.events_created = 0
        self.events_destroyed = 0
        #: The captures under way and the live graphs (:meth:`begin_capture`).
        self.captures = Captures()
        #: Another library on this device: its calls run here and are noted
        #: for a resource that observes (:meth:`observe`).
        self.observer = SimObserver(self)

    # ------------------------------------------------------------------ faults
    def inject_failure(self, call: str, code: int = CUDA_ERROR_INVALID_VALUE, *, skip: int = 0,
                       times: int = 1) -> None:
        """Make the ``times`` calls of ``call`` after the next ``skip`` fail with ``code``."""
        with self._lock:
            queue = self._faults.setdefault(call, collections.deque())
            queue.extend([0] * skip + [code] * times)

    def _enter(self, call: str) -> None:
        self.calls[call] += 1
        queue = self._faults.get(call)
        if queue:
            code = queue.popleft()
            if code:
                raise DriverError(call, code, "injected failure")

    # ------------------------------------------------------------------ memory
    @property
    def capacity(self) -> int:
        """Bytes the simulated device holds."""
        return self.memory.capacity

    @property
    def backing(self) -> bool:
        """Whether every chunk is backed by host memory at its device address."""
        return self.memory.backing

    @property
    def pool_attributes(self) -> dict[str, int]:
        """Attributes set with :meth:`set_pool_attribute`."""
        return self.memory.attributes

    @property
    def reserved_bytes(self) -> int:
        """Bytes held by live and pooled chunks."""
        return self.memory.reserved

    def alloc_async(self, nbytes: int, stream: int) -> int:
        with self._lock:
            self._enter("cuMemAllocAsync")
            if nbytes <= 0:
                raise DriverError("cuMemAllocAsync", CUDA_ERROR_INVALID_VALUE,
                                  "size must be positive")
            op = self._enqueue(stream, "cuMemAllocAsync", "cuMemAllocAsync")
            chunk = self.memory.take(nbytes, op, self._ordered, "cuMemAllocAsync")
            self.checker.check(chunk, chunk.base, nbytes, Access.WRITE, op)
            return chunk.base

    def alloc(self, nbytes: int) -> int:
        with self._lock:
            self._enter("cuMemAlloc")
            if nbytes <= 0:
                raise DriverError("cuMemAlloc", CUDA_ERROR_INVALID_VALUE, "size must be positive")
            chunk = self.memory.new_chunk(nbytes, "cuMemAlloc")
            self.checker.check(chunk, chunk.base, nbytes, Access.WRITE,
                               self._host_op("cuMemAlloc"))
            return chunk.base

    def free_async(self, ptr: int, stream: int) -> None:
        with self._lock:
            self._enter("cuMemFreeAsync")
            chunk = self.memory.live_chunk(ptr, "cuMemFreeAsync")
            op = self._enqueue(stream, "cuMemFreeAsync", "cuMemFreeAsync")
            op.stack = chunk.freed
            self.checker.check(chunk, chunk.base, chunk.nbytes, Access.WRITE, op)
            self.memory.pool(chunk, op)

    def free(self, ptr: int) -> None:
        with self._lock:
            self._enter("cuMemFree")
            chunk = self.memory.live_chunk(ptr, "cuMemFree")
            # cuMemFree synchronises the device before releasing the memory.
            self._join_device()
            op = self._host_op("cuMemFree")
            op.stack = chunk.freed
            self.checker.check(chunk, chunk.base, chunk.nbytes, Access.WRITE, op)
            self.memory.release(chunk, op)

    def register_foreign(self, ptr: int, nbytes: int, stream: int) -> None:
        """Check accesses to ``nbytes`` at ``ptr``, memory another library allocated
        and hands over on ``stream`` (a borrowed block), from now on.

        A range inside a live allocation the model knows (of any device of the
        system) needs nothing: its accesses are checked already. Other memory
        becomes an external chunk, ready after the work queued on ``stream``
        so far (its last write is a hand-over on ``stream``) and, when the
        driver keeps bytes (``backing=True``), backed by the host memory at
        ``ptr`` itself: under Numba's CUDA simulator device memory is host
        memory, so ``ptr`` must be the address of ``nbytes`` live host bytes.

        Raises
        ------
        DriverError
            ``nbytes`` is not positive, or the range runs into freed memory or
            past the end of an allocation (``CUDA_ERROR_INVALID_VALUE``);
            ``stream`` does not exist.
        """
        with self._lock:
            self._enter("register_foreign")
            if not isinstance(nbytes, int) or nbytes <= 0:
                raise DriverError("register_foreign", CUDA_ERROR_INVALID_VALUE,
                                  f"size {nbytes!r} is not a positive int")
            self._stream(stream, "register_foreign")
            chunk = self._owner_of(ptr)[1]
            if chunk is not None:
                if chunk.live and ptr + nbytes <= chunk.base + chunk.nbytes:
                    return
                what = "freed memory" if not chunk.live else "past the end of an allocation"
                raise DriverError("register_foreign", CUDA_ERROR_INVALID_VALUE,
                                  f"{ptr:#x}+{nbytes} runs into {what} at {chunk.base:#x}")
            chunk = self.memory.add_external(ptr, nbytes)
            self.checker.check(chunk, ptr, nbytes, Access.WRITE,
                               self._enqueue(stream, "foreign memory handed over",
                                             "register_foreign"))

    def release_foreign(self, ptr: int, stream: int) -> None:
        """The borrowed memory at ``ptr`` is released on ``stream``: for an external
        chunk (:meth:`register_foreign`), checked as a free there (every use
        must be ordered before it), then forgotten. A range of an allocation
        the model knows stays as it is (its owner frees it)."""
        with self._lock:
            self._enter("release_foreign")
            chunk = self.memory.external(ptr)
            if chunk is None:
                return
            op = self._enqueue(stream, "release of borrowed memory", "release_foreign")
            self.checker.check(chunk, chunk.base, chunk.nbytes, Access.WRITE, op)
            self.memory.release(chunk, op)

    def pool_trim(self, keep_bytes: int = 0) -> None:
        with self._lock:
            self._enter("cuMemPoolTrimTo")
            self.memory.trim_completed(keep_bytes)

    def set_pool_attribute(self, name: str, value: int) -> None:
        """Record a pool attribute (the model keeps freed memory pooled until a
        trim or an out-of-memory, whatever the release threshold)."""
        with self._lock:
            self._enter("cuMemPoolSetAttribute")
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise DriverError("cuMemPoolSetAttribute", CUDA_ERROR_INVALID_VALUE,
                                  f"pool attribute {name} cannot be {value!r}")
            self.memory.set_attribute(name, value)

    def get_pool_attribute(self, name: str) -> int:
        """The pool's reserved and used bytes and their high-water marks (the
        other attributes as last set, 0 if never)."""
        with self._lock:
            self._enter("cuMemPoolGetAttribute")
            return self.memory.attribute(name)

    def mem_info(self) -> tuple[int, int]:
        with self._lock:
            self._enter("cuMemGetInfo")
            return self.memory.capacity - self.memory.reserved, self.memory.capacity

    def buffer(self, ptr: int, nbytes: int) -> np.ndarray:
        """A NumPy ``uint8`` view of ``nbytes`` simulated device bytes at ``ptr``."""
        with self._lock:
            return self.memory.buffer(ptr, nbytes)

    def memset_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        """Queue the fill of ``nbytes`` bytes at ``ptr`` with the byte ``value`` on ``stream``.

        The model of ``cuMemsetD8Async``: checked as a write of the range by
        ``stream``, like a kernel (:meth:`trace_access`), so an unordered fill is
        a hazard. The backing bytes are filled at once; a range without backing
        (``backing=False``, or past the end of its chunk) is checked only.

        Raises
        ------
        DriverError
            ``value`` is not a byte or ``nbytes`` is negative
            (``CUDA_ERROR_INVALID_VALUE``); ``stream`` does not exist.
        """
        with self._lock:
            self._enter("cuMemsetD8Async")
            check_fill_args("cuMemsetD8Async", value, nbytes)
            op = self._enqueue(stream, "cuMemsetD8Async", "cuMemsetD8Async")
            if nbytes:
                self._trace(((ptr, nbytes, Access.WRITE),), op)
                view = self._backed_view(ptr, nbytes)
                if view is not None:
                    view[:] = value

    def copy_to_host(self, ptr: int, nbytes: int, stream: int) -> bytes:
        """Copy ``nbytes`` bytes at ``ptr`` to the host on ``stream``, then synchronise it.

        The model of ``cuMemcpyDtoHAsync`` followed by ``cuStreamSynchronize``:
        checked as a read of the range by ``stream``, like a kernel
        (:meth:`trace_access`); afterwards the host is ordered after everything
        queued on ``stream``.

        Raises
        ------
        DriverError
            ``nbytes`` is negative, or the range is not memory of this driver
            (``CUDA_ERROR_INVALID_VALUE``); ``stream`` does not exist.
        StreamMisuse
            This driver keeps no bytes (``backing=False``): build it with
            ``SimDriver(backing=True)`` to read device memory back.
        """
        with self._lock:
            self._enter("cuMemcpyDtoHAsync")
            check_fill_args("cuMemcpyDtoHAsync", 0, nbytes)
            self._stream(stream, "cuMemcpyDtoHAsync")
            data = b""
            if nbytes:
                if not self.memory.backing:
                    raise StreamMisuse(
                        f"cannot copy {nbytes} B at {ptr:#x} to the host: this SimDriver was "
                        "built with backing=False and keeps no bytes; use SimDriver(backing=True)"
                    )
                chunk = self.memory.chunk_at(ptr)
                if chunk is None or ptr + nbytes > chunk.base + chunk.capacity:
                    raise DriverError("cuMemcpyDtoHAsync", CUDA_ERROR_INVALID_VALUE,
                                      f"{ptr:#x}+{nbytes} is not memory of this device")
                op = self._enqueue(stream, "cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync")
                self._trace(((ptr, nbytes, Access.READ),), op)
                view = self._backed_view(ptr, nbytes)
                data = view.tobytes() if view is not None else b""
            self.stream_synchronize(stream)
            return data

    def copy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """Queue the copy of ``nbytes`` bytes from ``src`` to ``dst`` on ``stream``
        (``cuMemcpyAsync``): either may be memory of another device of the system,
        which needs no peer access. Checked as a read of ``src`` and a write of
        ``dst``; the backing bytes move at once.

        Raises
        ------
        DriverError
            ``nbytes`` is negative; ``stream`` does not exist.
        """
        with self._lock:
            self._enter("cuMemcpyAsync")
            check_fill_args("cuMemcpyAsync", 0, nbytes)
            op = self._enqueue(stream, "cuMemcpyAsync", "cuMemcpyAsync")
            if nbytes:
                self._trace(((src, nbytes, Access.READ), (dst, nbytes, Access.WRITE)), op)
                source = self._backed_view(src, nbytes)
                target = self._backed_view(dst, nbytes)
                if source is not None and target is not None:
                    n = min(len(source), len(target))
                    target[:n] = source[:n]

    def _owner_of(self, address: int) -> tuple[int, Chunk | None]:
        """The device whose memory holds ``address`` (this one first) and its chunk."""
        chunk = self.memory.chunk_at(address)
        if chunk is not None:
            return self.device, chunk
        for device, driver in self.system.drivers.items():
            if driver is not self:
                chunk = driver.memory.chunk_at(address)
                if chunk is not None:
                    return device, chunk
        return self.device, None

    def _backed_view(self, ptr: int, nbytes: int) -> np.ndarray | None:
        """The backing bytes of ``ptr``..``ptr+nbytes`` up to the end of its chunk, or None."""
        return SimPool.backed(self._owner_of(ptr)[1], ptr, nbytes)

    # ---------------------------------------------------------------- checking
    @property
    def hazards(self) -> list[Hazard]:
        """Every hazard seen on the system's devices (the system's list)."""
        return self.checker.hazards

    def trace_access(self, stream: int, accesses: Iterable[tuple[Any, ...]],
                     label: str, *, copy: bool = False, stack: tuple = (),
                     library: str | None = None) -> None:
        """Check a kernel or copy on ``stream`` that touches ``accesses``:
        ``(ptr, nbytes, access)`` or ``(ptr, nbytes, access, argument name)``.
        ``stack`` (the user's frames, :mod:`numba_streamsafe.core.sites`) and
        ``library`` (who queued it) are for the reports.

        Memory of another device of the system is checked too; a kernel
        (``copy`` False) that touches it without peer access
        (:meth:`enable_peer_access`) is a ``no-peer-access`` hazard.

        Raises
        ------
        RaceDetected
            Inside ``numba_streamsafe.race_check()``: this work conflicts
            with earlier work it is not ordered after (after every access
            of it was checked).
        """
        with self._lock:
            op = self._enqueue(stream, label, "launch")
            op.stack = stack
            op.library = library
            self._trace(accesses, op, peer_checked=not copy)
        if watchers:
            tell_watchers(self.system)

    def trace_host_access(self, accesses: Iterable[tuple[int, int, Access]], label: str) -> None:
        """Check a host-side access (for example reading results after a sync)."""
        with self._lock:
            self._trace(accesses, self._host_op(label))

    def _trace(self, accesses: Iterable[tuple[Any, ...]], op: Op,
               peer_checked: bool = False) -> None:
        base = op
        checker = self.checker
        for entry in accesses:
            ptr, nbytes, access = entry[0], entry[1], entry[2]
            op = dataclasses.replace(base, param=entry[3]) if len(entry) > 3 else base
            device, chunk = self._owner_of(ptr)
            if chunk is None or not chunk.live:
                checker.report("use-after-free", ptr, "the free", str(op), chunk, op)
                continue
            if peer_checked and device != self.device and not self.can_access(device):
                checker.report("no-peer-access", ptr, f"memory of device {device}",
                               f"{op} of device {self.device}, which has no peer access to it")
            if ptr + nbytes > chunk.base + chunk.nbytes:
                checker.report("out-of-bounds", ptr, f"allocation of {chunk.nbytes} B", str(op))
            checker.check(chunk, ptr, nbytes, access, op)

    def trace_sites(self, ptr: int, *, allocated: tuple | None = None,
                    freed: tuple | None = None) -> None:
        """Tell the checker where the user's code allocated the memory at
        ``ptr`` (``allocated``) or freed it (``freed``, named by its next
        free), as stacks (:mod:`numba_streamsafe.core.sites`); the hazards
        of that memory name them. Memory the model does not know is ignored."""
        with self._lock:
            chunk = self._owner_of(ptr)[1]
            if chunk is None or chunk.base != ptr:
                return
            if allocated is not None:
                chunk.allocated = allocated
                chunk.freed = ()
            if freed is not None:
                chunk.freed = freed

    def assert_no_hazards(self) -> None:
        """Raise ``AssertionError`` listing every hazard seen so far."""
        self.checker.assert_none()

    # ----------------------------------------------------------------- streams
    def create_stream(self, blocking: bool = False) -> int:
        """Create a stream and return its handle (a destroyed one's, when recycling).

        A ``blocking`` stream (what ``numba.cuda.stream()`` makes on a GPU) and
        the legacy default stream wait for each other's earlier work, as CUDA
        orders them; a non-blocking one (the default, as the CUDA driver's)
        is ordered with the legacy stream by nothing."""
        with self._lock:
            self._enter("cuStreamCreate")
            if self._free_handles:
                handle = self._free_handles.pop()
                self.destroyed_streams.discard(handle)
            else:
                handle = self.system.take_handles()
            stream = SimStream(handle, self.system.new_serial(), blocking)
            self._streams[handle] = stream
            self._by_serial[stream.serial] = stream
            self.streams_created += 1
            return handle

    def destroy_stream(self, stream: int) -> None:
        """Destroy ``stream``. Its queued work still completes (the host is ordered
        after it at the next device-wide synchronize); the handle may be reused.
        The stream leaves the clocks once the host waited for its work
        (:meth:`SimSystem.retire`)."""
        with self._lock:
            self._enter("cuStreamDestroy")
            if stream in (LEGACY_STREAM, 1, PER_THREAD_STREAM):
                raise DriverError("cuStreamDestroy", CUDA_ERROR_INVALID_HANDLE,
                                  f"stream {stream:#x} is a default stream")
            s = self._stream(stream, "cuStreamDestroy")
            del self._streams[stream]
            del self._by_serial[s.serial]
            join_clocks(self._retired, s.clock)
            self.system.retire(s.serial, s.clock.get(s.serial, 0))
            self.destroyed_streams.add(stream)
            if self.recycle_streams:
                self._free_handles.append(stream)
            self.streams_destroyed += 1

    def reset_context(self) -> None:
        """The context is destroyed and made anew: every stream but the default
        ones and every event is destroyed, all work completes and all memory goes
        back to the system. Handles of the destroyed streams may be reused.
        Captures under way end (their work is lost)."""
        with self._lock:
            self.captures.clear()
            for handle in [h for h in self._streams if h not in (LEGACY_STREAM,
                                                                 PER_THREAD_STREAM)]:
                self.destroy_stream(handle)
            self.synchronize()
            mine = [h for h, d in self.system.event_devices.items() if d == self.device]
            for handle in mine:
                del self._events[handle]
                del self.system.event_devices[handle]
            self.events_destroyed += len(mine)
            self.memory.clear()

    def launch_kernel(self, function: int, grid: tuple[int, int, int],
                      block: tuple[int, int, int], shmem: int, stream: int, params: Any) -> None:
        """Not available: the simulated device runs no compiled code (Numba's CUDA
        simulator runs the kernels; :meth:`trace_access` checks them)."""
        raise StreamMisuse("the simulated driver cannot launch compiled kernels; launch through "
                           "Numba's CUDA simulator")

    def launch_limits(self) -> LaunchLimits:
        """The limits of every CUDA GPU of compute capability 5 and up."""
        return SIMULATED

    def _stream(self, stream: int, call: str) -> SimStream:
        try:
            return self._streams[stream]
        except KeyError:
            raise DriverError(call, CUDA_ERROR_INVALID_HANDLE,
                              f"stream {stream:#x} does not exist") from None

    def check_stream(self, stream: int) -> None:
        if stream == CU_STREAM_LEGACY:
            raise StreamMisuse(
                f"stream {stream:#x} is CUDA's CU_STREAM_LEGACY, a second name of the legacy "
                "default stream, which the simulated driver does not take. Pass None or 0 for "
                "the default stream, or a stream of your own from numba.cuda.stream() (a stream "
                "is made, not numbered)"
            )
        if stream not in self._streams:
            raise StreamMisuse(
                f"stream {stream:#x} is not a stream of simulated device {self.device}: it "
                "was never created, or was destroyed. Pass a live stream, e.g. one from "
                "numba.cuda.stream()"
            )

    def _enqueue(self, stream: int, label: str, call: str) -> Op:
        if self.captures:
            self.captures.refuse_outside(stream, call)
        s = self._joined(stream, call)
        clock = s.clock
        serial = s.serial
        seq = clock.get(serial, 0) + 1
        clock[serial] = seq
        s.unseen = True
        return Op(serial, seq, label, stream)

    def _joined(self, stream: int, call: str) -> SimStream:
        """``stream``, its clock joined with what an operation queued on it now
        is ordered after: the host's past, and (CUDA's implicit
        synchronisation) the blocking streams' earlier work for the legacy
        default stream, the legacy stream's for a blocking stream."""
        s = self._stream(stream, call)
        clock = s.clock
        join_clocks(clock, self._host_clock)
        if stream == LEGACY_STREAM:
            for other in self._streams.values():
                if other.blocking and other.unseen:
                    join_clocks(clock, other.clock)
                    s.unseen = True
        elif s.blocking:
            legacy = self._streams[LEGACY_STREAM]
            if legacy.unseen:
                join_clocks(clock, legacy.clock)
                s.unseen = True
        return s

    def _host_op(self, label: str) -> Op:
        seq = self._host_clock.get(HOST, 0) + 1
        self._host_clock[HOST] = seq
        return Op(HOST, seq, label)

    def _ordered(self, earlier: Op, later: Op) -> bool:
        if later.stream == HOST:
            clock = self._host_clock
        else:
            clock = self._by_serial[later.stream].clock
        return self.system.covers(clock, earlier)

    def observe(self) -> SimObserver:
        """The calls made through :attr:`observer` (another library's)."""
        return self.observer

    def observe_failure(self) -> str | None:
        return None

    def stream_synchronize(self, stream: int) -> None:
        with self._lock:
            self._enter("cuStreamSynchronize")
            if self.captures:
                self.captures.refuse_outside(stream, "cuStreamSynchronize")
            # A synchronise of the legacy stream (or of a blocking one) waits
            # for what an operation queued there now would wait for.
            s = self._joined(stream, "cuStreamSynchronize")
            self._join_host(s.clock)
            s.unseen = False

    def stream_blocking(self, stream: int) -> bool:
        with self._lock:
            return self._stream(stream, "cuStreamGetFlags").blocking

    def stream_query(self, stream: int) -> bool:
        """Idle when the host has synchronised with everything queued on ``stream``:
        the model completes work only when the host observes it."""
        with self._lock:
            self._enter("cuStreamQuery")
            if self.captures:
                self.captures.refuse_outside(stream, "cuStreamQuery")
            return self.system.host_covers(self._stream(stream, "cuStreamQuery").clock)

    def synchronize(self) -> None:
        """Device-wide synchronise: the host is ordered after every stream,
        destroyed ones included."""
        with self._lock:
            self._enter("cuCtxSynchronize")
            if self.captures:
                self.captures.refuse_outside(None, "cuCtxSynchronize")
            self._join_device()

    def _join_device(self) -> None:
        for s in list(self._streams.values()):
            if s.unseen:
                self._join_host(s.clock)
                s.unseen = False
        retired, self._retired = self._retired, {}
        self._join_host(retired)

    def _join_host(self, clock: dict[int, int]) -> None:
        self.system.after_host(clock)

    def clocks(self) -> Iterable[dict[int, int]]:
        """The clocks this device keeps: its streams' and its destroyed streams'."""
        for s in self._streams.values():
            yield s.clock
        yield self._retired

    # ------------------------------------------------------------------ events
    def event_create(self) -> int:
        with self._lock:
            self._enter("cuEventCreate")
            handle = self.system.take_handles()
            self._events[handle] = None
            self.system.event_devices[handle] = self.device
            self.events_created += 1
            return handle

    def event_destroy(self, event: int) -> None:
        """Destroy ``event`` (one of any device of the system, as the driver allows)."""
        with self._lock:
            self._enter("cuEventDestroy")
            self._event(event, "cuEventDestroy")
            del self._events[event]
            owner = self.system.event_devices.pop(event)
            self.system.drivers[owner].events_destroyed += 1

    def _event(self, event: int, call: str) -> dict[int, int] | None:
        try:
            return self._events[event]
        except KeyError:
            raise DriverError(call, CUDA_ERROR_INVALID_HANDLE,
                              f"event {event:#x} does not exist") from None

    def event_record(self, event: int, stream: int) -> None:
        """Capture ``stream``'s work in ``event``, an event of this device (as
        ``cuEventRecord``, which fails for an event of another context)."""
        with self._lock:
            self._enter("cuEventRecord")
            self._event(event, "cuEventRecord")
            if self.system.event_devices[event] != self.device:
                raise DriverError("cuEventRecord", CUDA_ERROR_INVALID_HANDLE,
                                  f"event {event:#x} belongs to device "
                                  f"{self.system.event_devices[event]}, stream {stream:#x} to "
                                  f"device {self.device}")
            if self.captures:
                self.captures.refuse_outside(stream, "cuEventRecord")
            # A record is an operation of the stream: ordered as work queued there now.
            self._events[event] = dict(self._joined(stream, "cuEventRecord").clock)

    def event_query(self, event: int) -> bool:
        with self._lock:
            self._enter("cuEventQuery")
            clock = self._event(event, "cuEventQuery")
            return not clock or self.system.host_covers(clock)

    def event_synchronize(self, event: int) -> None:
        with self._lock:
            self._enter("cuEventSynchronize")
            clock = self._event(event, "cuEventSynchronize")
            if clock:
                self._join_host(clock)

    def stream_wait_event(self, stream: int, event: int) -> None:
        """Order later work on ``stream`` after ``event``'s, which may be an event of
        any device of the system (as ``cuStreamWaitEvent`` allows)."""
        with self._lock:
            self._enter("cuStreamWaitEvent")
            clock = self._event(event, "cuStreamWaitEvent")
            if self.captures:
                self.captures.refuse_outside(stream, "cuStreamWaitEvent")
            s = self._stream(stream, "cuStreamWaitEvent")
            if clock:
                join_clocks(s.clock, clock)
                s.unseen = True

    @property
    def live_streams(self) -> int:
        """Streams of this device that exist (the default streams included)."""
        return len(self._streams)

    @property
    def live_events(self) -> int:
        """Events of this device created and not yet destroyed."""
        device = self.device
        return sum(1 for d in self.system.event_devices.values() if d == device)

    # ---------------------------------------------------------------- graphs
    def begin_capture(self, stream: int) -> None:
        """Start recording the work queued on ``stream`` (``cuStreamBeginCapture``,
        thread-local mode): until :meth:`end_capture`, :meth:`capture_work`
        records it instead of running it. Default streams cannot be captured.

        While a capture is under way the model enforces CUDA's rules, as errors
        that also invalidate the capture (:meth:`end_capture` then fails with
        ``CUDA_ERROR_STREAM_CAPTURE_INVALIDATED``): work, an event record or
        wait, a synchronise or query of the capturing stream other than through
        :meth:`capture_work` (the library never queues any), work on or a
        synchronise of the legacy default stream (an implicit dependency on the
        capture), and a device-wide synchronise from the capturing thread
        (:class:`~numba_streamsafe._driver.sim_capture.Captures`).
        """
        with self._lock:
            self._enter("cuStreamBeginCapture")
            default = stream <= PER_THREAD_STREAM
            if not default:
                self._stream(stream, "cuStreamBeginCapture")
            self.captures.begin(stream, default)

    def capture_work(self, stream: int, work: Any, args: tuple[Any, ...],
                     accesses: list[tuple[int, int, Any]], label: str, copy: bool) -> Any:
        """Record ``work(*args)`` and what it touches, to run at every replay."""
        with self._lock:
            self.captures.record(stream, (work, args, list(accesses), label, copy))
        return None

    def end_capture(self, stream: int) -> Any:
        """End the capture of ``stream``; the graph of the work recorded.

        Raises
        ------
        DriverError
            ``stream`` is not capturing; or the capture was invalidated
            (``CUDA_ERROR_STREAM_CAPTURE_INVALIDATED``), which ends it too.
        """
        with self._lock:
            self._enter("cuStreamEndCapture")
            return self.captures.end(stream)

    @property
    def live_graphs(self) -> int:
        """Graphs and executables made and not yet destroyed."""
        return self.captures.live_graphs

    def graph_instantiate(self, graph: Any) -> Any:
        with self._lock:
            self._enter("cuGraphInstantiate")
            return self.captures.instantiate(graph)

    def graph_launch(self, graph_exec: Any, stream: int) -> None:
        """Replay the recorded work in order on ``stream`` (``cuGraphLaunch``):
        each operation runs again and is checked as work queued on ``stream``
        now, after what was queued there before and before what follows, and
        ordered with nothing else (a replay on another stream than the capture's
        is ordered with that stream by nothing)."""
        with self._lock:
            self._enter("cuGraphLaunch")
            self.captures.check_launch(graph_exec)
            if self.captures:
                self.captures.refuse_outside(stream, "cuGraphLaunch")
            self._stream(stream, "cuGraphLaunch")
        for work, args, accesses, label, copy in graph_exec.ops:
            work(*args)
            self.trace_access(stream, accesses, label, copy=copy)

    def graph_destroy(self, graph: Any, graph_exec: Any) -> None:
        """Destroy a graph and its executable (either may be None); a replay in
        flight completes (the model's replays complete when queued)."""
        with self._lock:
            self._enter("cuGraphDestroy")
            self.captures.destroy(graph, graph_exec)

    # -------------------------------------------------------------- devices
    def activate(self) -> AbstractContextManager[None]:
        """Make this device current for the calls inside (nothing to do here:
        every simulated call names its device)."""
        return nullcontext()

    def enable_peer_access(self, peer: int) -> None:
        """Let this device's kernels access ``peer``'s memory (``cuCtxEnablePeerAccess``).

        Idempotent. Raises :class:`~numba_streamsafe.core.errors.DriverError` when
        ``peer`` is this device or no device of the system.
        """
        with self._lock:
            self._enter("cuCtxEnablePeerAccess")
            if peer == self.device or peer not in self.system.drivers:
                raise DriverError("cuCtxEnablePeerAccess", INVALID_DEVICE,
                                  f"device {peer!r} is not a peer of simulated device "
                                  f"{self.device} (devices: {sorted(self.system.drivers)})")
            self.system.peer_access.add((self.device, peer))

    def can_access(self, peer: int) -> bool:
        """Whether this device's kernels may access ``peer``'s memory."""
        return peer == self.device or (self.device, peer) in self.system.peer_access
