"""The examples' command line, report and timer (nothing here touches the GPU work)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import target  # picks the GPU, or the simulator without one, before numba.cuda loads
from numba import cuda


@dataclass
class Report:
    """What an example did: its checks, times and the target it ran on."""

    name: str
    n: int
    tracking: bool
    checks: dict[str, bool] = field(default_factory=dict)
    seconds: float = 0.0
    hazards: int = 0
    first_race: str | None = None

    @property
    def correct(self) -> bool:
        return all(self.checks.values())

    def print(self) -> None:
        if target.SIMULATOR:
            where = "Numba's CUDA simulator with the simulated driver (no GPU found)"
        else:
            name = cuda.get_current_device().name
            where = name.decode() if isinstance(name, bytes) else str(name)
        print(f"{self.name}: n={self.n} on {where}")
        print(f"  tracking: {'on' if self.tracking else 'OFF (race expected)'}")
        for check, ok in self.checks.items():
            print(f"  {check}: {'ok' if ok else 'WRONG'}")
        if target.SIMULATOR:
            print(f"  hazards seen by the simulated driver: {self.hazards}")
            if self.first_race:
                print(f"  first race: {self.first_race}")
        print(f"  time: {self.seconds * 1e3:.1f} ms")
        verdict = "correct" if self.correct and self.hazards == 0 else "RACE SHOWN"
        if self.tracking and not (self.correct and self.hazards == 0):
            verdict = "FAILED"
        print(f"  result: {verdict}")


def parse_args(description: str, default_gpu_n: int = 1 << 24, sim_n: int = 1 << 9,
               min_n: int = 1, max_n: int | None = None,
               graph: bool = False) -> argparse.Namespace:
    """The examples' command line (with ``graph``, a ``--graph`` flag too).

    Values an example cannot run with (``--n`` outside ``min_n``..``max_n``,
    ``--streams`` not a power of two, ``--repeat`` below 1, a negative
    ``--seed``) end the program with argparse's one-line usage error and exit
    status 2.
    """
    parser = argparse.ArgumentParser(description=description)
    if graph:
        parser.add_argument("--graph", action="store_true",
                            help="run the stage the example captures as a CUDA graph, replayed")
    parser.add_argument("--n", type=int, default=None,
                        help=f"number of keys, at least {min_n} (default {default_gpu_n} on a "
                             f"GPU, {sim_n} on the simulator)")
    parser.add_argument("--streams", type=int, default=4, help="worker streams (power of two)")
    parser.add_argument("--no-tracking", action="store_true",
                        help="launch without fences, to show the race")
    parser.add_argument("--repeat", type=int, default=1, help="runs (the last one is reported)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--trace", metavar="FILE", default=None,
                        help="record the last run and save it as Chrome trace / Perfetto JSON "
                             "(device times on a GPU)")
    parser.add_argument("--plot", metavar="FILE", default=None,
                        help="record the last run and draw its timeline (PNG; needs matplotlib)")
    args = parser.parse_args()
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error("--plot draws with matplotlib, which is not installed: pip install "
                         "matplotlib (or the package's 'plot' extra), or leave out --plot")
    if args.n is None:
        args.n = sim_n if target.SIMULATOR else default_gpu_n
    if args.n < min_n:
        parser.error(f"--n must be at least {min_n}, got {args.n}")
    if max_n is not None and args.n > max_n:
        parser.error(f"--n must be at most {max_n}, got {args.n}")
    if args.streams < 1 or args.streams & (args.streams - 1):
        parser.error(f"--streams must be a power of two, got {args.streams}")
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    if args.seed < 0:
        parser.error(f"--seed must be non-negative, got {args.seed}")
    return args


#: Keys above which Numba's CUDA simulator (one Python thread per GPU thread) takes minutes.
SIMULATOR_LARGE_N = 1 << 16


def simulator_warning(n: int) -> str | None:
    """What to tell a user who asks the simulator for ``n`` keys, if it is slow."""
    if n <= SIMULATOR_LARGE_N:
        return None
    return (f"--n {n} is large for Numba's CUDA simulator, which runs every GPU thread as a "
            f"Python thread: expect minutes (at most {SIMULATOR_LARGE_N} runs in seconds); "
            "progress follows")


def run_main(run: Callable[[int, int, bool, int], Report], description: str, *,
             min_n: int = 1, max_n: int | None = None,
             graph: Callable[[int, int, bool, int], Report] | None = None) -> int:
    """Parse the example's arguments, run it ``--repeat`` times and report.

    ``min_n`` and ``max_n`` bound ``--n`` (see :func:`parse_args`). ``graph``:
    the run of ``--graph``. Exits non-zero when a tracked run is wrong or shows
    a hazard; an untracked run reports how often the race showed.
    """
    args = parse_args(description, min_n=min_n, max_n=max_n, graph=graph is not None)
    if graph is not None and args.graph:
        run = graph
    slow = simulator_warning(args.n) if target.SIMULATOR else None
    if slow:
        print(slow, file=sys.stderr, flush=True)
        run = _with_progress(run, args.repeat)
    reports = [run(args.n, args.streams, not args.no_tracking, args.seed)
               for _ in range(args.repeat - 1)]
    if args.trace or args.plot:
        reports.append(_traced(run, args))
    else:
        reports.append(run(args.n, args.streams, not args.no_tracking, args.seed))
    reports[-1].print()
    if args.repeat > 1:
        wrong = sum(not r.correct for r in reports)
        racy = sum(r.hazards > 0 for r in reports)
        median = sorted(r.seconds for r in reports)[len(reports) // 2]
        print(f"  runs: {args.repeat}, wrong results in {wrong}"
              + (f", hazards in {racy}" if target.SIMULATOR else "")
              + f"; median time {median * 1e3:.1f} ms"
              + f" (each: {' '.join(f'{r.seconds * 1e3:.1f}' for r in reports)})")
    ok = all(r.correct and r.hazards == 0 for r in reports)
    return 0 if (args.no_tracking or ok) else 1


def _with_progress(run: Callable[[int, int, bool, int], Report], total: int
                   ) -> Callable[[int, int, bool, int], Report]:
    """``run``, announcing each run and its time on standard error."""
    count = [0]

    def announced(n: int, streams: int, tracking: bool, seed: int) -> Report:
        count[0] += 1
        print(f"run {count[0]}/{total} started ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        report = run(n, streams, tracking, seed)
        print(f"run {count[0]}/{total} done in {time.perf_counter() - start:.1f} s",
              file=sys.stderr, flush=True)
        return report

    return announced


def _traced(run: Callable[[int, int, bool, int], Report], args: argparse.Namespace) -> Report:
    """One run under ``numba_streamsafe.trace``, saved and drawn as asked."""
    import numba_streamsafe as nss

    with nss.trace(device_times=not target.SIMULATOR) as t:
        report = run(args.n, args.streams, not args.no_tracking, args.seed)
    if args.trace:
        t.save(args.trace)
        print(f"trace: {args.trace} ({len(t.ops)} operations; open it in ui.perfetto.dev)")
    if args.plot:
        t.plot(args.plot)
        print(f"timeline: {args.plot}")
    summary = t.summary()
    print("  trace: " + ", ".join(f"{k} {v}" for k, v in summary.items())
          + f"; {'device' if t.device_times_measured else 'host'} times")
    return report


class Timer:
    """Wall time of a ``with`` block, up to the end of everything queued on the device."""

    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        cuda.synchronize()
        self.seconds = time.perf_counter() - self.start
