"""The fused free-then-allocate cycle (``AsyncResource._recycle_locked``).

A dropped Numba array queues its block (``defer_free``); the next allocation
of the same size on the same stream takes the address back at once, with a
new generation, when the block needs no wait. These tests check that it is
taken, that it hands out what the unfused path (free, keep, take) would, and
that it steps aside whenever the block needs more than that.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numba_streamsafe._driver.sim import SimDriver
from numba_streamsafe.core.access import Access
from numba_streamsafe.core.blocks import BlockState
from numba_streamsafe.core.errors import UseAfterFree
from numba_streamsafe.resources import AsyncResource
from numba_streamsafe.runtime import DeviceRuntime
from tests.helpers import programs as P


class _Owner:
    pass


@pytest.fixture
def setup():
    sim = SimDriver(backing=False)
    res = AsyncResource(sim)
    rt = DeviceRuntime(res)
    s1, s2 = sim.create_stream(), sim.create_stream()
    owner = _Owner()
    yield sim, res, rt, s1, s2, owner
    rt.reap()


@pytest.fixture
def count_recycles(monkeypatch):
    """Counts the cycles the fused path took."""
    taken = []
    real = AsyncResource._recycle_locked

    def counting(self, *args):
        block = real(self, *args)
        if block is not None:
            taken.append(block)
        return block

    monkeypatch.setattr(AsyncResource, "_recycle_locked", counting)
    return taken


def test_the_cycle_reuses_the_address_with_a_new_generation_and_no_driver_call(
        setup, count_recycles):
    sim, res, rt, s1, _s2, owner = setup
    a = res.allocate(4096, s1, "a", stream_owner=owner)
    allocs, frees = sim.calls["cuMemAllocAsync"], sim.calls["cuMemFreeAsync"]
    res.defer_free(a)
    b = res.allocate(4096, s1, "b", stream_owner=owner)
    assert count_recycles == [b]
    assert b.ptr == a.ptr and b.generation > a.generation
    assert a.state is BlockState.FREED and b.state is BlockState.LIVE
    assert (sim.calls["cuMemAllocAsync"], sim.calls["cuMemFreeAsync"]) == (allocs, frees)
    stats = res.stats()
    assert (stats.allocations, stats.frees, stats.live_blocks) == (2, 1, 1)
    assert res.live_bytes == 4096 and res.pending_bytes == 0
    assert len(res._deferred) == 0
    with pytest.raises(UseAfterFree):
        rt.deallocate(a)  # the old handle is dead, though its address lives on
    rt.deallocate(b)


def test_a_read_on_another_stream_is_waited_for_first(setup, count_recycles):
    """The freed block was read on s2: the unfused path queues the wait, and
    the next writer on s1 is ordered after the read."""
    sim, res, rt, s1, s2, owner = setup
    a = res.allocate(256, s1, "a", stream_owner=owner)
    P.launch(rt, s2, [(a, Access.READ)], label="reader")
    waits = sim.calls["cuStreamWaitEvent"]
    res.defer_free(a)
    b = res.allocate(256, s1, "b", stream_owner=owner)
    assert count_recycles == []
    assert b.ptr == a.ptr  # kept and taken back
    assert sim.calls["cuStreamWaitEvent"] == waits + 1
    P.launch(rt, s1, [(b, Access.WRITE)], label="writer")
    assert sim.hazards == []


def test_without_the_wait_the_checker_sees_the_race(setup):
    """Negative control for the test above: the read is not recorded, so the
    free waits for nothing and the writer races the reader."""
    sim, res, rt, s1, s2, owner = setup
    a = res.allocate(256, s1, "a", stream_owner=owner)
    P.launch(rt, s2, [(a, Access.READ)], fenced=False, label="reader")
    res.defer_free(a)
    b = res.allocate(256, s1, "b", stream_owner=owner)
    P.launch(rt, s1, [(b, Access.WRITE)], label="writer")
    assert sim.hazards


@pytest.mark.parametrize("case", ["other size", "other stream", "two queued", "held",
                                  "raw stream", "traced"])
def test_the_fused_path_steps_aside(setup, count_recycles, case):
    import numba_streamsafe as nss

    sim, res, rt, s1, s2, owner = setup
    a = res.allocate(512, s1, "a", stream_owner=None if case == "raw stream" else owner)
    c = res.allocate(512, s1, "c", stream_owner=owner)
    res.defer_free(a)
    if case == "two queued":
        res.defer_free(c)
    if case == "held":
        with res.hold_frees():
            b = res.allocate(512, s1, "b", stream_owner=owner)
            assert b.ptr != a.ptr and a.state is BlockState.LIVE
    elif case == "traced":
        with nss.trace() as trace:
            b = res.allocate(512, s1, "b", stream_owner=owner)
        assert [m.what for m in trace.memory] == ["kept", "alloc"]
    else:
        nbytes = 1024 if case == "other size" else 512
        stream = s2 if case == "other stream" else s1
        b = res.allocate(nbytes, stream, "b", stream_owner=owner)
    assert count_recycles == []
    assert a.state is (BlockState.LIVE if case == "held" else BlockState.FREED)
    for block in (b, c) if case != "two queued" else (b,):
        rt.deallocate(block)


def _outcome(program: P.Program, fenced: bool) -> tuple:
    run = P.execute(program, fenced=fenced, deferred=True)
    res = run.res
    live = [(b.ptr, b.nbytes, b.stream) if b is not None else None for b in run.blocks]
    outcome = (len(run.sim.hazards), run.reused, live, P.accounting(res),
               res.counters())
    waits = run.sim.calls["cuStreamWaitEvent"]
    P.cleanup(run)
    return outcome, waits, P.accounting(res)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=P.program_strategy(max_steps=30, renew=True), fenced=st.booleans())
def test_fused_and_unfused_cycles_run_programs_alike(program, fenced):
    fused, fused_waits, fused_end = _outcome(program, fenced)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(AsyncResource, "_recycle_locked", lambda self, *args: None)
        unfused, unfused_waits, unfused_end = _outcome(program, fenced)
    assert fused == unfused
    assert fused_end == unfused_end
    # A recycled block keeps its stream's open mark in use, so a stream that
    # waited for it need not wait again: never more waits than unfused.
    assert fused_waits <= unfused_waits
    if fenced:
        assert fused[0] == 0


def test_random_programs_take_the_fused_path(count_recycles):
    """The comparison above is not vacuous: its programs recycle blocks."""
    import random

    rng = random.Random(11)
    for _ in range(30):
        program = P.random_program(rng)
        steps = program.steps + tuple(P.Renew(i % len(program.sizes)) for i in range(6))
        run = P.execute(P.Program(program.n_streams, program.sizes, program.homes, steps),
                        deferred=True)
        P.cleanup(run)
    assert len(count_recycles) > 30


@pytest.mark.parametrize("synchronised", [True, False])
def test_a_block_kept_idle_is_ready_everywhere_when_taken_again(setup, synchronised):
    """A block whose every use the host saw complete before its free is kept
    idle: taken again (on the default stream, as plain Numba's stream-less
    allocations are) and used on another stream, it needs no wait and no event.
    Without the synchronise the library still orders the reuse (the control)."""
    sim, res, rt, s1, s2, owner = setup
    a = res.allocate(4096, 0, "a")
    P.launch(rt, s1, [(a, Access.WRITE)], label="first")
    if synchronised:
        clock = res.program_clock(s1)
        sim.stream_synchronize(s1)
        res.program_completed(clock)
    rt.deallocate(a)
    before = res.counters()
    b = res.allocate(4096, 0, "b")
    assert b.ptr == a.ptr  # the kept block, taken again
    P.launch(rt, s2, [(b, Access.WRITE)], label="second")
    after = res.counters()
    waits = after["waits"] - before["waits"]
    events = after["events_recorded"] - before["events_recorded"]
    assert (waits, events) == ((0, 0) if synchronised else (1, 1)), (waits, events)
    assert not sim.hazards
    rt.deallocate(b)


def test_control_a_block_taken_as_idle_while_in_use_races(setup, monkeypatch):
    """The negative control of the idle path: a block wrongly taken as idle
    (its use on s1 not complete) is written on s2 with no wait, and the
    simulated driver's checker sees the race."""
    sim, res, rt, s1, s2, owner = setup
    a = res.allocate(4096, 0, "a")
    P.launch(rt, s1, [(a, Access.WRITE)], label="first")
    real = AsyncResource._register
    monkeypatch.setattr(AsyncResource, "_register",
                        lambda self, block, stream, owner, idle=False:
                        real(self, block, stream, owner, True))
    rt.deallocate(a)
    b = res.allocate(4096, 0, "b")
    P.launch(rt, s2, [(b, Access.WRITE)], label="second")
    assert sim.hazards
