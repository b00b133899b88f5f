"""Property tests: random multi-stream programs are hazard-free through the recorder.

Each program runs twice on a fresh simulated device: fenced (every step
through a :class:`~numba_streamsafe.LaunchRecorder`) and unfenced (the same
kernels, allocations and frees with no recorder, so nothing waits for
anything). The fenced run must show no hazard and give every byte and event
back; the unfenced runs must show hazards often (the negative control that
proves the checker can fail).

The programs retire streams and reset the context, and the simulated driver
hands a destroyed stream's handle to the next stream created (as CUDA may), so
a new stream at an old handle must inherit nothing of the old one's history.
"""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import programs as P

#: Programs the Hypothesis property runs: a quick run by default, and the full
#: run (marked slow, run by CI) at NSS_PROPERTY_EXAMPLES, 5000 unless set.
QUICK_EXAMPLES = 400
EXAMPLES = int(os.environ.get("NSS_PROPERTY_EXAMPLES", "5000"))


def _assert_clean_after_fenced(run: P.Run) -> None:
    hazards = run.sim.hazards
    assert hazards == [], "\n".join(str(h) for h in hazards[:10])
    P.cleanup(run)
    assert run.rt.bytes_outstanding() == 0
    assert run.res.stats().live_blocks == 0 and run.res.pending_per_stream() == {}
    assert run.res.events.in_use == 0
    assert run.sim.live_events == run.res.events.idle, "an event lives outside the pool"
    assert run.sim.hazards == []
    # Every byte goes back to the system, freed on destroyed streams included.
    run.sim.synchronize()
    run.sim.pool_trim(0)
    assert run.sim.reserved_bytes == 0


def test_fenced_programs_have_no_hazards_quick():
    _fenced_programs_have_no_hazards(QUICK_EXAMPLES)


@pytest.mark.slow
def test_fenced_programs_have_no_hazards():
    _fenced_programs_have_no_hazards(EXAMPLES)


def _fenced_programs_have_no_hazards(examples: int) -> None:
    seen = {"programs": 0, "unfenced with hazards": 0, "with reuse": 0, "with kept reuse": 0,
            "with a recycled handle": 0, "with a reset": 0}

    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(program=P.program_strategy(max_steps=25), fences=st.sampled_from(["lazy", "eager"]))
    def fenced_program_is_safe(program: P.Program, fences: str) -> None:
        seen["programs"] += 1
        raw = P.execute(program, fenced=False)
        seen["unfenced with hazards"] += bool(raw.sim.hazards)
        run = P.execute(program, fenced=True, fences=fences)
        seen["with reuse"] += bool(run.reused)
        seen["with a recycled handle"] += bool(run.recycled)
        seen["with a reset"] += any(isinstance(s, P.Reset) for s in program.steps)
        # Allocations served from blocks kept on their stream, not by the driver.
        seen["with kept reuse"] += (run.res.stats().allocations
                                    > run.sim.calls["cuMemAllocAsync"])
        _assert_clean_after_fenced(run)

    fenced_program_is_safe()
    assert seen["programs"] >= examples, seen
    # The generated programs exercise what the property is about.
    assert seen["unfenced with hazards"] > 0 and seen["with reuse"] > 0, seen
    assert seen["with kept reuse"] > 0, seen
    assert seen["with a recycled handle"] >= examples // 10, seen
    assert seen["with a reset"] >= examples // 10, seen
    print(f"\nproperty run: {seen}")  # shown with pytest -s


def test_unfenced_programs_show_hazards_and_fenced_ones_none():
    """The negative control, over a fixed set of seeded programs."""
    n = 300
    unfenced = free_related = reused = recycled = 0
    for seed in range(n):
        program = P.random_program(random.Random(seed), max_steps=25)
        raw = P.execute(program, fenced=False)
        unfenced += bool(raw.sim.hazards)
        free_related += any("cuMemFreeAsync" in h.later or "cuMemAllocAsync" in h.later
                            for h in raw.sim.hazards)
        for fences in ("lazy", "eager"):
            run = P.execute(program, fenced=True, fences=fences)
            reused += bool(run.reused) and fences == "lazy"
            recycled += bool(run.recycled) and fences == "lazy"
            _assert_clean_after_fenced(run)
    assert unfenced >= n // 2, f"only {unfenced}/{n} unfenced programs showed a hazard"
    # Frees and address reuse (the ABA hazard) are part of what the control catches.
    assert free_related >= n // 10, free_related
    assert reused >= n // 5, reused
    assert recycled >= n // 5, recycled


def test_unfenced_program_hazard_is_a_real_cross_stream_race():
    """A two-step program whose only race is the one the recorder fences."""
    program = P.Program(
        n_streams=3, sizes=(256, 256), homes=(0, 0),
        steps=(P.HostSync(0),
               P.Launch(1, ((0, P.Access.WRITE),)),
               P.Launch(2, ((0, P.Access.READ), (1, P.Access.READ)))),
    )
    raw = P.execute(program, fenced=False)
    kinds = sorted({h.kind for h in raw.sim.hazards})
    assert kinds == ["read-after-write"], raw.sim.hazards
    assert all("step1" in h.earlier and "step2" in h.later for h in raw.sim.hazards)
    _assert_clean_after_fenced(P.execute(program, fenced=True))


def test_a_synchronise_of_a_new_stream_at_a_retired_handle_completes_none_of_the_old_work():
    """Stream 1 reads a buffer and is retired; the new stream at its handle is
    synchronised (as transparent mode notes it). That synchronise says
    nothing of the retired stream's read: the buffer's free on stream 0 still
    waits for it (before, the synchronise's point was taken for the old
    stream's too, the wait was skipped, and the free raced with the read)."""
    program = P.Program(
        n_streams=3, sizes=(16, 16), homes=(0, 0),
        steps=(P.Launch(1, ((0, P.Access.READ),)), P.Retire(1), P.ProgramSync(1)),
    )
    run = P.execute(program, fenced=True)
    assert run.recycled == 1  # the new stream has the retired one's handle
    _assert_clean_after_fenced(run)
    raw = P.execute(program, fenced=False)  # the negative control: the free races
    P.cleanup(raw)
    assert any(h.kind == "write-after-read" and "cuMemFreeAsync" in h.later
               for h in raw.sim.hazards), raw.sim.hazards
