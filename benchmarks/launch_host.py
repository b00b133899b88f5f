"""The compiled launch entry's own host work, with the driver taken out:
:func:`~numba_streamsafe.numba.launch.launcher.launch` of a kernel with three
device-array arguments (read, read, write), as a tracked or plain launch
reaches it once its plan and the arrays' fields are cached.

The entry calls libcuda's ``cuLaunchKernel``, ``cuEventRecord`` and
``cuStreamWaitEvent`` itself. Here those come from a stub library built with
the C compiler (``cc``) and loaded under libcuda's name, whose functions
return at once; the runtime is the simulated driver's, its event calls
emptied (``engine_host.QuietDriver``). What is left is the entry's work: the
checks that it may take the launch, the plan, the parameters packed, the
preflight and commit under the resource's lock. A GPU launch's host time is
this work plus the driver's (``launch_overhead.py`` measures both on a GPU).

Variants: ``same`` (every launch on one stream) and ``cross`` (launches
alternate two streams, each reading what the other wrote: a wait and an
event per launch), both with the same two argument lists in turn (a loop
over the same arrays: the entry reuses a recent launch's plan, entries and
parameters); ``new``: as ``same``, with eight argument lists in turn, each
its own array objects over the same blocks, more than the entry remembers
(every launch works its arguments out afresh, as a program that makes new
arrays every step). Rounds interleave the variants; medians are printed,
then what each variant asked per launch: the stub's event records and stream
waits, and the launches that reused a recent launch's work. The
figures count instructions as well under ``valgrind --tool=callgrind`` (two
runs of different ``--launches``, their difference), which, unlike time,
repeat from run to run: the way to compare two trees on a shared machine.

Needs the compiled engine and a C compiler; run it in a process of its own
(the stub stays loaded as libcuda in it).

    python benchmarks/launch_host.py [--launches N] [--rounds R] [--variant all|same|cross|new]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

STUB = """
static long counts[3];  /* launches, event records, stream waits */
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shmem, void *stream, void **params, void **extra)
{ counts[0]++; return 0; }
int cuEventRecord(void *event, void *stream) { counts[1]++; return 0; }
int cuStreamWaitEvent(void *stream, void *event, unsigned flags) { counts[2]++; return 0; }
long nss_stub_count(int which) { return counts[which]; }
"""


def load_stub(folder: str) -> Any:
    """Build the stub driver library in ``folder``, load it as libcuda and
    return its counter of calls (``nss_stub_count(0 | 1 | 2)``: launches,
    event records, stream waits)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        sys.exit("launch_host.py needs a C compiler (cc) to build its stub driver library")
    src = os.path.join(folder, "stub.c")
    lib = os.path.join(folder, "libcuda.so.1")
    with open(src, "w") as f:
        f.write(STUB)
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", lib, src],
                   check=True)
    count = ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL).nss_stub_count
    count.restype = ctypes.c_long
    count.argtypes = [ctypes.c_int]
    return count


def setup() -> tuple[Any, Any, tuple, tuple, tuple, tuple, list]:
    """A runtime over the quiet simulated driver, a kernel's launch state
    with one plan, and three arrays with their fields cached: ``(launcher
    module, state, args, args reversed, config on s, config on t, eight
    argument lists of other array objects over the same blocks)``."""
    from engine_host import QuietDriver

    import numba_streamsafe as nss
    from numba_streamsafe.core.access import Access
    from numba_streamsafe.numba.launch import launcher
    from numba_streamsafe.numba.launch.policy import launch_policy
    from numba_streamsafe.resources import AsyncResource
    from numba_streamsafe.runtime import DeviceRuntime

    class Driver(QuietDriver):
        def launch_kernel(self, *args: Any) -> None:
            raise AssertionError("the entry handed the launch to the driver layer: the stub "
                                 "libcuda was not found")

    drv = Driver(backing=False)
    res = AsyncResource(drv)
    rt = DeviceRuntime(res, drv)
    nss.set_runtime(rt)
    policy = launch_policy(rt)
    policy.direct_launch = True  # the simulator's runtime turns it off: no compiled kernels
    state = launcher.LaunchState(rt, policy, (int(Access.READ), int(Access.READ),
                                              int(Access.WRITE)), set(), True, "add",
                                 ("a", "b", "c"))
    argtype = object()  # a Numba array type: plans match argument types by identity

    class Array:
        """A device array as a launch reads it: its cached fields."""

    s, t = drv.create_stream(), drv.create_stream()
    arrays = []
    for _ in range(3):
        block = res.allocate(1 << 16, s)
        a = Array()
        # Seven 8-byte launch fields, as Numba passes a 1-d array.
        a._nss_fast = launcher.ArgFields(block, argtype, bytes(56), 0, block.nbytes)
        arrays.append(a)
    cufunc = object()
    state.add_plan(launcher.Plan((argtype,) * 3, 0x1000, b"AAA", {rt.device: cufunc}, cufunc,
                                 rt.device))
    args = tuple(arrays)
    fresh = []
    for k in range(8):  # new array objects, each with fields of its own, over the same blocks
        views = []
        for a in arrays:
            v = Array()
            f = a._nss_fast
            v._nss_fast = launcher.ArgFields(f.block, argtype, f.fields, f.lo, f.hi)
            views.append(v)
        fresh.append(tuple(views) if k % 2 == 0 else tuple(views[::-1]))
    return launcher, state, args, args[::-1], (1, 128, s), (1, 128, t), fresh


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--variant", choices=("all", "same", "cross", "new"), default="all",
                        help="one variant alone (for callgrind)")
    args = parser.parse_args(argv)
    if args.launches < 2 or args.rounds < 1:
        parser.error("--launches must be at least 2 and --rounds at least 1")
    from numba_streamsafe.numba.launch import launcher as entry

    if not entry.COMPILED:
        sys.exit("launch_host.py measures the compiled entry: this build runs the engine as "
                 "Python (build it: python setup.py build_ext --inplace)")
    folder = tempfile.mkdtemp(prefix="nss-stub-")
    try:
        count = load_stub(folder)
        launcher, state, fwd, rev, on_s, on_t, fresh = setup()
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # loaded: the file is no longer needed
    launch = launcher.launch
    if not launch(state, on_s, fwd):
        sys.exit("the compiled entry handed the launch back: nothing to measure")
    before = launcher.launches()

    n = args.launches // 2  # pairs of launches: each round runs 2 * n

    # Per variant, all rounds: driver calls of each kind, then launches that reused a recent
    # launch's plan, entries and parameters.
    calls: dict[str, list[int]] = {}

    def run(variant: str) -> float:
        other = on_t if variant == "cross" else on_s
        first = [count(k) for k in range(3)] + [launcher.recalled()]
        start = time.perf_counter_ns()
        if variant == "new":
            for i in range(n):
                launch(state, on_s, fresh[(2 * i) % 8])
                launch(state, on_s, fresh[(2 * i + 1) % 8])
        else:
            for _ in range(n):
                launch(state, on_s, fwd)
                launch(state, other, rev)
        took = (time.perf_counter_ns() - start) / (2 * n)
        done = calls.setdefault(variant, [0, 0, 0, 0])
        for k, now in enumerate([count(k) for k in range(3)] + [launcher.recalled()]):
            done[k] += now - first[k]
        return took

    variants = ("same", "cross", "new") if args.variant == "all" else (args.variant,)
    per: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(args.rounds):
        for v in variants:
            per[v].append(run(v))
    if launcher.launches() - before != 2 * n * len(variants) * args.rounds:
        sys.exit("some launches went another way than the compiled entry's: the figures are "
                 "not the entry's")
    med = {k: statistics.median(v) for k, v in per.items()}
    print(f"compiled launch entry, driver calls stubbed ({2 * n} launches x "
          f"{args.rounds} rounds): "
          + ", ".join(f"{v} {med[v]:.0f} ns" for v in variants) + " a launch")
    total = 2 * n * args.rounds
    if any(calls[v][0] != total for v in variants):
        sys.exit("the stub driver did not see every launch: the figures are not the entry's")
    print("a launch: " + ", ".join(
        f"{v} {calls[v][1] / total:.2f} records {calls[v][2] / total:.2f} waits "
        f"{calls[v][3] / total:.2f} recalled" for v in variants))
    return med


if __name__ == "__main__":
    main()
