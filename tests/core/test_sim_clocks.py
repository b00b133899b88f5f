"""The simulated driver's clocks as streams come and go.

A destroyed stream's queued work still completes, and whatever is not
ordered after it still races with it; once the host has waited for its last
operation, everything queued later is ordered after it, and it leaves the
clocks (:class:`~numba_streamsafe._driver.sim.SimSystem`). The clocks, a
launch and a device-wide synchronise then cost what the live streams make
them cost, not the streams made over a run.

The property runs random programs of driver calls on two simulated devices,
streams created and destroyed among them, against a reference model in
which a destroyed stream never leaves the clocks and every synchronise joins
every clock (what the model did before): both must find the same hazards,
answer every query alike and hand out the same addresses.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numba_streamsafe._driver.sim import (
    HOST,
    LEGACY_STREAM,
    PER_THREAD_STREAM,
    SimDriver,
    SimSystem,
)
from numba_streamsafe.core.access import Access

R, W = Access.READ, Access.WRITE


# ------------------------------------------------------------- the reference
class Unsettled(SimSystem):
    """The reference: a destroyed stream stays in the clocks for good."""

    def _settle(self, serials: Any) -> None:
        pass


class Joining(SimDriver):
    """The reference's driver: every synchronise and implicit ordering joins
    every stream's clock, moved since the host saw it or not."""

    def _every_stream_unseen(self) -> None:
        for s in self._streams.values():
            s.unseen = True

    def _joined(self, stream: int, call: str) -> Any:
        self._every_stream_unseen()
        return super()._joined(stream, call)

    def _join_device(self) -> None:
        self._every_stream_unseen()
        super()._join_device()


def _clock_state(system: SimSystem) -> tuple[int, int]:
    """``(largest clock, tracked serials)``, after checking that every clock
    names tracked or settled serials only, within the documented bound, and
    that the tracked serials are the host's, the live streams' and the
    unfinished destroyed streams'."""
    live = {s.serial for d in system.drivers.values() for s in d._streams.values()}
    assert system.tracked == {HOST} | live | set(system.unfinished), "tracked serials"
    batch = max(system.settle_batch, -len(system.tracked))  # negative: a pass at every settle
    assert len(system.settled) <= len(system.tracked) + batch
    largest = 0
    for clock in system.clocks():
        assert set(clock) <= system.tracked | system.settled, "a clock names a forgotten stream"
        largest = max(largest, len(clock))
    assert largest <= 2 * len(system.tracked) + batch
    return largest, len(system.tracked)


# ------------------------------------------------------------ the programs
class Step(NamedTuple):
    """One driver call: ``kind`` and its small-integer arguments (indexes taken
    modulo what exists when the step runs)."""

    kind: str
    args: tuple[Any, ...] = ()


_KINDS = {
    "create": 6, "destroy": 5, "churn": 5, "launch": 12, "host": 2, "record": 4, "wait": 4,
    "event_sync": 2, "stream_sync": 2, "device_sync": 2, "query": 1, "event_query": 1,
    "free": 2, "alloc": 2, "trim": 1,
}
_N_BUFS = 4
_EVENTS_PER_DEVICE = 2


def _step() -> st.SearchStrategy[Step]:
    small = st.integers(0, 7)
    uses = st.lists(st.tuples(st.integers(0, _N_BUFS - 1), st.sampled_from([R, W, R | W])),
                    min_size=1, max_size=3, unique_by=lambda u: u[0]).map(tuple)
    args = {
        "create": st.tuples(st.integers(0, 1), st.booleans()),
        "destroy": st.tuples(small),
        "churn": st.tuples(st.integers(0, 1), uses, st.one_of(st.none(), small)),
        "launch": st.tuples(small, uses),
        "host": st.tuples(uses),
        "record": st.tuples(small, small),
        "wait": st.tuples(small, small),
        "event_sync": st.tuples(small),
        "stream_sync": st.tuples(small),
        "device_sync": st.tuples(st.integers(0, 1)),
        "query": st.tuples(small),
        "event_query": st.tuples(small),
        "free": st.tuples(st.integers(0, _N_BUFS - 1), small),
        "alloc": st.tuples(st.integers(0, _N_BUFS - 1), small),
        "trim": st.tuples(st.integers(0, 1)),
    }
    return st.one_of(*[st.builds(Step, st.just(kind), args[kind])
                       for kind, weight in _KINDS.items() for _ in range(weight)])


class Machine:
    """Two simulated devices of one system, buffers and events on each, and
    the streams a program creates and destroys."""

    def __init__(self, system: SimSystem, driver: type[SimDriver]) -> None:
        self.system = system
        self.sims = [driver(d, backing=False, system=system) for d in (0, 1)]
        #: Per device, its live streams, the default ones first.
        self.streams = [[LEGACY_STREAM, PER_THREAD_STREAM] for _ in self.sims]
        self.events = [[sim.event_create() for _ in range(_EVENTS_PER_DEVICE)]
                       for sim in self.sims]
        #: Per buffer: its device and address (None: freed).
        self.bufs: list[list[Any]] = []
        for i in range(_N_BUFS):
            device = i % 2
            self.bufs.append([device, self.sims[device].alloc_async(256, LEGACY_STREAM)])
        for sim in self.sims:
            sim.synchronize()
        self.seen: list[Any] = []

    def _stream(self, k: int) -> tuple[int, int]:
        every = [(d, h) for d, handles in enumerate(self.streams) for h in handles]
        return every[k % len(every)]

    def _accesses(self, uses: tuple[tuple[int, Access], ...]) -> list[tuple[int, int, Access]]:
        return [(self.bufs[b][1], 256, a) for b, a in uses if self.bufs[b][1] is not None]

    def _launch(self, device: int, handle: int, uses: tuple[tuple[int, Access], ...]) -> None:
        accesses = self._accesses(uses)
        if accesses:  # a kernel of another device's memory: a copy (no peer access)
            copy = any(self.bufs[b][0] != device for b, _ in uses)
            self.sims[device].trace_access(handle, accesses, "kernel", copy=copy)

    def run(self, step: Step) -> None:
        kind, args = step.kind, step.args
        if kind == "create":
            device, blocking = args
            self.streams[device].append(self.sims[device].create_stream(blocking=blocking))
        elif kind == "destroy":
            made = [(d, h) for d, handles in enumerate(self.streams) for h in handles[2:]]
            if made:
                device, handle = made[args[0] % len(made)]
                self.sims[device].destroy_stream(handle)
                self.streams[device].remove(handle)
        elif kind == "churn":  # a stream made, a launch, maybe an event recorded, destroyed
            device, uses, event = args
            sim = self.sims[device]
            handle = sim.create_stream()
            self._launch(device, handle, uses)
            if event is not None:
                sim.event_record(self.events[device][event % _EVENTS_PER_DEVICE], handle)
            sim.destroy_stream(handle)
        elif kind == "launch":
            self._launch(*self._stream(args[0]), args[1])
        elif kind == "host":
            accesses = self._accesses(args[0])
            if accesses:
                self.sims[0].trace_host_access(accesses, "host")
        elif kind == "record":
            device, handle = self._stream(args[1])
            events = self.events[device]
            self.sims[device].event_record(events[args[0] % len(events)], handle)
        elif kind == "wait":
            device, handle = self._stream(args[0])
            events = [e for per in self.events for e in per]
            self.sims[device].stream_wait_event(handle, events[args[1] % len(events)])
        elif kind == "event_sync":
            events = [e for per in self.events for e in per]
            self.sims[0].event_synchronize(events[args[0] % len(events)])
        elif kind == "stream_sync":
            device, handle = self._stream(args[0])
            self.sims[device].stream_synchronize(handle)
        elif kind == "device_sync":
            self.sims[args[0]].synchronize()
        elif kind == "query":
            device, handle = self._stream(args[0])
            self.seen.append(("query", self.sims[device].stream_query(handle)))
        elif kind == "event_query":
            events = [e for per in self.events for e in per]
            self.seen.append(("event", self.sims[0].event_query(events[args[0] % len(events)])))
        elif kind == "free":
            device, ptr = self.bufs[args[0]]
            if ptr is not None:
                handles = self.streams[device]
                self.sims[device].free_async(ptr, handles[args[1] % len(handles)])
                self.bufs[args[0]][1] = None
        elif kind == "alloc":
            device, ptr = self.bufs[args[0]]
            if ptr is None:
                handles = self.streams[device]
                ptr = self.sims[device].alloc_async(200, handles[args[1] % len(handles)])
                self.bufs[args[0]][1] = ptr
                self.seen.append(("address", ptr))
        elif kind == "trim":
            sim = self.sims[args[0]]
            sim.pool_trim(0)
            self.seen.append(("reserved", sim.reserved_bytes))
        else:  # pragma: no cover - a new kind without a case here
            raise ValueError(kind)


def _observed(machine: Machine) -> tuple[list[Any], list[str]]:
    return machine.seen, [str(h) for h in machine.system.hazards]


def test_streams_that_come_and_go_leave_every_answer_as_the_reference_gives_it():
    """Random programs of driver calls on two devices, streams created and
    destroyed among them: the hazards, the answers of the queries, the
    addresses the pool hands out and its trims are the reference's, and after
    every step the clocks name only tracked serials (the host's, the live
    streams', the destroyed streams' whose work may be pending) and settled
    ones within the bound. The programs do what the property is about: many
    find hazards, many destroy a stream whose work is still pending and
    later find it settled (and some a race with its work)."""
    seen = {"programs": 0, "with hazards": 0, "pending then settled": 0,
            "a race with a destroyed stream's work": 0,
            "clocks swept at every settle": 0}

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(steps=st.lists(_step(), min_size=10, max_size=60),
           batch=st.sampled_from([-1 << 20, 0, 32]))  # -1 << 20: a pass at every settle
    def same_answers(steps: list[Step], batch: int) -> None:
        system = SimSystem()
        system.settle_batch = batch
        machine = Machine(system, SimDriver)
        reference = Machine(Unsettled(), Joining)
        pending: set[int] = set()
        settled = 0
        for step in steps:
            machine.run(step)
            reference.run(step)
            _clock_state(system)
            settled += len(pending - set(system.unfinished))
            pending = set(system.unfinished)
        for m in (machine, reference):
            m.sims[0].synchronize()
            m.sims[1].synchronize()
            m.run(Step("launch", (0, tuple((b, W) for b in range(_N_BUFS)))))
        assert _observed(machine) == _observed(reference)
        _clock_state(system)
        settled += len(pending)  # the synchronises left none pending
        assert system.unfinished == {}
        seen["programs"] += 1
        seen["with hazards"] += bool(system.hazards)
        seen["pending then settled"] += bool(settled)
        dead = {h for sim in machine.sims for h in sim.destroyed_streams}
        seen["a race with a destroyed stream's work"] += any(
            h.first is not None and h.first.stream in dead for h in system.hazards)
        seen["clocks swept at every settle"] += bool(batch < 0 and settled)

    same_answers()
    print(f"\nproperty run: {seen}")  # shown with pytest -s
    assert all(n >= seen["programs"] // 10 for n in seen.values()), seen


# ------------------------------------------------------------ directed cases
def _churn(sim: SimDriver, buf: int, n: int, *, hub: int | None = None,
           sync_every: int = 10) -> None:
    """Make and destroy ``n`` streams, each writing ``buf`` (ordered after the
    last one by an event), handing its work to ``hub`` (when given) and
    synchronising the device every ``sync_every`` streams."""
    handoff = sim.event_create()
    last = None
    for i in range(n):
        s = sim.create_stream()
        if last is not None:
            sim.stream_wait_event(s, last)
        sim.trace_access(s, [(buf, 256, W)], f"step{i}")
        sim.event_record(handoff, s)
        if hub is not None:
            sim.stream_wait_event(hub, handoff)
        sim.destroy_stream(s)
        last = handoff
        if sync_every and (i + 1) % sync_every == 0:
            sim.synchronize()
    sim.event_destroy(handoff)


@pytest.mark.parametrize("sync", ["device", "hub"])
def test_the_clocks_stay_bounded_as_streams_are_made_and_destroyed(sync):
    """A thousand streams made, each with a launch whose work an event hands
    to a long-lived stream, then destroyed. The host waits for them by a
    device-wide synchronise, or by synchronising the long-lived stream alone:
    either way every clock stays the size of a few streams (the host's, the
    default streams', the long-lived one's), not one entry per stream made."""
    sim = SimDriver(backing=False)
    buf = sim.alloc_async(256, LEGACY_STREAM)
    hub = sim.create_stream()
    sim.synchronize()
    _churn(sim, buf, 10, hub=hub, sync_every=0 if sync == "hub" else 10)
    sim.stream_synchronize(hub)
    for _ in range(100):
        _churn(sim, buf, 10, hub=hub, sync_every=0 if sync == "hub" else 10)
        sim.stream_synchronize(hub)
    # Tracked: the host, the two default streams and the hub; and the settled
    # serials a clock may still name (SimSystem.settle_batch, 32, beyond those).
    bound = 2 * 4 + 32
    assert len(sim.system.host_clock) <= bound, len(sim.system.host_clock)
    assert len(sim._streams[hub].clock) <= bound, len(sim._streams[hub].clock)
    assert _clock_state(sim.system) <= (bound, 4)
    assert sim.system.unfinished == {} and sim.live_streams == 3
    assert sim.streams_destroyed == 1010
    sim.assert_no_hazards()


def _written_on_a_destroyed_stream(sim: SimDriver, *, record: bool) -> tuple[int, int | None]:
    """``buf`` written on a stream that is then destroyed (an event recorded
    after the write when ``record``); returns ``(buf, event)``."""
    buf = sim.alloc_async(256, LEGACY_STREAM)
    sim.synchronize()
    s = sim.create_stream()
    sim.trace_access(s, [(buf, 256, W)], "writer")
    event = None
    if record:
        event = sim.event_create()
        sim.event_record(event, s)
    sim.destroy_stream(s)
    return buf, event


def test_a_destroyed_streams_pending_write_races_with_later_unordered_work():
    """The negative control: a stream writes, is destroyed, and a hundred
    streams come and go after it, each synchronised by the host (so each
    leaves the clocks). The destroyed writer's work was never waited for: a
    read on a new stream is a race, with the writer named."""
    sim = SimDriver(backing=False)
    buf, _ = _written_on_a_destroyed_stream(sim, record=False)
    other = sim.alloc_async(256, LEGACY_STREAM)
    sim.stream_synchronize(LEGACY_STREAM)
    for i in range(100):
        s = sim.create_stream()
        sim.trace_access(s, [(other, 256, R)], f"churn{i}")
        sim.stream_synchronize(s)
        sim.destroy_stream(s)
    assert len(sim.system.unfinished) == 1
    reader = sim.create_stream()
    sim.trace_access(reader, [(buf, 256, R)], "reader")
    assert [h.kind for h in sim.hazards] == ["read-after-write"]
    assert "'writer'" in sim.hazards[0].earlier and "'reader'" in sim.hazards[0].later


@pytest.mark.parametrize("order", ["wait", "event-synchronize", "device-synchronize"])
def test_a_destroyed_streams_write_is_ordered_by_what_orders_it(order):
    """The positive cases: an event recorded on the writer before it was
    destroyed, waited for by the reader's stream or by the host, or a
    device-wide synchronise, orders the read after the write. Waited for by
    the host, the writer leaves the clocks."""
    sim = SimDriver(backing=False)
    buf, event = _written_on_a_destroyed_stream(sim, record=True)
    reader = sim.create_stream()
    if order == "wait":
        sim.stream_wait_event(reader, event)
    elif order == "event-synchronize":
        sim.event_synchronize(event)
    else:
        sim.synchronize()
    if order != "wait":
        assert sim.system.unfinished == {}  # the host waited: it left the clocks
    sim.trace_access(reader, [(buf, 256, R)], "reader")
    sim.assert_no_hazards()


def test_the_host_waiting_for_an_earlier_point_of_a_destroyed_stream_orders_only_that():
    """An event recorded between two writes of a stream that is then
    destroyed: the host's wait for the event orders what the first write
    touched, not the second (the stream stays in the clocks)."""
    sim = SimDriver(backing=False)
    first, second = sim.alloc_async(256, LEGACY_STREAM), sim.alloc_async(256, LEGACY_STREAM)
    sim.synchronize()
    s = sim.create_stream()
    sim.trace_access(s, [(first, 256, W)], "first")
    event = sim.event_create()
    sim.event_record(event, s)
    sim.trace_access(s, [(second, 256, W)], "second")
    sim.destroy_stream(s)
    sim.event_synchronize(event)
    assert len(sim.system.unfinished) == 1
    reader = sim.create_stream()
    sim.trace_access(reader, [(first, 256, R)], "reads first")
    sim.assert_no_hazards()
    sim.trace_access(reader, [(second, 256, R)], "reads second")
    assert [h.kind for h in sim.hazards] == ["read-after-write"]
    assert "'second'" in sim.hazards[0].earlier


def test_memory_freed_on_a_destroyed_stream_is_reused_once_the_host_waited():
    """A free queued on a stream that is then destroyed: an allocation on a new
    stream gets the address back only after the host waited for the free
    (the stream has left the clocks by then), and a trim gives it back."""
    sim = SimDriver(backing=False)
    buf = sim.alloc_async(256, LEGACY_STREAM)
    sim.synchronize()
    s = sim.create_stream()
    sim.free_async(buf, s)
    sim.destroy_stream(s)
    t = sim.create_stream()
    fresh = sim.alloc_async(256, t)
    assert fresh != buf  # the free is not ordered before it
    sim.synchronize()
    assert sim.system.unfinished == {}
    assert sim.alloc_async(256, t) == buf
    sim.free_async(buf, t)
    sim.synchronize()
    sim.pool_trim(0)
    assert sim.reserved_bytes == 256  # ``fresh`` alone
    sim.assert_no_hazards()
