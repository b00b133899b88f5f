"""Faults on a real GPU: out of memory with frees still queued, destroyed streams.

* Out of memory: big arrays are dropped (their frees wait in the finalizer
  queue), then an allocation larger than the free memory, but smaller than
  free memory plus half of what was dropped, must succeed: the library drains
  the queued frees, reaps, trims the pool and retries. A size no card holds
  then raises :class:`~numba_streamsafe.OutOfMemory` with the figures, and the
  next small allocation works.
* Streams: a raw stream with a live block on it cannot be destroyed (the error
  names the block); freed, reaped, it can; reads recorded on it stay orderable
  after it is gone. Using the handle of a destroyed stream is a typed error, not
  a crash: that part runs in a child process, since the driver's handle check
  is all that stands between it and undefined behaviour.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import numba_streamsafe as nss
from numba_streamsafe import OutOfMemory, StreamMisuse

pytestmark = pytest.mark.gpu

MiB, GiB = 1 << 20, 1 << 30
N = 1 << 20
GRID, BLOCK = 512, 256


def _settle(gpu, rt) -> tuple[int, int]:
    """Everything idle, freed, reaped and trimmed: ``(free, total)`` device bytes."""
    gpu.synchronize()
    gc.collect()
    rt.flush()
    rt.reap()
    gpu.current_context().deallocations.clear()
    rt.driver.pool_trim(0)
    return rt.driver.mem_info()


def test_out_of_memory_drains_queued_frees_then_retries(gpu, fresh_runtime):
    rt = fresh_runtime
    a, b = gpu.stream(), gpu.stream()
    free0, total = _settle(gpu, rt)
    big = (free0 // 5) // MiB * MiB  # three of them: 60 % of the free memory
    try:
        arrays = [nss.device_array(big, np.uint8, stream=a, tag=f"big{i}") for i in range(3)]
        for arr in arrays:
            nss.memset(arr, 1, stream=a)  # still in flight when they are dropped
        del arr, arrays
        gc.collect()
        stats = rt.resource.stats()
        assert stats.deferred == 3 and stats.live_bytes == 3 * big, stats
        free1, _ = rt.driver.mem_info()
        ask = free1 + 3 * big // 2  # more than is free, less than free plus the dropped bytes
        x = nss.device_array(ask, np.uint8, stream=b, tag="larger than the free memory")
        assert nss.block_of(x).nbytes == ask
        stats = rt.resource.stats()
        assert stats.deferred == 0 and stats.frees == 3 and stats.live_bytes == ask, stats
        nss.memset(x, 2, stream=b)
        tail = nss.copy_to_host(x[ask - 4096:], stream=b)
        b.synchronize()
        assert (tail == 2).all()
        del x
        _settle(gpu, rt)
        assert rt.bytes_outstanding() == 0

        too_much = total + GiB
        keep = nss.to_device(np.arange(1000, dtype=np.int64), stream=b)
        before = rt.stats().resource
        with pytest.raises(OutOfMemory) as info:
            nss.device_array(too_much, np.uint8, stream=b)
        err = info.value
        assert (err.requested, err.live, err.pending) == (too_much, keep.nbytes, 0), str(err)
        assert "out of device memory" in str(err) and f"{too_much} bytes" in str(err)
        del info, err
        after = rt.stats().resource
        assert (after.live_bytes, after.live_blocks, after.allocations) == (
            before.live_bytes, before.live_blocks, before.allocations)
        small = nss.to_device(np.arange(1000, dtype=np.int64), stream=b)  # the next one works
        assert (nss.copy_to_host(small, stream=b) == np.arange(1000)).all()
        assert (nss.copy_to_host(keep, stream=b) == np.arange(1000)).all()
        b.synchronize()
    finally:
        _settle(gpu, rt)


def test_a_raw_stream_with_a_live_block_cannot_be_destroyed(gpu, fresh_runtime):
    rt = fresh_runtime
    drv = rt.driver
    h = drv.create_stream()
    blk = rt.allocate(4096, h, "block on a raw stream")
    drv.memset_async(blk.ptr, 1, blk.nbytes, h)
    with pytest.raises(StreamMisuse, match=r"1 live block.*'block on a raw stream'.*Free them"):
        rt.destroy_stream(h)
    drv.check_stream(h)  # still usable
    assert drv.copy_to_host(blk.ptr, 16, h) == b"\x01" * 16
    rt.deallocate(blk)
    assert rt.bytes_outstanding() == 4096, "the free is queued on h"
    rt.destroy_stream(h)  # reaps the queued free first
    assert rt.bytes_outstanding() == 0 and rt.stats().live_blocks == 0


def test_reads_on_a_destroyed_raw_stream_still_order_later_writes(gpu, kernels, fresh_runtime):
    rt = fresh_runtime
    a = gpu.stream()
    h = rt.driver.create_stream()
    x = nss.to_device(np.ones(N, np.int32), stream=a)
    y = nss.device_array(N, np.int32, stream=a)
    a.synchronize()
    kernels.slow_copy[GRID, BLOCK, h](x, y, 2000)  # reads x late, on the raw stream
    rt.destroy_stream(h)  # nothing is allocated on h: allowed, and its read is sealed
    kernels.fill[GRID, BLOCK, a](x, 2)  # must wait for that read
    out = nss.copy_to_host(y, stream=a)
    a.synchronize()
    assert (out == 1).all(), "the write overtook a read recorded on the destroyed stream"


DESTROYED_CHILD = textwrap.dedent(r'''
    import numba_streamsafe as nss
    from numba_streamsafe import DriverError, StreamMisuse

    rt = nss.get_runtime()
    drv = rt.driver
    h = drv.create_stream()
    blk = rt.allocate(4096, h, "doomed")
    rt.deallocate(blk)
    rt.destroy_stream(h)
    print("DESTROYED", flush=True)
    attempts = (
        ("allocate", lambda: rt.allocate(64, h, "after")),
        ("destroy again", lambda: rt.destroy_stream(h)),
        ("synchronize", lambda: drv.stream_synchronize(h)),
        ("order after", lambda: rt.order_after_stream(0, h)),
    )
    for what, attempt in attempts:
        print("TRY", what, flush=True)
        try:
            attempt()
        except (StreamMisuse, DriverError) as exc:
            print(f"TYPED {what}: {type(exc).__name__}: {exc}", flush=True)
        else:
            print(f"ACCEPTED {what}", flush=True)
    t = drv.create_stream()  # the runtime still works
    rt.deallocate(rt.allocate(64, t, "fine"))
    rt.reap()
    rt.destroy_stream(t)
    assert rt.bytes_outstanding() == 0
    print("DESTROYED CHILD OK", flush=True)
''')


def test_using_a_destroyed_stream_is_a_typed_error(gpu, child_env):
    proc = subprocess.run([sys.executable, "-c", DESTROYED_CHILD], env=child_env(),
                          capture_output=True, text=True, timeout=300)
    out = f"--- exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    print(proc.stdout)
    assert proc.returncode == 0, out
    assert "DESTROYED CHILD OK" in proc.stdout.splitlines(), out
    assert "ACCEPTED" not in proc.stdout, out
    assert proc.stdout.count("TYPED ") == 4, out


def test_destroying_a_numba_stream_leaves_its_handle_to_numba(gpu, kernels, fresh_runtime):
    """``destroy_stream(numba.cuda.stream())`` ends the stream's history; the
    handle stays Numba's, which destroys it once, when the object goes. Were
    it destroyed here, the stream object would hold a dead handle and Numba's
    finalizer would destroy it again, or destroy a newer stream that got the
    same handle (the threaded stress crashed so)."""
    rt = nss.get_runtime()
    t = gpu.stream()
    x = nss.device_array(N, np.int32, stream=t)
    for value in range(20):
        s = gpu.stream()
        kernels.fill[GRID, BLOCK, s](x, value)
        rt.destroy_stream(s)
        s.synchronize()  # the handle is still a live stream
        del s
        gc.collect()
        gpu.current_context().deallocations.clear()  # Numba destroys it, once
        fresh = gpu.stream()  # may get the same handle
        kernels.fill[GRID, BLOCK, fresh](x, value + 100)  # waits for the fill on s
        fresh.synchronize()
        assert (nss.copy_to_host(x, stream=t) == value + 100).all()
    del x
    _settle(gpu, rt)
    assert rt.bytes_outstanding() == 0
