"""Another library's calls, as the driver observer notes them, applied to a
tracking resource (``AsyncResource(observe=True)``; the simulated driver's
stand-in for the observer, ``SimDriver.observer``, runs each call on the
simulated device and notes it as CUPTI's callbacks would). The random
programs are in ``test_check_mode_programs.py``; these are the directed cases,
each with its negative control."""

from __future__ import annotations

import pytest

from numba_streamsafe._driver import observer
from numba_streamsafe._driver.sim import SimDriver
from numba_streamsafe.core.access import Access
from numba_streamsafe.core.errors import DriverError
from numba_streamsafe.resources import AsyncResource

R, W = Access.READ, Access.WRITE
NBYTES = 256


def _ready(res, sim, stream):
    """A block allocated on ``stream`` and ready for every stream (the device
    synchronised, and the resource told)."""
    x = res.allocate(NBYTES, stream, "x")
    point = res.program_point_all()
    sim.synchronize()
    res.program_completed_all(point)
    return x


def _use(res, sim, stream, block, access, label="k"):
    res.preflight([(block, access)], stream)
    sim.trace_access(stream, [(block.ptr, block.nbytes, access)], label)
    res.commit([(block, access)], stream)


@pytest.mark.parametrize("observe", [True, False])
def test_a_block_on_a_stream_another_library_destroyed_is_freed_elsewhere(observe):
    """A block allocated on another library's stream outlives the stream: its
    free is queued on the legacy stream once the device was synchronised
    (observed); without the observer it is queued on the dead handle, which
    the driver refuses (the negative control: on a GPU, a crash)."""
    sim = SimDriver(backing=False)
    res = AsyncResource(sim, observe=observe, reuse_bytes=0)
    lib = sim.observer
    theirs = lib.create_stream()
    x = res.allocate(NBYTES, theirs, "x")
    _use(res, sim, theirs, x, W)
    lib.destroy_stream(theirs)
    if observe:
        res.deallocate(x)
        assert x.stream == 0
        assert res.stats().live_blocks == 0
        assert sim.hazards == []
    else:
        with pytest.raises(DriverError):
            res.deallocate(x)


def test_kept_and_queued_frees_on_a_destroyed_stream_leave_it():
    """Frees queued and blocks kept for reuse on another library's stream,
    which it then destroys: nothing names the dead handle afterwards (a reap
    would synchronise it)."""
    sim = SimDriver(backing=False)
    res = AsyncResource(sim, observe=True, reuse_bytes=1 << 20)
    lib = sim.observer

    class Owner:  # the stream's object: blocks are kept for reuse only where one is known
        pass

    owner = Owner()
    theirs = lib.create_stream()
    kept = res.allocate(NBYTES, theirs, "kept", stream_owner=owner)
    res.deallocate(kept)  # kept for reuse on their stream
    assert res.counters()["kept_bytes"] == NBYTES
    lib.destroy_stream(theirs)
    res.catch_up()
    assert res.counters()["kept_bytes"] == 0
    res.reap_pending()  # would synchronise the dead stream, which the driver refuses


def test_an_event_destroyed_leaves_no_clock_behind():
    """The other library destroys an event and a new one gets its handle: a
    wait for the new one (never recorded) orders nothing, so the read races
    (as the simulator finds), where the stale clock would have hidden it."""
    sim = SimDriver(backing=False)
    res = AsyncResource(sim, check=True, observe=True, reuse_bytes=0)
    lib = sim.observer
    a, b = sim.create_stream(), sim.create_stream()
    x = _ready(res, sim, a)
    _use(res, sim, a, x, W, "write x on a")
    ev = lib.event_create()
    lib.event_record(ev, a)
    lib.event_destroy(ev)
    res.catch_up()
    assert ev not in res.observed.clocks
    # A wait on the handle now (as a new event of that handle would be waited for):
    # nothing recorded it since, so it orders nothing.
    res.observed.apply((observer.STREAM_WAIT, "cuStreamWaitEvent", b, ev, 0, 0, 0, 0, 0, None))
    _use(res, sim, b, x, R, "read x on b")
    assert [h.kind for h in res.race_log.hazards] == ["read-after-write"]
    assert [h.kind for h in sim.hazards] == ["read-after-write"]


def test_the_librarys_own_events_are_not_the_programs():
    """A record and a wait of one of the resource's own pool events (the
    library's waits, which the driver observer sees on a GPU) order nothing
    in the model: a race stays a race."""
    sim = SimDriver(backing=False)
    res = AsyncResource(sim, check=True, observe=True, reuse_bytes=0)
    a, b = sim.create_stream(), sim.create_stream()
    x = _ready(res, sim, a)
    _use(res, sim, a, x, W, "write x on a")
    ev = res.events.acquire()
    assert ev in res.events.owned
    for record in ((observer.EVENT_RECORD, "cuEventRecord", a, ev, 0, 0, 0, 0, 0, None),
                   (observer.STREAM_WAIT, "cuStreamWaitEvent", b, ev, 0, 0, 0, 0, 0, None)):
        res.observed.apply(record)
    res.events.release(ev)
    res.preflight([(x, R)], b)
    res.commit([(x, R)], b)
    assert [h.kind for h in res.race_log.hazards] == ["read-after-write"]


def test_a_copy_the_other_library_queued_is_reported_with_its_line():
    """A copy of the other library into the block on an unordered stream is a
    race (reported at the next decision, named by its API and the caller's
    line); ordered by the library's event it is none."""
    for ordered in (False, True):
        sim = SimDriver(backing=False)
        res = AsyncResource(sim, check=True, observe=True, reuse_bytes=0)
        lib = sim.observer
        a, b = sim.create_stream(), sim.create_stream()
        x = _ready(res, sim, a)
        _use(res, sim, a, x, R, "read x on a")
        if ordered:
            ev = lib.event_create()
            lib.event_record(ev, a)
            lib.stream_wait_event(b, ev)
        lib.memset_async(x.ptr, 0, NBYTES, b)  # the other library's fill
        res.catch_up()
        found = [(h.kind, h.second.label, h.second.site) for h in res.race_log.hazards]
        assert [h.kind for h in sim.hazards] == ([] if ordered else ["write-after-read"])
        if ordered:
            assert found == []
        else:
            (kind, label, site), = found
            assert kind == "write-after-read" and label.startswith("cuMemsetD8Async")
            assert site is not None and site.startswith(__file__)


def test_ordering_mode_skips_the_wait_another_librarys_event_satisfies():
    """Ordering mode: the other library's event orders ``b`` after ``a``'s
    write, so the read on ``b`` queues no wait (counted as skipped); without
    the observer the library waits itself (the negative control)."""
    for observe in (True, False):
        sim = SimDriver(backing=False)
        res = AsyncResource(sim, observe=observe, reuse_bytes=0)
        lib = sim.observer
        a, b = sim.create_stream(), sim.create_stream()
        x = res.allocate(NBYTES, a, "x")
        _use(res, sim, a, x, W)
        ev = lib.event_create()
        lib.event_record(ev, a)
        lib.stream_wait_event(b, ev)
        waits = res.marks.waits
        _use(res, sim, b, x, R)
        assert sim.hazards == []
        assert (res.marks.waits - waits, res.marks.skipped >= 1) == \
            ((0, True) if observe else (1, False)), observe


@pytest.mark.parametrize("destroyed", [True, False])
def test_work_after_another_librarys_stream_ended_waits_as_before(destroyed):
    """Another library destroys a stream on which the resource keeps a block:
    the resource synchronises the device and counts every earlier mark
    complete. Work queued after that, on a stream whose mark was open then,
    is not complete: a read of it on a third stream waits for it. Control
    (the stream not destroyed): the same program, no device synchronise."""
    sim = SimDriver(backing=False)
    res = AsyncResource(sim, observe=True)
    lib = sim.observer
    s2, s3 = sim.create_stream(), sim.create_stream()
    x = res.allocate(NBYTES, s2, "x")
    _use(res, sim, s2, x, W, "first write on s2")  # s2's open mark, in use
    theirs = lib.create_stream()
    y = res.allocate(NBYTES, theirs, "y")  # the resource keeps something on it
    if destroyed:
        lib.destroy_stream(theirs)  # applied at the next decision, before it
    _use(res, sim, s2, x, W, "second write on s2")
    _use(res, sim, s3, x, R, "read on s3")
    sim.assert_no_hazards()
    res.deallocate(x)
    res.deallocate(y)


def test_a_block_freed_after_another_librarys_stream_ended_is_not_idle_while_written():
    """The same ending, then the block is written again on its stream, a point
    of the program is taken there, and the block is freed: its write still
    runs, so it is not kept idle, and the allocation that takes it again is
    ordered after the write (a write on another stream waits for it)."""
    sim = SimDriver(backing=False)
    res = AsyncResource(sim, observe=True)
    lib = sim.observer

    class Owner:  # a stream object, so that freed blocks are kept for the stream
        pass

    owner = Owner()
    s2, s3 = sim.create_stream(), sim.create_stream()
    x = res.allocate(NBYTES, s2, "x", stream_owner=owner)
    _use(res, sim, s2, x, W, "first write on s2")
    theirs = lib.create_stream()
    y = res.allocate(NBYTES, theirs, "y")
    lib.destroy_stream(theirs)
    _use(res, sim, s2, x, W, "second write on s2")
    res.program_clock(s2)  # a point on s2: its open mark closed
    res.deallocate(x)
    assert x.ptr not in res._kept.idle, "kept idle while its last write runs"
    z = res.allocate(NBYTES, s2, "z", stream_owner=owner)
    assert z.ptr == x.ptr  # the kept block
    _use(res, sim, s3, z, W, "write on s3")
    sim.assert_no_hazards()
    res.deallocate(z)
    res.deallocate(y)
