"""DebugGuardResource on a real GPU: canaries caught after stray writes, poison read back.

The stack is ``DebugGuardResource(AsyncResource(CudaDriver(0)))``, installed
as device 0's runtime for one test. Stray writes come from the driver
(``cuMemsetD8Async`` one byte outside the block) and from a raw Numba kernel
that stores one element past the end of an array. Skipped, like the whole
directory, without a GPU (see ``conftest.py``).
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

import numba_streamsafe as nss
from numba_streamsafe import Access, BlockState, OutOfBounds, UseAfterFree
from numba_streamsafe.diagnostics.recorder import LaunchRecorder

pytestmark = pytest.mark.gpu

CANARY = 0xA5
POISON = 0xDD
GUARD = 256
Q = 4


@pytest.fixture
def guard_rt(gpu):
    """An owned runtime over the guard, installed as device 0's for one test."""
    from numba_streamsafe._driver.cuda import CudaDriver
    from numba_streamsafe.resources import AsyncResource, DebugGuardResource
    from numba_streamsafe.runtime import DeviceRuntime, clear_runtimes, set_runtime

    rt = DeviceRuntime(DebugGuardResource(AsyncResource(CudaDriver(0)), guard_bytes=GUARD,
                                          canary=CANARY, poison=POISON, quarantine=Q))
    old = set_runtime(rt, 0)
    try:
        yield rt
    finally:
        gpu.synchronize()
        gc.collect()
        try:
            rt.flush()
        finally:
            rt.resource.release_quarantine()
            rt.reap()
            if old is not None:
                set_runtime(old, 0)
            else:
                clear_runtimes()


def test_driver_fill_and_copy_round_trip(gpu, guard_rt):
    drv = guard_rt.driver
    s = gpu.stream()
    h = guard_rt.stream_handle(s)
    b = guard_rt.allocate(1000, s, "round trip")
    drv.memset_async(b.ptr, 0x3C, b.nbytes, h)
    assert drv.copy_to_host(b.ptr, b.nbytes, h) == bytes([0x3C]) * b.nbytes
    assert drv.copy_to_host(b.ptr - GUARD, GUARD, h) == bytes([CANARY]) * GUARD
    assert drv.copy_to_host(b.ptr + b.nbytes, GUARD, h) == bytes([CANARY]) * GUARD
    guard_rt.deallocate(b)


def test_a_byte_written_past_the_end_is_caught(gpu, guard_rt):
    drv = guard_rt.driver
    s = gpu.stream()
    h = guard_rt.stream_handle(s)
    b = guard_rt.allocate(4096, s, "overrun")
    drv.memset_async(b.ptr + b.nbytes, 0x00, 1, h)
    with pytest.raises(OutOfBounds, match="after") as info:
        guard_rt.deallocate(b)
    assert f"generation {b.generation}" in str(info.value)
    assert (info.value.side, info.value.offset, info.value.value) == ("after", b.nbytes, 0)
    assert b.state is BlockState.LIVE and guard_rt.find(b.ptr) is b
    guard_rt.resource.discard(b)
    assert b.state is BlockState.FREED


def test_a_byte_written_before_the_start_on_another_stream_is_caught(gpu, guard_rt):
    """The guards are read after the alloc stream waited for the use on the other stream."""
    drv = guard_rt.driver
    a, other = gpu.stream(), gpu.stream()
    b = guard_rt.allocate(4096, a, "underrun")
    rec = LaunchRecorder(guard_rt, other)
    rec.write(b)
    rec.preflight()
    drv.memset_async(b.ptr - 1, 0x00, 1, guard_rt.stream_handle(other))
    rec.commit()
    with pytest.raises(OutOfBounds, match="before") as info:
        guard_rt.deallocate(b)
    assert (info.value.side, info.value.offset) == ("before", -1)
    guard_rt.resource.discard(b)


def test_a_kernel_storing_one_element_past_the_end_is_caught(gpu, guard_rt):
    @gpu.jit
    def poke(a, i, v):
        a[i] = v  # no bounds check: i == a.size lands in the guard after

    n = 1024
    s = gpu.stream()
    arr = nss.device_array(n, np.int32, stream=s, tag="poked")
    block = nss.block_of(arr)
    assert block is not None and block.nbytes == n * 4
    poke[1, 1, s](arr, n, 0)
    with pytest.raises(OutOfBounds, match="after") as info:
        guard_rt.deallocate(block)
    assert "'poked'" in str(info.value)
    assert (info.value.offset, info.value.value) == (n * 4, 0)
    guard_rt.resource.discard(block)
    del arr  # its finalizer's free of the discarded block is ignored
    gc.collect()
    guard_rt.flush()


def test_a_freed_block_is_poisoned_and_quarantined(gpu, guard_rt):
    drv = guard_rt.driver
    s = gpu.stream()
    h = guard_rt.stream_handle(s)
    b = guard_rt.allocate(4096, s, "freed")
    drv.memset_async(b.ptr, 0x11, b.nbytes, h)
    guard_rt.deallocate(b)
    assert guard_rt.resource.quarantined == [b]
    assert drv.copy_to_host(b.ptr, b.nbytes, h) == bytes([POISON]) * b.nbytes
    assert drv.copy_to_host(b.ptr + b.nbytes, GUARD, h) == bytes([CANARY]) * GUARD
    with pytest.raises(UseAfterFree, match="quarantine"):
        guard_rt.resource.preflight([(b, Access.READ)], h)
    fresh = [guard_rt.allocate(4096, s, f"fresh{i}") for i in range(Q)]
    assert all(f.ptr != b.ptr for f in fresh)
    for f in fresh:
        guard_rt.deallocate(f)
    guard_rt.resource.release_quarantine()
    guard_rt.reap()
    assert guard_rt.bytes_outstanding() == 0
