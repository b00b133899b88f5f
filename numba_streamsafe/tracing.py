"""Recording what the library did: :func:`trace` and :class:`Trace`.

While a trace records, every allocation, free, fenced launch, copy and memset
of every device is appended to it in order, with the waits the launch
protocol queued and the reason of each (which argument of which launch waits
for which earlier launch or copy, on which stream), the events it recorded,
and the uses that needed no wait because they stayed on one stream.

Recording costs a few microseconds per operation; with no trace active the
hot paths read one module attribute (:mod:`numba_streamsafe.tracehook`).
:meth:`Trace.save` writes the Chrome trace / Perfetto JSON format and
:meth:`Trace.plot` draws a timeline with matplotlib
(:mod:`numba_streamsafe.trace_export`).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from numba_streamsafe import tracehook
from numba_streamsafe.access import Access
from numba_streamsafe.errors import InvalidArgument, StreamMisuse
from numba_streamsafe.protocol import _REMEDY, Uses, commit, preflight
from numba_streamsafe.protocol import trace as _tell_driver

if TYPE_CHECKING:
    from numba_streamsafe.runtime import DeviceRuntime

__all__ = ["Trace", "Op", "Wait", "MemoryEvent", "trace"]

_WRITE = Access.WRITE
#: The earlier operation of a block used before the trace began.
_BEFORE = (0, "(before the trace)", "")


@dataclass(frozen=True)
class Op:
    """A fenced launch, copy or memset.

    ``kind`` is ``"launch"``, ``"copy"`` or ``"memset"``; ``uses`` holds
    ``(argument, access name, address)`` per block; ``t0``/``t1`` are host
    times (ns since the trace began) around preflight, the work and commit;
    ``device_t0``/``device_t1`` the device times (ns) of the work when the
    trace measured them, else None. ``tracked`` is False for a launch with
    tracking switched off (no waits, nothing recorded).
    """

    id: int
    kind: str
    label: str
    device: int
    stream: int
    uses: tuple[tuple[str, str, int], ...]
    t0: int
    t1: int
    tracked: bool = True
    device_t0: int | None = None
    device_t1: int | None = None


@dataclass(frozen=True)
class Wait:
    """Why operation ``op`` waited (or needed no new wait) for an earlier one.

    ``stream`` (of ``device``) waits for ``on_stream``: argument ``param`` of
    ``op`` (its access ``access``) conflicts with ``after_param`` of the
    earlier operation ``after`` (id 0: the block's allocation, label
    ``"allocation"``, or work queued before the trace began, label
    ``"(before the trace)"``), a
    ``hazard`` of ``"read-after-write"``, ``"write-after-write"`` or
    ``"write-after-read"``. ``inserted`` is True when this operation queued
    the ``cuStreamWaitEvent``; False when the stream already waited for the
    same point before (stream order covers it). ``same_stream`` marks a use
    whose earlier operation ran on the same stream: no wait at all.
    """

    op: int
    label: str
    param: str
    access: str
    device: int
    stream: int
    on_stream: int
    after: int
    after_label: str
    after_param: str
    hazard: str
    inserted: bool
    same_stream: bool
    t: int


@dataclass(frozen=True)
class MemoryEvent:
    """An allocation or free. ``what`` is ``"alloc"``, ``"free"`` (queued on
    its stream with ``cuMemFreeAsync``, after the waits its uses need),
    ``"kept"`` (kept for reuse by the next allocation of its size on its
    stream) or ``"deferred"`` (a finalizer queued it; it runs at the next
    allocation, launch or flush). ``live_bytes`` and ``pending_bytes`` are
    the resource's figures right after it."""

    what: str
    device: int
    stream: int
    ptr: int
    nbytes: int
    tag: str
    live_bytes: int
    pending_bytes: int
    t: int


@dataclass(frozen=True)
class EventRecord:
    """An event the protocol recorded on ``stream`` (sealing a mark), during ``op``."""

    op: int
    device: int
    stream: int
    t: int


def _hazard(waiter: Access, earlier_write: bool) -> str:
    if earlier_write:
        return "write-after-write" if waiter & _WRITE else "read-after-write"
    return "write-after-read"


class Trace:
    """A recording of the library's work, made by :func:`trace`.

    The launch path appends raw tuples; the lists below are built from them
    when first read (and again after more was recorded).

    Attributes
    ----------
    ops : list of Op
    waits : list of Wait
        One per (argument, earlier conflicting operation) of every tracked
        operation, including the uses that needed no wait (``same_stream``)
        and the waits already covered by an earlier one (``inserted`` False).
    memory : list of MemoryEvent
    events : list of EventRecord
    """

    def __init__(self, *, device_times: bool = False, nvtx: bool = False,
                 record: bool = True) -> None:
        self.device_times = device_times
        self.record = record
        self._nvtx = _load_nvtx() if nvtx else None
        self._ids = itertools.count(1)
        self._t0 = time.perf_counter_ns()
        #: Raw records of the fenced operations and of the memory events.
        self._raw: list[tuple[Any, ...]] = []
        self._mem: list[tuple[Any, ...]] = []
        #: (device, ptr, generation) -> (op id, label, param) of the last writer.
        self._writers: dict[tuple[int, int, int], tuple[int, str, str]] = {}
        #: (device, ptr, generation) -> {stream: (op id, label, param)} of the reads since.
        self._readers: dict[tuple[int, int, int], dict[int, tuple[int, str, str]]] = {}
        #: Device timing: per device (base event, driver, host ns); per op id its events.
        self._bases: dict[int, tuple[Any, Any, int]] = {}
        self._timing: dict[int, tuple[Any, Any, int]] = {}
        self._device_ns: dict[int, tuple[int, int]] = {}
        self.device_times_measured = False
        self._built: tuple[int, int] = (-1, -1)
        self._ops: list[Op] = []
        self._waits: list[Wait] = []
        self._events: list[EventRecord] = []
        self._memory: list[MemoryEvent] = []

    # ------------------------------------------------------------ the queries
    def _build(self) -> None:
        size = (len(self._raw), len(self._mem))
        if size == self._built:
            return
        ops, waits, events = [], [], []
        for raw in list(self._raw):
            op, op_waits, op_events = _materialize(raw, self._device_ns)
            ops.append(op)
            waits.extend(op_waits)
            events.extend(op_events)
        self._ops, self._waits, self._events = ops, waits, events
        self._memory = [MemoryEvent(*m) for m in list(self._mem)]
        self._built = size

    @property
    def ops(self) -> list[Op]:
        self._build()
        return self._ops

    @property
    def waits(self) -> list[Wait]:
        self._build()
        return self._waits

    @property
    def events(self) -> list[EventRecord]:
        self._build()
        return self._events

    @property
    def memory(self) -> list[MemoryEvent]:
        self._build()
        return self._memory

    def inserted_waits(self) -> list[Wait]:
        """The waits operations queued (``cuStreamWaitEvent`` calls), in order."""
        return [w for w in self.waits if w.inserted]

    def streams(self) -> list[tuple[int, int]]:
        """``(device, stream)`` of every lane, in order of first appearance."""
        seen: dict[tuple[int, int], None] = {}
        for op in self.ops:
            seen.setdefault((op.device, op.stream), None)
        for m in self.memory:
            seen.setdefault((m.device, m.stream), None)
        return list(seen)

    def save(self, path: str) -> None:
        """Write the trace as Chrome trace / Perfetto JSON (open it in
        ui.perfetto.dev or chrome://tracing): one lane per stream, flow arrows
        for the waits, counters for live and pending bytes."""
        from numba_streamsafe.trace_export import save_chrome

        save_chrome(self, path)

    def plot(self, path: str | None = None) -> Any:
        """Draw the timeline (lanes per stream, arrows for the waits, memory
        below) with matplotlib; saved to ``path`` when given. Returns the figure.

        Raises
        ------
        ImportError
            matplotlib is not installed (``pip install numba-streamsafe[plot]``).
        """
        from numba_streamsafe.trace_export import plot

        return plot(self, path)

    def summary(self) -> dict[str, int]:
        """Counts: operations, waits inserted, waits already covered, same-stream
        uses, events recorded, allocations, frees."""
        waits = self.waits
        return {
            "ops": len(self.ops),
            "waits_inserted": sum(w.inserted for w in waits),
            "waits_covered": sum(not w.inserted and not w.same_stream for w in waits),
            "same_stream_uses": sum(w.same_stream for w in waits),
            "events_recorded": len(self.events),
            "allocations": sum(m.what == "alloc" for m in self.memory),
            "frees": sum(m.what in ("free", "kept") for m in self.memory),
        }

    # ---------------------------------------------------------- the recording
    def allocated(self, resource: Any, block: Any, stream: int) -> None:
        """Hook of a tracking resource: ``block`` became live (its lock held)."""
        if self.record:
            self._mem.append(("alloc", block.device, stream, block.ptr, block.nbytes, block.tag,
                              resource.live_bytes, resource.pending_bytes,
                              time.perf_counter_ns() - self._t0))
            self._writers[(block.device, block.ptr, block.generation)] = (0, "allocation", "")

    def freed(self, resource: Any, block: Any, stream: int, how: str) -> None:
        """Hook of a tracking resource: ``block``'s free was queued or kept (lock held)."""
        if self.record:
            self._mem.append(("kept" if how == "kept" else "free", block.device, stream,
                              block.ptr, block.nbytes, block.tag, resource.live_bytes,
                              resource.pending_bytes, time.perf_counter_ns() - self._t0))

    def deferred(self, resource: Any, block: Any) -> None:
        """Hook of a tracking resource: a finalizer deferred ``block``'s free."""
        if self.record:
            self._mem.append(("deferred", block.device, block.stream, block.ptr, block.nbytes,
                              block.tag, resource.live_bytes, resource.pending_bytes,
                              time.perf_counter_ns() - self._t0))

    def fenced(self, rt: DeviceRuntime, stream: int, uses: Uses, label: str, strict: bool,
               owner: object, work: Callable[..., Any], args: tuple[Any, ...],
               tracking: bool) -> Any:
        """:func:`numba_streamsafe.protocol.fenced`, recorded."""
        nvtx = self._nvtx
        if nvtx is not None:
            nvtx.push_range(label)
        try:
            if not self.record:
                return _run(rt, stream, uses, label, strict, owner, work, args, tracking)
            return self._fenced(rt, stream, uses, label, strict, owner, work, args, tracking)
        finally:
            if nvtx is not None:
                nvtx.pop_range()

    def _fenced(self, rt: DeviceRuntime, stream: int, uses: Uses, label: str, strict: bool,
                owner: object, work: Callable[..., Any], args: tuple[Any, ...],
                tracking: bool) -> Any:
        t0 = time.perf_counter_ns() - self._t0
        op_id = next(self._ids)
        blocks = uses.blocks
        names = uses.names
        if names is None or len(names) != len(blocks):
            names = ["?"] * len(blocks)
        tracker = rt.resource.tracker
        state = tracker.__dict__
        live = state.get("_live") if tracking else None
        cands = self._candidates(live, stream, blocks, names) if live is not None else None
        pool = state.get("events")
        recorded = pool.recorded if pool is not None else 0
        timing = self._start_timing(rt, stream, t0) if self.device_times else None
        result = _run(rt, stream, uses, label, strict, owner, work, args, tracking)
        if timing is not None:
            self._end_timing(rt, stream, op_id, timing)
        t1 = time.perf_counter_ns() - self._t0
        post = None
        if cands:
            # Whether this op queued each wait, and sealed (recorded) each mark.
            post = [(c[1:], not c[2] and c[8] != stream and c[0].waiters is not None
                     and stream in c[0].waiters, not c[1] and c[0].handle is not None)
                    for c in cands]
        if tracking:
            writers, readers = self._writers, self._readers
            for (block, access), name in zip(blocks, names, strict=False):
                key = (block.device, block.ptr, block.generation)
                if access & _WRITE:
                    writers[key] = (op_id, label, name)
                    readers.pop(key, None)
                else:
                    readers.setdefault(key, {})[stream] = (op_id, label, name)
        # The uses themselves (blocks and names are not changed after a launch):
        # read when the lists are built.
        self._raw.append((op_id, label, uses.copy, rt.device, stream, blocks, names,
                          t0, t1, tracking, post,
                          pool.recorded - recorded if pool is not None else 0))
        return result

    def _candidates(self, live: Any, stream: int, blocks: list[Any], names: list[str]
                    ) -> list[tuple[Any, ...]]:
        """Before preflight: per conflict of each use, (mark, sealed, waited by
        ``stream``, earlier (op, label, param), param, access, earlier was a
        write, block key, the mark's stream)."""
        out: list[tuple[Any, ...]] = []
        writers, readers = self._writers, self._readers
        for (block, access), name in zip(blocks, names, strict=False):
            entry = live.get(block.ptr)
            if entry is None or entry.block.generation != block.generation:
                continue  # freed or stale: preflight raises it with advice
            key = (block.device, block.ptr, block.generation)
            lw = entry.last_write
            w = lw.waiters
            out.append((lw, lw.handle is not None, w is not None and stream in w,
                        writers.get(key, _BEFORE), name, int(access), True, key, lw.stream))
            if access & _WRITE and entry.reads:
                seen = readers.get(key)
                for s, m in list(entry.reads.items()):
                    if s != stream:
                        mw = m.waiters
                        out.append((m, m.handle is not None, mw is not None and stream in mw,
                                    seen.get(s, _BEFORE) if seen else _BEFORE, name,
                                    int(access), False, key, s))
        return out

    # ------------------------------------------------------------ device times
    def _start_timing(self, rt: DeviceRuntime, stream: int, now: int) -> Any:
        driver = rt.driver
        make = getattr(driver, "timing_event", None)
        if make is None:
            return None
        if rt.device not in self._bases:
            base = make()
            driver.event_record(base, stream)
            self._bases[rt.device] = (base, driver, now)
        start = make()
        driver.event_record(start, stream)
        return start

    def _end_timing(self, rt: DeviceRuntime, stream: int, op_id: int, start: Any) -> None:
        driver = rt.driver
        end: Any = getattr(driver, "timing_event")()  # noqa: B009 - CUDA driver only
        driver.event_record(end, stream)
        self._timing[op_id] = (start, end, rt.device)

    def _resolve_device_times(self) -> None:
        """At the end of the trace: device times of the ops from their events
        (waits for them), then destroys the events."""
        if not self._timing:
            return
        for op_id, (start, end, device) in self._timing.items():
            base, driver, host = self._bases[device]
            a = driver.event_elapsed_ms(base, start)
            b = driver.event_elapsed_ms(base, end)
            # The device clock's zero (the base event) is put at the host time
            # it was recorded, so lanes of host and device times line up.
            self._device_ns[op_id] = (host + int(a * 1e6), host + int(b * 1e6))
        for start, end, device in self._timing.values():
            driver = self._bases[device][1]
            driver.event_destroy(start)
            driver.event_destroy(end)
        for base, driver, _host in self._bases.values():
            driver.event_destroy(base)
        self._timing.clear()
        self._bases.clear()
        self._built = (-1, -1)
        self.device_times_measured = True


def _materialize(raw: tuple[Any, ...], device_ns: dict[int, tuple[int, int]]
                 ) -> tuple[Op, list[Wait], list[EventRecord]]:
    """An op's raw record as its Op, Waits and EventRecords."""
    op_id, label, copy, device, stream, blocks, names, t0, t1, tracking, post, n_events = raw
    kind = "copy" if copy else ("memset" if label == "memset" else "launch")
    dt = device_ns.get(op_id)
    op = Op(op_id, kind, label, device, stream,
            tuple((n, a.name, b.ptr) for (b, a), n in zip(blocks, names, strict=False)),
            t0, t1, tracking, dt[0] if dt else None, dt[1] if dt else None)
    waits: list[Wait] = []
    events: list[EventRecord] = []
    for cand, inserted, sealed_now in post or ():
        _sealed, _waited, after, param, code, was_write, key, on_stream = cand
        access = Access(code)
        same = on_stream == stream
        waits.append(Wait(op_id, label, param, access.name, key[0], stream, on_stream,
                          after[0], after[1], after[2], _hazard(access, was_write),
                          bool(inserted) and not same, same, t0))
        if sealed_now:
            events.append(EventRecord(op_id, device, on_stream, t1))
    # Other events of the op (an eager commit seals its own stream's mark).
    for _ in range(max(n_events - len(events), 0)):
        events.append(EventRecord(op_id, device, stream, t1))
    return op, waits, events


def _run(rt: DeviceRuntime, stream: int, uses: Uses, label: str, strict: bool, owner: object,
         work: Callable[..., Any], args: tuple[Any, ...], tracking: bool) -> Any:
    """The steps of ``fenced`` (preflight, the work, commit), unrecorded."""
    if not tracking:
        result = work(*args)
        _tell_driver(rt, stream, uses, label)
        return result
    blocks = uses.blocks
    if uses.untracked or uses.producers or (rt.multi_device and blocks):
        preflight(rt, stream, uses, strict, owner, remedy=_REMEDY)
        result = work(*args)
        _tell_driver(rt, stream, uses, label)
        commit(rt, stream, uses, owner)
        return result
    # The common case, as protocol.fenced runs it (its steps written out).
    resource = rt.resource
    if blocks:
        resource.preflight(blocks, stream, owner)
    result = work(*args)
    if rt.driver.traces_accesses:
        _tell_driver(rt, stream, uses, label)
    if blocks:
        resource.commit(blocks, stream, owner)
    return result


def _load_nvtx() -> Any:
    try:
        import nvtx  # type: ignore[import-not-found]
    except ImportError:
        return None
    return nvtx


_active_lock = threading.Lock()


@contextlib.contextmanager
def trace(*, device_times: bool = False, nvtx: bool = False,
          record: bool = True) -> Iterator[Trace]:
    """Record everything the library does inside the block.

    Parameters
    ----------
    device_times : bool
        Also measure when each operation ran on the device: timing events are
        recorded around each launch and copy and read at the end of the block
        (which waits for them). Only the CUDA driver has them; on the
        simulated driver the trace keeps host times
        (``Trace.device_times_measured`` says which).
    nvtx : bool
        Make each launch, copy and memset an NVTX range named after it (when
        the ``nvtx`` package is installed), for Nsight Systems.
    record : bool
        False: record nothing (with ``nvtx=True``: NVTX ranges alone).

    Yields
    ------
    Trace

    Raises
    ------
    StreamMisuse
        Another trace is recording (traces do not nest).

    Examples
    --------
    >>> with nss.trace() as t:                           # doctest: +SKIP
    ...     scale[grid, block, a](x, y, 2.0)
    >>> t.save("run.json"); t.plot("run.png")            # doctest: +SKIP
    """
    if not isinstance(device_times, bool) or not isinstance(nvtx, bool):
        raise InvalidArgument("trace(): device_times and nvtx are True or False")
    t = Trace(device_times=device_times, nvtx=nvtx, record=record)
    with _active_lock:
        if tracehook.active is not None:
            raise StreamMisuse("a trace is already recording: traces do not nest; leave the "
                               "outer `with numba_streamsafe.trace()` block first")
        tracehook.active = t
        tracehook.keep_names = True
    try:
        yield t
    finally:
        with _active_lock:
            tracehook.active = None
            tracehook.keep_names = tracehook.sim_names
        t._resolve_device_times()
