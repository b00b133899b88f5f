"""The launch walk: which of the package's modules (rooms) one tracked launch
passes through on the Python path, in order, and how often it comes back to a
room it had left.

    python scripts/launch_walk.py [--depth N] [--show]

Runs on Numba's CUDA simulator (the library's simulated driver): a kernel
that reads two arrays and writes a third, launched once to warm up, then once
under :func:`sys.setprofile`. Every call into a function of
``numba_streamsafe`` from ``TrackedKernel.run`` down (``--depth`` levels
below it, default: all) is a step; consecutive steps in one module are one
stay. Prints the stays, the rooms, and the returns (stays that re-enter a
room left before: stays minus rooms).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
os.environ.setdefault("NUMBA_STREAMSAFE_DRIVER", "sim")

import numpy as np  # noqa: E402 - after the simulator is chosen
from numba import cuda  # noqa: E402

import numba_streamsafe as nss  # noqa: E402
from numba_streamsafe import Read, Write, tracked_kernel  # noqa: E402


@tracked_kernel
def add(a: Read, b: Read, c: Write):
    i = cuda.grid(1)
    if i < c.size:
        c[i] = a[i] + b[i]


SHOW_FUNCS = False


def walk(depth: int | None) -> list[str]:
    """The modules of the package entered, call by call, in one launch."""
    s = cuda.stream()
    a, b, c = (nss.device_array(32, np.float32, stream=s) for _ in range(3))
    add[1, 32, s](a, b, c)  # compiles, infers nothing (declared), caches
    modules: list[str] = []
    level = {"depth": 0, "inside": False}

    def profile(frame, event, arg):  # noqa: ANN001
        name = frame.f_globals.get("__name__", "")
        if event == "call":
            if not level["inside"] and frame.f_code.co_name == "run" and \
                    name == "numba_streamsafe.numba.launch.kernel":
                level["inside"] = True
                level["depth"] = 0
            if level["inside"]:
                level["depth"] += 1
                if name.startswith("numba_streamsafe") and \
                        (depth is None or level["depth"] <= depth + 1):
                    modules.append(name if not SHOW_FUNCS else
                                   f"{name}.{frame.f_code.co_name}")
        elif event == "return" and level["inside"]:
            level["depth"] -= 1
            if level["depth"] == 0:
                level["inside"] = False

    sys.setprofile(profile)
    try:
        add[1, 32, s](a, b, c)
    finally:
        sys.setprofile(None)
    return modules


def stays(modules: list[str]) -> list[str]:
    out: list[str] = []
    for m in modules:
        if not out or out[-1] != m:
            out.append(m)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", type=int, default=None)
    parser.add_argument("--show", action="store_true", help="print every stay")
    args = parser.parse_args()
    steps = walk(args.depth)
    walked = stays(steps)
    rooms = set(walked)
    if args.show:
        for m in walked:
            print("  ", m.removeprefix("numba_streamsafe."))
    print(f"steps {len(steps)}  stays {len(walked)}  rooms {len(rooms)}  "
          f"returns {len(walked) - len(rooms)}")


if __name__ == "__main__":
    main()
