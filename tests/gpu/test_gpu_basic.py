"""The Numba layer on a real GPU: copies, tracked kernels, the EMM plugin,
out-of-memory handling and accounting."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import numba_streamsafe as nss
from numba_streamsafe import InvalidArgument, OutOfMemory, StreamMisuse
from numba_streamsafe.numba.launch.policy import launch_policy

pytestmark = pytest.mark.gpu

HERE = Path(__file__).resolve().parent
N = 1 << 20
GRID, BLOCK = 512, 256


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.float32, np.float64,
                                   np.complex128], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape,order", [((1000,), "C"), ((37, 53), "C"), ((37, 53), "F")],
                         ids=["1d", "2d", "2d-F"])
def test_round_trip(gpu, dtype, shape, order):
    h = np.array((np.arange(np.prod(shape)) % 120).reshape(shape).astype(dtype), order=order)
    s = gpu.stream()
    d = nss.to_device(h, stream=s)
    out = nss.copy_to_host(d, stream=s)
    s.synchronize()
    np.testing.assert_array_equal(out, h)
    np.testing.assert_array_equal(nss.copy_to_host(d), h)  # default stream, synchronous


def test_device_copy_and_memset_across_streams(gpu):
    a, b = gpu.stream(), gpu.stream()
    h = np.arange(N, dtype=np.int32)
    src = nss.to_device(h, stream=a)
    dst = nss.device_array(N, np.int32, stream=b)
    nss.copy(dst, src, stream=b)
    nss.memset(src, 0xFF, stream=b)
    out_dst = nss.copy_to_host(dst, stream=a)
    out_src = nss.copy_to_host(src, stream=a)
    a.synchronize()
    np.testing.assert_array_equal(out_dst, h)
    np.testing.assert_array_equal(out_src, np.full(N, -1, np.int32))


def test_zero_size_and_f_order_targets(gpu):
    for shape in (0, (0, 3)):
        z = nss.device_array(shape, np.float32)
        assert nss.block_of(z) is not None  # an identity, as on the simulator
        assert nss.copy_to_host(z).shape == z.shape
        nss.memset(z, 0)
    e = nss.to_device(np.empty((0, 2), np.int16))
    assert nss.copy_to_host(e).shape == (0, 2)
    h = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    f = nss.device_array((3, 4), np.float32, order="F")
    nss.to_device(h, to=f)
    np.testing.assert_array_equal(nss.copy_to_host(f), h)


def test_tracked_kernels_across_streams(gpu, kernels):
    a, b = gpu.stream(), gpu.stream()
    x = nss.device_array(N, np.int32, stream=a)
    y = nss.device_array(N, np.int32, stream=b)
    kernels.fill[GRID, BLOCK, a](x, 41)
    kernels.copy[GRID, BLOCK, b](x, y)
    kernels.fill.forall(N, stream=a)(x, 5)  # waits for the read on b
    out_y = nss.copy_to_host(y, stream=b)
    out_x = nss.copy_to_host(x, stream=b)
    b.synchronize()
    np.testing.assert_array_equal(out_y, np.full(N, 41, np.int32))
    np.testing.assert_array_equal(out_x, np.full(N, 5, np.int32))


def test_host_array_arguments(gpu, kernels):
    s = gpu.stream()
    y = nss.device_array(1000, np.int32, stream=s)
    # Read: Numba auto-transfers it. On the default stream only: numba-cuda 0.30.4
    # with cuda-core 1.2 fails to auto-transfer a NumPy array on any other stream
    # ("NumPy only supports stream=None"), with or without this library.
    kernels.copy[8, 128](np.arange(1000, dtype=np.int32), y)
    np.testing.assert_array_equal(nss.copy_to_host(y, stream=s), np.arange(1000))
    with pytest.raises(InvalidArgument, match="host array"):
        kernels.fill[8, 128, s](np.zeros(1000, np.int32), 1)


def test_unannotated_array_in_strict_mode_is_stream_misuse(gpu, kernels):
    x = nss.device_array(32, np.int32)
    with pytest.raises(StreamMisuse, match="annotate"):
        kernels.unannotated[1, 32](x, 1)


def test_foreign_array_in_strict_mode_is_stream_misuse(gpu, kernels):
    if not launch_policy(nss.get_runtime()).tracking:
        pytest.skip("tracking is off (NUMBA_STREAMSAFE_RESOURCE=direct): launches are not "
                    "checked, so foreign arrays are not refused")
    foreign = gpu.to_device(np.arange(32, dtype=np.int32))  # Numba's default memory manager
    y = nss.device_array(32, np.int32)
    with pytest.raises(StreamMisuse, match="not allocated by numba_streamsafe"):
        kernels.copy[1, 32](foreign, y)


def test_out_of_memory_is_typed_and_recoverable(gpu, fresh_runtime):
    free, total = gpu.current_context().get_memory_info()
    too_much = int(total) + (1 << 30)
    try:
        with pytest.raises(OutOfMemory) as info:
            nss.device_array(too_much, np.uint8)
        assert info.value.requested == too_much
        assert "out of device memory" in str(info.value)
        small = nss.to_device(np.arange(1000, dtype=np.int64))
        np.testing.assert_array_equal(nss.copy_to_host(small), np.arange(1000))
    finally:
        # The failed cuMemAllocAsync leaves the pool holding the device's memory
        # (see the next test); give it back so later tests and children can run.
        fresh_runtime.driver.pool_trim(0)


def test_out_of_memory_gives_the_memory_back(gpu, fresh_runtime):
    free_before, total = gpu.current_context().get_memory_info()
    try:
        with pytest.raises(OutOfMemory):
            nss.device_array(int(total) + (1 << 30), np.uint8)
        fresh_runtime.reap()
        gpu.synchronize()
        free_after, _ = gpu.current_context().get_memory_info()
        assert free_after >= free_before - (1 << 30), (
            f"{free_after / 2**30:.2f} GiB free after OutOfMemory, "
            f"{free_before / 2**30:.2f} GiB before")
    finally:
        fresh_runtime.driver.pool_trim(0)


@pytest.mark.parametrize("threshold", ["keep all", 0])
def test_pool_release_threshold(gpu, threshold):
    """The default stack keeps freed memory pooled across a synchronize (the
    next allocations need not map it again) until ``trim``; with a threshold
    of 0 (CUDA's default) a synchronize hands it back."""
    from numba_streamsafe import POOL_KEEP_ALL
    from numba_streamsafe._driver.cuda import CudaDriver
    from numba_streamsafe.runtime import DeviceRuntime, default_stack

    driver = CudaDriver(0)
    if threshold == "keep all":
        rt = DeviceRuntime(default_stack(driver))
    else:
        rt = DeviceRuntime(nss.AsyncResource(driver, release_threshold=threshold))
    size, slack = 1 << 30, 64 << 20
    try:
        rt.trim()
        free0, _ = driver.mem_info()
        block = rt.allocate(size)  # larger than reuse_bytes: not kept, freed to the pool
        rt.deallocate(block)
        rt.reap()
        gpu.synchronize()
        free1, _ = driver.mem_info()
        if threshold == "keep all":
            assert free1 <= free0 - size + slack, "the pool gave the memory back at a sync"
            rt.trim()
            assert driver.mem_info()[0] >= free0 - slack
        else:
            assert free1 >= free0 - slack, "a threshold of 0 keeps nothing past a sync"
    finally:
        # The device's pool is shared: leave it as the process-wide runtime sets it.
        driver.set_pool_attribute("RELEASE_THRESHOLD", POOL_KEEP_ALL)
        rt.trim()


def test_bytes_outstanding_returns_to_zero(gpu, kernels, fresh_runtime):
    rt = fresh_runtime
    a, b = gpu.stream(), gpu.stream()
    x = nss.to_device(np.arange(N, dtype=np.int32), stream=a)
    y = nss.device_array(N, np.int32, stream=b)
    z = nss.device_array((64, 64), np.float64, stream=a)
    kernels.copy[GRID, BLOCK, b](x, y)
    nss.memset(z, 0, stream=b)
    assert rt.bytes_outstanding() == 2 * 4 * N + 8 * 64 * 64
    del x, y, z
    gc.collect()
    rt.reap()
    assert rt.bytes_outstanding() == 0
    assert rt.stats().live_blocks == 0


EMM_CHILD = textwrap.dedent(r'''
    import gc
    import importlib.util
    import os
    import sys

    import numpy as np
    from numba import cuda

    import numba_streamsafe as nss
    from numba_streamsafe.numba.emm import StreamSafeMemoryManager

    if os.environ.get("NUMBA_CUDA_MEMORY_MANAGER") != "numba_streamsafe":
        cuda.set_memory_manager(StreamSafeMemoryManager)  # before the context exists
    assert isinstance(cuda.current_context().memory_manager, StreamSafeMemoryManager)
    rt = nss.get_runtime()

    arr = cuda.device_array(1000, dtype=np.float32)
    block = nss.block_of(arr)
    assert block is not None and block.nbytes == 4000, block
    assert rt.find(arr.device_ctypes_pointer.value) is block

    d = cuda.to_device(np.arange(100))
    assert nss.block_of(d) is not None
    assert (d.copy_to_host() == np.arange(100)).all()

    s = cuda.stream()
    with nss.stream_scope(s):
        e = cuda.device_array(10)
    assert nss.block_of(e).stream == rt.stream_handle(s)

    # Numba's arrays are the library's now: strict tracked kernels take them.
    spec = importlib.util.spec_from_file_location("k", sys.argv[1])
    k = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(k)
    a, b = cuda.stream(), cuda.stream()
    x = cuda.device_array(1 << 16, dtype=np.int32, stream=a)
    y = cuda.device_array(1 << 16, dtype=np.int32, stream=b)
    k.fill[256, 256, a](x, 3)
    k.copy[256, 256, b](x, y)
    # A host input, auto-transferred (on the default stream: see test_host_array_arguments).
    k.copy[256, 256](np.arange(1 << 16, dtype=np.int32), x)
    out_y = nss.copy_to_host(y, stream=b)
    out_x = nss.copy_to_host(x, stream=b)
    b.synchronize()
    assert (out_y == 3).all()
    assert (out_x == np.arange(1 << 16)).all()
    cuda.synchronize()

    del arr, d, e, x, y, block
    gc.collect()
    rt.reap()
    assert rt.bytes_outstanding() == 0, rt.stats()
    print("EMM OK")
''')


@pytest.mark.parametrize("how", ["set_memory_manager", "environment"])
def test_emm_plugin(gpu, child_env, how):
    extra = {"NUMBA_CUDA_MEMORY_MANAGER": "numba_streamsafe"} if how == "environment" else {}
    proc = subprocess.run([sys.executable, "-c", EMM_CHILD, str(HERE / "kernels.py")],
                          env=child_env(**extra), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "EMM OK" in proc.stdout.splitlines(), proc.stdout + proc.stderr
