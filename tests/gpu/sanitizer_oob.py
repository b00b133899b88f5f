"""Negative control of scripts/sanitizer_check.sh: an out-of-bounds write memcheck must see.

A raw (untracked) Numba kernel stores one element past the end of an
``nss.device_array``. Run it under memcheck::

    NUMBA_STREAMSAFE_RESOURCE=direct compute-sanitizer --tool memcheck \\
        --error-exitcode 1 python3 tests/gpu/sanitizer_oob.py

memcheck must report ``Invalid __global__ write`` and exit non-zero; the
script itself exits 0 when nothing stops the write (without the sanitizer the
store lands in the allocation's slack, unnoticed).

``NUMBA_STREAMSAFE_RESOURCE`` defaults to ``direct`` here: ``cuMemAlloc`` gives
the array an allocation of its own whose end memcheck knows exactly. Set it to
``async`` for the same write inside a pooled block: compute-sanitizer 2025.3.1
caught that too on the H100 ("1 bytes after the nearest allocation ... of size
4,000 bytes"), as it tracks the size of every ``cuMemAllocAsync`` block.

Not a pytest module (its name does not start with ``test_``).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("NUMBA_STREAMSAFE_RESOURCE", "direct")
os.environ.setdefault("NUMBA_DISABLE_PERFORMANCE_WARNINGS", "1")

N = 1000


def main() -> int:
    import numpy as np
    from numba import cuda

    import numba_streamsafe as nss

    rt = nss.get_runtime()
    kind = type(rt.resource).__name__
    print(f"resource {kind} (NUMBA_STREAMSAFE_RESOURCE={os.environ['NUMBA_STREAMSAFE_RESOURCE']})",
          flush=True)
    if os.environ["NUMBA_STREAMSAFE_RESOURCE"] == "direct" and kind != "DirectResource":
        print("expected a DirectResource", file=sys.stderr)
        return 2

    @cuda.jit
    def store_at(arr, i, value):
        if cuda.grid(1) == 0:
            arr[i] = value  # no bounds check: Numba's default

    a = nss.device_array(N, np.int32, tag="oob target")
    block = nss.block_of(a)
    print(f"array of {N} int32 at {block.ptr:#x}, {block.nbytes} bytes; "
          f"writing element {N} (byte offset {4 * N})", flush=True)
    store_at[1, 32](a, N - 1, 1)  # in bounds: compiles the kernel, must stay silent
    store_at[1, 32](a, N, 7)  # one element past the end
    cuda.synchronize()
    print("OOB WRITE LAUNCHED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
