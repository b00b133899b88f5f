"""Borrowed blocks (``AsyncResource.borrow``): another library's memory,
tracked like a block while it is lent, never freed, released after every
use with what keeps it alive held until its stream has completed them."""

from __future__ import annotations

import gc
import weakref

import pytest

from numba_streamsafe._driver.sim import SimDriver
from numba_streamsafe.core.access import Access
from numba_streamsafe.core.blocks import BlockState
from numba_streamsafe.core.errors import DriverError, InvalidArgument, StreamMisuse
from numba_streamsafe.resources import AsyncResource, DebugGuardResource, DirectResource
from numba_streamsafe.runtime import DeviceRuntime

#: An address no simulated chunk holds (the core's driver keeps no bytes).
FOREIGN = 0x7F00_0000_0000


class Keep:
    """Stands for the producer's objects (a tensor, its capsule)."""


def _use(res, sim, block, stream, access, label="kernel"):
    res.preflight([(block, access)], stream)
    sim.trace_access(stream, [(block.ptr, block.nbytes, access)], label)
    res.commit([(block, access)], stream)


def test_a_borrowed_block_orders_its_uses_as_any_block(sim, res, two_streams):
    a, b = two_streams
    block = res.borrow(FOREIGN, 4096, a, "t")
    assert block.borrowed and block.state is BlockState.LIVE and res.find(FOREIGN + 10) is block
    _use(res, sim, block, a, Access.WRITE)
    waits = res.marks.waits
    _use(res, sim, block, b, Access.READ)            # waits for a's write
    _use(res, sim, block, a, Access.WRITE)           # waits for b's read
    assert res.marks.waits == waits + 2 and sim.hazards == []


def test_a_borrowed_block_counts_in_no_figure(sim, res, two_streams):
    a, _ = two_streams
    block = res.borrow(FOREIGN, 4096, a)
    stats = res.stats()
    assert (stats.live_bytes, stats.live_blocks, stats.allocations) == (0, 0, 0)
    assert res.bytes_outstanding() == 0 and res.counters()["live_blocks"] == 0
    res.deallocate(block)
    assert res.stats().frees == 0 and res.pending_per_stream() == {}
    assert res.bytes_outstanding() == 0


def test_the_release_waits_and_keeps_the_producer_until_the_stream_completes(
        sim, res, two_streams):
    a, b = two_streams
    keep = Keep()
    alive = weakref.ref(keep)
    block = res.borrow(FOREIGN, 4096, a, keep=[keep])
    del keep
    _use(res, sim, block, b, Access.READ)
    waits = res.marks.waits
    res.deallocate(block)                            # a waits for b's read
    assert res.marks.waits == waits + 1 and block.state is BlockState.FREED
    assert block.keep is None and alive() is not None
    res.reap_completed()                             # a not idle: still kept
    gc.collect()
    assert alive() is not None
    res.reap_pending()                               # a synchronised
    gc.collect()
    assert alive() is None


def test_an_idle_stream_lets_the_producer_go_at_the_next_borrow(sim, res, two_streams):
    a, _ = two_streams
    keep = Keep()
    alive = weakref.ref(keep)
    res.deallocate(res.borrow(FOREIGN, 4096, a, keep=[keep]))
    del keep
    sim.synchronize()
    res.borrow(FOREIGN, 4096, a)                     # the same memory again, freshly
    gc.collect()
    assert alive() is None


def test_a_borrow_that_overlaps_a_live_block_is_refused(sim, res, two_streams):
    a, _ = two_streams
    owned = res.allocate(1024, a, "owned")
    for ptr, n in ((owned.ptr, 8), (owned.ptr - 8, 16)):
        with pytest.raises(InvalidArgument, match="overlap"):
            res.borrow(ptr, n, a)
    res.borrow(FOREIGN, 4096, a)
    with pytest.raises(InvalidArgument, match="overlap"):
        res.borrow(FOREIGN + 4000, 4096, a)
    with pytest.raises(InvalidArgument, match="positive"):
        res.borrow(0, 16, a)
    assert res.table.borrowed == 1 and sim.calls["register_foreign"] == 1


def test_a_stream_with_a_borrowed_block_is_not_destroyed(sim, res, two_streams):
    a, _ = two_streams
    rt = DeviceRuntime(res)
    block = res.borrow(FOREIGN, 4096, a, "t")
    with pytest.raises(StreamMisuse, match="borrowed block"):
        rt.destroy_stream(a)
    res.deallocate(block)
    rt.destroy_stream(a)


def test_eager_fences_record_the_hand_over(sim, two_streams):
    a, _ = two_streams
    res = AsyncResource(sim, fences="eager")
    res.borrow(FOREIGN, 4096, a)
    assert res.events.recorded == 1


def test_the_debug_guard_passes_borrowed_blocks_through(two_streams):
    sim = SimDriver(backing=False)
    a, b = sim.create_stream(), sim.create_stream()
    inner = AsyncResource(sim)
    guard = DebugGuardResource(inner)
    block = inner.borrow(FOREIGN, 4096, a)
    assert guard.find(FOREIGN) is block
    guard.preflight([(block, Access.WRITE)], b)
    guard.commit([(block, Access.WRITE)], b)
    assert inner.block_events(block)[0].stream == b


def test_a_resource_that_does_not_track_refuses_to_borrow(sim):
    with pytest.raises(StreamMisuse, match="does not track"):
        DirectResource(sim).borrow(FOREIGN, 16, 0)


def test_a_context_reset_forgets_borrowed_blocks(sim, res, two_streams):
    a, _ = two_streams
    keep = Keep()
    alive = weakref.ref(keep)
    block = res.borrow(FOREIGN, 4096, a, keep=[keep])
    del keep
    res.reset_context()
    gc.collect()
    assert block.state is BlockState.FREED and alive() is None and sim.calls["cuMemFree"] == 0


# ------------------------------------------------------------ the simulated driver
def test_the_sim_checks_registered_memory_and_its_release():
    sim = SimDriver(backing=False)
    a, b = sim.create_stream(), sim.create_stream()
    reserved = sim.reserved_bytes
    sim.register_foreign(FOREIGN, 256, a)            # handed over on a
    sim.trace_access(b, [(FOREIGN, 256, Access.READ)], "unordered read")
    assert [h.kind for h in sim.hazards] == ["read-after-write"]
    sim.release_foreign(FOREIGN, a)                  # b's read is not ordered before it
    assert [h.kind for h in sim.hazards] == ["read-after-write", "write-after-read"]
    sim.trace_access(a, [(FOREIGN, 8, Access.READ)], "after the release")
    assert sim.hazards[-1].kind == "use-after-free" and sim.reserved_bytes == reserved


def test_the_sim_leaves_memory_it_knows_to_its_owner():
    sim = SimDriver(backing=False)
    a = sim.create_stream()
    ptr = sim.alloc_async(1024, a)
    sim.register_foreign(ptr + 64, 128, a)           # inside a live allocation: nothing to do
    sim.release_foreign(ptr + 64, a)
    sim.trace_access(a, [(ptr, 1024, Access.WRITE)], "owner")
    assert sim.hazards == []
    for start, n in ((ptr + 1000, 64), (ptr - 64, 128)):
        with pytest.raises(DriverError):
            sim.register_foreign(start, n, a)
    sim.free_async(ptr, a)
    with pytest.raises(DriverError, match="freed memory"):
        sim.register_foreign(ptr, 8, a)
