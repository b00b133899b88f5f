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
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


#: Benchmarks that did not finish: (script and arguments, how it ended).
FAILED: list[tuple[str, str]] = []


def run(script: str, *args: str, env: dict[str, str] | None = None) -> None:
    """Run one benchmark in its own process (``-X faulthandler``: a crash leaves a
    stack). One that dies is recorded in :data:`FAILED` and the others still run."""
    cmd = [sys.executable, "-X", "faulthandler", str(HERE / script), *args]
    print("$", " ".join(cmd[3:]), flush=True)
    proc = subprocess.run(cmd, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        how = (f"killed by signal {-proc.returncode}" if proc.returncode < 0
               else f"exit status {proc.returncode}")
        FAILED.append((" ".join([script, *args]), how))
        print(f"!! {script} did not finish ({how}); the table marks its rows", flush=True)


def at(obj: dict, *path: str) -> float | None:
    """``obj[path[0]][path[1]]...``, or None where a benchmark wrote no such figure."""
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj  # type: ignore[return-value]


def load(name: str) -> dict:
    """A benchmark's JSON, or an empty dict when it did not write one (it died)."""
    out = Path(os.environ.get("NSS_BENCH_DIR", "bench-results"))
    path = out / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds of every benchmark but the race (default: each one's "
                        "own); fewer make a before/after pair fit one session")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 1
    rounds = [] if args.rounds is None else ["--rounds", str(args.rounds)]
    quick = ["--launches", "4"] if args.quick else []
    run("launch_overhead.py", *quick, *rounds)
    run("plain_launch.py", *quick, *rounds)
    run("alloc_free.py", *(["--cycles", "4"] if args.quick else []), *rounds)
    tiny = ["--n", "256"] if args.quick else []
    run("pipeline.py", *tiny, *rounds)
    run("pipeline.py", "--sort", "bucket", *tiny, *rounds)
    run("pipeline.py", "--build-memory", "pageable", *tiny, *rounds)
    run("graph_replay.py", *(["--n", "256", "--batches", "2"] if args.quick else []), *rounds)
    run("graph_replay.py", "--race", *(["--trials", "2"] if args.quick else []))
    run("chunked_streams.py", *(["--chunk", "64", "--iters", "2"] if args.quick else []),
        *quick, *rounds)

    launch = load("launch_overhead").get("results", {})
    plain = load("plain_launch").get("results", {})
    alloc = load("alloc_free").get("ratio", {})
    pipe = load("pipeline")
    bucket = load("pipeline-bucket")
    pageable = load("pipeline-pageable")
    graph = load("graph_replay")
    graph_race = load("graph_replay_race")
    chunked = load("chunked_streams").get("results", {})

    rows = [
        ("tracked / untracked launch, cross stream", at(launch, "cross stream", "ratio"), "<=",
         1.10),
        ("tracked / untracked launch, same stream", at(launch, "same stream", "ratio"), "<=",
         1.05),
        ("tracked / raw cuLaunchKernel, same stream", at(launch, "same stream", "ratio_raw"),
         "<=", 1.15),
        ("tracked / raw cuLaunchKernel, cross stream", at(launch, "cross stream", "ratio_raw"),
         "<=", 2.0),
        ("tracked / hand-placed events floor, cross stream",
         at(launch, "cross stream", "ratio_events_floor"), "<=", 1.15),
        ("8 threads: launches/s tracked / raw", at(launch, "threads", "ratio"), ">=", 0.9),
        ("traced / tracked launch, same stream", at(launch, "same stream", "ratio_traced"),
         "<=", 1.5),
        # The peers' launch cost, measured in the same process (no target: where a
        # Numba user stands against them).
        ("peer: CuPy RawKernel launch / raw, same stream",
         at(launch, "same stream", "CuPy RawKernel / raw"), "", None),
        ("peer: PyTorch add on a stream / raw, same stream",
         at(launch, "same stream", "PyTorch add / raw"), "", None),
    ]
    for scenario in ("same stream", "cross stream"):
        rows.append((f"plain launch, transparent / Numba path, {scenario}",
                     at(plain, scenario, "transparent_over_numba"), "<=", 0.3))
        rows.append((f"plain launch, transparent / tracked, {scenario}",
                     at(plain, scenario, "transparent_over_tracked"), "<=", 1.2))
    for size in ("4KiB", "64MiB"):
        rows.append((f"alloc+free {size}: ours / Numba default", at(alloc, "default", size),
                     "<=", 0.5))
    for size in ("4KiB", "64MiB"):
        rows.append((f"alloc+free {size}: ours / RMM async plugin",
                     at(alloc, "rmm.allocators.numba", size), "<=", 0.95))
    rows += [
        ("pipeline: tracked / device sync per stage", at(pipe, "tracked_over_sync"), "<=", 0.67),
        ("pipeline: throughput vs hand-placed events", at(pipe, "tracked_throughput_vs_events"),
         ">=", 0.95),
        ("pipeline: peak bytes ours / Numba default", at(pipe, "peak_ours_over_numba"), "<=",
         1.0),
        ("probe stage: host time graph replay / eager", at(graph, "ratio_host"), "<=", 0.5),
    ]
    for k in ("K=4", "K=8"):
        for kind in ("plain", "tracked"):
            rows.append((f"chunks of one array / separate, {k}, {kind}",
                         at(chunked, k, f"{kind} views / separate"), "<=", 1.10))
    for kind in ("tracked", "plain"):
        rows.append((f"{kind} launch, view / whole-array argument",
                     at(chunked, "launch", f"{kind} view / whole"), "<=", 1.05))
    print()
    print(f"{'figure':48s} {'ours':>8s} {'target':>9s}  verdict")
    for name, value, op, target in rows:
        if target is None:
            print(f"{name:48s} {'-' if value is None else f'{value:8.3f}':>8s} {'':>9s}  (peer)")
            continue
        if value is None:
            print(f"{name:48s} {'-':>8s} {op}{target:>7.2f}  not run (no rmm, no GPU, or "
                  "its benchmark died)")
            continue
        ok = value <= target if op == "<=" else value >= target
        print(f"{name:48s} {value:8.3f} {op}{target:>7.2f}  {'pass' if ok else 'MISS'}")
    try:  # the details of the benchmarks that finished
        print(f"pipeline correct: {pipe['correct']}; graph replay correct: {graph['correct']}, "
              f"wall time graph / eager {graph['ratio_wall']:.3f} "
              f"({graph['operations']} operations)")
        wrong, trials = graph_race["wrong"], graph_race["trials"]
        print(f"graph replay racing a slow writer: wrong {wrong['ordered']}/{trials} ordered, "
              f"{wrong['ordering off']}/{trials} with the ordering off (negative control; hazards "
              f"{graph_race['hazards']['ordered']} / {graph_race['hazards']['ordering off']})")
        bare = alloc.get("bare_async_emm")
        if bare:
            print("alloc+free ours / bare cuMemAllocAsync+cuMemFreeAsync (the floor): "
                  + ", ".join(f"{size} {v:.3f}" for size, v in bare.items()))
        for scenario in ("same stream", "cross stream"):
            r = launch[scenario]
            if "ratio_raw" in r:
                m = r["us_per_launch"]
                print(f"launch, {scenario}: raw {m['raw']:.2f} us, tracked {m['tracked']:.2f} us, "
                      f"untracked {m['untracked']:.2f} us; untracked / raw "
                      f"{r['untracked_over_raw']:.3f}")
        if "ratio_numba_path" in launch["same stream"]:
            print("tracked launch through Numba's launch path (direct launches off): "
                  f"same stream {launch['same stream']['ratio_numba_path']:.3f}, "
                  f"cross stream {launch['cross stream']['ratio_numba_path']:.3f}")
        sync_s, events_s = pipe["median_s"]["sync"], pipe["median_s"]["events"]
        print(f"pipeline: hand-placed events / device sync per stage {events_s / sync_s:.3f} "
              "(the best any ordering reaches on this pipeline)")
        variants = (("build keys in pageable memory", pageable),
                    ("serial variant (upload everything, then bucket sort)", bucket))
        for label, other in variants:
            med = other["median_s"]
            print(f"{label}: tracked / sync {other['tracked_over_sync']:.3f}, throughput vs hand "
                  f"events {other['tracked_throughput_vs_events']:.3f}, hand events / sync "
                  f"{med['events'] / med['sync']:.3f}, tracked {med['tracked'] * 1e3:.2f} ms, "
                  f"correct: {other['correct']}")
    except (KeyError, TypeError):
        print("(details of a benchmark that did not finish are left out)")
    for script, how in FAILED:
        print(f"DIED: {script}: {how}")
    return 1 if FAILED else 0


if __name__ == "__main__":
    raise SystemExit(main())
