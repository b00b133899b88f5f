"""A two-GPU program that ends with its arrays alive: run as a child process by
``tests/gpu/test_multi_gpu.py``, whose test requires exit status 0.

Usage: ``python two_gpu_exit.py KERNELS_PY|numba-only [TRIALS] [SLOW_MS]``.
The memory manager is whatever ``NUMBA_CUDA_MEMORY_MANAGER`` selects (the test
selects the plugin, so the fourth case runs in transparent mode).

Both modes first launch ``SPREAD`` plain ``cuda.jit`` kernels on both GPUs (a
slow producer on GPU 0, its consumer on GPU 1 ordered by an event): GPUs of
one kind then share each kernel's library, and at exit Numba unloads it from
both contexts. With ``numba-only`` that is all, and ``numba_streamsafe`` is
never imported: numba-cuda 0.24-0.30 crash there at exit (the negative
control). Otherwise the library is imported and four cross-device cases
follow, ``TRIALS`` each (default 30), through the public API only, each with
a slow producer (a kernel of about ``SLOW_MS`` milliseconds, default 5) on
GPU 0:

- a tracked kernel on GPU 1 reads GPU 0's array through peer access;
- a tracked copy on GPU 1 from GPU 0's array;
- a free on GPU 1 after a slow read of its array from GPU 0;
- a plain ``cuda.jit`` kernel on GPU 1 reads GPU 0's array (transparent mode,
  when the plugin is selected).

Each case loads its own copy of the kernels, so each leaves modules on both
GPUs for Numba to unload at exit. Every result is checked (a wrong one exits
3). The arrays of every trial stay alive until the interpreter exits, and the
last producers are still queued on both GPUs when it does. Prints ``wrong=N``
per case and ``done`` last.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
from numba import cuda

N = 1 << 16
G, B = 256, 256
#: Every trial's arrays (and the kernels' modules), alive until the interpreter exits.
KEEP: list[object] = []


#: Plain kernels launched on both GPUs, more than Numba's pending-deallocation
#: count (10), so that each context's queue is flushed at exit.
SPREAD = 12


def make_slow_fill():
    """A new plain kernel: its own library once compiled."""

    @cuda.jit
    def slow_fill(out, value, spins):
        for _ in range(spins):
            cuda.nanosleep(1000)
        i = cuda.grid(1)
        step = cuda.gridsize(1)
        while i < out.size:
            out[i] = value
            i += step

    return slow_fill


def spread(spins: int) -> None:
    """SPREAD kernels, each run on GPU 0 then on GPU 1; arrays kept."""
    with cuda.gpus[0]:
        a0 = cuda.stream()
    with cuda.gpus[1]:
        b1 = cuda.stream()
    for value in range(SPREAD):
        kernel = make_slow_fill()
        with cuda.gpus[0]:
            x0 = cuda.device_array(N, np.int32, stream=a0)
            kernel[G, B, a0](x0, value, spins)
            done = cuda.event()
            done.record(a0)
        with cuda.gpus[1]:
            y1 = cuda.device_array(N, np.int32, stream=b1)
            done.wait(b1)
            kernel[G, B, b1](y1, value, spins)
        KEEP.append((kernel, x0, y1, done))


@cuda.jit
def plain_copy(src, dst):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < src.size:
        dst[i] = src[i]
        i += step


def load_kernels(path: str):
    spec = importlib.util.spec_from_file_location("kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    kernels_py = sys.argv[1]
    trials = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    slow_ms = float(sys.argv[3]) if len(sys.argv) > 3 else 5.0
    plugin = os.environ.get("NUMBA_CUDA_MEMORY_MANAGER") == "numba_streamsafe"
    if len(cuda.gpus) < 2:
        print(f"needs 2 GPUs, found {len(cuda.gpus)}")
        return 2
    if kernels_py == "numba-only":
        spread(max(1, int(slow_ms * 1000)))
        print("done", flush=True)
        return 0
    import numba_streamsafe as nss

    spread(max(1, int(slow_ms * 1000)))
    nss.enable_peer_access(0, 1)
    nss.enable_peer_access(1, 0)
    with nss.use_device(0):
        a0 = cuda.stream()
    with nss.use_device(1):
        b1 = cuda.stream()
    ones = np.ones(N, dtype=np.int32)

    # Spins for a producer of about slow_ms on GPU 0 (kernels.SLEEP_NS per spin).
    spins = max(1, int(slow_ms * 1e6 / 1000))  # kernels.SLEEP_NS = 1000 per spin
    keep = KEEP

    def peer_read(k, value: int) -> bool:
        with nss.use_device(0):
            x0 = nss.device_array(N, np.int32, stream=a0)
            k.slow_fill[G, B, a0](x0, value, spins)
        with nss.use_device(1):
            y1 = nss.device_array(N, np.int32, stream=b1)
            k.copy[G, B, b1](x0, y1)
            out = nss.copy_to_host(y1, stream=b1)
            b1.synchronize()
        keep.append((x0, y1))
        return bool((out != value).any())

    def copy_between(k, value: int) -> bool:
        with nss.use_device(0):
            x0 = nss.device_array(N, np.int32, stream=a0)
            k.slow_fill[G, B, a0](x0, value, spins)
        with nss.use_device(1):
            y1 = nss.device_array(N, np.int32, stream=b1)
            nss.copy(y1, x0, stream=b1)
            out = nss.copy_to_host(y1, stream=b1)
            b1.synchronize()
        keep.append((x0, y1))
        return bool((out != value).any())

    def free_after_read(k, value: int) -> bool:
        with nss.use_device(1):
            x1 = nss.to_device(ones, stream=b1)
        with nss.use_device(0):
            y0 = nss.device_array(N, np.int32, stream=a0)
            k.slow_copy[G, B, a0](x1, y0, spins)
        del x1
        with nss.use_device(1):
            z1 = nss.device_array(N, np.int32, stream=b1)
            k.fill[G, B, b1](z1, value)
        with nss.use_device(0):
            out = nss.copy_to_host(y0, stream=a0)
            a0.synchronize()
        keep.append((y0, z1))
        return bool((out != 1).any())

    def plain_peer_read(k, value: int) -> bool:
        with nss.use_device(0):
            x0 = cuda.device_array(N, np.int32, stream=a0)
            k.slow_fill[G, B, a0](x0, value, spins)
        with nss.use_device(1):
            y1 = cuda.device_array(N, np.int32, stream=b1)
            plain_copy[G, B, b1](x0, y1)
            out = y1.copy_to_host(stream=b1)
            b1.synchronize()
        keep.append((x0, y1))
        return bool((out != value).any())

    cases = [peer_read, copy_between, free_after_read]
    if plugin:
        cases.append(plain_peer_read)
    failed = False
    for case in cases:
        k = load_kernels(kernels_py)  # its own kernels: modules on both GPUs, unloaded at exit
        wrong = sum(case(k, i + 2) for i in range(trials))
        print(f"{case.__name__} wrong={wrong}/{trials}", flush=True)
        failed |= wrong > 0
    k = load_kernels(kernels_py)
    # The last producers are still running on both GPUs when the interpreter exits.
    with nss.use_device(0):
        x0 = nss.device_array(N, np.int32, stream=a0)
        k.slow_fill[G, B, a0](x0, 7, spins)
    with nss.use_device(1):
        x1 = nss.device_array(N, np.int32, stream=b1)
        k.slow_copy[G, B, b1](x0, x1, spins)
    keep.append((x0, x1))
    print("done", flush=True)
    return 3 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
