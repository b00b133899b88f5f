"""The hooks of Numba's driver-level copies and fills (:mod:`numba_streamsafe.numba.copies`,
installed on a GPU by transparent mode), run here against the simulated driver
with stand-ins for Numba's device objects and a copy that does nothing: the
hook's uses reach the driver's checker (``sim.hazards``) through the protocol.

A hooked copy that reads a block another stream wrote waits for that write; with
transparent mode's setting off (``fence=False``: the work is shown, not ordered)
the same copy races (the negative control). Memory the library does not track,
a copy of no bytes and a copy inside a fenced operation pass through unfenced;
the stream object a copy names is cached for the next call.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from numba_streamsafe import Access
from numba_streamsafe.numba import copies
from numba_streamsafe.numba.scope import numba_call
from tests.helpers.programs import launch


class _Memory:
    """What the hooks read of Numba's ``MemoryPointer``."""

    def __init__(self, block: Any) -> None:
        self.owner = SimpleNamespace(_nss_block=block)
        self.device_pointer_value = block.ptr
        self.size = block.nbytes


class _Array:
    """What the hooks read of Numba's device array."""

    def __init__(self, block: Any) -> None:
        self.gpu_data = _Memory(block)


class _Stream:
    """A stream object as Numba's calls pass it (its handle, and attributes)."""

    def __init__(self, handle: int) -> None:
        self.handle = handle


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
    _hook(fence)(_Array(dst), _Array(src), 256, _Stream(b))
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
    _hook()(_Array(dst), _Array(src), 256, _Stream(b))
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
    hook(untracked, untracked, 256, _Stream(a))  # memory no resource tracks
    hook(_Array(block), _Array(block), 0, _Stream(a))  # no bytes
    numba_call(hook, _Array(block), _Array(block), 256, _Stream(a))  # inside a fenced operation
    assert len(calls) == 3
    assert rt.resource.stats() == recorded  # nothing recorded for any of them


def test_the_stream_object_a_copy_names_is_cached(rt):
    sim = rt.driver
    a, b = sim.create_stream(), sim.create_stream()
    src = rt.resource.allocate(256, a)
    dst = rt.resource.allocate(256, b)
    stream = _Stream(b)
    _hook()(_Array(dst), _Array(src), 256, stream)
    assert stream._nss_stream == (rt, b)


def test_the_hooks_keep_numbas_names_and_a_memset_is_a_method():
    hooked = _hook()
    assert hooked.__name__ == "_noop"

    class Pointer:
        def memset(self, byte: int, count: int | None = None, stream: Any = 0) -> None:
            """Numba's docstring."""

    Pointer.memset = copies.pointer_memset_hook(Pointer.memset, fence=True)
    assert Pointer.memset.__doc__ == "Numba's docstring."
    assert Pointer().memset(0) is None  # bound to the pointer; untracked: passed through
