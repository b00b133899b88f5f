"""The engine's two builds agree: the compiled modules and their Python
source (``NUMBA_STREAMSAFE_PURE_PYTHON=1``), each in a child process of its
own, run the same random multi-stream programs: one thread each, with the
same driver calls, waits, events, hazards (none when fenced) and final
state; and several threads at once on one runtime, with no hazard, no error
and nothing left over on either.

The whole suite also runs with ``NUMBA_STREAMSAFE_PURE_PYTHON=1`` (CI runs
both).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numba_streamsafe.compiled import ENGINE
from tests.helpers import engine_env, engine_runs
from tests.helpers import programs as P


class _Child:
    """A child process that imports the engine's ``pure`` build and runs
    functions of :mod:`engine_runs`; one that dies fails the test (no hang)."""

    def __init__(self, pure: bool) -> None:
        self.pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                        initializer=engine_env.choose_build,
                                        initargs=("1" if pure else "0",))

    def apply(self, fn: Any, args: tuple[Any, ...] = ()) -> Any:
        return self.pool.submit(fn, *args).result(timeout=300)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


@pytest.fixture(scope="module")
def children() -> Iterator[tuple[_Child, _Child]]:
    source, compiled = _Child(True), _Child(False)
    try:
        built = compiled.apply(engine_runs.builds)
        if not all(b.startswith("compiled") for b in built.values()):
            pytest.skip(f"the engine is not compiled in this checkout: {built}")
        assert source.apply(engine_runs.builds) == dict.fromkeys(ENGINE, "Python source")
        yield source, compiled
    finally:
        source.close()
        compiled.close()


@settings(max_examples=120, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(program=P.program_strategy(max_steps=25, renew=True),
       fences=st.sampled_from(["lazy", "eager"]), fenced=st.booleans())
def test_both_builds_run_programs_alike(children, program, fences, fenced):
    source, compiled = children
    args = (program, fenced, fences)
    want = source.apply(engine_runs.sequential, args)
    got = compiled.apply(engine_runs.sequential, args)
    assert got == want
    if fenced:
        assert got[1] == 0  # no hazard


@settings(max_examples=15, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(programs=st.lists(P.program_strategy(max_steps=30), min_size=2, max_size=4),
       fences=st.sampled_from(["lazy", "eager"]), seed=st.integers(0, 2**16))
def test_both_builds_order_concurrent_threads(children, programs, fences, seed):
    for child in children:
        out = child.apply(engine_runs.concurrent, (programs, fences, seed))
        assert out["errors"] == 0, out["first_error"]
        assert (out["hazards"], out["outstanding"], out["events_in_use"]) == (0, 0, 0), out


def test_the_comparison_is_not_vacuous(children):
    """The programs compared queue waits and record events, and the threads
    launch and wait, on both builds."""
    import random

    rng = random.Random(7)
    waits = events = 0
    for _ in range(10):
        calls = children[1].apply(engine_runs.sequential, (P.random_program(rng), True, "lazy"))[0]
        waits += calls.get("cuStreamWaitEvent", 0)
        events += calls.get("cuEventRecord", 0)
    assert waits > 10 and events > 10
    progs = [P.random_program(random.Random(i), max_steps=30) for i in range(4)]
    launches = sum(isinstance(step, P.Launch) for prog in progs for step in prog.steps)
    assert launches >= 20
    for child in children:
        out = child.apply(engine_runs.concurrent, (progs, "lazy", 1))
        assert out["launches"] == launches and out["waits"] > 5, out


def test_both_builds_run_the_direct_launch(children):
    """The direct launch (``launcher.launch``) is one code in both builds:
    run as Python it packs the same parameter slots, queues the same wait and
    commits the same use as compiled, and only its last step (the driver
    layer's ``launch_kernel`` here: no libcuda on this machine) is the same
    call. Fails if the source build hands the launch back."""
    source, compiled = children
    got = {}
    for child, build in ((source, "source"), (compiled, "compiled")):
        out = child.apply(engine_runs.direct_launch)
        assert out["compiled"] == (build == "compiled")
        assert out["taken"], f"the {build} build handed the direct launch back"
        assert out["launches"] == out["by_driver"] == 1, out
        ((function, grid, block, shmem, stream, slots),) = out["called"]
        assert (function, grid, block, shmem, stream) == (0x1234, (2, 1, 1), (32, 1, 1), 0,
                                                          out["stream"])
        assert slots == out["expect"]
        assert out["waits"] == 1 and out["x_read_on_b"], out
        got[build] = (out["waits"], slots == out["expect"])
    assert got["source"] == got["compiled"]


def test_both_builds_take_new_arrays_and_streams_on_the_direct_launch(children):
    """A launch whose arrays no launch met (no cached fields) and whose stream
    object has no handle cached stays on the direct launch in both builds: the
    state's ``fields_of`` makes each array's fields once, the stream resolves
    as the Python path resolves it, the same slots are packed and the same wait
    queued; the next launch with them makes nothing. Where ``fields_of`` answers
    None the launch is handed back with nothing queued."""
    for child in children:
        out = child.apply(engine_runs.direct_launch, (True,))
        assert out["taken"] and out["again"] and out["stream_cached"], out
        assert out["made"] == 2, out
        (first, second) = out["called"]
        assert first[4] == second[4] == out["stream"]
        assert first[5] == second[5] == out["expect"]
        assert out["waits"] == 1 and out["x_read_on_b"], out
        refused = child.apply(engine_runs.direct_launch, (True, True))
        assert not refused["taken"] and refused["called"] == [], refused
        assert refused["made"] == 1 and refused["waits"] == 0 and refused["launches"] == 0


def test_both_builds_reuse_a_recent_launch_only_for_the_same_arguments(children):
    """A launch with the arguments of one of the kernel's recent launches
    (the same arrays' fields, the same scalars: an int of the same value)
    reuses its plan, entries and parameters in both builds, once those
    arguments were met twice; any other argument is packed afresh, and the
    waits are decided afresh (a write of ``x`` on another stream since is
    waited for). A plan whose module was unloaded hands the launch back and
    its slot is dropped; the plan Numba makes next takes its place. A freed
    block, also under an empty view, hands the launch back with nothing
    queued, and the slots naming it are dropped. Threads launching one
    kernel with arguments of their own each pass their own. Fails if a
    launch passes another launch's parameters or skips a wait."""
    names = ("first", "same", "third", "other_int", "equal_int", "writer", "after_write", "view",
             "view_again", "view_third", "unloaded", "replanned", "before_free", "empty",
             "empty_again", "empty_third", "freed", "freed_empty")
    for child in children:
        out = child.apply(engine_runs.recalled_launches)
        for name in names:
            got = out[name]
            assert got["slots"] == got["expect"], (out["compiled"], name, got)
            assert got["taken"] == bool(got["expect"]), (name, got)
        reused = {name: out[name]["recalled"] for name in names if name != "writer"}
        assert reused == {"first": 0, "same": 0, "third": 1, "other_int": 0, "equal_int": 1,
                          "after_write": 1, "view": 0, "view_again": 0, "view_third": 1,
                          "unloaded": 0, "replanned": 0, "before_free": 1, "empty": 0,
                          "empty_again": 0, "empty_third": 1, "freed": 0,
                          "freed_empty": 0}, reused
        assert out["replanned"]["functions"] == out["before_free"]["functions"] == [0x3333]
        assert out["slots_left"] == 1  # the view's: the freed launches dropped theirs
        assert out["first"]["waits"] == 1  # x's allocation on stream a
        assert out["same"]["waits"] == out["third"]["waits"] == 0
        assert out["after_write"]["waits"] == 1, out["after_write"]  # w wrote x on a since
        assert out["threads_wrong"] == 0
