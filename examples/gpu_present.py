"""Whether the CUDA driver finds a GPU, asked before Numba loads (no import of
numba_streamsafe: ``plain_numba_pipeline.py`` imports nothing of the library).

As a program (``python examples/gpu_present.py``) it says so, and exits 0 when
a GPU is there, 1 when not: where the examples run without being told.
"""

from __future__ import annotations

import argparse
import ctypes
import sys


def gpu_present() -> bool:
    """True when ``libcuda`` loads and reports at least one device."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int(0)
    return lib.cuInit(0) == 0 and lib.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Say whether the CUDA driver finds a GPU: the examples run there when it "
                    "does, and on Numba's CUDA simulator when it does not. Exit status 0: a "
                    "GPU; 1: none.")
    parser.parse_args(argv)
    present = gpu_present()
    print("a GPU: the examples run on it" if present else
          "no GPU (no CUDA driver, or no device): the examples run on Numba's CUDA simulator")
    return 0 if present else 1


if __name__ == "__main__":
    sys.exit(main())
