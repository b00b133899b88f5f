"""The names the guide's code fragments use, on Numba's CUDA simulator over the
simulated driver: one simulated device, or two (``DOC_DEVICES=2``) for a
fragment that uses a second; on a GPU with ``DOC_GPU=1``, with CuPy and
PyTorch where installed (``ts``, a PyTorch stream; ``t``, a tensor).

``tests/numba/test_doc_blocks.py`` runs each fragment of the README and of
``docs/`` after this prelude, in a process of its own, then checks that the
simulated driver saw no race.
"""

from __future__ import annotations

import os

import numpy as np
from numba import cuda

import numba_streamsafe as nss
from numba_streamsafe import Read, ReadWrite, Write, tracked_kernel
from numba_streamsafe._driver.sim import SimDriver, SimSystem
from numba_streamsafe.resources import AsyncResource
from numba_streamsafe.runtime import DeviceRuntime, clear_runtimes, set_runtime

#: On a GPU (``DOC_GPU=1``) the fragments run on the device's own runtime.
ON_GPU = os.environ.get("DOC_GPU") == "1"
if not ON_GPU:
    _system = SimSystem()
    clear_runtimes()
    for _d in range(int(os.environ.get("DOC_DEVICES", "1"))):
        set_runtime(DeviceRuntime(AsyncResource(SimDriver(_d, system=_system))), _d)


@tracked_kernel
def scale(src: Read, dst: Write, k):
    i = cuda.grid(1)
    if i < src.size:
        dst[i] = src[i] * k


@tracked_kernel
def fill(out: Write, value):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = value


@tracked_kernel
def copy(src: Read, dst: Write):
    i = cuda.grid(1)
    if i < src.size:
        dst[i] = src[i]


@tracked_kernel
def produce(out: Write):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = i


consume = copy


@tracked_kernel
def hash_probe(keys: Read, table: Read, out: Write, mask):
    i = cuda.grid(1)
    if i < keys.size:
        out[i] = table[keys[i] & mask]


@tracked_kernel
def bump(x: ReadWrite):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1


n = 256
grid, block = blocks, threads = 1, 256
host = np.arange(n, dtype=np.float64)
s, upload = cuda.stream(), cuda.stream()
x = nss.to_device(host, stream=s)
y = nss.device_array(n, np.float64, stream=s)
out = nss.device_array(n, np.float64, stream=s)
mask = 63
table = nss.to_device(np.arange(64, dtype=np.int64), stream=upload)
batches = [nss.to_device(np.arange(n, dtype=np.int64) % 64, stream=upload) for _ in range(2)]
outs = [nss.device_array(n, np.int64, stream=s) for _ in range(2)]
new_keys = np.arange(n, dtype=np.int64)[::-1] % 64
ngpus = 1


def run_pipeline() -> None:
    """A small tracked program over two streams."""
    b = cuda.stream()
    scale[grid, block, s](x, y, 2.0)
    bump[grid, block, b](y)
    nss.copy_to_host(y, stream=s)


run_my_pipeline = run_pipeline


if ON_GPU:
    try:
        import cupy  # noqa: F401
    except ImportError:
        pass
    try:
        import torch
    except ImportError:
        pass
    else:
        ts = torch.cuda.Stream()
        t = torch.ones(n, dtype=torch.float64, device="cuda")
