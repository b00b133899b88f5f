"""Stream identity, retirement and the simulated driver's model of destroyed streams.

CUDA may hand a destroyed stream's handle to the next stream created. The
tracker must not let the new stream inherit the old one's history (which marks
it already waited for, which uses it made), whether the old stream was
destroyed through :meth:`DeviceRuntime.destroy_stream` (raw handles) or by its
owning object going away (as Numba's streams destroy themselves when collected).
The simulated driver recycles handles as CUDA may, so every test here runs
against a reused handle.
"""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

import pytest

from numba_streamsafe._driver.sim import SimDriver
from numba_streamsafe.core.access import Access
from numba_streamsafe.core.errors import DriverError, InvalidArgument, StreamMisuse
from numba_streamsafe.resources import AsyncResource
from numba_streamsafe.runtime import DeviceRuntime

R, W = Access.READ, Access.WRITE


def kernel(res: AsyncResource, sim: SimDriver, stream: int, uses, owner=None, label="k"):
    """One kernel on ``stream``: preflight, the access as the simulator sees it, commit."""
    res.preflight(uses, stream, owner)
    sim.trace_access(stream, [(b.ptr, b.nbytes, a) for b, a in uses], label)
    res.commit(uses, stream, owner)


# ------------------------------------------------------------- the simulated driver
def test_simulated_driver_recycles_destroyed_handles():
    sim = SimDriver(backing=False)
    a = sim.create_stream()
    sim.destroy_stream(a)
    assert sim.create_stream() == a
    sim_fresh = SimDriver(backing=False, recycle_streams=False)
    b = sim_fresh.create_stream()
    sim_fresh.destroy_stream(b)
    assert sim_fresh.create_stream() != b


def test_a_recycled_handle_is_a_new_stream_for_the_checker():
    """Work of the destroyed stream is not ordered before the new one's by stream order."""
    sim = SimDriver(backing=False)
    ptr = sim.alloc(256)
    a = sim.create_stream()
    sim.trace_access(a, [(ptr, 256, W)], "old")
    sim.destroy_stream(a)
    c = sim.create_stream()
    assert c == a
    sim.trace_access(c, [(ptr, 256, R)], "new")
    assert [h.kind for h in sim.hazards] == ["read-after-write"]


def test_destroyed_streams_work_completes_at_a_device_synchronize():
    sim = SimDriver(backing=False)
    s = sim.create_stream()
    ptr = sim.alloc(256)
    sim.trace_access(s, [(ptr, 256, W)], "write")
    sim.destroy_stream(s)
    sim.free(ptr)  # cuMemFree synchronises the device: the write is complete
    sim.assert_no_hazards()


def test_memory_freed_on_a_destroyed_stream_is_released_by_sync_and_trim():
    sim = SimDriver(backing=False)
    s = sim.create_stream()
    ptr = sim.alloc_async(4096, s)
    sim.free_async(ptr, s)
    sim.destroy_stream(s)
    sim.synchronize()
    sim.pool_trim(0)
    assert sim.reserved_bytes == 0
    sim.assert_no_hazards()


# ------------------------------------------------------------- raw handles retired
def test_reused_handle_does_not_inherit_a_wait(sim, res, rt):
    """The issue's first form: c (b's handle) reads y, written with x in one mark."""
    a, b = sim.create_stream(), sim.create_stream()
    x = res.allocate(256, a, "x")
    y = res.allocate(256, a, "y")
    kernel(res, sim, a, [(x, W), (y, W)], label="write x, y")  # one mark
    kernel(res, sim, b, [(x, R)], label="b reads x")  # b waits for the mark
    kernel(res, sim, a, [(x, W)], label="a writes x")  # supersedes b's read
    rt.destroy_stream(b)
    c = sim.create_stream()
    assert c == b, "the simulated driver should hand out b's handle again"
    kernel(res, sim, c, [(y, R)], label="c reads y")
    sim.assert_no_hazards()
    # b on the mark, a's write on b's read, c on the mark: none skipped.
    assert sim.calls["cuStreamWaitEvent"] == 3


def test_reused_handle_does_not_inherit_a_write(sim, res, rt):
    """The issue's second form: b writes x, b is destroyed, c on b's handle reads x."""
    a, b = sim.create_stream(), sim.create_stream()
    x = res.allocate(256, a, "x")
    kernel(res, sim, b, [(x, W)], label="b writes x")
    rt.destroy_stream(b)
    c = sim.create_stream()
    assert c == b
    kernel(res, sim, c, [(x, R)], label="c reads x")
    sim.assert_no_hazards()


def test_reused_handle_does_not_inherit_a_read(sim, res, rt):
    """b reads x; c, on b's handle, writes x: the write waits for b's read."""
    a, b = sim.create_stream(), sim.create_stream()
    x = res.allocate(256, a, "x")
    kernel(res, sim, b, [(x, R)], label="b reads x")
    rt.destroy_stream(b)
    c = sim.create_stream()
    assert c == b
    kernel(res, sim, c, [(x, W)], label="c writes x")
    res.deallocate(x)
    sim.assert_no_hazards()


def test_negative_control_without_retirement_the_reused_handle_races(sim, res):
    """Destroying b behind the runtime's back (no retirement) shows the hazard the
    tests above guard against, so the checker sees it."""
    a, b = sim.create_stream(), sim.create_stream()
    x = res.allocate(256, a, "x")
    kernel(res, sim, b, [(x, W)], label="b writes x")
    res.retire_stream  # noqa: B018 - exists, but is deliberately not called
    sim.destroy_stream(b)
    c = sim.create_stream()
    assert c == b
    kernel(res, sim, c, [(x, R)], label="c reads x")
    assert [h.kind for h in sim.hazards] == ["read-after-write"]


# ----------------------------------------------------- owning objects that go away
class OwnedStream:
    """Like a Numba stream: owns its handle and destroys it when collected."""

    def __init__(self, sim: SimDriver) -> None:
        self.sim = sim
        self.handle = sim.create_stream()

    def __del__(self) -> None:
        self.sim.destroy_stream(self.handle)


def test_a_waiting_stream_object_outlives_the_marks_it_waited_for(sim, res):
    """The waiter's object stays alive while a mark it waited for is in use, so its
    handle cannot go to a new stream that would skip the wait."""
    a = OwnedStream(sim)
    x = res.allocate(256, a.handle, "x", stream_owner=a)
    y = res.allocate(256, a.handle, "y", stream_owner=a)
    kernel(res, sim, a.handle, [(x, W), (y, W)], a, "write x, y")
    b = OwnedStream(sim)
    kernel(res, sim, b.handle, [(x, R)], b, "b reads x")
    kernel(res, sim, a.handle, [(x, W)], a, "a writes x")
    gone = weakref.ref(b)
    old_handle = b.handle
    del b
    gc.collect()
    assert gone() is not None, "the mark b waited for must keep b alive"
    c = OwnedStream(sim)
    assert c.handle != old_handle
    kernel(res, sim, c.handle, [(y, R)], c, "c reads y")
    sim.assert_no_hazards()
    # Once no block refers to the mark any more, b goes.
    res.deallocate(y)
    gc.collect()
    assert gone() is None


# --------------------------------------------------------- reap racing destroy
class BlockingSync(SimDriver):
    """A simulated driver whose stream synchronise blocks until released."""

    def __init__(self) -> None:
        super().__init__(backing=False)
        self.entered = threading.Event()
        self.release = threading.Event()

    def stream_synchronize(self, stream: int) -> None:
        if not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(10)
        super().stream_synchronize(stream)


def test_reap_racing_destroy_stream_loses_nothing():
    sim = BlockingSync()
    res = AsyncResource(sim, reuse_bytes=0)
    rt = DeviceRuntime(res)
    s = sim.create_stream()
    res.deallocate(res.allocate(4096, s, "x"))
    errors: list[BaseException] = []

    def run(fn):
        try:
            fn()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    reaper = threading.Thread(target=run, args=(rt.reap,))
    reaper.start()
    assert sim.entered.wait(10)  # the reaper holds s's pending frees and syncs s
    destroyer = threading.Thread(target=run, args=(lambda: rt.destroy_stream(s),))
    destroyer.start()
    destroyer.join(0.2)
    sim.release.set()
    reaper.join(10)
    destroyer.join(10)
    assert not errors, errors
    assert rt.bytes_outstanding() == 0
    rt.reap()
    rt.trim()
    sim.assert_no_hazards()


# ------------------------------------------------------------ destroy after del
def test_destroy_stream_right_after_a_finalizer_queued_the_free(sim, res, rt):
    s = sim.create_stream()
    block = res.allocate(256, s, "a")
    res.defer_free(block)  # what the array's finalizer does on ``del a``
    rt.destroy_stream(s)
    assert rt.bytes_outstanding() == 0
    sim.assert_no_hazards()


def test_destroy_stream_still_refuses_live_blocks(sim, res, rt):
    s = sim.create_stream()
    block = res.allocate(256, s, "a")
    with pytest.raises(StreamMisuse, match="still orders 1 live block"):
        rt.destroy_stream(s)
    res.deallocate(block)
    rt.destroy_stream(s)


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("handle", [0, 1, 2])
def test_default_streams_cannot_be_destroyed(sim, res, rt, handle):
    with pytest.raises(StreamMisuse, match="default stream"):
        rt.destroy_stream(handle)
    block = res.allocate(256, 0, "still works")
    res.deallocate(block)
    rt.reap()
    sim.assert_no_hazards()


def test_destroy_stream_none_is_refused(rt):
    with pytest.raises(StreamMisuse, match="default stream"):
        rt.destroy_stream(None)


@pytest.mark.parametrize("junk", [None, "junk", 16, object()])
def test_deallocate_and_defer_free_refuse_what_is_not_a_block(sim, res, rt, junk):
    before = (rt.bytes_outstanding(), res.stats())
    with pytest.raises(InvalidArgument, match="not a Block"):
        res.deallocate(junk)
    with pytest.raises(InvalidArgument, match="not a Block"):
        rt.deallocate(junk)
    with pytest.raises(InvalidArgument, match="not a Block"):
        res.defer_free(junk)
    with pytest.raises(InvalidArgument, match="not a Block"):
        rt.defer_free(junk)
    # Nothing was queued: the next allocation works.
    res.deallocate(res.allocate(256, 0, "after"))
    rt.reap()
    assert (rt.bytes_outstanding(), res.stats().live_blocks) == (before[0], 0)


@pytest.mark.parametrize("bad", [-1, 1.5, "8", True])
def test_max_idle_events_must_be_a_non_negative_int(sim, bad):
    with pytest.raises(InvalidArgument, match="max_idle_events"):
        AsyncResource(sim, max_idle_events=bad)


@pytest.mark.parametrize("bad", [-1, 1.5, "0", None])
def test_trim_refuses_a_bad_keep(rt, bad):
    with pytest.raises(InvalidArgument, match="keep_bytes"):
        rt.trim(bad)


def test_numpy_integer_sizes_are_accepted(sim, res):
    np = pytest.importorskip("numpy")
    for n in (np.int64(16), np.uint32(300), np.int8(1)):
        block = res.allocate(n, 0, "np size")
        assert block.nbytes == int(n) and type(block.nbytes) is int
        res.deallocate(block)
    with pytest.raises(InvalidArgument, match="positive int"):
        res.allocate(np.float64(16), 0, "float")
    with pytest.raises(InvalidArgument, match="positive int"):
        res.allocate(np.bool_(True), 0, "bool")


def test_destroy_of_a_destroyed_stream_raises_a_driver_error(sim, res, rt):
    s = sim.create_stream()
    rt.destroy_stream(s)
    with pytest.raises((DriverError, StreamMisuse)):
        rt.destroy_stream(s)


# ------------------------------------------------------ the program's own order
class _StreamObject:
    """Stands for a stream object that owns its handle (Numba's on a GPU)."""


def _written_on_a() -> tuple[SimDriver, AsyncResource, int, int, Any]:
    """A simulated device, its resource, streams ``a`` and ``b``, and a block
    ``x`` written by a kernel on ``a`` (its allocation complete)."""
    sim = SimDriver(backing=False)
    res = AsyncResource(sim)
    a, b = sim.create_stream(), sim.create_stream()
    x = res.allocate(256, a, "x")
    sim.synchronize()
    kernel(res, sim, a, [(x, W)], label="write x on a")
    return sim, res, a, b, x


@pytest.mark.parametrize("owner_dies", [True, False])
def test_a_new_stream_on_a_dead_streams_handle_is_ordered_after_nothing(owner_dies):
    """The program ordered stream ``b`` (an object owning its handle) after
    ``a`` with an event; ``b``'s object died and CUDA gave its handle to a new
    stream ``c``, which the program never ordered. ``c``'s read of what ``a``
    wrote is waited for (no race). Negative control: while ``b``'s object lives
    the knowledge stands and the wait is skipped."""
    sim, res, a, b, x = _written_on_a()
    owner = _StreamObject()
    clock = res.program_clock(a)
    event = sim.event_create()
    sim.event_record(event, a)
    sim.stream_wait_event(b, event)
    res.program_waited(b, clock, owner)
    if owner_dies:
        del owner
        gc.collect()
        sim.destroy_stream(b)  # the object's finalizer, behind the resource's back
        c = sim.create_stream()
        assert c == b, "the simulated driver reuses the handle"
    else:
        c = b
    waits, skipped = res.marks.waits, res.marks.skipped
    kernel(res, sim, c, [(x, R)], label="read x")
    if owner_dies:
        assert (res.marks.waits - waits, res.marks.skipped - skipped) == (1, 0)
    else:
        assert (res.marks.waits - waits, res.marks.skipped - skipped) == (0, 1)
    assert sim.hazards == []


def test_a_point_of_the_program_records_the_event_of_the_marks_it_closes():
    """The program's point on ``a`` closes ``a``'s open mark and records its
    event there and then: later, ``a`` may be captured by a graph or gone
    (a stream the library knows only by its handle), and nothing could be
    recorded on it; in check mode none is recorded. After ``a`` ends (its
    marks renamed), a stream the program ordered after the point needs no
    wait and is no race: the clocks know the marks by the stream they were
    made on."""
    for check in (False, True):
        sim = SimDriver(backing=False)
        res = AsyncResource(sim, check=check)
        a, b = sim.create_stream(), sim.create_stream()
        x = res.allocate(256, a, "x")
        sim.synchronize()
        kernel(res, sim, a, [(x, W)], label="write x on a")
        recorded = sim.calls["cuEventRecord"]
        clock = res.program_clock(a)
        assert sim.calls["cuEventRecord"] == recorded + (0 if check else 1)
        event = sim.event_create()
        sim.event_record(event, a)                # the program's event
        res.retire_stream(a, sim.destroy_stream)
        assert sim.calls["cuEventRecord"] == recorded + (1 if check else 2)
        sim.stream_wait_event(b, event)
        res.program_waited(b, clock)
        waits = res.marks.waits
        kernel(res, sim, b, [(x, R)], label="read x on b")
        assert res.marks.waits == waits  # the program ordered it: no wait, no report
        assert sim.hazards == [] and not (res.race_log and res.race_log.hazards)


@pytest.mark.parametrize("end", ["retired", "recorded again"])
def test_a_mark_that_borrows_the_programs_event_gets_its_own_before_that_event_changes(end):
    """The program's point on ``a`` closes ``a``'s mark without an event of the
    library's: the mark borrows the program's event. Before ``a`` is retired,
    or before the program records that event again (on the idle stream
    ``c``), the mark, which ``x`` still refers to, gets an event of its own
    recorded on ``a``; a read of ``x`` on ``b``, which the program does not
    order, then waits for that one and is no race. Negative control: a wait
    for the program's event, as recorded again, leaves ``b`` unordered."""
    for library in (True, False):
        sim, res, a, b, x = _written_on_a()
        c = sim.create_stream()
        event = sim.event_create()
        recorded = sim.calls["cuEventRecord"]
        if library:
            _, mark = res.program_record(a, object(), event)
            assert mark is not None
        sim.event_record(event, a)                   # the program's record
        assert sim.calls["cuEventRecord"] == recorded + 1
        if end == "retired":
            if library:
                res.retire_stream(a, sim.destroy_stream)
                assert sim.calls["cuEventRecord"] == recorded + 2  # its own, on a
            else:
                sim.destroy_stream(a)
        if library:
            res.program_unborrow(mark)              # the program records it again
            assert sim.calls["cuEventRecord"] == recorded + 2
        sim.event_record(event, c)
        if library:
            kernel(res, sim, b, [(x, R)], label="read x on b")
            assert sim.hazards == []
        else:
            sim.stream_wait_event(b, event)
            sim.trace_access(b, [(x.ptr, x.nbytes, R)], "read x on b")
            assert sim.hazards, "waiting for the event as recorded again orders nothing"


def _written_by_an_owned_stream(observe: bool = False):
    """``_written_on_a``, with the write on ``a`` made through a stream object
    that owns ``a``'s handle (the mark keeps it alive)."""
    sim = SimDriver(backing=False)
    res = AsyncResource(sim, observe=observe)
    a, b = sim.create_stream(), sim.create_stream()
    owner = _StreamObject()
    x = res.allocate(256, b, "x")
    sim.synchronize()
    kernel(res, sim, a, [(x, W)], owner=owner, label="write x on a")
    return sim, res, a, b, x, owner


@pytest.mark.parametrize("case", ["completed", "needed before", "synchronise fails",
                                  "retired before"])
def test_a_synchronise_of_a_stream_records_no_event_of_the_librarys(case):
    """The host synchronises ``a``, whose stream object owns its handle, and
    which wrote ``x`` (as transparent mode's hook tells it:
    ``program_sync_clock``, the synchronise, then ``program_completed``):
    ``a``'s mark is closed with no event of the library's, and a read of ``x``
    on ``b`` afterwards needs neither a wait nor an event. Where the mark is
    needed before the host saw it complete (a read on ``b`` meanwhile, as
    another thread may queue it), where the synchronise fails (the host saw
    nothing complete), or where ``a`` is retired first, the mark gets an
    event then, recorded on ``a``, and the read on ``b`` waits for it: no
    hazard in any case. Negative control: the read on ``b`` queued without
    the library's wait before the synchronise races the write."""
    sim, res, a, b, x, owner = _written_by_an_owned_stream()
    recorded, waits = sim.calls["cuEventRecord"], res.marks.waits
    clock, mark = res.program_sync_clock(a)
    assert mark is not None and sim.calls["cuEventRecord"] == recorded
    if case == "completed":
        sim.stream_synchronize(a)
        res.program_completed(clock, a)
        kernel(res, sim, b, [(x, R)], label="read x on b")
        assert (sim.calls["cuEventRecord"], res.marks.waits) == (recorded, waits)
    else:
        if case == "needed before":
            kernel(res, sim, b, [(x, R)], label="read x on b")
            sim.stream_synchronize(a)
            res.program_completed(clock, a)
        elif case == "synchronise fails":
            res.program_unborrow(mark)  # as program_order.synchronised does then
            kernel(res, sim, b, [(x, R)], label="read x on b")
        else:
            res.retire_stream(a, sim.destroy_stream)
            kernel(res, sim, b, [(x, R)], label="read x on b")
        assert sim.calls["cuEventRecord"] == recorded + 1  # the mark's event, on a
        assert res.marks.waits == waits + 1
    assert sim.hazards == []
    # Control: the same read, unordered, before the synchronise.
    sim, res, a, b, x, _ = _written_by_an_owned_stream()
    res.program_sync_clock(a)
    sim.trace_access(b, [(x.ptr, x.nbytes, R)], "read x on b, no wait")
    assert sim.hazards, "the read on b must be ordered after the write on a"


@pytest.mark.parametrize("observe", [False, True], ids=["handle only", "observed"])
def test_a_synchronised_stream_known_by_handle_only_records_its_marks_event(observe):
    """A stream the library knows by its handle only (another library's, or
    one wrapped by ``cuda.external_stream``), synchronised by the program:
    nothing keeps the handle alive for the mark, so the synchronise records
    the mark's event then. The stream's owner may destroy it once the
    synchronise returned and before the completion is told (where the driver
    observer runs, it notes that destroy); a read of ``x`` on ``b`` by
    another thread meanwhile waits for that event: no hazard, no event
    recorded on a stream that is gone. Without the event (a mark closed at
    the synchronise with none), the read would record one on the destroyed
    stream."""
    sim = SimDriver(backing=False)
    res = AsyncResource(sim, observe=observe)
    s = sim.observer.create_stream() if observe else sim.create_stream()
    b = sim.create_stream()
    x = res.allocate(256, b, "x")
    sim.synchronize()
    kernel(res, sim, s, [(x, W)], label="write x on s")
    recorded = sim.calls["cuEventRecord"]
    clock, mark = res.program_sync_clock(s)
    assert mark is None and sim.calls["cuEventRecord"] == recorded + 1
    sim.stream_synchronize(s)
    if observe:
        sim.observer.destroy_stream(s)
    else:
        sim.destroy_stream(s)
    kernel(res, sim, b, [(x, R)], label="read x on b")  # another thread, meanwhile
    res.program_completed(clock, s)
    sim.assert_no_hazards()


def test_a_stream_per_step_synchronised_records_no_event_per_step():
    """The steps of ``stream_per_step.py`` on the simulated driver, as
    transparent mode's hooks tell the resource: a stream per step (an object
    owning its handle) writes ``x``, half the steps hand it to a long-lived
    reader stream by an event of the program's, the stream that read it is
    synchronised and the blocks freed. The library records no event of its
    own and queues no wait, and nothing races."""
    sim = SimDriver(backing=False, recycle_streams=False)
    res = AsyncResource(sim)
    reader = sim.create_stream()
    reader_object = _StreamObject()
    recorded = sim.calls["cuEventRecord"]
    programs = 0
    for i in range(200):
        s = sim.create_stream()
        step = _StreamObject()
        x = res.allocate(256, s, f"x{i}")
        y = res.allocate(256, s, f"y{i}")
        kernel(res, sim, s, [(x, W)], owner=step, label=f"write x{i}")
        on, on_object = s, step
        event = None
        if i & 1:  # the program's event, as the hooks of record and wait tell it
            event = sim.event_create()
            clock, _ = res.program_record(s, object(), event)
            sim.event_record(event, s)
            sim.stream_wait_event(reader, event)
            res.program_waited(reader, clock, reader_object)
            programs += 1
            on, on_object = reader, reader_object
        kernel(res, sim, on, [(x, R), (y, W)], owner=on_object, label=f"copy x{i}")
        clock, _ = res.program_sync_clock(on)
        sim.stream_synchronize(on)
        res.program_completed(clock, on)
        if event is not None:
            sim.event_destroy(event)
        res.deallocate(x)
        res.deallocate(y)
    assert sim.calls["cuEventRecord"] - recorded == programs  # the program's own only
    assert res.marks.waits == 0
    sim.assert_no_hazards()


def _hand_off(res, sim, s, hub):
    """The program records an event on ``s`` and makes ``hub`` wait for it, and
    the resource is told (as transparent mode's hooks tell it): returns the
    event and its point's clock."""
    clock = res.program_clock(s)
    event = sim.event_create()
    sim.event_record(event, s)
    sim.stream_wait_event(hub, event)
    res.program_waited(hub, clock)
    return event, clock


def _step_to_hub(res, sim, s, hub, x, out, i, by_stream=True):
    """One step of a stream per step: ``x`` written on ``s``, an event of the
    program's hands it to ``hub``, which reads it into ``out``; the host waits
    for ``hub`` (the resource told of each, as transparent mode's hooks tell it:
    ``by_stream`` False tells the point without its stream, as for an
    event's)."""
    kernel(res, sim, s, [(x, W)], label=f"write x{i}")
    event, _ = _hand_off(res, sim, s, hub)
    kernel(res, sim, hub, [(x, R), (out, W)], label=f"read x{i}")
    clock = res.program_clock(hub)
    sim.stream_synchronize(hub)
    res.program_completed(clock, hub if by_stream else None)
    sim.event_destroy(event)


def test_the_program_clocks_stay_bounded_as_streams_come_and_go_with_no_use_held():
    """A stream per step, as a program that makes and drops one does: work on
    it, an event of the program's hands it to a long-lived stream, the host
    waits for the event, the step's blocks are freed and the stream destroyed
    through the runtime; never a device synchronise. No block holds a use of
    a destroyed stream, so its key leaves the host's clock and the long-lived
    stream's: they keep a handful of keys, not one per stream (each point the
    program takes on the long-lived stream copies its clock). Every use stays
    ordered. Control: the same steps with the blocks freed after the stream
    is destroyed (its uses held then) keep a key per stream until a device
    synchronise."""
    for held in (False, True):
        sim = SimDriver(backing=False, recycle_streams=False)  # a new handle per stream
        res = AsyncResource(sim)
        rt = DeviceRuntime(res)
        hub = sim.create_stream()
        out = res.allocate(256, hub, "out")
        for i in range(200):
            s = sim.create_stream()
            x = res.allocate(256, hub, f"x{i}")
            _step_to_hub(res, sim, s, hub, x, out, i)
            if not held:
                res.deallocate(x)
            rt.destroy_stream(s)
            if held:
                res.deallocate(x)
        sizes = (len(res.marks.done), *(len(e[1]) for e in res.marks.ordered.values()))
        if held:
            assert max(sizes) >= 200, sizes  # the control: a key per stream
        else:
            assert max(sizes) <= 4, sizes
        kernel(res, sim, hub, [(out, W)], label="last write")
        sim.assert_no_hazards()
        res.deallocate(out)
        rt.reap()


@pytest.mark.parametrize("by_stream", [True, False], ids=["stream synchronised", "point"])
def test_a_long_lived_streams_clock_keeps_only_what_the_host_has_not_seen_complete(by_stream):
    """A stream per step that the library is never told is gone (as Numba's
    own streams in transparent mode, a new handle each), its work handed to a
    long-lived stream by an event of the program's, the host waiting for the
    long-lived stream each step; never a device synchronise. The long-lived
    stream's clock drops the points the host saw complete, so it keeps a few
    dozen keys, not one per step (each point taken on it copies it, so its
    size is a cost per step); told that the point was a synchronise of that
    stream, it keeps none past the step. A device synchronise empties the
    clocks. Every use stays ordered. Before the clocks were pruned it kept one
    key per step."""
    sim = SimDriver(backing=False, recycle_streams=False)  # a new handle per stream
    res = AsyncResource(sim)
    hub = sim.create_stream()
    out = res.allocate(256, hub, "out")
    largest = 0
    for i in range(300):
        s = sim.create_stream()
        x = res.allocate(256, s, f"x{i}")
        _step_to_hub(res, sim, s, hub, x, out, i, by_stream)
        res.deallocate(x)
        largest = max(largest, len(res.marks.ordered[hub][1]))
    assert largest <= (0 if by_stream else 80), largest
    point = res.program_point_all()
    sim.synchronize()
    res.program_completed_all(point)
    sizes = (len(res.marks.done), *(len(e[1]) for e in res.marks.ordered.values()))
    assert max(sizes) <= 1, sizes
    kernel(res, sim, hub, [(out, W)], label="last write")
    sim.assert_no_hazards()
    res.deallocate(out)


def test_the_program_clocks_stay_bounded_as_streams_are_destroyed_with_their_uses_held():
    """Streams destroyed through the runtime while a block still holds their
    reads, one after another at the same handle, each handing its work to a
    long-lived stream by an event that the host then waits for; a device
    synchronise every ten. A later stream at the handle is known to the
    clocks by a key of its own (so its points reach none of the marks still
    held), and those keys leave the clocks once a device synchronise
    completed their marks: the clocks keep a handful of keys, not one per
    stream destroyed. Every use stays ordered."""
    sim = SimDriver(backing=False)
    res = AsyncResource(sim)
    rt = DeviceRuntime(res)
    hub = sim.create_stream()
    shared = res.allocate(256, hub, "shared")
    out = res.allocate(256, hub, "out")
    for i in range(300):
        s = sim.create_stream()
        kernel(res, sim, s, [(shared, R)], label=f"read{i}")
        event, clock = _hand_off(res, sim, s, hub)
        sim.event_synchronize(event)
        res.program_completed(clock)
        sim.event_destroy(event)
        rt.destroy_stream(s)
        kernel(res, sim, hub, [(out, W)], label=f"write{i}")
        if i % 10 == 9:
            point = res.program_point_all()
            sim.synchronize()
            res.program_completed_all(point)
    assert len(res.marks.done) <= 16, len(res.marks.done)
    assert all(len(entry[1]) <= 16 for entry in res.marks.ordered.values()), res.marks.ordered
    kernel(res, sim, hub, [(shared, W)], label="last write")
    sim.assert_no_hazards()
    res.deallocate(shared)
    res.deallocate(out)
    rt.reap()
