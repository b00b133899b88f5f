"""Where a compiled tracked launch spends its host time: a loop of
``launcher.launch`` (one stream, three arrays), timed, with variants that
leave parts out. Run it under ``perf record -g`` for the C-level picture.

    python3 scripts/profile_launch.py [--launches N]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from numba import cuda

import numba_streamsafe as nss
from numba_streamsafe import Read, Write, tracked_kernel
from numba_streamsafe.numba.launch import launcher


def body(a, b, c):
    i = cuda.grid(1)
    if i < c.size:
        c[i] = a[i] + b[i]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--launches", type=int, default=100_000)
    args = parser.parse_args()
    k = tracked_kernel(body, access={"a": Read, "b": Read, "c": Write})
    s = cuda.stream()
    a, b, c = (nss.device_array(256, np.float32, stream=s) for _ in range(3))
    for _ in range(3):
        k[1, 32, s](a, b, c)
    cuda.synchronize()
    state = k.launch_state
    assert state is not None and launcher.launch(state, (1, 32, s), (a, b, c))
    cfg, abc = (1, 32, s), (a, b, c)
    launch = launcher.launch
    for label, fn in (("launcher.launch", lambda: launch(state, cfg, abc)),
                      ("k[1, 32, s](a, b, c)", lambda: k[1, 32, s](a, b, c))):
        cuda.synchronize()
        t = time.perf_counter()
        for _ in range(args.launches):
            fn()
        cuda.synchronize()
        print(f"{label}: {(time.perf_counter() - t) / args.launches * 1e9:.0f} ns per launch")
    print("retried:", launcher.retried())


if __name__ == "__main__":
    main()
