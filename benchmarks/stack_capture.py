"""Cost of capturing the user's stack, as check mode does at every launch.

Check mode (and a race check in ordering mode) captures each launch's and
copy's stack (``numba_streamsafe.core.sites.user_stack``): a race found
later names the earlier side. This times one capture on the CPU, the way the
compiled launch calls it (from compiled code, the user's frames above it),
for programs whose launch sits 1, 4 and 16 user frames deep, at the stacks'
default depth and at depth 1 (the innermost line alone). It needs no GPU
and no simulator: the capture walks Python frames only.

``--baseline MODULE`` also times ``MODULE.user_site()`` (say, the compiled
``user_site`` of an earlier tree, which found the innermost user line only).

Prints nanoseconds per capture (best of ``--repeat`` runs of ``--n`` calls,
less the empty loop's time) and writes ``stack_capture.json``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from numba_streamsafe.core import sites


def _loop(fn: Callable[[], Any], n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t0) / n


def _nothing() -> None:
    return None


def _at_depth(frames: int, fn: Callable[[], Any], n: int, repeat: int) -> float:
    """Best ns per ``fn()`` called ``frames`` user frames deep, less an empty call's."""
    if frames > 1:
        return _at_depth(frames - 1, fn, n, repeat)
    best = min(_loop(fn, n) for _ in range(repeat))
    empty = min(_loop(_nothing, n) for _ in range(repeat))
    return max(best - empty, 0.0)


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--baseline", default=None,
                        help="a module whose user_site() to time beside (on sys.path)")
    args = parser.parse_args()
    out: dict[str, Any] = {"compiled": bool(sites.COMPILED), "ns": {}}
    cases: list[tuple[str, Callable[[], Any], int]] = [
        (f"capture_stack depth {sites.DEFAULT_DEPTH}", sites.capture_stack, sites.DEFAULT_DEPTH),
        ("capture_stack depth 1", sites.capture_stack, 1)]
    if args.baseline:
        old = importlib.import_module(args.baseline)
        cases.append((f"{args.baseline}.user_site", old.user_site, 1))
    print(f"numba_streamsafe.core.sites {'compiled' if sites.COMPILED else 'as Python'}; "
          f"ns per capture (best of {args.repeat} x {args.n})")
    print(f"{'capture':32s}" + "".join(f"{f'{k} frames':>12s}" for k in (1, 4, 16)))
    for name, fn, depth in cases:
        sites.set_stack_depth(depth)
        row = [_at_depth(k, fn, args.n, args.repeat) for k in (1, 4, 16)]
        out["ns"][name] = row
        print(f"{name:32s}" + "".join(f"{v:12.1f}" for v in row))
    sites.set_stack_depth(sites.DEFAULT_DEPTH)
    with open("stack_capture.json", "w") as f:
        json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 200))
    main()
