"""The compiled hot path (``numba_streamsafe._hot``) against the pure-Python
code it replaces: the same random multi-stream programs give the same driver
calls, the same waits and events, the same hazards (none when fenced) and the
same final state; its parameter packing equals ``struct``'s where it packs,
and hands back exactly where ``struct`` refuses; its lock behaves as
``threading.Lock``.

The whole suite also runs with ``NUMBA_STREAMSAFE_PURE_PYTHON=1`` (CI runs
both), which leaves the module unused.
"""

from __future__ import annotations

import math
import struct
import threading

import programs as P
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import numba_streamsafe.resources.async_resource as async_resource
from numba_streamsafe.hot import hot

pytestmark = pytest.mark.skipif(hot is None, reason="the compiled hot path is not built "
                                "(or NUMBA_STREAMSAFE_PURE_PYTHON is set)")


def _outcome(program: P.Program, fenced: bool, fences: str) -> tuple:
    run = P.execute(program, fenced=fenced, fences=fences)
    res = run.res
    outcome = (dict(run.sim.calls), len(run.sim.hazards), P.accounting(res), res.counters(),
               res.marks.waits, res.events.recorded, res.events.in_use)
    P.cleanup(run)
    return outcome


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=P.program_strategy(max_steps=25), fences=st.sampled_from(["lazy", "eager"]),
       fenced=st.booleans())
def test_compiled_and_python_paths_run_programs_alike(program, fences, fenced):
    compiled = _outcome(program, fenced, fences)
    saved = async_resource._hot
    async_resource._hot = None
    try:
        python = _outcome(program, fenced, fences)
    finally:
        async_resource._hot = saved
    assert compiled == python
    if fenced:
        assert compiled[1] == 0  # no hazard


def test_the_programs_need_waits():
    """The comparison above is not vacuous: fenced programs queue waits and
    record events through the compiled path."""
    import random

    rng = random.Random(7)
    waits = events = 0
    for _ in range(20):
        run = P.execute(P.random_program(rng), fenced=True)
        waits += run.sim.calls["cuStreamWaitEvent"]
        events += run.sim.calls["cuEventRecord"]
        P.cleanup(run)
    assert waits > 20 and events > 20


_EDGES = {
    "b": [-128, 127, -129, 128, 0, -1], "B": [0, 255, 256, -1], "h": [-(1 << 15), (1 << 15) - 1,
    1 << 15], "H": [0, (1 << 16) - 1, 1 << 16, -1], "i": [-(1 << 31), (1 << 31) - 1, 1 << 31],
    "I": [0, (1 << 32) - 1, 1 << 32, -1], "q": [-(1 << 63), (1 << 63) - 1, 1 << 63],
    "Q": [0, (1 << 64) - 1, 1 << 64, -1],
    "f": [0.0, -0.0, 1.5, 3.4028234663852886e38, 3.5e38, -3.5e38, math.inf, math.nan, 1e-45,
          7, 1 << 200],
    "d": [0.0, -0.0, 1e308, math.inf, -math.inf, math.nan, 5e-324, 3, -(1 << 60), 1 << 2000],
    "?": [True, False, 0, 1, 0.5],
}


def _struct_bytes(code: str, value) -> bytes | None:
    try:
        raw = struct.pack("=" + code, value)
    except (struct.error, TypeError, OverflowError):
        return None
    return raw + b"\0" * (8 - len(raw))


@pytest.mark.parametrize("code", sorted(_EDGES))
def test_scalar_packing_matches_struct(code):
    packed = 0
    for value in _EDGES[code] + [True, False, "x", None, 2.5, 3]:
        got = hot.pack(code.encode(), (value,), (None,))
        want = _struct_bytes(code, value)
        if got is None:
            continue  # handed back: the Python path packs (or refuses) it
        assert want is not None, (code, value, got)
        assert got == want, (code, value, got, want)
        packed += 1
    assert packed >= 3  # it does pack the plain cases itself


def test_complex_and_array_packing():
    fields = struct.pack("=QQqqQqq", 0, 0, 10, 4, 0xDEAD0000, 10, 4)
    got = hot.pack(b"AZC", (object(), 1.5 - 2j, 0.25 + 4j), ((None, 0, None, fields), None, None))
    want = fields + struct.pack("=dd", 1.5, -2.0) + struct.pack("=f4xf4x", 0.25, 4.0)
    assert got == want
    # A Python float given for a complex parameter: the Python path decides.
    assert hot.pack(b"Z", (1.5,), (None,)) is None
    # Fewer codes than arguments, or an array where a scalar is expected.
    assert hot.pack(b"q", (1, 2), (None, None)) is None
    assert hot.pack(b"q", (object(),), ((None, 0, None, fields),)) is None


def test_lock_behaves_as_threading_lock():
    lock = hot.Lock()
    assert not lock.locked()
    assert lock.acquire() is True
    assert lock.locked()
    assert lock.acquire(False) is False
    assert lock.acquire(blocking=False) is False
    lock.release()
    with pytest.raises(RuntimeError, match="release unlocked lock"):
        lock.release()
    with pytest.raises(ValueError, match="no timeout"):
        lock.acquire(True, 1.0)
    with lock:
        assert lock.locked()
    assert not lock.locked()
    # Exclusion across threads: every increment survives.
    count = [0]

    def work():
        for _ in range(2000):
            with lock:
                v = count[0]
                count[0] = v + 1

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert count[0] == 16000


def test_launch_hands_back_without_libcuda():
    """With no libcuda in the process (this machine), launch() hands every
    launch back to the Python path, changing nothing."""
    if hot.available():
        pytest.skip("libcuda is loaded in this process")
    state = tuple([None] * 18)
    assert hot.launch(state, (1, 32), ()) is False


def test_more_buffers_than_the_compiled_path_takes():
    """A launch of 70 buffers (the compiled preflight and commit take 64) is
    ordered by the Python code: the waits are queued and no hazard shows."""
    from numba_streamsafe._driver.sim import SimDriver
    from numba_streamsafe.access import Access
    from numba_streamsafe.resources import AsyncResource

    sim = SimDriver(backing=False)
    res = AsyncResource(sim)
    a, b = sim.create_stream(), sim.create_stream()
    blocks = [res.allocate(64, a, f"x{i}") for i in range(70)]
    uses = [(blk, Access.WRITE) for blk in blocks]
    res.preflight(uses, a)
    sim.trace_access(a, [(blk.ptr, blk.nbytes, Access.WRITE) for blk in blocks], "writer")
    res.commit(uses, a)
    res.preflight(uses, b)
    sim.trace_access(b, [(blk.ptr, blk.nbytes, Access.WRITE) for blk in blocks], "writer")
    res.commit(uses, b)
    assert sim.calls["cuStreamWaitEvent"] == 1 and sim.hazards == []


# ------------------------------------------------------------------ Launcher
class _Kernel:
    """Stands for a TrackedKernel: ``_fast`` is its hot-path state (None: none)."""

    _fast = None


class _Recording(hot.Launcher if hot is not None else object):  # type: ignore[misc]
    __slots__ = ()

    def _slow(self, *args, **kwargs):
        self.kernel.calls.append((args, kwargs))


def test_launcher_fields_and_its_python_fallback():
    kernel = _Kernel()
    kernel.calls = []
    launch = _Recording(kernel, (4, 32))
    assert (launch.kernel, launch.config, launch.stream) == (kernel, (4, 32), 0)
    assert _Recording(kernel, (4, 32, "s", 0)).stream == "s"
    assert launch(1, 2.5) is None
    launch(x=1)
    assert kernel.calls == [((1, 2.5), {}), ((), {"x": 1})]
    with pytest.raises(AttributeError):
        launch.kernel = None
    with pytest.raises(TypeError):
        _Recording(kernel, [4, 32])  # the configuration is a tuple


def test_launcher_raises_what_the_slow_path_raises_and_is_collected():
    import gc
    import weakref

    class Boom(hot.Launcher):
        __slots__ = ()

        def _slow(self, *args):
            raise KeyError(args)

    kernel = _Kernel()
    launch = Boom(kernel, (1, 1))
    with pytest.raises(KeyError):
        launch(7)
    kernel.launch = launch  # a cycle through the C type's fields
    alive = weakref.ref(kernel)
    del kernel, launch
    gc.collect()
    assert alive() is None


def test_tracked_kernels_launch_through_the_compiled_launcher():
    from numba_streamsafe.numba import kernel

    assert issubclass(kernel._Launch, hot.Launcher)
