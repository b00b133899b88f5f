"""Transparent mode on Numba's CUDA simulator: plain Numba code on the
plugin's memory, ordered by the library and checked by the simulated driver.

Each race is shown twice: with transparent mode on (no hazard) and inside
``nss.transparent(False)`` (the negative control: the checker reports it,
naming the kernel or copy, the argument, the stream and this file's line).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numba import cuda

import numba_streamsafe as nss
from numba_streamsafe.core.access import Access
from numba_streamsafe.numba import emm, program_order, sim_plugin, transparent  # noqa: F401 - emm: companion
from tests.helpers.programs import launch
from tests.helpers.sim_kernels import copy, fill, tracked_fill

ROOT = Path(__file__).resolve().parents[2]
N = 64
HERE = os.path.basename(__file__)


@cuda.jit
def add_one(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1


@pytest.fixture
def plain(rt):
    """The plugin selected on the simulator for one test: Numba's allocation calls
    routed to the library and transparent mode installed."""
    assert not sim_plugin.installed()
    sim_plugin.install()
    assert transparent.installed()
    try:
        yield rt
    finally:
        sim_plugin.uninstall()
    assert not transparent.installed()


def _hazards(rt):
    return list(rt.driver.hazards)


def _on_and_off(rt, program):
    """Run ``program()`` with transparent mode on, then off; the hazards of each."""
    program()
    on = _hazards(rt)
    rt.driver.hazards.clear()
    with nss.transparent(False):
        program()
    off = _hazards(rt)
    rt.driver.hazards.clear()
    return on, off


def test_plain_kernels_across_streams_are_ordered(plain, streams):
    a, b = streams

    def program():
        x = cuda.device_array(N, dtype=np.int64)
        y = cuda.device_array(N, dtype=np.int64)
        fill[1, N, a](x, 7)
        copy[1, N, b](x, y)              # reads what a wrote
        out = y.copy_to_host(stream=b)
        b.synchronize()
        assert (out == 7).all()

    on, off = _on_and_off(plain, program)
    assert on == []
    text = "\n".join(str(h) for h in off)
    assert "'fill' argument 'out'" in text and "'copy' argument 'src'" in text
    assert HERE in text  # the user's line, not the library's


def test_numba_copy_to_host_after_a_tracked_write_is_ordered(plain, streams):
    a, b = streams

    def program():
        x = cuda.device_array(N, dtype=np.int64)
        tracked_fill[1, N, a](x, 3)
        out = x.copy_to_host(stream=b)
        b.synchronize()
        assert (out == 3).all()

    on, off = _on_and_off(plain, program)
    assert on == []
    assert any("copy to host (Numba)" in str(h) for h in off)


def test_a_free_after_a_plain_read_on_another_stream_waits_for_it(plain, streams):
    a, b = streams

    def program():
        with nss.stream_scope(a):
            x = cuda.device_array(N, dtype=np.int64)
        fill[1, N, a](x, 1)
        y = cuda.device_array(N, dtype=np.int64)
        copy[1, N, b](x, y)              # a read of x on b
        del x
        with nss.stream_scope(a):
            z = cuda.device_array(N, dtype=np.int64)  # reuses x's memory on a
        fill[1, N, a](z, -1)
        plain.driver.synchronize()

    on, off = _on_and_off(plain, program)
    assert on == []
    assert any("'copy' argument 'src'" in str(h) for h in off)


def test_numbas_events_and_synchronize_are_seen_by_the_checker(plain, streams):
    """Ordered by Numba alone (transparent mode off): no false race. Without
    the event, the race is reported with names and this file's lines."""
    a, b = streams

    def program(with_event: bool):
        x = cuda.device_array(N, dtype=np.int64)
        y = cuda.device_array(N, dtype=np.int64)
        a.synchronize()                  # x's allocation (default stream) is ordered ...
        cuda.synchronize()               # ... before both streams by the host
        fill[1, N, a](x, 5)
        if with_event:
            done = cuda.event()
            done.record(a)
            done.wait(b)
        copy[1, N, b](x, y)
        b.synchronize()
        out = y.copy_to_host()           # default stream, after the host's wait for b
        assert (out == 5).all()

    with nss.transparent(False):
        program(True)
        assert _hazards(plain) == []
        program(False)
    text = "\n".join(str(h) for h in _hazards(plain))
    assert "read-after-write" in text and "'fill' argument 'out'" in text
    assert "'copy' argument 'src'" in text and HERE in text


def _waits(rt):
    stats = nss.memory_stats()
    return stats["waits_inserted"], stats["waits_skipped"]


def _consumer_waits(rt, launch):
    """``launch()``'s waits: those the library queued and those it skipped."""
    before = _waits(rt)
    launch()
    inserted, skipped = (n - m for n, m in zip(_waits(rt), before, strict=True))
    return inserted, skipped


@pytest.mark.parametrize("order", ["event", "event-synchronize", "stream-synchronize",
                                   "device-synchronize", "none"])
def test_waits_the_programs_own_synchronisation_satisfies_are_skipped(plain, streams, order):
    """A consumer on another stream that the program itself ordered after the
    producer (a Numba event it records and waits for, or a host synchronise)
    needs no wait of the library's: none is queued, it is counted as skipped,
    and the checker sees no race. With no ordering of the program's (the
    negative control) the library queues the wait."""
    a, b = streams
    x = cuda.device_array(N, dtype=np.int64)
    y = cuda.device_array(N, dtype=np.int64)
    cuda.synchronize()
    fill[1, N, a](x, 7)
    if order.startswith("event"):
        done = cuda.event()
        done.record(a)
        if order == "event":
            done.wait(b)
        else:
            done.synchronize()
    elif order == "stream-synchronize":
        a.synchronize()
    elif order == "device-synchronize":
        cuda.synchronize()
    inserted, skipped = _consumer_waits(plain, lambda: copy[1, N, b](x, y))
    b.synchronize()
    assert (y.copy_to_host() == 7).all()
    assert _hazards(plain) == []
    # y's allocation (on the default stream) was completed by the host's first
    # cuda.synchronize(): its wait is skipped in every case.
    if order == "none":
        assert (inserted, skipped) == (1, 1)
    else:
        assert (inserted, skipped) == (0, 2)


def test_an_event_record_that_fails_orders_nothing(plain, streams, monkeypatch):
    """The program's record of an event on ``a`` is refused: the event keeps
    its earlier record (on an idle stream), so a wait for it orders ``b``
    after nothing of ``a``, and the library still queues its own wait."""
    from numba_streamsafe.core.errors import DriverError

    a, b = streams
    c = cuda.stream()
    x = cuda.device_array(N, dtype=np.int64)
    y = cuda.device_array(N, dtype=np.int64)
    cuda.synchronize()
    event = cuda.event()
    event.record(c)                  # a point on the idle stream c
    fill[1, N, a](x, 7)
    real = plain.driver.event_record
    programs = event.__dict__["_nss_event"][1]  # the simulated driver's handle of it
    refused = []

    def refuse_the_programs_record(handle, stream):
        if handle != programs:
            return real(handle, stream)  # the library's own event, once the record failed
        refused.append(handle)
        raise DriverError("cuEventRecord", 400, "refused (test)")

    monkeypatch.setattr(plain.driver, "event_record", refuse_the_programs_record)
    with pytest.raises(DriverError):
        event.record(a)
    monkeypatch.setattr(plain.driver, "event_record", real)
    assert refused == [programs]
    event.wait(b)
    inserted, _ = _consumer_waits(plain, lambda: copy[1, N, b](x, y))
    b.synchronize()
    assert inserted == 1
    assert (y.copy_to_host() == 7).all() and _hazards(plain) == []


def _events_recorded():
    return nss.memory_stats()["events_recorded"]


def test_a_program_that_orders_itself_records_no_event_of_the_librarys(plain, streams):
    """Each event the program records closes its stream's mark, which borrows
    the program's event: over rounds of a producer and a consumer ordered by
    two Numba events, the library records no event and queues no wait, and
    holds no event at the end."""
    a, b = streams
    x = cuda.device_array(N, dtype=np.int64)
    y = cuda.device_array(N, dtype=np.int64)
    made, consumed = cuda.event(), cuda.event()
    cuda.synchronize()
    recorded, (inserted, _) = _events_recorded(), _waits(plain)
    for k in range(20):
        fill[1, N, a](x, k)
        made.record(a)
        made.wait(b)
        copy[1, N, b](x, y)
        consumed.record(b)
        consumed.wait(a)
    cuda.synchronize()
    assert (y.copy_to_host() == 19).all() and _hazards(plain) == []
    assert _events_recorded() == recorded
    assert _waits(plain)[0] == inserted
    del x, y
    nss.get_runtime().flush()
    assert nss.memory_stats()["events.in_use"] == 0


def test_an_event_recorded_again_gives_the_mark_it_closed_an_event_of_its_own(plain, streams):
    """The program records an event on ``a`` after writing ``x`` there, then
    records the same event again on another stream: the mark that borrowed
    the first record (``x`` still refers to it) gets an event of the
    library's, recorded on ``a``, and a consumer the program does not order
    waits for that one, not for the event's new record (negative control:
    the same program unordered, where the checker reports the race)."""
    a, b = streams
    c = cuda.stream()

    def program(ordered):
        x = cuda.device_array(N, dtype=np.int64)
        y = cuda.device_array(N, dtype=np.int64)
        z = cuda.device_array(N, dtype=np.int64)
        cuda.synchronize()
        event = cuda.event()
        fill[1, N, a](x, 7)
        event.record(a)                 # a's mark borrows it
        fill[1, N, c](z, 1)
        recorded = _events_recorded()
        event.record(c)                 # again, elsewhere: the mark needs its own
        if ordered:
            assert _events_recorded() == recorded + 1
        copy[1, N, b](x, y)             # the program orders b after nothing
        b.synchronize()
        if ordered:
            assert (y.copy_to_host() == 7).all()

    program(True)
    assert _hazards(plain) == []
    with nss.transparent(False):
        program(False)
    off = _hazards(plain)
    assert off and any("copy" in str(h) for h in off)


def test_a_use_after_the_programs_event_is_still_waited_for(plain, streams):
    """The program's event covers what was queued before it was recorded: a
    write on the producer's stream after the record is waited for."""
    a, b = streams
    x = cuda.device_array(N, dtype=np.int64)
    y = cuda.device_array(N, dtype=np.int64)
    cuda.synchronize()
    fill[1, N, a](x, 1)
    done = cuda.event()
    done.record(a)
    fill[1, N, a](x, 9)              # after the event: not covered by it
    done.wait(b)
    inserted, _ = _consumer_waits(plain, lambda: copy[1, N, b](x, y))
    b.synchronize()
    assert inserted == 1
    assert (y.copy_to_host() == 9).all() and _hazards(plain) == []


def test_streams_made_and_dropped_in_a_loop_go(plain):
    """A stream made per step reads an array every step reads and writes one
    every step writes, hands its work to a long-lived stream through an
    event and is dropped; the long-lived stream is synchronised every five
    steps and the device every ten. The dropped streams die and are
    destroyed as the program goes: the live streams, the reads the shared
    array keeps, the streams waiting for its allocation and the program's
    clocks stay a handful, not one per stream made, and so do the simulated
    driver's clocks."""
    src = cuda.to_device(np.arange(N, dtype=np.int64))
    dst = cuda.device_array(N, dtype=np.int64)
    hub = cuda.stream()
    for i in range(300):
        s = cuda.stream()
        copy[1, N, s](src, dst)
        done = cuda.event()
        done.record(s)
        done.wait(hub)
        if i % 5 == 4:
            hub.synchronize()
        if i % 10 == 9:
            cuda.synchronize()
    del s, done
    copy[1, N, cuda.stream()](src, dst)  # destroys the streams of the objects that died
    driver = plain.driver
    assert driver.streams_created >= 300
    assert driver.live_streams <= 16, driver.live_streams
    last_write, reads = plain.resource.block_events(nss.block_of(src))
    assert len(reads) <= 12, len(reads)
    assert len(last_write.waiting()) <= 12, len(last_write.waiting())
    assert len(driver.system.host_clock) <= 64, len(driver.system.host_clock)
    book = plain.resource.marks
    assert len(book.done) <= 16 and len(book.ordered[plain.stream_handle(hub)][1]) <= 16
    cuda.synchronize()
    assert (dst.copy_to_host() == np.arange(N)).all()
    assert _hazards(plain) == []


def test_the_default_streams_are_the_default_handles(plain):
    assert plain.stream_handle(cuda.default_stream()) in (0, 2)
    assert plain.stream_handle(cuda.legacy_default_stream()) == 0
    assert plain.stream_handle(cuda.per_thread_default_stream()) == 2


@pytest.mark.parametrize("operation", ["copy_to_device", "device_copy", "setitem", "getitem",
                                       "forall", "host_argument"])
def test_numbas_copies_and_launches_are_ordered(plain, streams, operation):
    a, b = streams

    def program():
        x = cuda.device_array(N, dtype=np.int64)
        y = cuda.device_array(N, dtype=np.int64)
        fill[1, N, a](x, 2)
        if operation == "copy_to_device":
            x.copy_to_device(np.full(N, 9, np.int64), stream=b)   # write after a's write
            expect = 9
        elif operation == "device_copy":
            y.copy_to_device(x, stream=b)                         # read after a's write
            x = y
            expect = 2
        elif operation == "setitem":
            x.bind(b)[:] = 4                                      # on b, after a's write
            expect = 4
        elif operation == "getitem":
            assert x.bind(b)[3] == 2                              # an element read on b
            expect = 2
        elif operation == "forall":
            add_one.forall(N, 32, b)(x)                           # read-write on b
            expect = 3
        else:
            host = np.zeros(N, np.int64)
            copy[1, N, b](x, host)                                # Numba transfers host
            assert (host == 2).all()
            expect = 2
        b.synchronize()
        plain.driver.synchronize()
        assert (x.copy_to_host() == expect).all()

    on, off = _on_and_off(plain, program)
    assert on == []
    assert off, f"{operation}: the negative control showed no race"


def test_a_device_function_and_a_varargs_kernel_are_left_to_numba(plain):
    @cuda.jit(device=True)
    def twice(v):
        return 2 * v

    @cuda.jit
    def use(x):
        i = cuda.grid(1)
        if i < x.size:
            x[i] = twice(i)

    x = cuda.device_array(N, dtype=np.int64)
    use[1, N](x)
    assert (x.copy_to_host() == 2 * np.arange(N)).all()
    assert use.__dict__["_nss_plain"].kind.name == "plain kernel"
    assert "_nss_plain" not in twice.__dict__


def test_a_plain_kernel_has_every_field_of_a_tracked_one(plain):
    """Plain and tracked kernels are one class set up in one place: a field a
    tracked kernel gets, a plain one gets too, and only the kind tells them
    apart."""
    from numba_streamsafe.numba.launch.kernel import PLAIN, TRACKED

    @cuda.jit
    def use(x):
        i = cuda.grid(1)
        if i < x.size:
            x[i] = i

    x = cuda.device_array(N, dtype=np.int64)
    use[1, N](x)
    plain_kernel = use.__dict__["_nss_plain"]
    assert type(plain_kernel) is type(tracked_fill)
    assert set(vars(plain_kernel)) == set(vars(tracked_fill))
    assert (plain_kernel.kind, tracked_fill.kind) == (PLAIN, TRACKED)


def test_tracked_kernels_are_fenced_once(plain, streams):
    """A tracked launch that goes through Numba's path is not fenced again by
    transparent mode (one trace entry, one operation)."""
    a, _ = streams
    x = cuda.device_array(N, dtype=np.int64)
    with nss.trace() as t:
        tracked_fill[1, N, a](x, 1)
        nss.copy_to_host(x, stream=a)
    assert [(op.kind, op.label) for op in t.ops] == [("launch", "tracked_fill"),
                                                     ("copy", "copy to host")]


OPS = st.lists(st.tuples(st.sampled_from(["fill", "copy", "add", "to_host", "upload",
                                           "event", "record", "event_sync", "sync",
                                           "device_sync"]),
                         st.integers(0, 2), st.integers(0, 2), st.integers(0, 2)),
               min_size=1, max_size=12)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_random_plain_programs_have_no_hazard_and_the_sequential_result(plain, ops):
    """Random plain-Numba programs over three streams and three arrays, with the
    program's own events (two, recorded again and again) and synchronises among
    them: in transparent mode no
    hazard (the waits the program's ordering satisfies are skipped, and the
    checker would see a skip too many), and every value as if run in program
    order."""
    run_plain_program(plain, ops)


#: Programs of launches and the program's two events only (no host synchronise,
#: which would complete every mark): marks that borrowed an event are often
#: still needed once the event is recorded again, on another stream.
EVENT_OPS = st.lists(st.tuples(st.sampled_from(["fill", "copy", "add", "event", "record"]),
                               st.integers(0, 2), st.integers(0, 2), st.integers(0, 2)),
                     min_size=4, max_size=10)


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=EVENT_OPS)
def test_random_programs_recording_their_events_again_have_no_hazard(plain, ops):
    """As above, with the program's events recorded again and again between
    launches: the library's waits for marks that borrowed an event's earlier
    record still order what they must (no hazard, the sequential result)."""
    run_plain_program(plain, ops)


def run_plain_program(plain, ops):
    """One program of :data:`OPS` (see the test above); the skipped waits."""
    skipped0 = nss.memory_stats()["waits_skipped"]
    streams = [cuda.stream() for _ in range(3)]
    arrays = [cuda.to_device(np.zeros(N, np.int64)) for _ in range(3)]
    model = [np.zeros(N, np.int64) for _ in range(3)]
    # Two events, recorded again and again: a mark that borrowed one's earlier
    # record needs an event of the library's before the next.
    events = [cuda.event(), cuda.event()]
    plain.driver.hazards.clear()
    for step, (kind, s, i, j) in enumerate(ops):
        stream = streams[s]
        if kind == "fill":
            fill[1, N, stream](arrays[i], step)
            model[i][:] = step
        elif kind == "copy" and i != j:
            copy[1, N, stream](arrays[i], arrays[j])
            model[j][:] = model[i]
        elif kind == "add":
            add_one[1, N, stream](arrays[i])
            model[i] += 1
        elif kind == "to_host":
            out = arrays[i].copy_to_host(stream=stream)
            stream.synchronize()
            assert (out == model[i]).all()
        elif kind == "upload":
            arrays[i].copy_to_device(np.full(N, -step, np.int64), stream=stream)
            model[i][:] = -step
        elif kind == "event":
            event = events[j % 2]
            event.record(stream)
            event.wait(streams[i])
        elif kind == "record":  # recorded, and waited for by nothing until recorded again
            events[j % 2].record(stream)
        elif kind == "event_sync":
            event = events[j % 2]
            event.record(stream)
            event.synchronize()
        elif kind == "sync":
            stream.synchronize()
        elif kind == "device_sync":
            cuda.synchronize()
    skipped = nss.memory_stats()["waits_skipped"] - skipped0
    plain.driver.synchronize()
    for got, want in zip(arrays, model, strict=True):
        assert (got.copy_to_host() == want).all()
    assert _hazards(plain) == []
    return skipped


def test_random_programs_skip_waits(plain):
    """The random programs above do skip waits (their property is not vacuous)."""
    ops = [("fill", 0, 0, 0), ("event", 0, 1, 0), ("copy", 1, 0, 1), ("sync", 1, 0, 0),
           ("add", 2, 1, 0), ("device_sync", 0, 0, 0), ("copy", 0, 1, 2)]
    assert run_plain_program(plain, ops) >= 3


def _child(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_STREAMSAFE")}
    full.update(NUMBA_ENABLE_CUDASIM="1", **env)
    full["PYTHONPATH"] = os.pathsep.join([str(ROOT), full.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=300)


EXAMPLE = """
    import runpy, sys
    import numba_streamsafe  # what the start-up hook does in an installed copy
    sys.argv = ["plain_numba_pipeline.py"]
    sys.path.insert(0, "examples")  # as `python examples/plain_numba_pipeline.py` puts it
    try:
        runpy.run_path("examples/plain_numba_pipeline.py", run_name="__main__")
    except SystemExit as exc:
        print("EXIT", exc.code)
"""


@pytest.mark.slow  # end to end (CI runs it); the default run stays under a minute
def test_the_plain_numba_example_has_hazards_with_the_mode_off_and_none_with_it_on():
    on = _child(EXAMPLE, NUMBA_CUDA_MEMORY_MANAGER="numba_streamsafe")
    off = _child(EXAMPLE, NUMBA_CUDA_MEMORY_MANAGER="numba_streamsafe",
                 NUMBA_STREAMSAFE_TRANSPARENT="0")
    assert on.returncode == 0 and off.returncode == 0, on.stderr[-2000:] + off.stderr[-2000:]
    assert "plugin loaded" in on.stdout and "hazards: 0" in on.stdout, on.stdout
    assert "hazards: 0" not in off.stdout, off.stdout
    with_names = _child(EXAMPLE.replace('print("EXIT", exc.code)', '''print("EXIT", exc.code)
    print("\\n".join(str(h) for h in numba_streamsafe.hazards()))'''),
                        NUMBA_CUDA_MEMORY_MANAGER="numba_streamsafe",
                        NUMBA_STREAMSAFE_TRANSPARENT="0")
    assert "'scale' argument 'out'" in with_names.stdout
    assert "'square' argument 'src'" in with_names.stdout
    assert "plain_numba_pipeline.py:" in with_names.stdout


def test_the_start_up_hook_loads_the_plugin_only_when_both_variables_select_it():
    code = """
        import sys
        import _numba_streamsafe_autoload
        print("before", "numba_streamsafe" in sys.modules)
        from numba import cuda
        print("after", "numba_streamsafe" in sys.modules)
    """
    selected = _child(code, NUMBA_CUDA_MEMORY_MANAGER="numba_streamsafe")
    assert "before False" in selected.stdout and "after True" in selected.stdout, selected.stderr
    plain_numba = _child(code)
    assert "after False" in plain_numba.stdout, plain_numba.stderr


@cuda.jit("void(int64[:], int64)")
def eager_fill(out, value):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = value


@cuda.jit(device=True)
def store(arr, i, value):
    arr[i] = value


@cuda.jit
def copy_through_device_function(src, dst):
    i = cuda.grid(1)
    if i < src.size:
        store(dst, i, src[i])


def test_eager_kernels_and_device_functions_are_covered(plain, streams):
    """A kernel compiled from a signature writes on a; a kernel that writes its
    argument only through a device function reads it on b, then a rewrites it."""
    a, b = streams

    def program():
        x = cuda.device_array(N, dtype=np.int64)
        y = cuda.device_array(N, dtype=np.int64)
        plain.driver.synchronize()
        eager_fill[1, N, a](x, 6)
        copy_through_device_function[1, N, b](x, y)    # y written inside store()
        eager_fill[1, N, a](y, 1)                      # after b's write of y
        plain.driver.synchronize()
        assert (y.copy_to_host() == 1).all()

    on, off = _on_and_off(plain, program)
    assert on == []
    text = "\n".join(str(h) for h in off)
    assert "'eager_fill' argument 'out'" in text
    assert "'copy_through_device_function' argument 'dst'" in text


def test_transparent_true_is_refused_where_the_process_turned_the_mode_off(monkeypatch):
    from numba_streamsafe.core.settings import reload_settings

    monkeypatch.setenv("NUMBA_STREAMSAFE_TRANSPARENT", "0")
    reload_settings()
    try:
        with pytest.raises(nss.InvalidArgument, match="NUMBA_STREAMSAFE_TRANSPARENT=0"):
            with nss.transparent(True):
                pass
        with nss.transparent(False):     # turning it off stays allowed
            pass
    finally:
        monkeypatch.delenv("NUMBA_STREAMSAFE_TRANSPARENT")
        reload_settings()
    with nss.transparent(True):
        pass


@pytest.mark.parametrize("enabled", ["no", "False", 0, 1, None, np.bool_(True)])
def test_transparent_takes_only_true_or_false(enabled):
    from numba_streamsafe.numba.scope import per_thread

    before = per_thread.transparent
    with pytest.raises(nss.InvalidArgument, match="True or False") as info:
        with nss.transparent(enabled):
            pass
    assert repr(enabled) in str(info.value)
    assert per_thread.transparent == before  # the thread's setting is as it was


def test_configured_launch_without_pre_launch_callbacks(monkeypatch):
    """numba-cuda releases before 0.30 have no ``pre_launch_callbacks`` on a
    launch configuration: the hooked call runs the tracked launch there (it
    raised AttributeError on every transparent launch on a GPU)."""
    from numba_streamsafe.numba import scope, transparent

    calls = []

    class OldConfiguration:  # numba-cuda 0.24 to 0.29: no such field
        pass

    call = transparent._config_call_hook(lambda self, *args: calls.append(("numba", args)))
    config = OldConfiguration()
    config._nss_launch = lambda *args: calls.append(("tracked", args))
    monkeypatch.setattr(scope.per_thread, "transparent", scope.FENCE)
    call(config, 1, 2)
    config.pre_launch_callbacks = [print]  # numba-cuda 0.30 with a callback: Numba's path
    call(config, 3)
    assert calls == [("tracked", (1, 2)), ("numba", (3,))]


def test_the_event_hooks_read_either_kind_of_numba_event_handle():
    """numba-cuda's events carry a cuda-python ``CUevent``, or, in older
    releases, a ``ctypes.c_void_p``: the hooks take the driver handle from
    either (``int()`` of the second raises)."""
    import ctypes

    from cuda.bindings import driver

    class Event:
        handle: object = None

    for handle in (driver.CUevent(0x1000), ctypes.c_void_p(0x1000)):
        event = Event()
        event.handle = handle
        assert program_order.event_handle(event) == 0x1000
        event.handle = None  # read once: an event's handle is fixed for its life
        assert program_order.event_handle(event) == 0x1000


def _written_on_a_stream():
    """A runtime over a simulated driver, two of its streams and a block ``x``
    written on the first (for the tests of the program's record)."""
    from numba_streamsafe._driver.sim import SimDriver
    from numba_streamsafe.resources import AsyncResource
    from numba_streamsafe.runtime import DeviceRuntime

    sim = SimDriver(backing=False)
    rt = DeviceRuntime(AsyncResource(sim))
    s1, s2 = sim.create_stream(), sim.create_stream()
    x = rt.resource.allocate(256, s1, "x")
    launch(rt, s1, [(x, Access.WRITE)], label="write x on s1")
    return sim, rt, s1, s2, x


class _Event:
    """A program's event object, as the program-order hooks keep state on it."""


@pytest.mark.parametrize("library", [True, False])
def test_a_read_on_another_stream_during_the_programs_record_waits_for_its_event(library):
    """A program's ``Event.record`` on ``s1`` after a write of ``x`` there,
    while another thread queues a read of ``x`` on ``s2``, the interleaving
    made certain: the thread starts inside the record, after the program's
    point is taken and before the driver records the event. The point's
    mark borrows the program's event, so the read must wait for that event
    as recorded: the thread waits for the resource's lock until it is. The
    negative control (``library=False``): the same read queued in the same
    window with no wait races with the write."""
    import threading

    sim, rt, s1, s2, x = _written_on_a_stream()
    handle = sim.event_create()
    queued = threading.Event()
    threads = []

    def read() -> None:
        launch(rt, s2, [(x, Access.READ)], fenced=library, label="read x on s2")
        queued.set()

    def driver_record(stream: int) -> None:
        thread = threading.Thread(target=read)
        threads.append(thread)
        thread.start()
        queued.wait(0.5)  # the read runs now unless it waits for the library
        sim.event_record(handle, stream)

    program_order.record(rt, _Event(), s1, handle, False, driver_record, (s1,))
    for thread in threads:
        thread.join()
    if library:
        sim.assert_no_hazards()
    else:
        assert sim.hazards, "the read queued before the event with no wait must race"


def test_a_record_that_another_runtimes_mark_cannot_give_up_fails_once():
    """The program recorded an event on a stream of one runtime (its closed
    mark borrows the event), then records it on a stream of another while
    the first runtime's driver refuses every record (a sticky error): that
    record raises, the first runtime's error, and the event's earlier point
    is gone with it, so the next records of the event on the second runtime
    succeed rather than retry the first runtime's mark for ever."""
    from numba_streamsafe.core.errors import DriverError

    sim1, rt1, s1, _, _ = _written_on_a_stream()
    sim2, rt2, t1, _, _ = _written_on_a_stream()
    event = _Event()
    h1, h2 = sim1.event_create(), sim2.event_create()
    program_order.record(rt1, event, s1, h1, False, sim1.event_record, (h1, s1))
    sim1.inject_failure("cuEventRecord", times=100)
    with pytest.raises(DriverError, match="cuEventRecord"):
        program_order.record(rt2, event, t1, h2, False, sim2.event_record, (h2, t1))
    for _ in range(2):
        program_order.record(rt2, event, t1, h2, False, sim2.event_record, (h2, t1))


def test_the_hooks_keep_no_dead_runtimes_mark_book_alive():
    """A runtime whose program recorded and waited for an event, then dropped:
    its mark book (and the program's events and streams its marks hold) is
    collected with it, though the hooks keep the last runtime's tracking
    state for their next call."""
    import gc
    import weakref

    sim, rt, s1, s2, x = _written_on_a_stream()
    handle = sim.event_create()
    event = _Event()
    program_order.record(rt, event, s1, handle, False, sim.event_record, (handle, s1))
    program_order.wait(rt, event, s2, None, handle, False, sim.stream_wait_event, (s2, handle))
    kept = weakref.ref(event), weakref.ref(sim)  # a mark of the book borrows the event
    del rt, x, event, sim
    gc.collect()
    assert [ref() for ref in kept] == [None, None]


@pytest.mark.parametrize("failures", [1, 2])
def test_a_failed_program_record_leaves_the_write_ordered(failures):
    """The program's ``Event.record`` fails after its point closed the
    stream's mark (the mark was to borrow the event): the mark gets an event
    of the library's instead; where that record fails too (``failures=2``),
    the mark borrows nothing and gets one when a use needs it. Either way a
    later read on another stream waits for the write, and the program's error
    is what is raised."""
    from numba_streamsafe.core.errors import DriverError

    sim, rt, s1, s2, x = _written_on_a_stream()
    handle = sim.event_create()
    sim.inject_failure("cuEventRecord", times=failures)
    with pytest.raises(DriverError, match="cuEventRecord"):
        program_order.record(rt, _Event(), s1, handle, False, sim.event_record, (handle, s1))
    launch(rt, s2, [(x, Access.READ)], label="read x on s2")
    sim.assert_no_hazards()
