"""Cost of a plain ``cuda.jit`` launch in transparent mode, side by side.

Runs with the plugin selected (``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe``,
set here before Numba loads). In one process, rounds interleaved, per launch:

* ``Numba path``: the plain kernel inside ``numba_streamsafe.transparent(False)``,
  which launches through Numba's own path, as without the plugin;
* ``transparent``: the same launch in transparent mode (accesses inferred,
  fenced, launched directly);
* ``tracked``: the same body as a ``@tracked_kernel`` with declared accesses.

Same stream, and across two streams (every launch writes ``c`` on the other
stream, so each one waits for the last). Prints the ratios and writes
``plain_launch.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("NUMBA_CUDA_MEMORY_MANAGER", "numba_streamsafe")

import numpy as np  # noqa: E402
from _harness import SIMULATOR, cuda, device_name, ratio_of_medians, write_result  # noqa: E402

import numba_streamsafe as nss  # noqa: E402
from numba_streamsafe import Read, Write, tracked_kernel  # noqa: E402


def body(a, b, c):
    i = cuda.grid(1)
    if i < c.size:
        c[i] = a[i] + b[i]


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=4 if SIMULATOR else 5000)
    parser.add_argument("--rounds", type=int, default=2 if SIMULATOR else 15)
    args = parser.parse_args()
    plain = cuda.jit(body)
    tracked = tracked_kernel(body, access={"a": Read, "b": Read, "c": Write})
    s1, s2 = cuda.stream(), cuda.stream()
    a, b, c = (cuda.to_device(np.zeros(256, np.float32)) for _ in range(3))
    for k in (plain, tracked):
        for _ in range(3):
            k[1, 32, s1](a, b, c)
    cuda.synchronize()

    def numba_path(k, streams, n):
        with nss.transparent(False):
            for i in range(n):
                k[1, 32, streams[i & 1]](a, b, c)

    def fenced(k, streams, n):
        for i in range(n):
            k[1, 32, streams[i & 1]](a, b, c)

    variants = (("Numba path", plain, numba_path), ("transparent", plain, fenced),
                ("tracked", tracked, fenced))
    results = {}
    for scenario, streams in (("same stream", (s1, s1)), ("cross stream", (s1, s2))):
        per: dict[str, list[float]] = {label: [] for label, _, _ in variants}
        for _ in range(args.rounds):
            for label, k, go in variants:
                cuda.synchronize()
                start = time.perf_counter()
                go(k, streams, args.launches)
                cuda.synchronize()
                per[label].append((time.perf_counter() - start) / args.launches * 1e6)

        results[scenario] = {
            "us_per_launch": {k: statistics.median(v) for k, v in per.items()},
            "transparent_over_numba": ratio_of_medians(per, "transparent", "Numba path"),
            "transparent_over_tracked": ratio_of_medians(per, "transparent", "tracked"),
        }
    c.copy_to_host()  # the launches ran
    print(f"plain launch in transparent mode on {device_name()} "
          f"({args.launches} launches x {args.rounds} rounds)")
    for scenario, r in results.items():
        m = r["us_per_launch"]
        print(f"  {scenario:12s}: Numba path {m['Numba path']:7.2f} us  transparent "
              f"{m['transparent']:7.2f} us  tracked {m['tracked']:7.2f} us  transparent / "
              f"Numba {r['transparent_over_numba']:.3f}  transparent / tracked "
              f"{r['transparent_over_tracked']:.3f}")
    write_result("plain_launch", {"launches": args.launches, "rounds": args.rounds,
                                  "results": results})
    return results


if __name__ == "__main__":
    main()
