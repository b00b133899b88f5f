"""DebugGuardResource on the simulated driver: canaries, poison, quarantine, tracking.

The stack is ``SimDriver(backing=True)`` under ``AsyncResource`` under
``DebugGuardResource``, inside an owned ``DeviceRuntime``. The simulated
driver backs every chunk with host memory whose address is the device
address, so a test can plant a stray write with ``SimDriver.buffer`` and read
the poison back the same way.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

from numba_streamsafe._driver.sim import SimDriver
from numba_streamsafe.core.access import Access
from numba_streamsafe.core.blocks import BlockState
from numba_streamsafe.core.errors import (
    DriverError,
    InvalidArgument,
    OutOfBounds,
    StaleContext,
    StreamMisuse,
    UseAfterFree,
)
from numba_streamsafe.diagnostics.recorder import LaunchRecorder
from numba_streamsafe.resources import AsyncResource, DebugGuardResource, DirectResource
from numba_streamsafe.runtime import DeviceRuntime

G = 256
CANARY = 0xA5
POISON = 0xDD
Q = 4
N = 1000


@pytest.fixture
def drv() -> SimDriver:
    return SimDriver(backing=True)


@pytest.fixture(params=["lazy", "eager"])
def fences(request) -> str:
    return request.param


@pytest.fixture
def guard(drv: SimDriver, fences: str) -> DebugGuardResource:
    return DebugGuardResource(AsyncResource(drv, fences=fences), guard_bytes=G, canary=CANARY,
                              poison=POISON, quarantine=Q)


@pytest.fixture
def rt(guard: DebugGuardResource) -> DeviceRuntime:
    return DeviceRuntime(guard)


@pytest.fixture
def streams(drv: SimDriver) -> tuple[int, int, int]:
    return drv.create_stream(), drv.create_stream(), drv.create_stream()


def launch(rt: DeviceRuntime, stream: int, uses, *, fenced: bool = True,
           label: str = "kernel") -> None:
    """One kernel on ``stream`` making ``uses``, through a recorder unless ``fenced`` is False."""
    rec = None
    if fenced:
        rec = LaunchRecorder(rt, stream)
        for block, access in uses:
            rec.use(block, access)
        rec.preflight()
    rt.driver.trace_access(stream, [(b.ptr, b.nbytes, Access(a)) for b, a in uses], label)
    if rec is not None:
        rec.commit()


def drain(rt: DeviceRuntime) -> None:
    rt.flush()
    rt.resource.release_quarantine()
    rt.reap()


# ------------------------------------------------------------------- canaries
def test_guards_hold_the_canary_and_the_inner_block_is_in_the_middle(rt, drv, streams):
    s = streams[0]
    b = rt.allocate(N, s, "x")
    assert b.nbytes == N and b.stream == s and b.state is BlockState.LIVE
    assert (drv.buffer(b.ptr - G, G) == CANARY).all()
    assert (drv.buffer(b.ptr + N, G) == CANARY).all()
    assert b.ptr % 16 == 0
    rt.deallocate(b)
    drv.assert_no_hazards()


def test_a_clean_block_frees_without_error(rt, drv, streams):
    b = rt.allocate(N, streams[0], "clean")
    launch(rt, streams[1], [(b, Access.WRITE)])
    rt.deallocate(b)
    assert b.state is BlockState.FREED
    assert rt.resource.quarantined == [b]
    drv.assert_no_hazards()


def test_a_write_past_the_end_is_caught_at_deallocate(rt, drv, streams):
    b = rt.allocate(N, streams[0], "overrun")
    drv.buffer(b.ptr + N, 1)[0] = 0x00
    with pytest.raises(OutOfBounds, match="after") as info:
        rt.deallocate(b)
    msg = str(info.value)
    assert f"generation {b.generation}" in msg
    assert "'overrun'" in msg and "0x00" in msg and "canary 0xa5" in msg
    exc = info.value
    assert (exc.side, exc.offset, exc.value, exc.generation) == ("after", N, 0, b.generation)
    assert exc.sides == ("after",)
    # Left live for inspection: still found, still usable, still counted.
    assert b.state is BlockState.LIVE
    assert rt.find(b.ptr + 5) is b
    launch(rt, streams[1], [(b, Access.READ)])
    assert rt.resource.quarantined == []
    # It keeps failing the check until freed without it.
    with pytest.raises(OutOfBounds):
        rt.deallocate(b)
    rt.resource.discard(b)
    assert b.state is BlockState.FREED
    drv.assert_no_hazards()


def test_a_write_before_the_start_is_caught_as_before(rt, drv, streams):
    b = rt.allocate(N, streams[0], "underrun")
    drv.buffer(b.ptr - 3, 1)[0] = 0x42
    with pytest.raises(OutOfBounds, match="before") as info:
        rt.deallocate(b)
    assert f"generation {b.generation}" in str(info.value)
    assert (info.value.side, info.value.offset, info.value.value) == ("before", -3, 0x42)
    rt.resource.discard(b)


def test_both_sides_bad_are_both_reported(rt, drv, streams):
    b = rt.allocate(64, streams[0], "both")
    drv.buffer(b.ptr - G, 1)[0] = 1
    drv.buffer(b.ptr + 64 + G - 1, 1)[0] = 2
    with pytest.raises(OutOfBounds) as info:
        rt.deallocate(b)
    assert info.value.sides == ("before", "after")
    assert (info.value.offset, info.value.value) == (-G, 1)
    assert "before" in str(info.value) and "after" in str(info.value)
    rt.resource.discard(b)


def test_the_check_waits_for_a_kernel_on_another_stream(rt, drv, streams):
    """A stray write by an unfinished kernel elsewhere is still seen: the guards are read
    on the alloc stream after it waited for every recorded use."""
    a, b_stream, _ = streams
    blk = rt.allocate(N, a, "late")
    launch(rt, b_stream, [(blk, Access.WRITE)])
    drv.buffer(blk.ptr + N + 7, 1)[0] = 0  # the kernel on b overran
    with pytest.raises(OutOfBounds, match="after"):
        rt.deallocate(blk)
    drv.assert_no_hazards()  # the guard read was ordered after the kernel
    rt.resource.discard(blk)


# --------------------------------------------------------- poison, quarantine
def test_freed_blocks_are_poisoned(rt, drv, streams):
    b = rt.allocate(N, streams[0], "p")
    drv.buffer(b.ptr, N)[:] = 7
    rt.deallocate(b)
    assert (drv.buffer(b.ptr, N) == POISON).all()
    assert (drv.buffer(b.ptr - G, G) == CANARY).all()  # the guards are not touched
    raw = drv.copy_to_host(b.ptr, N, streams[0])
    assert raw == bytes([POISON]) * N
    drv.assert_no_hazards()


def test_quarantined_address_is_not_reused_until_the_quarantine_overflows(rt, drv, streams):
    s = streams[0]
    x = rt.allocate(N, s, "x")
    rt.deallocate(x)
    fresh = [rt.allocate(N, s, f"b{i}") for i in range(Q)]
    assert all(f.ptr != x.ptr for f in fresh)
    assert all(x.ptr not in f and f.ptr not in range(x.ptr - G, x.ptr + N + G) for f in fresh)
    for f in fresh[:-1]:
        rt.deallocate(f)
    assert len(rt.resource.quarantined) == Q  # full, not yet overflowing
    again = rt.allocate(N, s, "still held")
    assert again.ptr != x.ptr
    rt.deallocate(again)  # overflows: x, the oldest, is freed upstream
    assert x not in rt.resource.quarantined
    assert len(rt.resource.quarantined) == Q
    reused = rt.allocate(N, s, "reuse")
    assert reused.ptr == x.ptr and reused.generation != x.generation
    rt.deallocate(reused)
    rt.deallocate(fresh[-1])
    drain(rt)
    drv.assert_no_hazards()


def test_release_quarantine_lets_the_address_be_reused(rt, drv, streams):
    s = streams[0]
    x = rt.allocate(N, s, "x")
    rt.deallocate(x)
    assert rt.allocate(N, s, "other").ptr != x.ptr
    rt.resource.release_quarantine()
    assert rt.resource.quarantined == []
    y = rt.allocate(N, s, "y")
    assert y.ptr == x.ptr
    # Only the guards are written at allocation: the inner bytes keep the old poison.
    assert (drv.buffer(y.ptr, N) == POISON).all()
    assert (drv.buffer(y.ptr + N, G) == CANARY).all()
    drv.assert_no_hazards()


def test_quarantine_zero_frees_at_once(drv, streams):
    rt = DeviceRuntime(DebugGuardResource(AsyncResource(drv), quarantine=0))
    x = rt.allocate(N, streams[0], "x")
    rt.deallocate(x)
    assert rt.resource.quarantined == []
    assert rt.allocate(N, streams[0], "y").ptr == x.ptr


# ----------------------------------------------------------- use after free
def test_a_use_of_a_quarantined_block_is_use_after_free(rt, drv, streams):
    b = rt.allocate(N, streams[0], "gone")
    rt.deallocate(b)
    with pytest.raises(UseAfterFree, match="quarantine"):
        rt.resource.preflight([(b, Access.READ)], streams[1])
    with pytest.raises(UseAfterFree, match="quarantine"):
        rt.resource.commit([(b, Access.WRITE)], streams[1])
    rec = LaunchRecorder(rt, streams[1])
    rec.read(b)
    with pytest.raises(UseAfterFree):
        rec.preflight()
    rec.abandon()
    with pytest.raises(UseAfterFree, match="quarantine"):
        rt.deallocate(b)  # double free
    assert rt.find(b.ptr) is None


def test_a_stale_handle_is_refused_after_the_address_is_reused(rt, streams):
    s = streams[0]
    b = rt.allocate(N, s, "old")
    rt.deallocate(b)
    rt.resource.release_quarantine()
    new = rt.allocate(N, s, "new")
    assert new.ptr == b.ptr
    with pytest.raises(UseAfterFree, match=f"generation {new.generation}"):
        rt.resource.preflight([(b, Access.READ)], s)
    with pytest.raises(UseAfterFree):
        rt.deallocate(b)
    assert new.state is BlockState.LIVE
    rt.deallocate(new)


def test_a_block_of_another_resource_is_refused(rt, drv, streams):
    other = AsyncResource(drv).allocate(N, streams[0], "foreign")
    with pytest.raises(UseAfterFree, match="not a live block"):
        rt.resource.preflight([(other, Access.READ)], streams[0])
    with pytest.raises(UseAfterFree):
        rt.deallocate(other)


# ------------------------------------------------------------------ tracking
def test_find_returns_the_inner_block(rt, streams):
    b = rt.allocate(N, streams[0], "f")
    assert rt.find(b.ptr) is b
    assert rt.find(b.ptr + N - 1) is b
    assert rt.find(b.ptr - 1) is None  # in the guard before
    assert rt.find(b.ptr + N) is None  # in the guard after
    rt.deallocate(b)
    assert rt.find(b.ptr) is None


def test_cross_stream_write_then_read_has_no_hazards(rt, drv, streams):
    a, w, r = streams
    b = rt.allocate(N, a, "shared")
    launch(rt, w, [(b, Access.WRITE)], label="write")
    launch(rt, r, [(b, Access.READ)], label="read")
    launch(rt, a, [(b, Access.READ_WRITE)], label="update")
    rt.deallocate(b)
    drain(rt)
    c = rt.allocate(N, w, "after")  # may reuse b's address on another stream
    launch(rt, w, [(c, Access.WRITE)])
    rt.deallocate(c)
    drain(rt)
    drv.assert_no_hazards()
    assert rt.bytes_outstanding() == 0


def test_without_fences_the_checker_sees_hazards(rt, drv, streams):
    """Negative control: the same program with the recorder left out."""
    a, w, r = streams
    b = rt.allocate(N, a, "shared")
    launch(rt, w, [(b, Access.WRITE)], fenced=False, label="write")
    launch(rt, r, [(b, Access.READ)], fenced=False, label="read")
    kinds = {h.kind for h in drv.hazards}
    assert drv.hazards and {"write-after-write", "read-after-write"} <= kinds
    rt.deallocate(b)


def test_block_events_take_the_inner_block(rt, streams):
    b = rt.allocate(N, streams[0], "ev")
    launch(rt, streams[1], [(b, Access.WRITE)])
    last_write, reads = rt.resource.block_events(b)
    assert last_write.stream == streams[1] and reads == {}
    rt.deallocate(b)


# ---------------------------------------------------------------- accounting
def test_quarantined_bytes_stay_outstanding_until_released(rt, streams):
    blocks = [rt.allocate(n, streams[i % 3], f"b{i}") for i, n in enumerate((16, 100, N, 4096))]
    held = sum(b.nbytes + 2 * G for b in blocks)
    assert rt.bytes_outstanding() == held
    for b in blocks:
        rt.deallocate(b)
    rt.reap()
    assert rt.bytes_outstanding() == held  # all quarantined, still held
    rt.resource.release_quarantine()
    rt.reap()
    assert rt.bytes_outstanding() == 0
    assert rt.stats().live_blocks == 0


def test_accounting_after_a_mixed_program(rt, drv, streams):
    live = []
    for i in range(40):
        s = streams[i % 3]
        b = rt.allocate(32 + 64 * (i % 5), s, f"b{i}")
        launch(rt, streams[(i + 1) % 3], [(b, Access.WRITE)])
        live.append(b)
        if i % 3 == 2:
            launch(rt, streams[(i + 2) % 3], [(live[0], Access.READ)])
            rt.deallocate(live.pop(0))
    for b in live:
        rt.deallocate(b)
    rt.resource.release_quarantine()
    rt.reap()
    assert rt.bytes_outstanding() == 0
    drv.assert_no_hazards()


def test_a_failed_guard_fill_allocates_nothing(rt, drv, streams):
    drv.inject_failure("cuMemsetD8Async", skip=1)
    with pytest.raises(DriverError, match="cuMemsetD8Async"):
        rt.allocate(N, streams[0], "x")
    rt.reap()
    assert rt.bytes_outstanding() == 0
    assert rt.resource.live_blocks == []


def test_a_failed_guard_read_leaves_the_block_live(rt, drv, streams):
    b = rt.allocate(N, streams[0], "x")
    drv.inject_failure("cuMemcpyDtoHAsync")
    with pytest.raises(DriverError):
        rt.deallocate(b)
    assert b.state is BlockState.LIVE and rt.find(b.ptr) is b
    rt.deallocate(b)  # the retry works
    assert b.state is BlockState.FREED


# ------------------------------------------------------------ deferred frees
def test_deferred_frees_are_checked_and_quarantined(rt, drv, streams):
    clean = rt.allocate(N, streams[0], "clean")
    bad = rt.allocate(N, streams[0], "bad")
    drv.buffer(bad.ptr + N, 1)[0] = 0
    rt.defer_free(clean)
    rt.defer_free(bad)
    assert clean.state is BlockState.LIVE
    with pytest.raises(OutOfBounds, match="'bad'"):
        rt.flush()
    assert clean.state is BlockState.FREED and rt.resource.quarantined == [clean]
    assert bad.state is BlockState.LIVE and rt.find(bad.ptr) is bad
    rt.flush()  # reported once
    rt.resource.discard(bad)
    drain(rt)
    assert rt.bytes_outstanding() == 0


def test_frees_are_held_inside_hold_frees(rt, streams):
    b = rt.allocate(N, streams[0], "held")
    with rt.resource.hold_frees():
        rt.defer_free(b)
        rt.flush()
        assert b.state is BlockState.LIVE
    rt.flush()
    assert b.state is BlockState.FREED


def test_a_finalizer_free_after_an_explicit_free_is_ignored(rt, streams):
    b = rt.allocate(N, streams[0], "twice")
    rt.deallocate(b)
    rt.defer_free(b)
    rt.flush()
    assert rt.resource.quarantined == [b]


# ----------------------------------------------------------------- lifecycle
def test_destroy_stream_frees_the_quarantined_blocks_on_it(rt, drv):
    s = drv.create_stream()
    b = rt.allocate(N, s, "on s")
    with pytest.raises(StreamMisuse, match="'on s'"):
        rt.destroy_stream(s)
    rt.deallocate(b)
    rt.destroy_stream(s)  # the quarantined block is freed on s first
    assert rt.resource.quarantined == []
    rt.reap()
    assert rt.bytes_outstanding() == 0


def test_reset_context_makes_every_handle_stale(rt, streams):
    live = rt.allocate(N, streams[0], "live")
    freed = rt.allocate(N, streams[0], "freed")
    rt.deallocate(freed)
    rt.reset()
    assert rt.resource.quarantined == [] and rt.bytes_outstanding() == 0
    with pytest.raises(StaleContext):
        rt.resource.preflight([(live, Access.READ)], streams[0])
    with pytest.raises(StaleContext):
        rt.deallocate(freed)
    assert live.state is BlockState.FREED


def test_guard_over_a_non_tracking_resource(drv):
    res = DebugGuardResource(DirectResource(drv), quarantine=1)
    assert not res.supports_tracking()
    b = res.allocate(N, 0, "direct")
    drv.buffer(b.ptr + N, 1)[0] = 0
    with pytest.raises(OutOfBounds, match="after"):
        res.deallocate(b)
    with pytest.raises(StreamMisuse):
        res.preflight([(b, Access.READ)], 0)
    res.discard(b)
    res.release_quarantine()
    assert res.bytes_outstanding() == 0


# ------------------------------------------------------------------ arguments
@pytest.mark.parametrize("kwargs, match", [
    ({"guard_bytes": 10}, "multiple of 16"),
    ({"guard_bytes": -16}, "multiple of 16"),
    ({"canary": 256}, "canary"),
    ({"poison": -1}, "poison"),
    ({"quarantine": -1}, "quarantine"),
])
def test_bad_arguments_are_refused(drv, kwargs, match):
    with pytest.raises(InvalidArgument, match=match):
        DebugGuardResource(AsyncResource(drv), **kwargs)


def test_a_driver_without_fill_and_copy_is_refused(drv):
    class Bare:
        device = 0

    with pytest.raises(InvalidArgument, match="memset_async"):
        DebugGuardResource(AsyncResource(drv), driver=Bare())


@pytest.mark.parametrize("nbytes", [0, -1, 1.5, True])
def test_bad_sizes_are_refused(rt, streams, nbytes):
    with pytest.raises(InvalidArgument, match="positive int"):
        rt.allocate(nbytes, streams[0], "bad")
    assert rt.bytes_outstanding() == 0


def test_zero_guard_bytes_keeps_poison_and_quarantine(drv, streams):
    rt = DeviceRuntime(DebugGuardResource(AsyncResource(drv), guard_bytes=0, quarantine=2))
    b = rt.allocate(N, streams[0], "nog")
    assert rt.find(b.ptr) is b
    rt.deallocate(b)
    assert (drv.buffer(b.ptr, N) == POISON).all()
    with pytest.raises(UseAfterFree):
        rt.resource.preflight([(b, Access.READ)], streams[0])
    drain(rt)
    assert rt.bytes_outstanding() == 0


# ------------------------------------------------- the simulated driver calls
def test_sim_memset_and_copy_are_checked_like_kernels(drv):
    a, b = drv.create_stream(), drv.create_stream()
    ptr = drv.alloc_async(64, a)
    drv.memset_async(ptr, 0x11, 64, a)
    assert drv.copy_to_host(ptr, 64, a) == bytes([0x11]) * 64
    assert drv.stream_query(a)  # the copy synchronised the stream
    drv.assert_no_hazards()
    drv.memset_async(ptr, 0x22, 8, b)  # not ordered after the copy's read on a...
    assert not drv.hazards  # ...but the host synchronised a, and b's work comes after
    drv.memset_async(ptr, 0x33, 8, a)  # a never waited for b's write
    assert [h.kind for h in drv.hazards] == ["write-after-write"]
    assert np.array_equal(drv.buffer(ptr, 9), [0x33] * 8 + [0x11])
    assert drv.calls["cuMemsetD8Async"] == 3 and drv.calls["cuStreamSynchronize"] == 1


def test_sim_copy_of_an_unordered_write_is_a_hazard(drv):
    a, b = drv.create_stream(), drv.create_stream()
    ptr = drv.alloc_async(64, a)
    drv.stream_synchronize(a)
    drv.trace_access(b, [(ptr, 64, Access.WRITE)], "kernel on b")
    drv.copy_to_host(ptr, 64, a)
    assert [h.kind for h in drv.hazards] == ["read-after-write"]


def test_sim_fill_and_copy_refuse_bad_input(drv):
    a = drv.create_stream()
    ptr = drv.alloc_async(64, a)
    with pytest.raises(DriverError, match="not a byte"):
        drv.memset_async(ptr, 256, 4, a)
    with pytest.raises(DriverError, match="non-negative"):
        drv.copy_to_host(ptr, -1, a)
    with pytest.raises(DriverError, match="does not exist"):
        drv.copy_to_host(ptr, 4, 0xBAD0)
    with pytest.raises(DriverError, match="not memory"):
        drv.copy_to_host(0x10, 4, a)
    assert drv.copy_to_host(ptr, 0, a) == b""
    unbacked = SimDriver(backing=False)
    p2 = unbacked.alloc_async(64, 0)
    unbacked.memset_async(p2, 1, 64, 0)  # checked only: no bytes to fill
    with pytest.raises(StreamMisuse, match="backing=True"):
        unbacked.copy_to_host(p2, 64, 0)
    assert not drv.hazards and not unbacked.hazards


def test_gc_of_guarded_blocks_is_not_needed_for_accounting(rt, streams):
    # Blocks are plain handles: dropping them frees nothing (Numba's finalizers call
    # defer_free), so what is not freed stays counted.
    rt.allocate(N, streams[0], "dropped")
    gc.collect()
    assert rt.bytes_outstanding() == N + 2 * G
