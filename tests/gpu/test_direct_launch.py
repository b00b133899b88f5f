"""Direct launches on a real GPU: the same results as Numba's launch path for
every argument kind the direct path marshals, the fallback for the rest, and
the switch that turns it off."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import numba_streamsafe as nss
from numba_streamsafe import Read, ReadWrite, Write
from numba_streamsafe.numba.launch.policy import launch_policy

pytestmark = pytest.mark.gpu


class Counting:
    """Counts the direct launches of one runtime: those the driver layer
    queues and those the compiled hot path queues itself."""

    def __init__(self, rt, monkeypatch):
        self._calls = 0
        self._fast0 = _fast_launches()
        inner = rt.driver.launch_kernel

        def launch_kernel(*args):
            self._calls += 1
            return inner(*args)

        monkeypatch.setattr(rt.driver, "launch_kernel", launch_kernel)

    @property
    def calls(self):
        return self._calls + _fast_launches() - self._fast0

    @calls.setter
    def calls(self, value):
        self._calls = value
        self._fast0 = _fast_launches()


def _fast_launches():
    """Launches the direct launch queued through libcuda itself (those it
    handed to the driver layer are counted there)."""
    from numba_streamsafe.numba.launch import launcher

    return launcher.launches() - launcher.by_driver()


def _both_paths(rt, run):
    """``run()`` once with direct launches and once through Numba's path."""
    results = []
    for on in (True, False):
        launch_policy(rt).direct_launch = on
        try:
            results.append(run())
        finally:
            launch_policy(rt).direct_launch = True
    return results


def test_arrays_and_scalars_match_numba(gpu, fresh_runtime, monkeypatch):
    @nss.tracked_kernel
    def axpy(x: Read, y: Read, out: Write, a, b, flag, z):
        i = gpu.grid(1)
        if i < out.size:
            v = a * x[i] + y[i] + b
            if flag:
                v += z.real + z.imag
            out[i] = v

    s = gpu.stream()
    n = 10_001
    hx = np.arange(n, dtype=np.float64)
    hy = np.linspace(-1, 1, n)
    x, y = nss.to_device(hx, stream=s), nss.to_device(hy, stream=s)
    count = Counting(fresh_runtime, monkeypatch)

    def run():
        out = nss.device_array(n, np.float64, stream=s)
        for _ in range(2):  # the first launch of a type tuple compiles through Numba
            axpy[(n + 255) // 256, 256, s](x, y, out, 2.5, np.float32(0.25), True, 1 + 2j)
        return nss.copy_to_host(out, stream=s)

    direct, numba_path = _both_paths(fresh_runtime, run)
    expected = 2.5 * hx + hy + 0.25 + 3.0
    np.testing.assert_allclose(direct, expected)
    np.testing.assert_array_equal(direct, numba_path)
    assert count.calls == 1  # second launch direct; Numba's path never calls it


@pytest.mark.parametrize("order", ["C", "F"])
def test_2d_arrays_views_and_strides(gpu, fresh_runtime, monkeypatch, order):
    @nss.tracked_kernel
    def scale2d(src: Read, dst: ReadWrite, k):
        i, j = gpu.grid(2)
        if i < dst.shape[0] and j < dst.shape[1]:
            dst[i, j] += k * src[i, j]

    s = gpu.stream()
    h = np.asarray(np.arange(64 * 48, dtype=np.int32).reshape(64, 48), order=order)
    src_full = nss.to_device(h, stream=s)
    src = src_full[::2, 1::3]  # a strided view: layout 'A'
    count = Counting(fresh_runtime, monkeypatch)

    def run():
        dst = nss.to_device(np.ones(src.shape, np.int32), stream=s)
        for _ in range(3):
            scale2d[(4, 4), (16, 16), s](src, dst, 3)
        return nss.copy_to_host(dst, stream=s)

    direct, numba_path = _both_paths(fresh_runtime, run)
    np.testing.assert_array_equal(direct, 1 + 9 * h[::2, 1::3])
    np.testing.assert_array_equal(direct, numba_path)
    assert count.calls == 2


def test_specialized_signature_converts_scalars(gpu, fresh_runtime, monkeypatch):
    @nss.tracked_kernel(signature="void(float32[:], float32[:], int32, float32)",
                    access={"src": "r", "dst": "w"})
    def shift(src, dst, k, c):
        i = gpu.grid(1)
        if i < dst.size:
            dst[i] = src[i] * k + c

    s = gpu.stream()
    h = np.arange(1000, dtype=np.float32)
    src = nss.to_device(h, stream=s)
    dst = nss.device_array(1000, np.float32, stream=s)
    count = Counting(fresh_runtime, monkeypatch)
    shift[4, 256, s](src, dst, 7, 0.5)  # Python int and float, declared int32 / float32
    np.testing.assert_array_equal(nss.copy_to_host(dst, stream=s), h * 7 + 0.5)
    assert count.calls == 1  # compiled at decoration: the first launch is direct
    # A value that does not fit int32 goes to Numba's path, which wraps it as before.
    before = count.calls
    shift[4, 256, s](src, dst, 2**32 + 3, 0.0)
    np.testing.assert_array_equal(nss.copy_to_host(dst, stream=s), h * 3)
    assert count.calls == before


def test_uncovered_arguments_fall_back(gpu, fresh_runtime, monkeypatch):
    @nss.tracked_kernel
    def add_pair(out: Write, pair):
        i = gpu.grid(1)
        if i < out.size:
            out[i] = pair[0] + pair[1] * i

    s = gpu.stream()
    out = nss.device_array(500, np.int64, stream=s)
    count = Counting(fresh_runtime, monkeypatch)
    for _ in range(2):
        add_pair[2, 256, s](out, (5, 2))  # a tuple: Numba marshals it
    np.testing.assert_array_equal(nss.copy_to_host(out, stream=s), 5 + 2 * np.arange(500))
    assert count.calls == 0


def test_forall_and_shared_memory_launches(gpu, fresh_runtime, monkeypatch):
    @nss.tracked_kernel
    def reverse_tiles(src: Read, dst: Write):
        tile = gpu.shared.array(0, dtype=np.float32)  # dynamic shared memory
        t = gpu.threadIdx.x
        i = gpu.grid(1)
        if i < src.size:
            tile[t] = src[i]
        gpu.syncthreads()
        j = gpu.blockDim.x - 1 - t
        base = gpu.blockIdx.x * gpu.blockDim.x
        if base + j < src.size and i < dst.size:
            dst[i] = tile[j]

    s = gpu.stream()
    h = np.arange(4096, dtype=np.float32)
    src = nss.to_device(h, stream=s)
    dst = nss.device_array(4096, np.float32, stream=s)
    count = Counting(fresh_runtime, monkeypatch)
    for _ in range(2):
        reverse_tiles[16, 256, s, 256 * 4](src, dst)
    expected = h.reshape(16, 256)[:, ::-1].ravel()
    np.testing.assert_array_equal(nss.copy_to_host(dst, stream=s), expected)
    assert count.calls == 1

    @nss.tracked_kernel
    def neg(src: Read, dst: Write):
        i = gpu.grid(1)
        if i < dst.size:
            dst[i] = -src[i]

    for _ in range(2):
        neg.forall(4096, 128, stream=s)(src, dst)
    np.testing.assert_array_equal(nss.copy_to_host(dst, stream=s), -h)
    assert count.calls == 2


def test_cross_stream_direct_launches_are_ordered(gpu, fresh_runtime, monkeypatch):
    """A producer on one stream and a consumer on another, both direct, with a
    slow producer: the consumer must see the producer's writes."""

    @nss.tracked_kernel
    def slow_fill(out: Write, v, spins):
        i = gpu.grid(1)
        if i < out.size:
            acc = 0
            for k in range(spins):
                acc += k & 1
            out[i] = v + (acc - acc)

    @nss.tracked_kernel
    def copy(src: Read, dst: Write):
        i = gpu.grid(1)
        if i < dst.size:
            dst[i] = src[i]

    s1, s2 = gpu.stream(), gpu.stream()
    n = 1 << 16
    buf = nss.device_array(n, np.int64, stream=s1)
    dst = nss.device_array(n, np.int64, stream=s2)
    slow_fill[n // 256, 256, s1](buf, 0, 1)
    copy[n // 256, 256, s2](buf, dst)
    gpu.synchronize()
    count = Counting(fresh_runtime, monkeypatch)
    for v in range(1, 6):
        slow_fill[n // 256, 256, s1](buf, v, 20_000)
        copy[n // 256, 256, s2](buf, dst)
        assert (nss.copy_to_host(dst, stream=s2) == v).all()
    assert count.calls == 10


def test_switch_off_by_environment(gpu, child_env):
    code = (
        "import numba_streamsafe as nss\n"
        "from numba_streamsafe.numba.launch.policy import launch_policy\n"
        "print(launch_policy(nss.get_runtime()).direct_launch)\n"
    )
    on = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True,
                        text=True, timeout=300)
    off = subprocess.run([sys.executable, "-c", code],
                         env=child_env(NUMBA_STREAMSAFE_DIRECT_LAUNCH="0"),
                         capture_output=True, text=True, timeout=300)
    assert on.returncode == 0 and off.returncode == 0, on.stderr + off.stderr
    assert on.stdout.split() == ["True"]
    assert off.stdout.split() == ["False"]


def test_low_occupancy_warning_as_numba(gpu, fresh_runtime, monkeypatch):
    from numba.cuda.core import config
    from numba.cuda.core.errors import NumbaPerformanceWarning

    monkeypatch.setattr(config, "CUDA_LOW_OCCUPANCY_WARNINGS", 1)
    monkeypatch.setattr(config, "DISABLE_PERFORMANCE_WARNINGS", 0)

    @nss.tracked_kernel
    def fill(out: Write, v):
        i = gpu.grid(1)
        if i < out.size:
            out[i] = v

    s = gpu.stream()
    out = nss.device_array(128 * 32, np.int32, stream=s)
    count = Counting(fresh_runtime, monkeypatch)
    fill[128, 32, s](out, 1)  # compiles through Numba; no warning at 128 blocks
    with pytest.warns(NumbaPerformanceWarning, match="Grid size 3 "):
        fill[3, 32, s](out, 2)
    assert count.calls == 1
    h = nss.copy_to_host(out, stream=s)
    assert (h[:96] == 2).all() and (h[96:] == 1).all()


def test_a_number_for_a_boolean_parameter_matches_numba(gpu, fresh_runtime, monkeypatch):
    """Numba's path converts 0.5 for a boolean parameter its own way; the
    direct path leaves such a launch to it, so both give the same."""
    @nss.tracked_kernel(signature="void(int32[:], boolean)", access={"out": "w"})
    def flag(out, b):
        i = gpu.grid(1)
        if i < out.size:
            out[i] = 1 if b else 0

    s = gpu.stream()
    out = nss.device_array(64, np.int32, stream=s)

    def run(value):
        def go():
            flag[1, 64, s](out, value)
            return nss.copy_to_host(out, stream=s)
        return _both_paths(fresh_runtime, go)

    for value in (0.5, 0.0, 1.0, 2, True, False, np.float32(0.25)):
        direct, numba_path = run(value)
        np.testing.assert_array_equal(direct, numba_path, err_msg=repr(value))
