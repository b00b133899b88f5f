"""Ranges in the engine, against the simulated driver's checker.

Random programs of many uses of byte ranges of a few blocks, on several
streams, through ``AsyncResource.preflight``/``commit``, with the work shown
to the checker over the same spans. With more ranges than a block keeps
(``MAX_SPANS``) neighbours merge; the merged state must still order every
conflicting pair (no hazard), and a free must wait for every range's uses.
A negative control without the resource's ordering shows the checker sees
these programs' races.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numba_streamsafe._driver.sim import SimDriver
from numba_streamsafe.core.access import Access
from numba_streamsafe.resources import AsyncResource
from numba_streamsafe.resources.tracking.rules import MAX_SPANS

SIZE = 512
STREAMS = 4

_use = st.tuples(st.integers(0, STREAMS - 1), st.integers(0, 1),
                 st.sampled_from([Access.READ, Access.WRITE, Access.READ_WRITE]),
                 st.integers(0, SIZE - 1), st.integers(1, 96))
_programs = st.lists(_use, min_size=1, max_size=220)


def _run(program, ordered: bool):
    sim = SimDriver()
    res = AsyncResource(sim)
    streams = [sim.create_stream() for _ in range(STREAMS)]
    blocks = [res.allocate(SIZE, streams[0], f"b{i}") for i in range(2)]
    for s, b, access, lo, n in program:
        hi = min(lo + n, SIZE)
        use = [(blocks[b], access, lo, hi)]
        if ordered:
            res.preflight(use, streams[s])
        sim.trace_access(streams[s], [(blocks[b].ptr + lo, hi - lo, access)], "k")
        if ordered:
            res.commit(use, streams[s])
    most = max(len(res.block_ranges(b)) for b in blocks) if ordered else 0
    for b in blocks:
        if ordered:
            res.deallocate(b)
    return sim, most


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=_programs)
def test_random_range_programs_are_ordered_within_the_bound(program):
    sim, most = _run(program, ordered=True)
    assert most <= MAX_SPANS
    # The frees above ran on the allocation stream: the next allocation there
    # reuses the memory, and the checker sees any use the free did not wait for.
    assert not sim.hazards, sim.hazards[:3]


def test_many_small_ranges_merge_and_stay_ordered():
    """300 one-byte uses on four streams, then a whole-block write on a fifth
    use's stream: merged ranges still order it after every one of them."""
    program = [(i % STREAMS, 0, Access.WRITE, i, 1) for i in range(300)]
    program.append((1, 0, Access.WRITE, 0, SIZE))
    sim, most = _run(program, ordered=True)
    assert most <= MAX_SPANS and not sim.hazards


@pytest.mark.parametrize("seed", range(3))
def test_the_checker_sees_these_programs_races_without_ordering(seed):
    import random

    rng = random.Random(seed)
    program = [(rng.randrange(STREAMS), 0, Access.WRITE, rng.randrange(SIZE - 64), 64)
               for _ in range(40)]
    sim, _ = _run(program, ordered=False)
    assert sim.hazards, "negative control: the same program, unordered, races"


def test_merged_ranges_keep_the_newest_write_of_each_stream():
    """Each byte written on stream A under a mark of its own (a read on B seals
    A's mark in between), so neighbouring ranges differ and merge past the
    bound; the last writes are read by nobody. A whole-block write on C must
    still be ordered after every one of A's writes."""
    sim = SimDriver()
    res = AsyncResource(sim)
    a, b, c = (sim.create_stream() for _ in range(3))
    block = res.allocate(SIZE, a, "x")

    def use(stream, access, lo, hi):
        res.preflight([(block, access, lo, hi)], stream)
        sim.trace_access(stream, [(block.ptr + lo, hi - lo, access)], "k")
        res.commit([(block, access, lo, hi)], stream)

    for i in range(200):
        use(a, Access.WRITE, i, i + 1)
        if i < 190:
            use(b, Access.READ, i, i + 1)      # B waits for A: A's next write, a new mark
    assert len(res.block_ranges(block)) <= MAX_SPANS
    use(c, Access.WRITE, 0, SIZE)
    assert not sim.hazards, sim.hazards[:3]


@pytest.mark.parametrize("split", [False, True], ids=["uniform", "split"])
@pytest.mark.parametrize("access", [Access.READ, Access.WRITE], ids=["read", "write"])
def test_a_use_of_no_bytes_waits_for_nothing_and_records_nothing(split, access):
    """An empty view (``lo == hi``) touches no byte: no wait is queued for it,
    on a block whose state is uniform or split, and it leaves no mark."""
    sim = SimDriver()
    res = AsyncResource(sim)
    a, b = sim.create_stream(), sim.create_stream()
    block = res.allocate(SIZE, a)
    res.preflight([(block, Access.WRITE)], a)
    res.commit([(block, Access.WRITE)], a)
    if split:
        res.preflight([(block, Access.READ, 0, 64)], a)
        res.commit([(block, Access.READ, 0, 64)], a)
        assert len(res.block_ranges(block)) == 2
    before = res.block_ranges(block)
    waits = sim.calls["cuStreamWaitEvent"]
    res.preflight([(block, access, 128, 128)], b)
    res.commit([(block, access, 128, 128)], b)
    assert sim.calls["cuStreamWaitEvent"] == waits
    assert res.block_ranges(block) == before
    res.preflight([(block, access, 128, 129)], b)   # one byte: it waits for a's write
    assert sim.calls["cuStreamWaitEvent"] == waits + 1
