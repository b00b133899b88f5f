"""Quick start: the README's "Usage" example as a program, checked against NumPy.

The code between the two marks below is the README's snippet, verbatim. Without
a GPU it runs on Numba's CUDA simulator and the library's simulated driver (and
says so) with 1 << 10 elements instead of 1 << 20: the simulator runs each GPU
thread as a Python thread. Its checker then reports any two accesses to the
same bytes that nothing orders: there are none.
"""

# ruff: noqa: E402, I001  (the command line is read before the snippet's imports)
import argparse

argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()

import target  # not in the snippet: the GPU, or the simulator without one

# ---- the README's "Usage" snippet, from here ----
import numpy as np
from numba import config, cuda

import numba_streamsafe as nss
from numba_streamsafe import Read, Write, tracked_kernel


@tracked_kernel
def scale(src: Read, dst: Write, k):
    i = cuda.grid(1)
    if i < src.size:
        dst[i] = src[i] * k


n = 1 << 10 if config.ENABLE_CUDASIM else 1 << 20        # fewer on Numba's CUDA simulator
host = np.arange(n, dtype=np.float64)
a, b = cuda.stream(), cuda.stream()
x = nss.to_device(host, stream=a)                        # upload on a
y = nss.device_array(host.shape, host.dtype, stream=a)
scale[(host.size + 255) // 256, 256, b](x, y, 2.0)       # waits for the upload on a
out = nss.copy_to_host(y, stream=a)                      # waits for the kernel on b
a.synchronize()
del x, y                                                 # frees wait for b's uses
# ---- to here ----

nss.get_runtime().flush()  # run the queued frees now, so the simulator's checker sees them
correct = bool(np.array_equal(out, host * 2.0))
hazards = target.hazards_now()
if target.SIMULATOR:
    where = "Numba's CUDA simulator with the simulated driver (no GPU found)"
else:
    name = cuda.get_current_device().name
    where = name.decode() if isinstance(name, bytes) else str(name)
print(f"quickstart: n={n} on {where}")
print(f"  out equals 2 * host: {'ok' if correct else 'WRONG'}")
if target.SIMULATOR:
    print(f"  hazards seen by the simulated driver: {hazards}")
print(f"  result: {'correct' if correct and hazards == 0 else 'FAILED'}")
raise SystemExit(0 if correct and hazards == 0 else 1)
