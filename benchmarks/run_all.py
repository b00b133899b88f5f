"""Run every benchmark and print the table of figures, targets and pass / miss.

Each benchmark runs in its own process (the memory manager is chosen per
process) and writes JSON under ``$NSS_BENCH_DIR`` (default ``bench-results``);
this script reads them back. ``--quick`` runs tiny sizes (CI uses it on the
simulator so the benchmark code cannot rot).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run(script: str, *args: str, env: dict[str, str] | None = None) -> None:
    cmd = [sys.executable, str(HERE / script), *args]
    print("$", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, env={**os.environ, **(env or {})})


def load(name: str) -> dict:
    out = Path(os.environ.get("NSS_BENCH_DIR", "bench-results"))
    return json.loads((out / f"{name}.json").read_text())


#: Processes per memory manager in the allocation benchmark.
ALLOC_RUNS = 5


def alloc_medians(manager: str, runs: int) -> dict[str, dict[str, float]]:
    """Per size, the median over ``runs`` processes of each one's median cycle cost."""
    name = "alloc_free_" + manager.replace(".", "_")
    per = [load(name + (f"_{i}" if i else ""))["results"] for i in range(runs)]
    return {size: {"us_per_cycle": statistics.median(p[size]["us_per_cycle"] for p in per)}
            for size in per[0]}


def rmm_available() -> bool:
    try:
        import rmm.allocators.numba  # noqa: F401
    except Exception:
        return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    args = parser.parse_args()
    quick = ["--launches", "4", "--rounds", "1"] if args.quick else []
    run("launch_overhead.py", *quick)
    quick = ["--cycles", "4", "--rounds", "1"] if args.quick else []
    have_rmm = rmm_available()
    managers = ["default", "numba_streamsafe"] + (["rmm.allocators.numba"] if have_rmm else [])
    runs = 1 if args.quick else ALLOC_RUNS
    for i in range(runs):  # interleaved: host timings drift between processes
        for manager in managers:
            run("alloc_free.py", *quick, "--run", str(i),
                env={"NUMBA_CUDA_MEMORY_MANAGER": manager})
    run("pipeline.py", *(["--n", "256", "--rounds", "1"] if args.quick else []))

    launch = load("launch_overhead")["results"]
    default = alloc_medians("default", runs)
    ours = alloc_medians("numba_streamsafe", runs)
    rmm = alloc_medians("rmm.allocators.numba", runs) if have_rmm else None
    pipe = load("pipeline")

    rows = [
        ("tracked / untracked launch, cross stream", launch["cross stream"]["ratio"], "<=", 1.10),
        ("tracked / untracked launch, same stream", launch["same stream"]["ratio"], "<=", 1.05),
    ]
    for size in ("4KiB", "64MiB"):
        rows.append((f"alloc+free {size}: ours / Numba default",
                     ours[size]["us_per_cycle"] / default[size]["us_per_cycle"], "<=", 0.5))
    for size in ("4KiB", "64MiB"):
        value = (ours[size]["us_per_cycle"] / rmm[size]["us_per_cycle"]) if rmm else None
        rows.append((f"alloc+free {size}: ours / RMM async plugin", value, "<=", 1.0))
    rows += [
        ("pipeline: tracked / device sync per stage", pipe["tracked_over_sync"], "<=", 0.67),
        ("pipeline: throughput vs hand-placed events", pipe["tracked_throughput_vs_events"],
         ">=", 0.95),
        ("pipeline: peak bytes ours / Numba default", pipe["peak_ours_over_numba"], "<=", 1.0),
    ]
    print()
    print(f"{'figure':48s} {'ours':>8s} {'target':>9s}  verdict")
    for name, value, op, target in rows:
        if value is None:
            print(f"{name:48s} {'-':>8s} {op}{target:>7.2f}  not run (rmm not installed)")
            continue
        ok = value <= target if op == "<=" else value >= target
        print(f"{name:48s} {value:8.3f} {op}{target:>7.2f}  {'pass' if ok else 'MISS'}")
    print(f"pipeline correct: {pipe['correct']}")
    if "ratio_numba_path" in launch["same stream"]:
        print("tracked launch through Numba's launch path (direct launches off): "
              f"same stream {launch['same stream']['ratio_numba_path']:.3f}, "
              f"cross stream {launch['cross stream']['ratio_numba_path']:.3f}")
    sync_s, events_s = pipe["median_s"]["sync"], pipe["median_s"]["events"]
    print(f"pipeline: hand-placed events / device sync per stage {events_s / sync_s:.3f} "
          "(the best any ordering reaches on this pipeline)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
