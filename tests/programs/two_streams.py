"""A plain Numba program on two streams: it imports nothing of numba_streamsafe.

The kernel on ``b`` reads what the upload on ``a`` wrote, and the copy back on
``a`` reads what the kernel wrote: unordered as written. Run as the README's
"Set one variable" says: ``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe python
two_streams.py`` (tests/numba/test_first_start.py on a CPU,
tests/gpu/test_first_start_gpu.py on a GPU).
"""

import numpy as np
from numba import config, cuda


@cuda.jit
def scale(src, dst, k):
    i = cuda.grid(1)
    if i < src.size:
        dst[i] = src[i] * k


a, b = cuda.stream(), cuda.stream()
host = np.arange(1 << 10 if config.ENABLE_CUDASIM else 1 << 22, dtype=np.float64)
x = cuda.to_device(host, stream=a)
y = cuda.device_array_like(x)
scale[(host.size + 255) // 256, 256, b](x, y, 2.0)   # reads what the upload on a wrote
out = y.copy_to_host(stream=a)                       # reads what the kernel on b wrote
a.synchronize()
where = "Numba's CUDA simulator" if config.ENABLE_CUDASIM else "the GPU"
print(f"{'right' if (out == 2 * host).all() else 'WRONG'} on {where}")
