"""The plugin when another library made the CUDA context first: PyTorch and
CuPy initialise CUDA, then Numba attaches to their (primary) context with
``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe``. Each case runs in a child
interpreter (the first library to touch CUDA must be the other one)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

CHILD = """
    import numpy as np
    {first}
    from numba import cuda
    import numba_streamsafe as nss

    @nss.tracked_kernel
    def add(src: nss.Read, dst: nss.Write, k):
        i = cuda.grid(1)
        if i < src.size:
            dst[i] = src[i] + k

    a, b = cuda.stream(), cuda.stream()
    x = cuda.to_device(np.arange(1024, dtype=np.int64), stream=a)   # Numba's call: the plugin
    y = cuda.device_array(1024, dtype=np.int64, stream=b)
    add[4, 256, b](x, y, 1)
    out = y.copy_to_host(stream=b)
    b.synchronize()
    print("PLUGIN", nss.block_of(x) is not None, "RIGHT", bool((out == np.arange(1024) + 1).all()))
"""

FIRST = {
    "torch": "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()",
    "cupy": "import cupy; cupy.zeros(1); cupy.cuda.Device().synchronize()",
}


@pytest.mark.parametrize("library", sorted(FIRST))
def test_the_plugin_attaches_to_another_librarys_context(child_env, library):
    pytest.importorskip(library)
    code = textwrap.dedent(CHILD.format(first=FIRST[library]))
    env = child_env(NUMBA_CUDA_MEMORY_MANAGER="numba_streamsafe")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "PLUGIN True RIGHT True" in proc.stdout, proc.stdout
