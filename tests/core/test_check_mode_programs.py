"""Check mode against the simulator's own happens-before checker, over random
multi-stream programs (Hypothesis).

A program runs on a :class:`~numba_streamsafe._driver.sim.SimDriver` under a
checking :class:`~numba_streamsafe.resources.AsyncResource` (``check=True``):
kernels over whole buffers and halves of them, on the legacy default
stream, blocking streams and non-blocking ones (destroyed and replaced by
new ones as the program goes), ordered only by what the program does
itself (events recorded and waited for, stream and device synchronises,
frees). Every such operation is made on the simulated driver
(which checks the accesses) and told to the resource as Numba's hooks tell it.

The property: the resource reports a race between the same pairs of streams
(earlier, later) as the simulator finds, and every race it reports, with its
kind, the simulator finds too. The resource reports a pair once per mark (a
stream's work between two points of the program) and later stream; the
simulator each time, so a later access of another kind on that pair may be
the simulator's alone.

The same programs in ordering mode (``check=False``) leave the simulator no
race: the waits the library skips because the program's own ordering covers
them (through chains of events too) are ones it did not need.

With ``foreign``, the program's ordering comes from another library instead
(its events, waits and synchronises made through the simulated driver's
stand-in for one, ``SimDriver.observer``, as the driver observer notes a
CuPy or PyTorch program's on a GPU), and that library also copies into and
fills the buffers: the resource learns all of it from the observer's notes
(``AsyncResource(observe=True)``), and the same properties hold.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from numba_streamsafe._driver.sim import SimDriver
from numba_streamsafe.core.access import Access
from numba_streamsafe.resources import AsyncResource
from numba_streamsafe.resources.tracking.marks import retired_stream_id, set_work

#: Stream kinds: the legacy default stream, blocking and non-blocking streams.
LEGACY, BLOCKING, NON_BLOCKING = "legacy", "blocking", "non-blocking"
NBYTES = 512


class Kernel(NamedTuple):
    stream: int
    uses: tuple[tuple[int, Access, int], ...]  # (buffer, access, part: 0 all, 1 low, 2 high)


class Record(NamedTuple):
    event: int
    stream: int


class Wait(NamedTuple):
    stream: int
    event: int


class Handoff(NamedTuple):
    """An event recorded on ``producer`` and waited for by ``consumer`` at once."""

    producer: int
    consumer: int


class StreamSync(NamedTuple):
    stream: int


class DeviceSync(NamedTuple):
    pass


class Free(NamedTuple):
    buf: int


class Replace(NamedTuple):
    """The stream is destroyed (its history retired first, as
    ``destroy_stream`` does) and a new stream of its kind takes its place:
    the destroyed stream's queued work still races with what is not ordered
    after it. The buffers allocated on it are freed first (their frees
    queued there) and allocated again on the new stream; a stream with frees
    queued is synchronised first (as a program waits for a stream's frees
    before it destroys it; the library would otherwise, which the simulator
    would see and check mode not). Skipped for the legacy default stream."""

    stream: int


class Realloc(NamedTuple):
    """The buffer freed (queued, as Numba's finalizers queue it) and allocated
    again at once on its home stream: reused there when the resource keeps
    freed blocks."""

    buf: int


class ForeignCopy(NamedTuple):
    """Another library copies into ``dst`` on ``stream``, from buffer ``src``
    (-1: from the host)."""

    stream: int
    dst: int
    src: int


class ForeignFill(NamedTuple):
    """Another library fills ``buf`` on ``stream`` (``cuMemsetD8Async``)."""

    stream: int
    buf: int


class Program:
    def __init__(self, kinds: tuple[str, ...], nbufs: int, homes: tuple[int, ...],
                 steps: tuple[Any, ...]) -> None:
        self.kinds, self.nbufs, self.homes, self.steps = kinds, nbufs, homes, steps

    def __repr__(self) -> str:
        return f"Program({self.kinds}, {self.nbufs}, {self.homes}, {self.steps})"


@st.composite
def programs(draw: Any, realloc: bool = False, foreign: bool = False) -> Program:
    """Random programs; with ``realloc`` they also free buffers and allocate
    them again on their stream (:class:`Realloc`); with ``foreign`` another
    library copies into and fills them (:class:`ForeignCopy`,
    :class:`ForeignFill`)."""
    kind = st.sampled_from([LEGACY, BLOCKING, BLOCKING, NON_BLOCKING, NON_BLOCKING])
    kinds = tuple(draw(st.lists(kind, min_size=2, max_size=3)))
    nbufs = draw(st.integers(1, 2))
    stream = st.integers(0, len(kinds) - 1)
    homes = tuple(draw(st.lists(stream, min_size=nbufs, max_size=nbufs)))
    buf = st.integers(0, nbufs - 1)
    use = st.tuples(buf, st.sampled_from([Access.READ, Access.WRITE, Access.READ_WRITE]),
                    st.sampled_from([0, 0, 1, 2]))
    kernel = st.builds(Kernel, stream, st.lists(use, min_size=1, max_size=2,
                                                  unique_by=lambda u: u[0]).map(tuple))
    event = st.integers(0, 1)
    handoff = st.builds(Handoff, stream, stream)
    step = st.one_of(*[kernel] * 16, *[handoff] * 4, st.builds(Record, event, stream),
                     st.builds(Record, event, stream), st.builds(Wait, stream, event),
                     st.builds(Wait, stream, event), st.builds(StreamSync, stream),
                     st.just(DeviceSync()), st.builds(Free, buf),
                     *[st.builds(Replace, stream)] * 4,
                     *([st.builds(Realloc, buf)] if realloc else []),
                     *([st.builds(ForeignCopy, stream, buf, st.integers(-1, nbufs - 1)),
                        st.builds(ForeignFill, stream, buf)] * 2 if foreign else []))
    steps = tuple(draw(st.lists(step, min_size=3, max_size=24)))
    return Program(kinds, nbufs, homes, steps)


class _Owner:
    """Stands for a user's stream object."""


def _span(part: int) -> tuple[int, int]:
    return ((0, NBYTES), (0, NBYTES // 2), (NBYTES // 2, NBYTES))[part]


def run(program: Program, check: bool = True, watch: bool = False, reuse: bool = False,
        foreign: bool = False, observe: bool = True, complete: bool = False
        ) -> tuple[set[tuple[str, Any, Any]], set[tuple[str, Any, Any]]]:
    """The race pairs the checking resource reported and those the simulator
    found (``check`` False: the program in ordering mode, which reports none
    unless a race check ``watch`` es it from the start; ``reuse``: freed
    blocks are kept for reuse on their stream). A stream is named by its
    place in the program and how many streams were there before it
    (:class:`Replace`), the same in every run of the program. With ``foreign``
    the program's events, waits and synchronises are another library's
    (``SimDriver.observer``), which the resource learns of where it
    ``observe`` s (the negative control: it does not). ``complete``: the
    simulator's checker also meets the accesses a racing write left
    unordered, not only the last write and the reads since
    (``HappensBefore.complete``)."""
    # Destroyed handles are not handed out again: the simulator names a
    # destroyed stream's work by its handle, the resource by the identity it
    # renamed it to (``renamed``).
    sim = SimDriver(backing=False, recycle_streams=False)
    sim.checker.complete = complete
    res = AsyncResource(sim, check=check, reuse_bytes=1 << 20 if reuse else 0,
                        observe=foreign and observe)
    lib = sim.observer  # another library's calls: run on the simulator, and noted
    renamed: dict[Any, int] = {}
    if watch:
        res.watch_races(True)
    run.skipped = 0  # type: ignore[attr-defined]
    streams = [0 if kind == LEGACY else sim.create_stream(blocking=kind == BLOCKING)
               for kind in program.kinds]
    names = {s: (i, 0) for i, s in enumerate(streams)}
    owners = [_Owner() for _ in streams]  # the streams' objects (blocks are kept for them)
    blocks: list[Any] = [res.allocate(NBYTES, streams[h], f"buf{i}", stream_owner=owners[h])
                         for i, h in enumerate(program.homes)]
    point = res.program_point_all()  # the allocations are ready for every stream,
    sim.synchronize()                 # in both models
    res.program_completed_all(point)
    events: dict[int, tuple[int, dict[Any, int]]] = {}
    for k, step in enumerate(program.steps):
        if isinstance(step, Kernel):
            s = streams[step.stream]
            uses = []
            for buf, access, part in step.uses:
                if blocks[buf] is not None:
                    lo, hi = _span(part)
                    uses.append((blocks[buf], access, lo, hi))
            if not uses:
                continue
            res.preflight(uses, s)
            sim.trace_access(s, [(b.ptr + lo, hi - lo, a) for b, a, lo, hi in uses], f"k{k}")
            res.commit(uses, s)
        elif foreign and not isinstance(step, Kernel | Free | Realloc | Replace):
            _foreign_step(lib, step, streams, blocks, events)
        elif isinstance(step, Record):
            s = streams[step.stream]
            clock = res.program_clock(s)
            handle = events[step.event][0] if step.event in events else sim.event_create()
            sim.event_record(handle, s)
            events[step.event] = (handle, clock)
        elif isinstance(step, Handoff):
            clock = res.program_clock(streams[step.producer])
            handle = sim.event_create()
            sim.event_record(handle, streams[step.producer])
            sim.stream_wait_event(streams[step.consumer], handle)
            res.program_waited(streams[step.consumer], clock)
        elif isinstance(step, Wait):
            if step.event in events:
                handle, clock = events[step.event]
                sim.stream_wait_event(streams[step.stream], handle)
                res.program_waited(streams[step.stream], clock)
        elif isinstance(step, StreamSync):
            s = streams[step.stream]
            clock, _ = res.program_sync_clock(s)
            sim.stream_synchronize(s)
            res.program_completed(clock, s)
        elif isinstance(step, DeviceSync):
            point = res.program_point_all()
            sim.synchronize()
            res.program_completed_all(point)
        elif isinstance(step, Free) and blocks[step.buf] is not None:
            res.deallocate(blocks[step.buf])
            blocks[step.buf] = None
        elif isinstance(step, Realloc) and blocks[step.buf] is not None:
            home = program.homes[step.buf]
            res.defer_free(blocks[step.buf])
            blocks[step.buf] = res.allocate(NBYTES, streams[home], f"buf{step.buf}",
                                            stream_owner=owners[home])
        elif isinstance(step, Replace) and program.kinds[step.stream] != LEGACY:
            s = streams[step.stream]
            homed = [i for i, b in enumerate(blocks) if b is not None and b.stream == s]
            for i in homed:
                res.deallocate(blocks[i])
            if s in res.pending_per_stream():
                clock = res.program_clock(s)
                sim.stream_synchronize(s)
                res.program_completed(clock, s)
            # The identity the resource renames the stream's history to is the
            # next retired_stream_id after this one (nothing else takes one here).
            renamed[retired_stream_id() - 1] = s
            res.retire_stream(s, sim.destroy_stream)
            streams[step.stream] = sim.create_stream(
                blocking=program.kinds[step.stream] == BLOCKING)
            names[streams[step.stream]] = (step.stream, names[s][1] + 1)
            owners[step.stream] = _Owner()
            for i in homed:
                blocks[i] = res.allocate(NBYTES, streams[step.stream], f"buf{i}",
                                         stream_owner=owners[step.stream])
    res.catch_up()  # what the other library did last (as the exit summary does)
    run.skipped = res.marks.skipped  # type: ignore[attr-defined]
    run.hazards = list(sim.hazards)  # type: ignore[attr-defined]
    hazards = res.race_log.hazards if res.race_log is not None else []

    def name(stream: Any) -> Any:
        stream = renamed.get(stream, stream)
        return names.get(stream, stream)

    found = {(h.kind, name(h.first.stream), name(h.second.stream)) for h in hazards}
    oracle = {(h.kind, name(h.first.stream), name(h.second.stream)) for h in sim.hazards
              if h.first is not None and h.second is not None}
    return found, oracle


def _foreign_step(lib: Any, step: Any, streams: list[int], blocks: list[Any],
                  events: dict[int, Any]) -> None:
    """An ordering step, a copy or a fill made by another library (``lib``:
    the simulated driver's stand-in, whose calls the resource learns of
    through the observer's notes, not from the test)."""
    if isinstance(step, Record):
        handle = events[step.event][0] if step.event in events else lib.event_create()
        lib.event_record(handle, streams[step.stream])
        events[step.event] = (handle, None)
    elif isinstance(step, Handoff):
        handle = lib.event_create()
        lib.event_record(handle, streams[step.producer])
        lib.stream_wait_event(streams[step.consumer], handle)
        lib.event_destroy(handle)  # as PyTorch's wait_stream does
    elif isinstance(step, Wait):
        if step.event in events:
            lib.stream_wait_event(streams[step.stream], events[step.event][0])
    elif isinstance(step, StreamSync):
        lib.stream_synchronize(streams[step.stream])
    elif isinstance(step, DeviceSync):
        lib.synchronize()
    elif isinstance(step, ForeignCopy):
        dst = blocks[step.dst]
        src = blocks[step.src] if step.src >= 0 else None
        if dst is not None and (step.src < 0 or src is not None):
            lib.copy_async(dst.ptr, src.ptr if src is not None else 0, NBYTES // 2,
                           streams[step.stream])
    elif isinstance(step, ForeignFill):
        if blocks[step.buf] is not None:
            lib.memset_async(blocks[step.buf].ptr + NBYTES // 2, 0, NBYTES // 2,
                             streams[step.stream])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(realloc=True))
def test_check_mode_reports_the_races_the_simulator_finds(program):
    """Where a buffer is freed and allocated again (:class:`Realloc`), the
    library's wait for the new memory (the pool hands it out in its stream's
    order) orders that stream's earlier work in the run too, so the
    simulator may miss a race the program has: there every pair the
    simulator finds is reported, and no more is asked."""
    _reports_the_simulators_races(program)


def _reports_the_simulators_races(program: Program, **how: Any) -> None:
    """Check mode reports, of ``program`` run as ``how`` says, every pair the
    simulator's checker finds, and, but where buffers are allocated again,
    only those: a pair more is a race only where the complete checker (which
    also meets the accesses an earlier racing write left unordered) finds it
    with its kind, as where another stream's write of a buffer, unordered
    with a read or a write of it, comes between that access and a third
    stream's write."""
    found, oracle = run(program, **how)
    assert {o[1:] for o in oracle} <= {f[1:] for f in found}, program
    if _reallocates(program) or found <= oracle:
        return
    _, complete = run(program, complete=True, **how)
    assert found <= complete, (program, found - complete)


def test_the_complete_checker_meets_what_a_racing_write_left_unordered():
    """A write of ``x`` on ``a``, an unordered write of it on ``b``, then a
    write on ``c`` ordered after ``b``'s only: the last-write checker meets
    ``b``'s write alone (the pair ``a``-``c`` has a write between), the
    complete one also ``a``'s; a read in place of ``a``'s write likewise."""
    for first in (W, R):
        kinds = {W: "write-after-write", R: "write-after-read"}
        seen = {}
        for complete in (False, True):
            sim = SimDriver(backing=False)
            sim.checker.complete = complete
            a, b, c = (sim.create_stream() for _ in range(3))
            x = sim.alloc(NBYTES)
            sim.trace_access(a, [(x, NBYTES, first)], "on a")
            sim.trace_access(b, [(x, NBYTES, W)], "on b")
            event = sim.event_create()
            sim.event_record(event, b)
            sim.stream_wait_event(c, event)
            sim.trace_access(c, [(x, NBYTES, W)], "on c")
            seen[complete] = {(h.kind, h.earlier, h.later) for h in sim.hazards}
        assert not any("on a" in e and "on c" in lt for _, e, lt in seen[False]), seen
        assert any(k == kinds[first] and "on a" in e and "on c" in lt
                   for k, e, lt in seen[True]), seen


@pytest.mark.parametrize("later", [0, 2], ids=["legacy", "another-blocking"])
def test_work_after_the_legacy_stream_stays_ordered_after_a_replaced_blocking_stream(later):
    """A read on a blocking stream, then work on the legacy default stream
    (CUDA orders it after the read), then the blocking stream is destroyed:
    a write on the legacy stream, or on another blocking stream (after the
    legacy stream's earlier work), is still ordered after the read, though
    the stream is gone. Without the legacy stream's work in between, CUDA
    orders nothing after a destroyed stream's work: both report the pair."""
    read, write = Kernel(1, ((0, Access.READ, 0),)), Kernel(later, ((0, Access.WRITE, 0),))
    kinds = (LEGACY, BLOCKING, BLOCKING)
    legacy = Kernel(0, ((0, Access.READ, 0),))
    ordered = Program(kinds, 1, (0,), (read, legacy, Replace(1), write))
    assert run(ordered) == (set(), set())
    unordered = Program(kinds, 1, (0,), (read, Replace(1), write))
    found, oracle = run(unordered)
    assert found == oracle == {("write-after-read", (1, 0), (later, 0))}, found


@pytest.mark.parametrize("point", ["event", "synchronise"])
def test_a_legacy_streams_point_covers_a_destroyed_blocking_streams_earlier_work(point):
    """A write on a blocking stream, then work on the legacy default stream
    (after the write), whose point the program takes (an event waited for on a
    non-blocking stream, or a synchronise of the legacy stream), then the
    blocking stream is destroyed: a read on the non-blocking stream after the
    point is ordered after the write. With the blocking stream destroyed
    before the legacy stream's work, CUDA orders nothing after its write, and
    both report the pair."""
    write, read = Kernel(0, ((0, Access.WRITE, 0),)), Kernel(2, ((0, Access.READ, 0),))
    legacy = Kernel(1, ((1, Access.WRITE, 0),))
    take = (Record(0, 1), Wait(2, 0)) if point == "event" else (StreamSync(1),)
    kinds = (BLOCKING, LEGACY, NON_BLOCKING)
    ordered = Program(kinds, 2, (1, 1), (write, legacy, *take, Replace(0), read))
    assert run(ordered) == (set(), set())
    unordered = Program(kinds, 2, (1, 1), (write, Replace(0), legacy, *take, read))
    found, oracle = run(unordered)
    assert found == oracle == {("read-after-write", (0, 0), (2, 0))}, (found, oracle)


def _reallocates(program: Program) -> bool:
    """Whether the program allocates a buffer again as it goes: a
    :class:`Realloc`, or a :class:`Replace` of a stream some buffer is homed
    on (the buffer is allocated again on the new stream). The library's wait
    for that new memory on another stream orders what came before it on the
    new stream too, so the simulator may miss a race the program has there
    (another library's copy or fill, which no library orders, after such a
    wait on its stream)."""
    homes = {h for h in program.homes if program.kinds[h] != LEGACY}
    return any(isinstance(step, Realloc)
               or (isinstance(step, Replace) and step.stream in homes)
               for step in program.steps)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_ordering_mode_orders_the_same_programs(program):
    """The same programs in ordering mode: the library's waits, skipped where
    the program's own ordering covers them (through chains of events too),
    leave the simulator no race to find."""
    found, oracle = run(program, check=False)
    assert found == set() and oracle == set(), program


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(realloc=True))
@example(Program((BLOCKING, LEGACY, BLOCKING), 2, (0, 0),  # a second block of one mark
                 (Realloc(0), Kernel(0, ((0, Access.READ, 0),)),
                  Kernel(0, ((0, Access.WRITE, 0), (1, Access.READ, 0))),
                  Kernel(2, ((0, Access.READ, 0), (1, Access.WRITE, 0))))))
@example(Program((NON_BLOCKING,) * 2, 1, (0,),  # reused memory read on its stream, then raced
                 (Realloc(0), Kernel(0, ((0, Access.READ, 0),)),
                  Kernel(1, ((0, Access.READ, 0),)), Kernel(1, ((0, Access.WRITE, 0),)))))
def test_a_race_check_in_ordering_mode_reports_the_races_it_orders(program):
    """The same programs in ordering mode, watched by a race check (as
    ``race_check()`` watches on a GPU), freed blocks kept for reuse: the
    library still orders them (the simulator finds no race in the run), and
    it reports the races of the program as written: only races the simulator
    finds in check mode's run (or check mode reports, where a buffer is
    allocated again, see above), and where the legacy default stream takes
    no part all pairs of streams check mode reports."""
    found, ran = run(program, check=False, watch=True, reuse=True)
    assert ran == set(), program
    checked, oracle = run(program)
    # Where a buffer is allocated again, the races of the program are the
    # simulator's and check mode's together (check mode names one block per
    # pair of mark and stream, the simulator misses what new memory's wait orders).
    assert found <= (checked | oracle if _reallocates(program) else oracle), program
    if LEGACY not in program.kinds:
        assert {f[1:] for f in found} == {c[1:] for c in checked}, program


@pytest.mark.parametrize("order", [None, "handoff", "stream-synchronize",
                                   "device-synchronize"])
def test_a_destroyed_streams_work_races_in_check_mode_as_in_the_simulator(order):
    """A stream writes a buffer and is replaced by a new one; another stream
    then reads the buffer. Unless the program ordered the read after the
    write (an event handed over before the destroy, or the host's wait for
    the stream or the device) both the resource and the simulator find the
    race, with the destroyed stream as the earlier side; in ordering mode
    the library orders it."""
    before = {"handoff": [Handoff(0, 1)], "stream-synchronize": [StreamSync(0)]}.get(order, [])
    after = [DeviceSync()] if order == "device-synchronize" else []
    steps = (Kernel(0, ((0, Access.WRITE, 0),)), *before, Replace(0), *after,
             Kernel(1, ((0, Access.READ, 0),)))
    program = Program((NON_BLOCKING,) * 3, 1, (2,), steps)
    found, oracle = run(program)
    assert found == oracle, (found, oracle)
    if order is None:
        assert {f[0] for f in found} == {"read-after-write"}, found
    else:
        assert found == set(), found
    assert run(program, check=False) == (set(), set())


def test_ordering_mode_skips_waits_in_such_programs():
    """The property above is not vacuous: a chain of events makes the
    library skip the consumer's wait (through ``b``'s clock)."""
    steps = (Kernel(0, ((0, Access.WRITE, 0),)), Record(0, 0), Wait(1, 0), Record(1, 1),
             Wait(2, 1), Kernel(2, ((0, Access.READ, 0),)))
    found, oracle = run(Program((NON_BLOCKING,) * 3, 1, (0,), steps), check=False)
    assert found == oracle == set()
    assert run.skipped >= 1  # type: ignore[attr-defined]


def test_a_chain_of_events_orders_across_three_streams():
    """``a`` writes, ``b`` waits for ``a``'s event and records its own, ``c``
    waits for ``b``'s: ``c`` is ordered after ``a``'s write through ``b``
    (the event's clock carries what ``b`` waited for). Without ``b``'s wait
    for ``a`` it is not (the negative control)."""
    for chained in (True, False):
        steps: list[Any] = [Kernel(0, ((0, Access.WRITE, 0),)), Record(0, 0)]
        if chained:
            steps.append(Wait(1, 0))
        steps += [Record(1, 1), Wait(2, 1), Kernel(2, ((0, Access.READ, 0),))]
        found, oracle = run(Program((NON_BLOCKING,) * 3, 1, (0,), tuple(steps)))
        assert found == oracle, (found, oracle)
        assert (found == set()) is chained, found


def test_a_report_names_the_allocation_raced_on_not_an_earlier_one_at_its_address():
    """Memory freed and allocated again at the same address: a race on the new
    allocation is reported against its own writer only, as the simulator
    finds it (the earlier allocation's notes are not taken for it)."""
    sim = SimDriver(backing=False)
    res = AsyncResource(sim, check=True, reuse_bytes=0)
    s, t = sim.create_stream(), sim.create_stream()
    keep = res.allocate(NBYTES, s, "keep")
    sim.synchronize()

    def use(stream: int, block: Any, access: Access, label: str) -> None:
        set_work((label, None, None))  # as the protocol names the work
        try:
            res.preflight([(block, access)], stream)
            sim.trace_access(stream, [(block.ptr, block.nbytes, access)], label)
            res.commit([(block, access)], stream)
        finally:
            set_work(None)

    use(s, keep, Access.WRITE, "keeps s's mark in use")
    old = res.allocate(NBYTES, s, "old")
    use(s, old, Access.WRITE, "write old")
    res.deallocate(old)
    new = res.allocate(NBYTES, s, "new")
    assert new.ptr == old.ptr
    use(s, new, Access.WRITE, "write new")
    use(t, new, Access.READ, "read new on t")
    found = [(h.kind, h.first.label) for h in res.race_log.hazards]
    assert found == [("read-after-write", "write new")], found
    assert [h.kind for h in sim.hazards] == ["read-after-write"]


def test_a_write_ends_the_reads_before_it_in_a_report():
    """A free after reads and then a write of the buffer on another stream
    races with the write only, as the simulator keeps it (the write on that
    stream ends the reads before it); in check mode and under a race check."""
    steps = (Kernel(0, ((0, Access.READ, 0),)), Kernel(0, ((0, Access.READ, 1),)),
             Kernel(0, ((0, Access.WRITE, 0),)), Free(0))
    program = Program((BLOCKING, BLOCKING), 1, (1,), steps)
    found, oracle = run(program)
    assert found == oracle and {f[0] for f in found} == {"write-after-write"}, found
    watched, _ = run(program, check=False, watch=True)
    assert watched == oracle, watched


def test_a_race_check_tells_new_memory_from_a_use_on_its_stream():
    """Under a race check in ordering mode, a buffer allocated on ``s1`` and
    read there is read on ``s0`` (the library waits for the allocation: no
    race of the program) and then written on ``s0``: that write races with
    ``s1``'s read, which the allocation's wait does not hide."""
    steps = (Kernel(1, ((0, Access.READ, 0),)), Kernel(0, ((0, Access.READ, 0),)),
             Kernel(0, ((0, Access.WRITE, 0),)))
    program = Program((BLOCKING, BLOCKING), 1, (1,), steps)
    found, ran = run(program, check=False, watch=True)
    _, oracle = run(program)
    assert ran == set() and found == oracle, (found, oracle)
    assert {f[0] for f in found} == {"write-after-read"}, found


# ------------------------------------------------- a race check's watch, directed
R, W = Access.READ, Access.WRITE


def _use(res: Any, sim: Any, stream: int, uses: list[tuple[Any, Access]], label: str) -> None:
    """One launch on ``stream`` told to ``res`` and to the simulator's checker."""
    set_work((label, None, None))
    try:
        res.preflight(uses, stream)
        sim.trace_access(stream, [(b.ptr, b.nbytes, a) for b, a in uses], label)
        res.commit(uses, stream)
    finally:
        set_work(None)


def _found(res: Any) -> list[tuple[str, str, str]]:
    return [(h.kind, h.first.label, h.second.label) for h in res.race_log.hazards]


def test_a_synchronise_of_a_new_stream_at_a_retired_handle_is_no_synchronise_of_the_old():
    """A stream reads a buffer and is destroyed; the next stream gets its
    handle and the host synchronises that one. A write of the buffer on
    another stream still races with the destroyed stream's read: check mode
    reports it, as the simulator finds it (before, the synchronise's point
    was taken for the destroyed stream's work too)."""
    sim = SimDriver(backing=False)
    res = AsyncResource(sim, check=True, reuse_bytes=0)
    s, t = sim.create_stream(), sim.create_stream()
    buf = res.allocate(NBYTES, t, "buf")
    sim.synchronize()
    _use(res, sim, s, [(buf, R)], "read on s")
    res.retire_stream(s, sim.destroy_stream)
    again = sim.create_stream()
    assert again == s  # the handle is handed out again
    clock = res.program_clock(again)
    sim.stream_synchronize(again)
    res.program_completed(clock)
    _use(res, sim, t, [(buf, W)], "write on t")
    assert [h.kind for h in sim.hazards] == ["write-after-read"]
    assert _found(res) == [("write-after-read", "read on s", "write on t")]


def test_a_watch_names_no_use_made_before_it_began():
    """Notes from an earlier watch are not reported in a later one: between
    the two a read on the legacy stream ordered the writes, which no watch
    followed (its marks come before the second watch's point)."""
    sim = SimDriver(backing=False)
    res = AsyncResource(sim, reuse_bytes=0)
    s, t = sim.create_stream(blocking=True), sim.create_stream(blocking=True)
    res.watch_races(True)
    x = res.allocate(NBYTES, s, "x")
    sim.synchronize()
    _use(res, sim, s, [(x, W)], "write x on s")
    res.watch_races(False)
    _use(res, sim, 0, [(x, R)], "read x on the legacy stream")
    res.watch_races(True)
    _use(res, sim, t, [(x, W)], "write x on t")
    res.watch_races(False)
    assert _found(res) == [] and sim.hazards == []


def test_a_free_on_the_legacy_stream_orders_as_its_work_does():
    """A free on the legacy stream is work there: a blocking stream's read
    before it is ordered before a later free on another blocking stream (in
    check mode and under a watch, as the simulator finds)."""
    program = Program((BLOCKING, BLOCKING, LEGACY), 2, (2, 0),
                      (Kernel(1, ((1, R, 0),)), Free(0), Free(1)))
    found, oracle = run(program)
    assert found <= oracle, (found, oracle)
    watched, _ = run(program, check=False, watch=True)
    assert watched <= oracle, (watched, oracle)


def test_a_race_found_at_a_queued_free_is_reported_by_the_allocation_that_runs_it():
    """A free queued (as Numba's finalizers queue it) and run by the next
    allocation finds a race, which that allocation reports: no launch need
    follow, and the block's end finds it in the log."""
    sim = SimDriver(backing=False)
    res = AsyncResource(sim, reuse_bytes=0)
    s, t = sim.create_stream(), sim.create_stream()
    res.watch_races(True)
    x = res.allocate(NBYTES, s, "x")
    _use(res, sim, t, [(x, W)], "write x on t")
    res.defer_free(x)
    res.allocate(NBYTES, s, "y")  # runs the queued free, on s
    assert _found(res) == [("write-after-write", "write x on t", "cuMemFreeAsync")]
    res.watch_races(False)
    assert len(_found(res)) == 1


def test_a_watch_tells_reused_memory_from_a_use_on_its_stream():
    """Memory freed and allocated again at once on one stream (reuse on, a
    stream object known): a read on another stream waits for the allocation
    only, and a write there after still races with the read on ``s``."""
    for check in (True, False):
        sim = SimDriver(backing=False)
        res = AsyncResource(sim, check=check)
        owner = _Owner()
        s, t = sim.create_stream(), sim.create_stream()
        res.watch_races(True)
        old = res.allocate(NBYTES, s, "old", stream_owner=owner)
        res.defer_free(old)
        b = res.allocate(NBYTES, s, "b", stream_owner=owner)
        _use(res, sim, s, [(b, R)], "read b on s")
        _use(res, sim, t, [(b, R)], "read b on t")
        _use(res, sim, t, [(b, W)], "write b on t")
        res.watch_races(False)
        assert _found(res) == [("write-after-read", "read b on s", "write b on t")], check


def _two_buffers(check: bool) -> tuple[Any, ...]:
    """``(sim, res, s, t, x, y)``: a resource (checking or watched) and two
    buffers allocated on ``s`` and ready."""
    sim = SimDriver(backing=False)
    res = AsyncResource(sim, check=check, reuse_bytes=0)
    s, t = sim.create_stream(), sim.create_stream()
    res.watch_races(True)
    x, y = res.allocate(NBYTES, s, "x"), res.allocate(NBYTES, s, "y")
    sim.synchronize()
    return sim, res, s, t, x, y


def test_a_long_run_of_works_on_one_mark_keeps_the_one_a_race_names():
    """600 reads of ``y`` on ``s`` after one of ``x``: a write of ``x`` on
    ``t`` races with that read, named as such (the mark's notes keep the
    newest use of each range, not the newest works)."""
    for check in (True, False):
        sim, res, s, t, x, y = _two_buffers(check)
        _use(res, sim, s, [(x, R)], "read x on s")
        for _ in range(600):
            _use(res, sim, s, [(y, R)], "read y on s")
        _use(res, sim, t, [(x, W)], "write x on t")
        assert _found(res) == [("write-after-read", "read x on s", "write x on t")], check


def test_a_watch_reports_a_pair_once():
    """A use that needs one mark for two reasons (a write and a read of ``x``
    on ``s``) reports each hazard once, as check mode does (which names the
    mark's first block only: a pair of mark and stream is one race there)."""
    found = {}
    for check in (True, False):
        sim, res, s, t, x, y = _two_buffers(check)
        _use(res, sim, s, [(x, W)], "write x on s")
        _use(res, sim, s, [(x, R)], "read x on s")
        _use(res, sim, s, [(y, W)], "write y on s")
        _use(res, sim, t, [(x, W), (y, R)], "on t")
        found[check] = sorted(_found(res))
        assert len(found[check]) == len(set(found[check])), found[check]
    assert set(found[True]) <= set(found[False]), found
    assert ("read-after-write", "write y on s", "on t") in found[False], found


# ----------------------------------------------------- another library's ordering
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(realloc=True, foreign=True))
@example(Program((BLOCKING,) * 3, 1, (0,),  # a write between a write and a third stream's
                 (Kernel(0, ((0, R, 0),)), ForeignFill(0, 0), ForeignFill(1, 0),
                  Kernel(2, ((0, W, 0),)))))
def test_check_mode_learns_another_librarys_ordering_and_copies(program):
    """The ordering is another library's (its events, waits, synchronises, as
    the driver observer notes a CuPy or PyTorch program's), and it copies into
    and fills the buffers too: check mode reports the races the simulator
    finds, as where the ordering is Numba's."""
    _reports_the_simulators_races(program, foreign=True)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(foreign=True))
def test_ordering_mode_learns_another_librarys_ordering(program):
    """The same programs in ordering mode, observing: the waits skipped
    because the other library's ordering covers them were not needed (the
    simulator finds no race, but those the other library's own copies and
    fills make as they are queued, which no library can order after the fact:
    their second access is theirs)."""
    found, _ = run(program, check=False, foreign=True)
    assert found == set(), program
    ours = [h for h in run.hazards  # type: ignore[attr-defined]
            if h.second is None or h.second.label not in _FOREIGN]
    assert ours == [], (program, ours)


#: The simulator's labels of the other library's copies and fills.
_FOREIGN = ("cuMemcpyAsync", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync", "cuMemsetD8Async")


def test_another_librarys_event_orders_what_it_covers_and_nothing_without_the_observer():
    """A write on ``a``, the other library's event recorded there and waited
    for on ``b``, a read on ``b``: no race observed (and the simulator finds
    none); without the observer, check mode reports the pair (the ordering is
    unknown to it: the negative control), and without the wait both find it."""
    steps = (Kernel(0, ((0, Access.WRITE, 0),)), Record(0, 0), Wait(1, 0),
             Kernel(1, ((0, Access.READ, 0),)))
    program = Program((NON_BLOCKING,) * 2, 1, (0,), steps)
    assert run(program, foreign=True) == (set(), set())
    found, oracle = run(program, foreign=True, observe=False)
    assert oracle == set() and {f[0] for f in found} == {"read-after-write"}, found
    unordered = Program((NON_BLOCKING,) * 2, 1, (0,), steps[:2] + steps[3:])
    found, oracle = run(unordered, foreign=True)
    assert found == oracle and {f[0] for f in found} == {"read-after-write"}, found
