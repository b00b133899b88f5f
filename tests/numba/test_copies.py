"""The hooks of Numba's driver-level copies and fills (:mod:`numba_streamsafe.numba.copies`,
installed on a GPU by transparent mode), run here against the simulated driver
with stand-ins for Numba's device objects and a copy that does nothing: the
hook's uses reach the driver's checker (``sim.hazards``) through the protocol.

A hooked copy that reads a block another stream wrote waits for that write; with
transparent mode's setting off (``fence=False``: the work is shown, not ordered)
the same copy races (the negative control). Memory the library does not track,
a copy of no bytes and a copy inside a fenced operation pass through unfenced;
the stream object a copy names is cached for the next call, where it carries
its handle.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from numba_streamsafe import Access
from numba_streamsafe.numba import copies
from numba_streamsafe.numba.scope import numba_call
from tests.helpers.numba_objects import NumbaArray, NumbaMemory, NumbaStream
from tests.helpers.programs import launch

ROOT = Path(__file__).resolve().parents[2]


#: The calls of Numba's copy (:func:`_noop`) that reached it.
calls: list[tuple] = []


def _noop(dst: Any, src: Any, size: int, stream: Any = 0) -> None:
    calls.append((dst, src, size, stream))


def _hook(fence: bool = True) -> Any:
    return copies.copy_hook(_noop, fence=fence, label="device copy (Numba)", write_dst=True,
                            read_src=True)


@pytest.mark.parametrize("fence", [True, False], ids=["hooked", "unordered"])
def test_a_copy_reading_what_another_stream_wrote_waits_for_it(rt, fence):
    sim = rt.driver
    a, b = sim.create_stream(), sim.create_stream()
    src = rt.resource.allocate(256, a)
    dst = rt.resource.allocate(256, b)
    launch(rt, a, [(src, Access.WRITE)])  # a tracked write of src on a
    calls.clear()
    _hook(fence)(NumbaArray(dst), NumbaArray(src), 256, NumbaStream(b))
    assert len(calls) == 1  # Numba's copy ran once
    if fence:
        assert not sim.hazards, sim.hazards
    else:  # the negative control: shown to the checker, not ordered
        assert sim.hazards, "the copy on b did not race the write on a"


def test_a_copy_of_a_block_written_by_the_copy_orders_the_next_reader(rt):
    """The hooked copy's write of its destination is recorded: a reader on a
    third stream waits for it."""
    sim = rt.driver
    a, b, c, d = (sim.create_stream() for _ in range(4))
    src = rt.resource.allocate(256, a)
    dst = rt.resource.allocate(256, a)
    _hook()(NumbaArray(dst), NumbaArray(src), 256, NumbaStream(b))
    launch(rt, c, [(dst, Access.READ)])
    assert not sim.hazards, sim.hazards
    launch(rt, d, [(dst, Access.READ)], fenced=False)  # the control: an unordered reader
    assert sim.hazards


def test_untracked_memory_no_bytes_and_nested_copies_pass_through(rt):
    sim = rt.driver
    a = sim.create_stream()
    block = rt.resource.allocate(256, a)
    hook = _hook()
    untracked = SimpleNamespace(gpu_data=SimpleNamespace(device_pointer_value=0))
    recorded = rt.resource.stats()
    calls.clear()
    hook(untracked, untracked, 256, NumbaStream(a))  # memory no resource tracks
    hook(NumbaArray(block), NumbaArray(block), 0, NumbaStream(a))  # no bytes
    # inside a fenced operation
    numba_call(hook, NumbaArray(block), NumbaArray(block), 256, NumbaStream(a))
    assert len(calls) == 3
    assert rt.resource.stats() == recorded  # nothing recorded for any of them


def test_the_stream_object_a_copy_names_is_cached(rt):
    sim = rt.driver
    a, b = sim.create_stream(), sim.create_stream()
    src = rt.resource.allocate(256, a)
    dst = rt.resource.allocate(256, b)
    stream = NumbaStream(b)
    _hook()(NumbaArray(dst), NumbaArray(src), 256, stream)
    assert stream._nss_stream == (rt, b)


def test_numbas_keyword_calls_reach_the_hook(rt):
    """Numba passes every argument by name (``device_to_host(dst=..., ...)``)."""
    sim = rt.driver
    a, b = sim.create_stream(), sim.create_stream()
    src = rt.resource.allocate(256, a)
    dst = rt.resource.allocate(256, b)
    launch(rt, a, [(src, Access.WRITE)])
    calls.clear()
    _hook()(dst=NumbaArray(dst), src=NumbaArray(src), size=256, stream=NumbaStream(b))
    assert len(calls) == 1 and not sim.hazards, sim.hazards


class _Pointer(NumbaMemory):
    """Numba's ``MemoryPointer``, its ``memset`` a fill that does nothing."""

    def memset(self, byte: int, count: int | None = None, stream: Any = 0) -> None:
        """Numba's docstring."""
        calls.append((self, byte, count, stream))


@pytest.mark.parametrize("fence", [True, False], ids=["hooked", "unordered"])
def test_a_memset_of_what_another_stream_reads_waits_for_the_read(rt, monkeypatch, fence):
    monkeypatch.setattr(_Pointer, "memset",
                        copies.pointer_memset_hook(_Pointer.memset, fence=fence))
    assert _Pointer.memset.__doc__ == "Numba's docstring."
    sim = rt.driver
    a, b = sim.create_stream(), sim.create_stream()
    block = rt.resource.allocate(256, a)
    launch(rt, a, [(block, Access.READ)])
    calls.clear()
    pointer = _Pointer(block)
    pointer.memset(0, stream=NumbaStream(b))  # bound to the pointer
    assert calls == [(pointer, 0, None, calls[0][3])]
    if fence:
        assert not sim.hazards, sim.hazards
    else:
        assert sim.hazards, "the memset on b did not race the read on a"


def test_the_hooks_keep_numbas_names(rt):
    assert _hook().__name__ == "_noop"
    assert _hook().__doc__ == _noop.__doc__


def test_a_destroyed_simulator_stream_stays_refused_after_a_copy_named_it():
    """The simulator's stream objects carry no handle: the runtime made one for
    each, and refuses the object once it destroyed that stream, even where the
    next stream got the same handle. Nothing caches the handle on such an
    object (a launch, a copy or a synchronise that named it)."""
    code = """
        import numpy as np
        from numba import cuda
        import numba_streamsafe as nss
        rt = nss.get_runtime()
        x = cuda.device_array(16, dtype=np.int64)
        s = cuda.stream()
        x.copy_to_host(stream=s)
        s.synchronize()
        rt.destroy_stream(s)
        t = cuda.stream()
        x.copy_to_host(stream=t)
        try:
            x.copy_to_host(stream=s)
        except nss.StreamMisuse as exc:
            print("REFUSED", "destroyed" in str(exc))
        else:
            print("ACCEPTED")
    """
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1",
           "NUMBA_CUDA_MEMORY_MANAGER": "numba_streamsafe"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert "REFUSED True" in proc.stdout, proc.stdout + proc.stderr[-3000:]
