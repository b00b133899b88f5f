"""Numba-CUDA programs written outside this project, run unmodified in their own
processes with and without the plugin: whole-process and in-program time.

The programs are numba-cuda's documentation examples
(``numba.cuda.tests.doc_examples``: vector addition, matrix multiplication,
Laplace, Monte Carlo, random numbers, reductions, ufuncs, sessionize,
cooperative groups, ...), which ship with numba-cuda under its licence
(BSD-2-Clause), so nothing is copied or fetched: each runs from the
installed package as ``python -m unittest`` would run it, in a process of its
own, under this script's child runner, which also times the examples alone.

Rounds are interleaved: in each round every program runs once without and
once with the plugin (``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe``), the
order of the two alternating from round to round. Prints, per program, the
median whole-process and in-program times with and without, their ratios,
and the spread of the runs without the plugin ((max - min) / median), and
last the median ratios over the programs, the programs whose whole-process
ratio is above 1.05 beyond their own spread, and the part the library
spends: the plugin's import (its share of every process; Numba and
numba-cuda are imported before it in both modes, and before the in-program
time starts), its first-launch work (the access inference and launch plans,
timed where they run), the launches it queued on its compiled path, and the
waits it queued and skipped (the program's own ordering). A launch's and a
hook's own cost are measured by ``launch_overhead.py`` and
``self_ordered.py``. A program that fails (or is skipped) in either mode is
named and left out of the figures. The library is byte-compiled first, as
pip installs it (``_installed.py``). JSON to ``--json``.

    python benchmarks/real_programs.py [--rounds 5] [--only NAME ...] [--profile DIR]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import statistics
import subprocess
import sys
import time
import unittest
from typing import Any

PACKAGE = "numba.cuda.tests.doc_examples"
#: Examples that build foreign code first (a CUDA C file and a linker): not a
#: program's own work, and they need a toolchain the others do not.
LEFT_OUT = {"test_ffi", "test_cpointer"}


def programs() -> list[str]:
    """The documentation examples of the installed numba-cuda, by module name."""
    pkg = importlib.import_module(PACKAGE)
    names = [m.name for m in pkgutil.iter_modules(pkg.__path__)
             if m.name.startswith("test_") and not m.ispkg]
    return sorted(n for n in names if n not in LEFT_OUT)


def child(module: str) -> None:
    """Run one example module in this process; print its times as JSON.

    Numba and numba-cuda are imported first in both modes (the program
    imports them anyway): the plugin's import is then timed alone, and the
    in-program time of the two modes starts from the same point."""
    start = time.perf_counter()
    importlib.import_module("numba.cuda")
    numba_import = time.perf_counter() - start
    plugin_import = None
    library = None
    if os.environ.get("NUMBA_CUDA_MEMORY_MANAGER") == "numba_streamsafe":
        start = time.perf_counter()
        nss = importlib.import_module("numba_streamsafe")
        plugin_import = time.perf_counter() - start
        library = _instrument()
    profile_dir = os.environ.get("NSS_REAL_PROFILE")
    prof = None
    if profile_dir:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    start = time.perf_counter()
    suite = unittest.defaultTestLoader.loadTestsFromName(f"{PACKAGE}.{module}")
    result = unittest.TestResult()
    suite.run(result)
    in_program = time.perf_counter() - start
    if prof is not None:
        import pstats

        prof.disable()
        side = "with" if plugin_import is not None else "without"
        with open(os.path.join(profile_dir, f"{module}-{side}.txt"), "w") as f:
            pstats.Stats(prof, stream=f).sort_stats("cumulative").print_stats(60)
    if library is not None:
        from numba_streamsafe.numba.launch import launcher

        stats = nss.memory_stats()
        library.update(compiled_launches=launcher.launches(),
                       waits_queued=stats.get("waits_inserted", 0),
                       waits_skipped=stats.get("waits_skipped", 0),
                       events_recorded=stats.get("events_recorded", 0))
    print(json.dumps({"ok": result.wasSuccessful() and result.testsRun > 0
                      and not result.skipped,
                      "tests": result.testsRun, "skipped": len(result.skipped),
                      "errors": [str(e[1])[-300:] for e in result.errors + result.failures]
                      + [f"skipped: {why}" for _, why in result.skipped]
                      + [f"unexpected success: {t}" for t in result.unexpectedSuccesses]
                      + ([] if result.testsRun else [f"no test ran in {module}"]),
                      "in_program": in_program, "numba_import": numba_import,
                      "plugin_import": plugin_import, "library": library}))


def _instrument() -> dict:
    """Time the library's first-launch work where it runs (the access
    inference of a kernel, the launch plan of an overload), into the dict
    returned (seconds, summed over the program)."""
    from _first_launch_work import time_first_launch_work

    out = {"first_launch_s": 0.0}

    def add(_label: str, seconds: float) -> None:
        out["first_launch_s"] += seconds

    time_first_launch_work(add)
    return out


def run_once(module: str, plugin: bool) -> dict:
    from _installed import PLUGIN, memory_manager_env

    # NSS_REAL_PROFILE (from --profile) is kept: the child profiles itself.
    env = memory_manager_env(PLUGIN if plugin else None,
                             {k: v for k, v in os.environ.items()
                              if not k.startswith("NUMBA_STREAMSAFE_")})
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-X", "faulthandler", __file__, "--child", module],
                          env=env, capture_output=True, text=True, timeout=600)
    whole = time.perf_counter() - start
    last = proc.stdout.strip().splitlines()[-1:] or ["{}"]
    try:
        out = json.loads(last[0])
    except json.JSONDecodeError:
        out = {}
    out["whole"] = whole
    if proc.returncode != 0 or not out.get("ok"):
        out["ok"] = False
        out.setdefault("errors", []).append(proc.stderr[-500:])
    return out


def spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values)


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds after which no new round starts (at least one runs)")
    parser.add_argument("--profile", default=None, metavar="DIR",
                        help="profile each program's in-program part (cProfile) into "
                             "DIR/PROGRAM-with.txt and -without.txt (the times then include "
                             "the profiler's)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
        os.environ["NSS_REAL_PROFILE"] = os.path.abspath(args.profile)
    if args.child:
        child(args.child)
        return {}
    from _installed import byte_compile_library

    print(f"library byte-compiled, as pip installs it: {byte_compile_library()}", flush=True)
    names = args.only or programs()
    runs: dict[str, dict[bool, list[dict]]] = {n: {False: [], True: []} for n in names}
    began = time.perf_counter()
    done = 0
    for r in range(args.rounds):
        if r and args.budget is not None and time.perf_counter() - began > args.budget:
            break
        for name in names:
            for plugin in ((False, True) if r % 2 == 0 else (True, False)):
                out = run_once(name, plugin)
                runs[name][plugin].append(out)
                print(f"round {r + 1} {name} {'with' if plugin else 'without'}: "
                      f"{out['whole']:.2f} s{'' if out.get('ok') else ' (failed)'}", flush=True)
        done = r + 1
    rows: dict[str, dict[str, Any]] = {}
    failed: dict[str, list[str]] = {}
    for name in names:
        both = runs[name][False] + runs[name][True]
        if not all(o.get("ok") for o in both):
            first = next(o for o in both if not o.get("ok"))
            failed[name] = [e for e in first.get("errors", []) if e][:2]
            continue
        row: dict[str, Any] = {}
        for key in ("whole", "in_program"):
            without = [o[key] for o in runs[name][False]]
            with_ = [o[key] for o in runs[name][True]]
            row[key] = {"without": statistics.median(without), "with": statistics.median(with_),
                        "ratio": statistics.median(with_) / statistics.median(without),
                        "spread": spread(without)}
        row["plugin_import"] = statistics.median(o["plugin_import"] for o in runs[name][True])
        lib = [o.get("library") or {} for o in runs[name][True]]
        row["library"] = {k: statistics.median(x.get(k, 0) for x in lib)
                          for k in ("first_launch_s", "compiled_launches", "waits_queued",
                                    "waits_skipped", "events_recorded")}
        rows[name] = row
    summary = {
        "programs": len(rows), "rounds": done,
        "median whole ratio": statistics.median(r["whole"]["ratio"] for r in rows.values())
        if rows else None,
        "median in-program ratio": statistics.median(r["in_program"]["ratio"]
                                                     for r in rows.values()) if rows else None,
        "above 1.05 beyond their spread": [n for n, r in rows.items()
                                           if r["whole"]["ratio"] > 1.05 + r["whole"]["spread"]],
        "plugin import, median s": statistics.median(r["plugin_import"] for r in rows.values())
        if rows else None,
        "library first launches, median s": statistics.median(
            r["library"]["first_launch_s"] for r in rows.values()) if rows else None,
        "failed or skipped": failed,
    }
    print(f"{'program':24s} {'whole without':>13s} {'with':>7s} {'ratio':>6s} {'spread':>6s}"
          f" {'in-program without':>18s} {'with':>7s} {'ratio':>6s}"
          f"  {'import':>7s} {'1st launches':>12s} {'launches':>8s} {'waits':>5s} {'skipped':>7s}")
    for name, entry in rows.items():
        w, p, lib = entry["whole"], entry["in_program"], entry["library"]
        print(f"{name:24s} {w['without']:12.2f}s {w['with']:6.2f}s {w['ratio']:6.3f} "
              f"{w['spread']:6.3f} {p['without']:17.2f}s {p['with']:6.2f}s {p['ratio']:6.3f}"
              f"  {entry['plugin_import'] * 1e3:5.0f}ms {lib['first_launch_s'] * 1e3:10.1f}ms"
              f" {lib['compiled_launches']:8.0f} {lib['waits_queued']:5.0f}"
              f" {lib['waits_skipped']:7.0f}")
    print(json.dumps(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "summary": summary}, f, indent=1)
    return summary


if __name__ == "__main__":
    main()
