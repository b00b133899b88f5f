"""Diagnostic for scripts/sanitizer_check.sh: does a device array passed to a
kernel die when its last reference goes?

Launches a plain Numba kernel and a tracked kernel (twice each: the first
launch of a tracked kernel goes through Numba's launch path, the second is
direct) over fresh arrays, drops them, collects, and prints for each case
whether the array is still alive and, if so, the types of what refers to it.
Run it with and without compute-sanitizer and compare. Exits 0 either way.

Not a pytest module (its name does not start with ``test_``).
"""

from __future__ import annotations

import gc
import os
import sys
import weakref

os.environ.setdefault("NUMBA_DISABLE_PERFORMANCE_WARNINGS", "1")

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

import numba_streamsafe as nss  # noqa: E402
from numba_streamsafe import Read, Write, tracked_kernel  # noqa: E402


def body(src, dst):
    i = cuda.grid(1)
    if i < dst.size:
        dst[i] = src[i]


def referrers(obj: object) -> list[str]:
    out = []
    for r in gc.get_referrers(obj):
        if isinstance(r, dict):
            holders = [type(h).__name__ for h in gc.get_referrers(r)
                       if not isinstance(h, list) or len(h) < 50]
            out.append(f"dict (held by {holders[:4]})")
        elif isinstance(r, (list, tuple)):
            holders = [type(h).__name__ for h in gc.get_referrers(r)]
            out.append(f"{type(r).__name__}[{len(r)}] (held by {holders[:4]})")
        else:
            out.append(type(r).__name__)
    return out


def case(name: str, launch) -> bool:
    s = cuda.stream()
    x = nss.to_device(np.arange(1 << 16, dtype=np.int32), stream=s)
    y = nss.device_array(1 << 16, np.int32, stream=s)
    launch(s, x, y)
    s.synchronize()
    refs = (weakref.ref(x), weakref.ref(y), weakref.ref(x.gpu_data), weakref.ref(y.gpu_data))
    del x, y
    gc.collect()
    alive = [r() is not None for r in refs]
    print(f"{name:34s} alive after del (x, y, x.gpu_data, y.gpu_data): {alive}")
    for r, label in zip(refs, ("x", "y", "x.gpu_data", "y.gpu_data"), strict=True):
        obj = r()
        if obj is not None:
            print(f"    {label} referred to by: {referrers(obj)}")
    return not any(alive)


def main() -> int:
    plain = cuda.jit(body)
    tracked = tracked_kernel(body, access={"src": Read, "dst": Write})
    ok = [
        case("plain Numba kernel, first launch", lambda s, x, y: plain[256, 256, s](x, y)),
        case("plain Numba kernel, second launch", lambda s, x, y: plain[256, 256, s](x, y)),
        case("tracked kernel, first launch", lambda s, x, y: tracked[256, 256, s](x, y)),
        case("tracked kernel, direct launch", lambda s, x, y: tracked[256, 256, s](x, y)),
        case("no kernel", lambda s, x, y: None),
    ]
    rt = nss.get_runtime()
    rt.flush()
    rt.reap()
    print(f"all dropped arrays freed: {all(ok)}; bytes outstanding: {rt.bytes_outstanding()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
