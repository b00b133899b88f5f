"""The simulated driver's model of the machine: operations stamped with
vector clocks, streams, memory chunks, the system several simulated devices
share, and the hazards the checker reports (see :mod:`.sim`)."""

from __future__ import annotations

import bisect
import itertools
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from numba_streamsafe._driver.base import (
    CUDA_ERROR_INVALID_VALUE,
)
from numba_streamsafe.core.errors import DriverError
from numba_streamsafe.core.hazards import Hazard, Side, site_text

__all__ = ["SimSystem", "Hazard", "Side", "HOST", "LEGACY_STREAM", "PER_THREAD_STREAM", "ALIGN",
           "INVALID_DEVICE", "watchers", "Op", "SimStream", "Chunk", "round_capacity",
           "join_clocks", "tell_watchers", "check_fill_args"]

#: The host, as a pseudo-stream in vector clocks.
HOST = -1
LEGACY_STREAM = 0
PER_THREAD_STREAM = 2
_MIN_CHUNK = 256
ALIGN = 256


#: ``CUDA_ERROR_INVALID_DEVICE``: a peer that is no device of the system.
INVALID_DEVICE = 101


#: Race checks in progress (``numba_streamsafe.race_check``): each gets every
#: hazard found while it is active.
watchers: list[Any] = []


@dataclass
class Op:
    #: Serial of the stream (HOST for the host): vector clocks are keyed by
    #: serials, so a stream that reuses a destroyed one's handle starts afresh.
    stream: int
    seq: int
    label: str
    handle: int = HOST
    param: str | None = None
    #: The user's stack where it was queued (:mod:`numba_streamsafe.core.sites`).
    stack: tuple = ()
    #: Who queued it (:attr:`numba_streamsafe.core.hazards.Side.library`).
    library: str | None = None

    def __str__(self) -> str:
        where = "host" if self.stream == HOST else f"stream {self.handle:#x}"
        arg = f" argument {self.param!r}" if self.param else ""
        site = site_text(self.stack)
        at = f" called at {site}" if site else ""
        return f"{self.label!r}{arg} (#{self.seq} on {where}{at})"

    def side(self) -> Side:
        return Side(self.label, self.param, None if self.stream == HOST else self.handle,
                    self.stack, self.library)


class SimStream:
    __slots__ = ("handle", "serial", "clock", "blocking", "unseen")

    def __init__(self, handle: int, serial: int, blocking: bool = False) -> None:
        self.handle = handle
        self.serial = serial
        self.clock: dict[int, int] = {}
        #: Whether it and the legacy default stream wait for each other's work.
        self.blocking = blocking
        #: Whether the clock may name work the host has not waited for since
        #: it last joined the clock (a device-wide synchronise skips it if not).
        self.unseen = False


class _Shadow:
    """For each range of a chunk's bytes (offsets from its base), the
    accesses a later one must be ordered after: ``[lo, hi, writes, reads]``
    items, sorted and covering the chunk, where ``writes`` and ``reads`` map
    a stream to its newest write, or read, of the range: the last write and
    the reads since it, and where the checker is complete
    (:attr:`~.sim_checker.HappensBefore.complete`) also the earlier accesses
    no later write is ordered after. A range is split where an access begins
    or ends inside it, and neighbours that saw the same accesses join again."""

    __slots__ = ("parts",)

    def __init__(self, capacity: int) -> None:
        self.parts: list[list[Any]] = [[0, capacity, {}, {}]]

    def cover(self, lo: int, hi: int) -> tuple[int, int]:
        """``(i, j)``: ``parts[i:j]`` are exactly the bytes ``lo .. hi - 1``."""
        return self._split(lo), self._split(hi)

    def _split(self, at: int) -> int:
        parts = self.parts
        i = bisect.bisect_right(parts, at, key=lambda p: p[0]) - 1
        part = parts[i]
        if part[0] == at:
            return i
        if at >= part[1]:
            return i + 1
        parts.insert(i + 1, [at, part[1], dict(part[2]), dict(part[3])])
        part[1] = at
        return i + 1

    def join(self, i: int, j: int) -> None:
        """Join the neighbours among ``parts[i:j]`` that saw the same accesses."""
        parts = self.parts
        k = min(j, len(parts)) - 1
        while k > max(i, 0):
            left, right = parts[k - 1], parts[k]
            if _same(left[2], right[2]) and _same(left[3], right[3]):
                left[1] = right[1]
                del parts[k]
            k -= 1


def _same(a: dict[Any, Any], b: dict[Any, Any]) -> bool:
    """Whether two of a shadow's maps hold the same accesses."""
    return a.keys() == b.keys() and all(a[k] is b[k] for k in a)


class Chunk:
    __slots__ = ("base", "capacity", "nbytes", "buffer", "live", "free_op", "shadow",
                 "external", "allocated", "freed", "in_use")

    def __init__(self, base: int, capacity: int, buffer: Any, external: bool = False) -> None:
        self.base = base
        self.capacity = capacity
        self.nbytes = 0
        self.buffer = buffer
        self.live = False
        self.free_op: Op | None = None
        self.shadow = _Shadow(capacity)
        #: Memory another library allocated, registered while it is borrowed
        #: (:meth:`SimDriver.register_foreign`): not the pool's.
        self.external = external
        #: Handed out by the stream-ordered pool (cuMemAllocAsync) and not freed since:
        #: counted in the pool's used bytes.
        self.in_use = False
        #: The user's stacks where the memory was allocated and freed, as the
        #: resource tells them (:meth:`SimDriver.trace_sites`); the hazards name them.
        self.allocated: tuple = ()
        self.freed: tuple = ()


class SimSystem:
    """What the simulated devices of one machine share.

    One lock, one host clock, one counter of stream serials (vector clocks
    are keyed by them, so clocks compare across devices), one counter of
    handles (stream and event handles and unbacked addresses never collide
    across devices, as CUDA's do not), the events (any device's stream may
    wait for any event), the peer-access flags and the hazards found.

    A destroyed stream is *settled* once the host has waited for its last
    operation (:meth:`after_host`): everything queued from then on, on any
    stream, is ordered after its work (each operation is ordered after the
    host's past), so no clock needs an entry for it. :meth:`covers` decides
    every comparison: the work of a serial no longer ``tracked`` is before
    everything. The settled serials' entries leave the clocks in batches
    (:meth:`_settle`), so the clocks name the host, the live streams, the
    destroyed streams whose work may still be pending and a bounded number
    of settled ones: their size and cost do not grow with the streams made
    over a run.

    Build the drivers over it: ``SimDriver(0, system=s)``, ``SimDriver(1,
    system=s)``. A driver built without one gets a system of its own.
    """

    #: Settled serials beyond the tracked ones whose entries may stay in the
    #: clocks before a pass removes them all (:meth:`_settle`; negative: a
    #: pass at every settle).
    settle_batch = 32

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._serials = itertools.count(1)
        #: Serials a clock may have to name: the host's, every stream's that
        #: exists, and destroyed streams' until the host waited for their work.
        #: Work of any other serial is before everything queued from now on.
        self.tracked: set[int] = {HOST}
        #: Destroyed streams whose work the host has not waited for yet:
        #: serial -> the sequence number of the stream's last operation.
        self.unfinished: dict[int, int] = {}
        #: Settled serials whose entries may still be in some clock (:meth:`_settle`).
        self.settled: set[int] = set()
        self.host_clock: dict[int, int] = {}
        #: Event handle -> its captured clock (None until recorded).
        self.events: dict[int, dict[int, int] | None] = {}
        #: Event handle -> the device it was created on.
        self.event_devices: dict[int, int] = {}
        #: ``(device, peer)``: ``device``'s kernels may access ``peer``'s memory.
        self.peer_access: set[tuple[int, int]] = set()
        self.hazards: list[Hazard] = []
        self.drivers: dict[int, Any] = {}  # device -> its SimDriver
        self._next_handle = 0x1000
        #: Whether the hazards found here are the user's reports: False where a
        #: checking resource over this system reports instead (check mode).
        self.reports = True

    def new_serial(self) -> int:
        """The serial of a new stream (its key in the vector clocks)."""
        serial = next(self._serials)
        self.tracked.add(serial)
        return serial

    def covers(self, clock: dict[int, int], op: Op) -> bool:
        """Whether ``clock`` is ordered after ``op``: its entry for ``op``'s
        stream reaches ``op``, or that stream was destroyed and the host has
        waited for all its work (it left the clocks)."""
        stream = op.stream
        return stream not in self.tracked or clock.get(stream, 0) >= op.seq

    def host_covers(self, clock: dict[int, int]) -> bool:
        """Whether the host waited for everything ``clock`` names (:meth:`covers`)."""
        tracked, host = self.tracked, self.host_clock
        return all(k not in tracked or host.get(k, 0) >= v for k, v in clock.items())

    def retire(self, serial: int, last: int) -> None:
        """The stream ``serial`` was destroyed after its operation ``last``
        (0: none): it leaves the clocks now if the host waited for that
        operation already, else once it does (:meth:`after_host`)."""
        if self.host_clock.get(serial, 0) >= last:
            self._settle((serial,))
        else:
            self.unfinished[serial] = last

    def after_host(self, clock: dict[int, int]) -> None:
        """The host waited for what ``clock`` names: the host clock joins it,
        and the destroyed streams whose work it now covers leave the clocks."""
        host = self.host_clock
        join_clocks(host, clock)
        unfinished = self.unfinished
        if unfinished:
            done = [k for k in clock if k in unfinished and host[k] >= unfinished[k]]
            if done:
                self._settle(done)

    def clocks(self) -> Iterator[dict[int, int]]:
        """Every clock the system keeps: the host's, the events', and each
        device's streams' and destroyed streams' (:meth:`SimDriver.clocks`)."""
        yield self.host_clock
        for clock in self.events.values():
            if clock:
                yield clock
        for driver in self.drivers.values():
            yield from driver.clocks()

    def _settle(self, serials: Iterable[int]) -> None:
        """The host waited for all the work of the destroyed streams
        ``serials``: they are no longer ``tracked`` (:meth:`covers` orders
        their work before everything). Their entries, harmless now, leave
        the clocks once the settled serials outnumber the tracked ones by
        more than :attr:`settle_batch`: one pass over the clocks per batch,
        and no clock names more than ``2 * len(tracked) + settle_batch``
        serials."""
        settled = self.settled
        for serial in serials:
            self.tracked.discard(serial)
            self.unfinished.pop(serial, None)
            settled.add(serial)
        if len(settled) <= len(self.tracked) + self.settle_batch:
            return
        for clock in self.clocks():
            if len(clock) < len(settled):
                for key in [k for k in clock if k in settled]:
                    del clock[key]
            else:
                for key in settled:
                    clock.pop(key, None)
        settled.clear()

    def take_handles(self, step: int = 0x10) -> int:
        """A fresh handle; the next ``step`` values are taken with it."""
        handle = self._next_handle
        self._next_handle += step
        return handle

    def assert_no_hazards(self) -> None:
        """Raise ``AssertionError`` listing every hazard seen on any device."""
        if self.hazards:
            shown = "\n  ".join(str(h) for h in self.hazards[:10])
            raise AssertionError(f"{len(self.hazards)} hazard(s):\n  {shown}")


def round_capacity(nbytes: int) -> int:
    cap = _MIN_CHUNK
    while cap < nbytes:
        cap <<= 1
    return cap


def join_clocks(clock: dict[int, int], other: dict[int, int]) -> None:
    """``clock`` after ``other``: the newest of each entry."""
    for k, v in other.items():
        if clock.get(k, 0) < v:
            clock[k] = v


def tell_watchers(system: Any) -> None:
    """Give the hazards ``system`` found since they last looked to every race
    check in progress; raise for the first new one when a check asks to stop
    at the first hazard. A system that does not report (``reports`` False)
    tells nobody."""
    if not system.reports:
        return
    stop = None
    for watcher in list(watchers):
        new = watcher.collect(system)
        if new and watcher.stop_at_first and stop is None:
            stop = new[0]
    if stop is not None:
        from numba_streamsafe.core.errors import RaceDetected

        raise RaceDetected(stop)


def check_fill_args(call: str, value: int, nbytes: int) -> None:
    """Refuse a fill value that is not a byte, or a negative size, as the driver would."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 255:
        raise DriverError(call, CUDA_ERROR_INVALID_VALUE,
                          f"fill value {value!r} is not a byte; pass an int from 0 to 255")
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
        raise DriverError(call, CUDA_ERROR_INVALID_VALUE,
                          f"size {nbytes!r} is not a non-negative int")
