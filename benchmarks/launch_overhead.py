"""Host cost of a tracked launch against a plain Numba launch, side by side.

A kernel with three device-array arguments (read, read, write) is launched N
times per round, tracked and untracked interleaved round by round, in two
scenarios: all on one stream (no fence needed) and alternating between two
streams (every launch must wait for the previous one's write). A third
variant, "tracked, Numba path", turns the direct launches off
(``launch_policy(rt).direct_launch = False``) to show what fencing alone costs
on top of Numba's launch, and "tracked, traced" records every launch in a
``numba_streamsafe.trace()`` (its cost over "tracked"). Prints the per-launch
medians and the ratios; writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import numpy as np
from _harness import SIMULATOR, cuda, device_name, write_result

import numba_streamsafe as nss
from numba_streamsafe import Read, Write, tracked_kernel
from numba_streamsafe.numba.policy import launch_policy


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
    n = 256
    a, b, c = (nss.device_array(n, np.float32, stream=s1) for _ in range(3))
    nss.memset(a, 0, stream=s1)
    nss.memset(b, 0, stream=s1)
    cuda.synchronize()
    for k in (plain, tracked):  # compile and warm up
        for _ in range(3):
            k[1, 32, s1](a, b, c)
    cuda.synchronize()

    rt = nss.get_runtime()
    direct = launch_policy(rt).direct_launch
    variants = [("untracked", plain, direct), ("tracked", tracked, direct),
                ("tracked, traced", tracked, direct)]
    if direct:
        variants.append(("tracked, Numba path", tracked, False))
    results = {}
    for scenario, streams in (("same stream", (s1, s1)), ("cross stream", (s1, s2))):
        per: dict[str, list[float]] = {label: [] for label, _, _ in variants}
        for _ in range(args.rounds):
            for label, k, on in variants:
                launch_policy(rt).direct_launch = on
                cuda.synchronize()
                recording = nss.trace() if label == "tracked, traced" else contextlib.nullcontext()
                with recording:
                    start = time.perf_counter()
                    for i in range(args.launches):
                        k[1, 32, streams[i & 1]](a, b, c)
                    cuda.synchronize()
                    per[label].append((time.perf_counter() - start) / args.launches * 1e6)
        launch_policy(rt).direct_launch = direct
        med = {k: statistics.median(v) for k, v in per.items()}
        results[scenario] = {"us_per_launch": med, "samples_us": per,
                             "ratio": med["tracked"] / med["untracked"]}
        results[scenario]["ratio_traced"] = med["tracked, traced"] / med["tracked"]
        if "tracked, Numba path" in med:
            results[scenario]["ratio_numba_path"] = med["tracked, Numba path"] / med["untracked"]
    print(f"launch overhead on {device_name()} ({args.launches} launches x {args.rounds} rounds)")
    for scenario, r in results.items():
        m = r["us_per_launch"]
        line = (f"  {scenario:12s}: untracked {m['untracked']:7.2f} us  "
                f"tracked {m['tracked']:7.2f} us  ratio {r['ratio']:.3f}")
        if "ratio_numba_path" in r:
            line += (f"  (Numba path {m['tracked, Numba path']:7.2f} us, "
                     f"ratio {r['ratio_numba_path']:.3f})")
        line += f"  traced {m['tracked, traced']:7.2f} us, traced/tracked {r['ratio_traced']:.3f}"

        print(line)
    write_result("launch_overhead", {"launches": args.launches, "rounds": args.rounds,
                                     "results": results})
    return results


if __name__ == "__main__":
    main()
