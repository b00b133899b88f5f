"""Recording what the library did: :func:`trace` and :class:`Trace`.

While a trace records, every allocation, free, fenced launch, copy and memset
of every device is appended to it in order, with the waits the launch
protocol queued and the reason of each (which argument of which launch waits
for which earlier launch or copy, on which stream), the events it recorded,
and the uses that needed no wait because they stayed on one stream.

Recording costs a few microseconds per operation; with no trace active the
hot paths read one module attribute (:mod:`numba_streamsafe.core.tracehook`).
:meth:`Trace.save` writes the Chrome trace / Perfetto JSON format and
:meth:`Trace.plot` draws a timeline with matplotlib
(:mod:`numba_streamsafe.diagnostics.trace_export`).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from numba_streamsafe.core import tracehook
from numba_streamsafe.core.access import Access
from numba_streamsafe.core.blocks import BlockId
from numba_streamsafe.core.errors import InvalidArgument, StreamMisuse
from numba_streamsafe.core.uses import Uses
from numba_streamsafe.diagnostics.trace_records import (  # noqa: F401
    EventRecord,
    MemoryEvent,
    Op,
    Wait,
    hazard_kind,
)
from numba_streamsafe.protocol import PERMISSIVE_REMEDY, commit, preflight
from numba_streamsafe.protocol import trace as _tell_driver

if TYPE_CHECKING:
    from numba_streamsafe.runtime import DeviceRuntime

__all__ = ["Trace", "Op", "Wait", "MemoryEvent", "trace"]

_WRITE = Access.WRITE


class Trace:
    """A recording of the library's work, made by :func:`trace`.

    The launch path appends one raw tuple per operation; the waits the
    resource queues and the events it records are logged by hooks in the
    mark book. The lists below are built from them when first read (again
    after more was recorded), by replaying the operations in order: each
    argument's conflicts with earlier work (the last writer of its block, and
    for a write the readers since), matched with the waits the operation
    queued on their streams.

    Attributes
    ----------
    ops : list of Op
    waits : list of Wait
        One per (argument, earlier conflicting operation) of every tracked
        operation, including the uses that needed no wait (``same_stream``)
        and the waits already covered by an earlier one (``inserted`` False).
        When several arguments conflict with work of one other stream and
        one wait covered them, the first of them is reported as inserted.
    memory : list of MemoryEvent
    events : list of EventRecord
    """

    def __init__(self, *, device_times: bool = False, nvtx: bool = False,
                 record: bool = True) -> None:
        self.device_times = device_times
        self.record = record
        self._nvtx_asked = nvtx
        self._nvtx = _load_nvtx() if nvtx else None
        self._used = False
        self._t0 = time.perf_counter_ns()
        #: Raw records: operations, memory events, waits queued, events recorded.
        self._raw: list[tuple[Any, ...]] = []
        self._mem: list[tuple[Any, ...]] = []
        #: Ids, waits queued, events recorded, launches of the compiled path.
        self._log = tracehook.TraceLog(self._t0)
        #: Blocks live when the trace began: key -> (last writer's stream, reader streams).
        self._initial: dict[tuple[int, int, int], tuple[int, tuple[int, ...], int]] = {}
        #: Device timing: per device (base event, driver, host ns); per op id its events.
        self._bases: dict[int, tuple[Any, Any, int]] = {}
        self._timing: dict[int, tuple[Any, Any, int]] = {}
        self._device_ns: dict[int, tuple[int, int]] = {}
        self.device_times_measured = False
        self._built: tuple[int, ...] = ()
        self._ops: list[Op] = []
        self._waits: list[Wait] = []
        self._events: list[EventRecord] = []
        self._memory: list[MemoryEvent] = []

    def _snapshot(self, trackers: list[Any]) -> None:
        """Where the blocks live at the start stand: their last writer's and
        readers' streams (their earlier operations are "before the trace")."""
        for tracker in trackers:
            table = getattr(tracker, "table", None)
            lock = getattr(tracker, "lock", None)
            if table is None or lock is None:
                continue
            with lock:
                for entry in list(table.live.values()):
                    b = entry.block
                    last_write, reads = entry.newest()
                    self._initial[(b.device, b.ptr, b.generation)] = (
                        last_write.stream, tuple(reads), b.nbytes)

    # ------------------------------------------------------------ recording
    def __enter__(self) -> Trace:
        from numba_streamsafe.runtime import installed_devices, installed_runtime

        if self._used:
            raise StreamMisuse("this trace has recorded already: a trace records one block; "
                               "make a new one with numba_streamsafe.trace()")
        trackers = [rt.resource.tracker for d in installed_devices()
                    if (rt := installed_runtime(d)) is not None]
        with _active_lock:
            if tracehook.active is not None:
                raise StreamMisuse("a trace is already recording: traces do not nest; leave "
                                   "the outer `with numba_streamsafe.trace()` block first")
            self._used = True
            self._snapshot(trackers)
            tracehook.start_recording(self, self._log if self.record else None,
                                      not self._nvtx_asked
                                      and not (self.record and self.device_times))
        return self

    def __exit__(self, *exc: object) -> None:
        with _active_lock:
            tracehook.stop_recording()
        self._resolve_device_times()

    # ------------------------------------------------------------ the queries
    def _build(self) -> None:
        log = self._log
        size = (len(self._raw), len(log.launches), len(self._mem), len(log.waits), len(log.seals),
                len(self._device_ns))
        if size == self._built:
            return
        self._ops, self._waits, self._events = self._replay()
        self._memory = [MemoryEvent(*m[1:10]) for m in list(self._mem)]
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
        from numba_streamsafe.diagnostics.trace_export import save_chrome

        save_chrome(self, path)

    def plot(self, path: str | None = None) -> Any:
        """Draw the timeline (lanes per stream, arrows for the waits, memory
        below) with matplotlib; saved to ``path`` when given. Returns the figure.

        Raises
        ------
        ImportError
            matplotlib is not installed (``pip install numba-streamsafe[plot]``).
        """
        from numba_streamsafe.diagnostics.trace_export import plot

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
    def _memory_event(self, what: str, resource: Any, block: Any, stream: int) -> None:
        self._mem.append((self._log.next_id(), what, block.device, stream, block.ptr, block.nbytes,
                          block.tag, resource.live_bytes, resource.pending_bytes,
                          time.perf_counter_ns() - self._t0, block.generation))

    def allocated(self, resource: Any, block: Any, stream: int) -> None:
        """Hook of a tracking resource: ``block`` became live (its lock held)."""
        if self.record:
            self._memory_event("borrow" if block.borrowed else "alloc", resource, block, stream)

    def freed(self, resource: Any, block: Any, stream: int, how: str) -> None:
        """Hook of a tracking resource: ``block``'s free was queued or kept (lock held)."""
        if self.record:
            what = {"kept": "kept", "released": "release"}.get(how, "free")
            self._memory_event(what, resource, block, stream)

    def deferred(self, resource: Any, block: Any) -> None:
        """Hook of a tracking resource: a finalizer deferred ``block``'s free."""
        if self.record:
            self._memory_event("deferred", resource, block, block.stream)

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
            log = self._log
            t0 = time.perf_counter_ns() - self._t0
            op_id = log.next_id()
            w0, e0 = len(log.waits), len(log.seals)
            timing = self._start_timing(rt, stream, t0) if self.device_times else None
            result = _run(rt, stream, uses, label, strict, owner, work, args, tracking)
            if timing is not None:
                self._end_timing(rt, stream, op_id, timing)
            # The uses themselves: blocks and names do not change after a launch.
            self._raw.append((op_id, label, uses.copy, rt.device, stream, uses.blocks,
                              uses.names, t0, time.perf_counter_ns() - self._t0, tracking,
                              w0, len(log.waits), e0, len(log.seals)))
            return result
        finally:
            if nvtx is not None:
                nvtx.pop_range()

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
        self.device_times_measured = True

    def _replay(self) -> tuple[list[Op], list[Wait], list[EventRecord]]:
        """The operations, waits and events, from the raw records in order."""
        writers: _Uses = {}
        readers: _Uses = {}
        for key, (w_stream, r_streams, nbytes) in self._initial.items():
            writers[key] = [(0, nbytes, w_stream, (0, "(before the trace)", "", w_stream))]
            readers[key] = [(0, nbytes, s, (0, "(before the trace)", "", s)) for s in r_streams]
        mem = {m[0]: m for m in list(self._mem)}
        raws = {r[0]: r for r in list(self._raw)}
        for r in list(self._log.launches):
            raws[r[0]] = _expand(r)
        ops: list[Op] = []
        waits: list[Wait] = []
        events: list[EventRecord] = []
        for seq in sorted(set(mem) | set(raws)):
            m = mem.get(seq)
            if m is not None:
                if m[1] in ("alloc", "borrow"):
                    key = (m[2], m[4], m[10])
                    earlier = (0, "allocation" if m[1] == "alloc" else "borrow", "", m[3])
                    writers[key] = [(0, m[5], m[3], earlier)]
                    readers.pop(key, None)
                continue
            op, op_waits, op_events = self._replay_op(raws[seq], writers, readers)
            ops.append(op)
            waits.extend(op_waits)
            events.extend(op_events)
        return ops, waits, events

    def _replay_op(self, raw: tuple[Any, ...], writers: _Uses, readers: _Uses
                   ) -> tuple[Op, list[Wait], list[EventRecord]]:
        (op_id, label, copy, device, stream, blocks, names, t0, t1, tracking,
         w0, w1, e0, e1) = raw
        if names is None or len(names) != len(blocks):
            names = ["?"] * len(blocks)
        kind = "copy" if copy else ("memset" if label == "memset" else "launch")
        dt = self._device_ns.get(op_id)
        op = Op(op_id, kind, label, device, stream,
                tuple((n, a.name, b.ptr + lo, hi - lo)
                      for (b, a, lo, hi), n in zip(blocks, names, strict=False)),
                t0, t1, tracking, dt[0] if dt else None, dt[1] if dt else None)
        waits: list[Wait] = []
        # The waits this op queued (not those of frees run inside its preflight).
        queued = collections.Counter(on for s, on, free in self._log.waits[w0:w1]
                                     if s == stream and not free)
        events = [EventRecord(op_id, d, s, t1) for d, s in self._log.seals[e0:e1]]
        if not tracking:
            return op, waits, events
        for (block, access, lo, hi), name in zip(blocks, names, strict=False):
            waits += _replay_use(op_id, label, name, block, access, lo, hi, stream, t0, queued,
                                 writers, readers)
        return op, waits, events


_Earlier = tuple[int, str, str, int]  # (op id, label, argument, stream)


def _expand(record: tuple[Any, ...]) -> tuple[Any, ...]:
    """A launch of the compiled path
    (:meth:`~numba_streamsafe.core.tracehook.TraceLog.launched`) as a raw record
    of the Python path."""
    op_id, t0, w0, e0, t1, w1, e1, label, device, stream = record[:10]
    uses = record[10:]
    blocks = [(BlockId(uses[i + 2], uses[i + 3], uses[i + 4]), Access(uses[i + 1]),
               uses[i + 5], uses[i + 6]) for i in range(0, len(uses), 7)]
    return (op_id, label, False, device, stream, blocks, list(uses[::7]), t0, t1, True,
            w0, w1, e0, e1)


#: Per block (``(device, ptr, generation)``): the writes and reads a later use
#: may conflict with, each ``(lo, hi, stream, earlier)`` over its bytes.
_Uses = dict[tuple[int, int, int], list[tuple[int, int, int, _Earlier]]]


def _replay_use(op_id: int, label: str, name: str, block: Any, access: Access, lo: int, hi: int,
                stream: int, t0: int, queued: collections.Counter[int], writers: _Uses,
                readers: _Uses) -> list[Wait]:
    """The waits one use of the bytes ``lo .. hi - 1`` of a block needed (each
    marked inserted, or ordered by its stream), and the use recorded as the
    newest of those bytes."""
    key = (block.device, block.ptr, block.generation)
    waits = []
    for earlier, was_write in _conflicts(key, access, lo, hi, stream, writers, readers):
        on = earlier[3]
        same = on == stream
        inserted = not same and queued[on] > 0
        if inserted:
            queued[on] -= 1
        waits.append(Wait(op_id, label, name, access.name, block.device, stream, on,
                          earlier[0], earlier[1], earlier[2], hazard_kind(access, was_write),
                          inserted, same, t0))
    _note_use(key, access, lo, hi, stream, (op_id, label, name, stream), writers, readers)
    return waits


def _overlaps(lo: int, hi: int, ulo: int, uhi: int) -> bool:
    return ulo < hi and lo < uhi


def _conflicts(key: tuple[int, int, int], access: Access, lo: int, hi: int, stream: int,
               writers: _Uses, readers: _Uses) -> list[tuple[_Earlier, bool]]:
    """The earlier uses of the same bytes that ``access`` conflicts with, one
    per (op, stream), each with whether it wrote: every overlapping write, and
    for a write also the overlapping reads of other streams."""
    conflicts: dict[tuple[int, int], tuple[_Earlier, bool]] = {}
    for wlo, whi, _, earlier in writers.get(key, ()):
        if _overlaps(lo, hi, wlo, whi):
            conflicts.setdefault((earlier[0], earlier[3]), (earlier, True))
    if access & _WRITE:
        for rlo, rhi, s, earlier in readers.get(key, ()):
            if s != stream and _overlaps(lo, hi, rlo, rhi):
                conflicts.setdefault((earlier[0], earlier[3]), (earlier, False))
    return list(conflicts.values())


def _note_use(key: tuple[int, int, int], access: Access, lo: int, hi: int, stream: int,
              now: _Earlier, writers: _Uses, readers: _Uses) -> None:
    """Record a use as the newest of its bytes: a write replaces the uses wholly
    under it (they are ordered before it); a read replaces its stream's reads
    wholly under it."""
    def under(u: tuple[Any, ...]) -> bool:
        return lo <= u[0] <= u[1] <= hi

    if access & _WRITE:
        writers[key] = [u for u in writers.get(key, ()) if not under(u)]
        writers[key].append((lo, hi, stream, now))
        readers[key] = [u for u in readers.get(key, ()) if not under(u)]
    else:
        readers[key] = [u for u in readers.get(key, ()) if u[2] != stream or not under(u)]
        readers[key].append((lo, hi, stream, now))


def _run(rt: DeviceRuntime, stream: int, uses: Uses, label: str, strict: bool, owner: object,
         work: Callable[..., Any], args: tuple[Any, ...], tracking: bool) -> Any:
    """The steps of ``fenced`` (preflight, the work, commit), unrecorded."""
    if not tracking:
        result = work(*args)
        _tell_driver(rt, stream, uses, label)
        return result
    blocks = uses.blocks
    if uses.untracked or uses.producers or (rt.multi_device and blocks):
        preflight(rt, stream, uses, strict, owner, remedy=PERMISSIVE_REMEDY)
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


def trace(*, device_times: bool = False, nvtx: bool = False, record: bool = True) -> Trace:
    """Record everything the library does inside a ``with`` block.

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

    Returns
    -------
    Trace
        A context manager: the block it is entered for is recorded, once.

    Raises
    ------
    InvalidArgument
        ``device_times`` or ``nvtx`` is not a bool.
    StreamMisuse
        On entering the block: another trace is recording (traces do not
        nest), or this trace has recorded already.

    Examples
    --------
    >>> with nss.trace() as t:                           # doctest: +SKIP
    ...     scale[grid, block, a](x, y, 2.0)
    >>> t.save("run.json"); t.plot("run.png")            # doctest: +SKIP
    """
    if not isinstance(device_times, bool) or not isinstance(nvtx, bool):
        raise InvalidArgument("trace(): device_times and nvtx are True or False")
    return Trace(device_times=device_times, nvtx=nvtx, record=record)
