"""The race reports, one format wherever a race is found (check mode, the
simulator's checker): both sides' stacks (the user's frames, innermost
first, as deep as ``NUMBA_STREAMSAFE_STACK_DEPTH`` says), where the memory
was allocated (and freed), who made each stream, and a fix written for the
program's kind (an event for plain Numba, the annotation for tracked
kernels); the same as one JSON object (``Hazard.record``).

The lines are found by the markers of this file's source, so a report that
names another line, or none, fails.
"""

from __future__ import annotations

import gc
import json
import os

import numpy as np
import pytest
from numba import cuda

import numba_streamsafe as nss
from numba_streamsafe.core import sites
from numba_streamsafe.core.errors import InvalidArgument
from numba_streamsafe.core.hazards import NUMBA, TRACKED
from numba_streamsafe.core.settings import reload_settings
from numba_streamsafe.core.streams import (
    forget_stream,
    note_stream_created,
    note_stream_seen,
    stream_origin,
)
from numba_streamsafe.numba import sim_plugin
from tests.helpers.sim_kernels import copy, fill, tracked_copy, tracked_fill

N = 64
HERE = os.path.abspath(__file__)
with open(HERE) as _f:
    _SOURCE = _f.read().splitlines()


def line(marker: str) -> int:
    """The line of this file that ends with the comment ``# <marker>``."""
    found = [i + 1 for i, text in enumerate(_SOURCE) if text.rstrip().endswith(f"# <{marker}>")]
    assert len(found) == 1, (marker, found)
    return found[0]


def produce(kind: str, stream, x) -> None:
    (fill if kind == "plain" else tracked_fill)[1, N, stream](x, 1.0)  # <producer>


def racy(kind: str):
    """A producer on ``a`` (through :func:`produce`), a consumer on ``b``, not ordered."""
    a, b = cuda.stream(), cuda.stream()  # <streams>
    x = cuda.device_array(N, np.float32, stream=a)  # <allocation>
    y = cuda.device_array(N, np.float32, stream=b)
    produce(kind, a, x)  # <helper call>
    (copy if kind == "plain" else tracked_copy)[1, N, b](x, y)  # <consumer>
    return a, b, x, y


def assert_full_report(hazard, kind: str) -> None:
    """``hazard`` (the read of ``x`` on ``b`` after its write on ``a``) names
    both stacks, the allocation, the streams' creators and the fix, as
    fields, as text and as JSON."""
    first, second = hazard.first, hazard.second
    assert hazard.kind == "read-after-write"
    assert first.stack[:2] == ((HERE, line("producer")), (HERE, line("helper call"))), first
    assert second.stack[0] == (HERE, line("consumer")), second
    assert hazard.allocated[0] == (HERE, line("allocation")), hazard.allocated
    library = NUMBA if kind == "plain" else TRACKED
    assert first.library == second.library == library
    for side in (first, second):
        assert side.origin is not None and side.origin.library == "numba", side
        assert side.origin.stack[0] == (HERE, line("streams")), side.origin
    name = os.path.basename(HERE)
    text = hazard.report()
    assert text.startswith(f"race: {hazard}")
    assert "first (write): " in text and "second (read): " in text, text
    assert f"{name}:{line('helper call')}   produce(kind, a, x)  # <helper call>" in text, text
    assert "memory allocated at:\n      " in text, text
    assert f"made by numba at {os.path.relpath(HERE)}:{line('streams')}" in text, text
    fix = hazard.fix()
    assert fix and f"fix: {fix}" in text
    if kind == "plain":  # the event to add, at the lines named
        assert f"after {os.path.relpath(HERE)}:{line('producer')}, add:   " \
               f"ev = cuda.event(); ev.record(<stream {first.stream:#x}>)" in fix, fix
        assert f"before {os.path.relpath(HERE)}:{line('consumer')} (the second), add:   " \
               f"ev.wait(<stream {second.stream:#x}>)" in fix, fix
    else:
        assert "declare the arguments' accesses" in fix and "tracked copy" in fix, fix
        assert "where tracking was off for this work" in fix, fix
    record = json.loads(json.dumps(hazard.record()))
    assert record["first"]["stack"][0] == [HERE, line("producer")]
    assert record["second"]["stack"][0] == [HERE, line("consumer")]
    assert record["allocated"][0] == [HERE, line("allocation")]
    assert record["first"]["access"] == "write" and record["second"]["access"] == "read"
    assert record["first"]["stream_origin"]["stack"][0] == [HERE, line("streams")]
    assert record["fix"] == fix and record["report"] == text


@pytest.mark.parametrize("kind", ["plain", "tracked"])
def test_check_mode_reports_both_stacks_the_allocation_the_streams_and_the_fix(checked,
                                                                               kind):
    racy(kind)
    found = list(checked.resource.race_log.hazards)
    assert len(found) == 1, found
    assert_full_report(found[0], kind)


@pytest.fixture
def simulated(rt):
    """``rt`` with Numba's work routed to it (the plugin selected): the
    simulator's checker sees plain Numba's launches and copies."""
    from numba_streamsafe.numba import emm  # noqa: F401 - its companion: transparent mode's hooks

    sim_plugin.install()
    try:
        yield rt
    finally:
        sim_plugin.uninstall()


@pytest.mark.parametrize("kind", ["plain", "tracked"])
def test_the_simulators_checker_reports_in_the_same_format(simulated, kind):
    """The simulator's own hazards (ordering mode, the ordering switched off
    for the block) carry the same fields and text."""
    off = nss.transparent(False) if kind == "plain" else nss.tracking(False)
    with nss.race_check(stop_at_first=False) as check, off:
        racy(kind)
    assert len(check.hazards) == 1, check.hazards
    assert_full_report(check.hazards[0], kind)


def test_a_race_detected_carries_the_full_report(checked):
    with pytest.raises(nss.RaceDetected) as info, nss.race_check():
        racy("plain")
    assert str(info.value) == info.value.hazard.report()
    assert "fix: " in str(info.value) and "memory allocated at:" in str(info.value)


def test_a_free_that_races_names_where_the_memory_was_dropped(checked):
    a, b = cuda.stream(), cuda.stream()
    x = cuda.device_array(N, np.float32, stream=a)  # <freed allocation>
    y = cuda.device_array(N, np.float32, stream=b)
    fill[1, N, a](x, 1.0)
    a.synchronize()
    copy[1, N, b](x, y)  # <reader>
    del x  # <drop>
    gc.collect()
    checked.flush()  # the free the finalizer queued is made now
    found = list(checked.resource.race_log.hazards)
    assert [h.kind for h in found] == ["write-after-read"], found
    hazard = found[0]
    assert hazard.first.stack[0] == (HERE, line("reader"))
    assert hazard.second.label == "cuMemFreeAsync"
    assert hazard.second.stack[0] == (HERE, line("drop")), hazard.second
    assert hazard.freed[0] == (HERE, line("drop"))
    assert hazard.allocated[0] == (HERE, line("freed allocation"))
    fix = hazard.fix()
    assert f"before {os.path.relpath(HERE)}:{line('drop')} (the free)" in fix, fix
    assert "the free of the memory" in hazard.report()


def test_a_use_after_free_on_the_simulator_names_the_free(rt):
    """The simulator's checker: a use of freed memory names the free (its
    stack, as the resource told it) as the first side."""
    driver = rt.driver
    s = driver.create_stream()
    block = rt.allocate(256, s)
    ptr = block.ptr
    rt.deallocate(block)  # <free>
    rt.reap()
    driver.trace_access(s, [(ptr, 256, nss.Access.READ, "src")], "late read",
                        stack=sites.capture_stack())  # <late read>
    hazard = driver.hazards[-1]
    assert hazard.kind == "use-after-free"
    assert hazard.first is not None and hazard.first.label == "cuMemFreeAsync"
    assert hazard.first.stack[0] == (HERE, line("free")), hazard.first
    assert hazard.second.stack[0] == (HERE, line("late read")), hazard.second
    assert hazard.freed[0] == (HERE, line("free")) and hazard.allocated
    assert "memory freed at:" not in hazard.report() or hazard.second.label != "cuMemFreeAsync"


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_the_stack_depth_setting(checked, monkeypatch, depth):
    monkeypatch.setenv("NUMBA_STREAMSAFE_STACK_DEPTH", str(depth))
    reload_settings()
    try:
        racy("plain")
    finally:
        monkeypatch.delenv("NUMBA_STREAMSAFE_STACK_DEPTH")
        reload_settings()
    hazard = checked.resource.race_log.hazards[0]
    assert len(hazard.first.stack) == min(depth, 3)  # producer, helper call, this test
    assert len(hazard.second.stack) == min(depth, 2)
    if depth == 0:
        assert hazard.first.site is None and "(its line is not known)" in hazard.fix()
    else:
        assert hazard.first.stack[0] == (HERE, line("producer"))


@pytest.mark.parametrize("value", ["-1", "257", "eight"])
def test_a_bad_stack_depth_is_refused_naming_the_setting(monkeypatch, value):
    monkeypatch.setenv("NUMBA_STREAMSAFE_STACK_DEPTH", value)
    try:
        with pytest.raises(InvalidArgument, match=f"NUMBA_STREAMSAFE_STACK_DEPTH={value!r}"):
            reload_settings()
    finally:
        monkeypatch.delenv("NUMBA_STREAMSAFE_STACK_DEPTH")
        reload_settings()


def _nested(levels: int):
    if levels:
        return _nested(levels - 1)  # <nested>
    return sites.user_stack(), sites.capture_stack()  # <capture>


def test_a_stack_is_the_users_frames_innermost_first_and_stops_at_the_test_runner():
    """The frames of this file, from the capture down to this test (pytest's
    own frames below it are not the user's: the walk stops there), their
    lines as ``f_lineno`` reads them; the unresolved capture resolves to them."""
    stack, raw = _nested(2)
    here = (HERE, line("capture"))
    test_line = next(i + 1 for i, text in enumerate(_SOURCE)
                     if "stack, raw = _nested(2)" in text)
    assert stack == (here, (HERE, line("nested")), (HERE, line("nested")), (HERE, test_line))
    assert sites.resolve_stack(raw)[1:] == stack[1:]
    assert sites.resolve_stack(stack) is stack and sites.resolve_stack(None) == ()


def test_the_stream_origin_registry():
    handle = 0x7F00_0000
    try:
        assert stream_origin(handle) is None
        seen = note_stream_seen(handle, "wrapped by numba.cuda.external_stream()")
        assert seen.library is None and seen.stack[0][0] == HERE
        made = note_stream_created(handle, "cupy", ((HERE, 1),))
        assert stream_origin(handle) is made and made.how == "made"
        assert note_stream_seen(handle, "first used") is made  # a creation is kept
        forget_stream(handle, seen)  # not the one known: kept
        assert stream_origin(handle) is made
        forget_stream(handle, made)
        assert stream_origin(handle) is None
    finally:
        forget_stream(handle)


def test_a_stream_origin_resolves_its_stack_when_read_and_copies_and_pickles():
    """A creation keeps its stack as captured (code objects); the lines are
    made when it is first read, and an origin copies, pickles and compares
    by its resolved fields."""
    import copy
    import dataclasses
    import pickle

    from numba_streamsafe.core.hazards import Side

    handle = 0x7F00_0001
    try:
        made = note_stream_created(handle, "numba")
        raw = made._stack
        assert raw and raw[0].__class__ is not tuple  # captured, not resolved yet
        assert made.stack[0] == (HERE, made.stack[0][1]) and made._stack is made.stack
        for other in (copy.copy(made), copy.deepcopy(made), pickle.loads(pickle.dumps(made))):
            assert other == made and hash(other) == hash(made) and other is not made
        fresh = note_stream_created(handle, "numba")  # pickled before it was ever read
        assert pickle.loads(pickle.dumps(fresh)).stack == fresh.stack
        side = Side("k", None, handle, origin=fresh)
        assert dataclasses.asdict(side)["origin"] == fresh
        with pytest.raises(AttributeError, match="immutable"):
            made.how = "seen"  # type: ignore[misc]
    finally:
        forget_stream(handle)


def test_numbas_streams_are_noted_where_they_are_made(rt):
    sim_plugin.install()
    try:
        s = cuda.stream()  # <made>
        handle = rt.stream_handle(s)
    finally:
        sim_plugin.uninstall()
    origin = stream_origin(handle)
    assert origin is not None and origin.library == "numba" and origin.how == "made"
    assert origin.stack[0] == (HERE, line("made"))
