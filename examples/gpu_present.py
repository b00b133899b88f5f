"""Whether the CUDA driver finds a GPU, asked before Numba loads (no import of
numba_streamsafe: ``plain_numba_pipeline.py`` imports nothing of the library)."""

from __future__ import annotations

import ctypes


def gpu_present() -> bool:
    """True when ``libcuda`` loads and reports at least one device."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int(0)
    return lib.cuInit(0) == 0 and lib.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0
