"""Blocks kept for reuse on their stream (``AsyncResource(reuse_bytes=...)``):
what is kept, that reuse is ordered, and that kept bytes are accounted and
given back."""

from __future__ import annotations

import pytest

from numba_streamsafe import (
    AsyncResource,
    DeviceRuntime,
    DriverError,
    InvalidArgument,
    UseAfterFree,
)
from numba_streamsafe._driver.sim import SimDriver
from numba_streamsafe.core.access import Access


class Owner:
    """Stands for a user's stream object (kept alive while blocks wait on it)."""


def test_same_stream_same_size_is_reused_without_a_driver_call(res, sim):
    a = res.allocate(4096, 0, "a")
    res.deallocate(a)
    allocs, frees = sim.calls["cuMemAllocAsync"], sim.calls["cuMemFreeAsync"]
    b = res.allocate(4096, 0, "b")
    assert b.ptr == a.ptr and b.generation > a.generation
    assert (sim.calls["cuMemAllocAsync"], sim.calls["cuMemFreeAsync"]) == (allocs, frees)
    with pytest.raises(UseAfterFree):  # the old handle names a freed generation
        res.deallocate(a)
    res.deallocate(b)


def test_other_sizes_and_streams_go_to_the_driver(res, sim):
    owner = Owner()
    s = sim.create_stream()
    a = res.allocate(4096, 0, "a")
    res.deallocate(a)
    before = sim.calls["cuMemAllocAsync"]
    b = res.allocate(8192, 0, "b")  # another size
    c = res.allocate(4096, s, "c", stream_owner=owner)  # another stream
    assert sim.calls["cuMemAllocAsync"] == before + 2
    assert a.ptr not in (b.ptr, c.ptr)


def test_kept_bytes_are_pending_until_reaped(rt, res, sim):
    a = res.allocate(1000, 0, "a")
    res.deallocate(a)
    assert res.live_bytes == 0 and res.pending_bytes == 1000
    assert rt.bytes_outstanding() == 1000
    assert res.pending_per_stream() == {0: 1000}
    assert res.stats().outstanding_bytes == 1000
    frees = sim.calls["cuMemFreeAsync"]
    rt.reap()
    assert rt.bytes_outstanding() == 0 and res.pending_per_stream() == {}
    assert sim.calls["cuMemFreeAsync"] == frees + 1
    b = res.allocate(1000, 0, "b")  # nothing kept any more: from the driver
    assert sim.calls["cuMemAllocAsync"] == 2
    res.deallocate(b)


def test_limit_and_unowned_streams(sim):
    res = AsyncResource(sim, reuse_bytes=6000)
    blocks = [res.allocate(4096, 0, f"b{i}") for i in range(2)]
    frees = sim.calls["cuMemFreeAsync"]
    for b in blocks:
        res.deallocate(b)
    # Both would pass the limit: the older goes back to the pool, the newer is kept.
    assert sim.calls["cuMemFreeAsync"] == frees + 1
    assert res.pending_per_stream() == {0: 8192}
    allocs = sim.calls["cuMemAllocAsync"]
    assert res.allocate(4096, 0, "again").ptr == blocks[1].ptr
    assert sim.calls["cuMemAllocAsync"] == allocs
    res.deallocate(res.find(blocks[1].ptr))
    frees = sim.calls["cuMemFreeAsync"]
    # A stream handle with no owning object may be destroyed and its handle
    # reused by an unrelated stream: its blocks are never kept.
    s = sim.create_stream()
    c = res.allocate(16, s, "c")
    res.deallocate(c)
    assert sim.calls["cuMemFreeAsync"] == frees + 1
    off = AsyncResource(sim, reuse_bytes=0)
    d = off.allocate(16, 0, "d")
    off.deallocate(d)
    assert sim.calls["cuMemFreeAsync"] == frees + 2
    for bad in (-1, 1.5, True, None):
        with pytest.raises(InvalidArgument, match="reuse_bytes"):
            AsyncResource(sim, reuse_bytes=bad)


def test_a_lower_limit_frees_the_kept_blocks_past_it(sim):
    res = AsyncResource(sim, reuse_bytes=1 << 20)
    blocks = [res.allocate(4096, 0, f"b{i}") for i in range(3)]
    for b in blocks:
        res.deallocate(b)
    frees = sim.calls["cuMemFreeAsync"]
    assert res.counters()["kept_bytes"] == 3 * 4096
    res.reuse_bytes = 4096  # two of them go back to the pool now
    assert sim.calls["cuMemFreeAsync"] == frees + 2
    assert res.counters()["kept_bytes"] == 4096
    allocs = sim.calls["cuMemAllocAsync"]
    again = res.allocate(4096, 0, "again")  # the one still kept, no driver call
    assert sim.calls["cuMemAllocAsync"] == allocs and again.ptr in {b.ptr for b in blocks}
    res.deallocate(again)
    res.reuse_bytes = 0
    assert res.counters()["kept_bytes"] == 0
    with pytest.raises(InvalidArgument, match="reuse_bytes"):
        res.reuse_bytes = -1


def test_a_block_that_does_not_fit_evicts_the_oldest(sim):
    res = AsyncResource(sim, reuse_bytes=64 << 20)
    owner = Owner()
    s = sim.create_stream()
    small = [res.allocate(4096, 0, "small"), res.allocate(4096, s, "small", stream_owner=owner)]
    for b in small:
        res.deallocate(b)
    big = res.allocate(64 << 20, 0, "big")
    frees = sim.calls["cuMemFreeAsync"]
    res.deallocate(big)  # 64 MiB fits only once both small blocks are gone
    assert sim.calls["cuMemFreeAsync"] == frees + 2
    assert res.pending_bytes == (64 << 20) + 8192
    allocs = sim.calls["cuMemAllocAsync"]
    again = res.allocate(64 << 20, 0, "big again")
    assert again.ptr == big.ptr and sim.calls["cuMemAllocAsync"] == allocs
    res.allocate(4096, s, "small again", stream_owner=owner)  # evicted: from the driver
    assert sim.calls["cuMemAllocAsync"] == allocs + 1
    too_big = res.allocate((64 << 20) + 1, 0, "too big")
    frees = sim.calls["cuMemFreeAsync"]
    res.deallocate(too_big)  # larger than the whole limit: never kept, nothing evicted
    assert sim.calls["cuMemFreeAsync"] == frees + 1


@pytest.mark.parametrize("free", ["deallocate", "defer_free"])
def test_reuse_after_a_cross_stream_read_is_ordered(res, sim, free):
    """A block read on another stream, freed and taken again on its own stream:
    the new owner's write must come after the old read (the checker says so).
    ``defer_free`` (what a finalizer calls) leaves the free queued until the
    next allocation runs it and takes the block back in one step."""
    owner = Owner()
    s, t = sim.create_stream(), sim.create_stream()
    a = res.allocate(4096, s, "a", stream_owner=owner)
    res.preflight([(a, Access.WRITE)], s)
    sim.trace_access(s, [(a.ptr, a.nbytes, Access.WRITE)], "produce")
    res.commit([(a, Access.WRITE)], s)
    res.preflight([(a, Access.READ)], t)
    sim.trace_access(t, [(a.ptr, a.nbytes, Access.READ)], "consume")
    res.commit([(a, Access.READ)], t)
    getattr(res, free)(a)
    allocs, frees = sim.calls["cuMemAllocAsync"], sim.calls["cuMemFreeAsync"]
    b = res.allocate(4096, s, "b", stream_owner=owner)
    assert b.ptr == a.ptr and b.generation > a.generation
    assert (sim.calls["cuMemAllocAsync"], sim.calls["cuMemFreeAsync"]) == (allocs, frees)
    assert res.live_bytes == 4096 and res.pending_bytes == 0
    with pytest.raises(UseAfterFree):  # the old handle names a freed generation
        res.deallocate(a)
    res.preflight([(b, Access.WRITE)], s)
    sim.trace_access(s, [(b.ptr, b.nbytes, Access.WRITE)], "overwrite")
    res.commit([(b, Access.WRITE)], s)
    assert sim.hazards == []
    # Without the free's fence the same program races: the checker sees it.
    bare = SimDriver(backing=False)
    s2, t2 = bare.create_stream(), bare.create_stream()
    bare.trace_access(s2, [(a.ptr, 64, Access.WRITE)], "produce")
    bare.trace_access(t2, [(a.ptr, 64, Access.READ)], "consume")
    bare.trace_access(s2, [(a.ptr, 64, Access.WRITE)], "overwrite")
    assert bare.hazards


def test_out_of_memory_gives_kept_blocks_back_first():
    sim = SimDriver(capacity=1 << 20, backing=False)
    res = AsyncResource(sim, reuse_bytes=1 << 20)
    rt = DeviceRuntime(res)
    kept = [res.allocate(256 << 10, 0, f"k{i}") for i in range(3)]
    for b in kept:
        res.deallocate(b)
    assert res.pending_bytes == 3 * (256 << 10)
    big = rt.allocate(768 << 10, 0, "big")  # fits only once the kept blocks are back
    assert big.nbytes == 768 << 10 and res.pending_bytes == 0
    rt.deallocate(big)


def test_retire_stream_and_reset_give_kept_blocks_back(sim):
    owner = Owner()
    res = AsyncResource(sim)
    s = sim.create_stream()
    a = res.allocate(128, s, "a", stream_owner=owner)
    res.deallocate(a)
    assert res.pending_per_stream() == {s: 128}
    res.retire_stream(s)
    assert res.pending_bytes == 0 and res.bytes_outstanding() == 0
    b = res.allocate(256, 0, "b")
    res.deallocate(b)
    frees = sim.calls["cuMemFree"]
    res.reset_context()
    assert res.bytes_outstanding() == 0 and sim.calls["cuMemFree"] == frees + 1
    # The pool holds nothing after the reset, and hands nothing out (the kept block was
    # live to the pool: counted used until the reset took it).
    assert sim.get_pool_attribute("RESERVED_MEM_CURRENT") == 0
    assert sim.get_pool_attribute("USED_MEM_CURRENT") == 0
    c = res.allocate(256, 0, "c")  # a fresh block, not the address from before the reset
    assert sim.calls["cuMemAllocAsync"] == 3
    assert sim.get_pool_attribute("USED_MEM_CURRENT") == \
        sim.get_pool_attribute("RESERVED_MEM_CURRENT") > 0
    res.deallocate(c)


def test_a_failed_eviction_keeps_accounting_and_the_block_live(sim):
    res = AsyncResource(sim, reuse_bytes=8192)
    kept = [res.allocate(4096, 0, f"k{i}") for i in range(2)]
    for b in kept:
        res.deallocate(b)
    big = res.allocate(8192, 0, "big")
    before = (res.live_bytes, res.pending_bytes)
    sim.inject_failure("cuMemFreeAsync", times=2)  # the eviction's free, then the block's
    with pytest.raises(DriverError):
        res.deallocate(big)
    assert (res.live_bytes, res.pending_bytes) == before
    assert res.find(big.ptr) is big  # still live: the caller may free it again
    sim.inject_failure("cuMemFreeAsync")  # only the eviction fails: the block is not kept
    res.deallocate(big)
    assert res.live_bytes == 0 and res.pending_bytes == 16384
    allocs = sim.calls["cuMemAllocAsync"]
    res.deallocate(res.allocate(8192, 0, "again"))  # nothing of 8 KiB kept: from the driver
    assert sim.calls["cuMemAllocAsync"] == allocs + 1
    res.reap_pending()
