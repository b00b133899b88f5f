"""A plain Numba program that makes and drops a stream per step, with and
without the plugin: steps per second side by side, and a long run's drift.

Each step makes a stream with ``cuda.stream()``, uploads an array on it
(``cuda.to_device``), runs a kernel that writes a second array from it, and
then, every other step, hands the result to a long-lived reader stream with
an event of the program's own (``cuda.event()``, ``record``, ``wait``) and
copies it there into a third array; the other steps copy on the step's own
stream. The copy comes back to the host on that same stream, is checked, and
the three arrays and the stream are dropped. The program orders every
cross-stream use itself, so it runs right with or without the library.

Two ways to run it:

``python benchmarks/stream_per_step.py [--rounds R] [--steps N]``
    Steps per second of the program in processes of its own, without the
    plugin and with it (``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe``),
    the two taking turns for ``R`` rounds (each process warms up first, so
    import and compile are left out). Prints each round's ratio (with /
    without), their median and spread, the library's events recorded per
    step, the steps that read a wrong value (expected 0), and each phase of
    a step (the stream's creation, the upload, the launch, ... the drop of
    the arrays and the stream) as the median of its time, without and with
    the plugin: where the difference lies. ``--bare`` adds a third process
    per round under ``bare_async_emm``: stream-ordered allocation without
    the library.

``python benchmarks/stream_per_step.py --minutes M [--window S]``
    One process under the plugin runs the steps for ``M`` minutes and prints,
    per window of ``S`` seconds: steps per second, the median time of the
    kernel's launch call, the device memory in use (the driver's total less
    its free), the library's (``pool_used_bytes.current``, and the bytes of
    live arrays, ``allocated_bytes.all.current``), the events it holds
    (``events.in_use``) and the steps that went wrong; then the last window
    against the first.

Writes ``stream_per_step.json`` (``$NSS_BENCH_DIR``, default ``bench-results``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from numba import cuda

HERE = Path(__file__).resolve()
#: A step's phases, in order (their medians are printed side by side).
PHASES = ("stream", "to_device", "device_array", "launch", "handoff", "device_array 2",
          "copy", "copy_to_host", "synchronize", "drop")
TRACE = os.environ.get("NSS_STEP_TRACE") == "1"


@cuda.jit
def scale(src, dst, k):
    i = cuda.grid(1)
    if i < dst.size:
        dst[i] = src[i] * 2 + k


def _clock_keys() -> int | None:
    """How many keys the library's clocks of the program's order hold (the
    host's and every stream's), or None where none are kept: a diagnostic of
    whether they stay bounded as streams come and go."""
    try:
        import numba_streamsafe as nss

        book = nss.get_runtime().resource.marks
        return len(book.done) + sum(len(entry[1]) for entry in book.ordered.values())
    except Exception:  # no plugin, or a resource that keeps no clocks
        return None


def _count_calls(rt) -> dict:
    """Wrap the library's driver calls that cost a step time (events, waits,
    synchronises, streams) to count them by their callers: a diagnostic."""
    import collections
    import traceback

    counts: collections.Counter = collections.Counter()
    names = ("event_record", "stream_wait_event", "stream_synchronize", "event_synchronize",
             "event_query", "ctx_synchronize", "create_stream", "destroy_stream")
    for name in names:
        orig = getattr(rt.driver, name, None)
        if orig is None:
            continue

        def wrapper(*a, _orig=orig, _name=name, **k):
            stack = traceback.extract_stack(limit=8)[:-1]
            key = _name + " <- " + " < ".join(f.name for f in reversed(stack[-6:]))
            counts[key] += 1
            if TRACE:
                args = ", ".join(hex(x) if isinstance(x, int) else repr(x) for x in a)
                print(f"    {_name}({args})  <- " + " < ".join(
                    f"{f.name}:{f.lineno}" for f in reversed(stack[-5:])), file=sys.stderr)
            return _orig(*a, **k)

        setattr(rt.driver, name, wrapper)
    return counts


def _child(steps: int, warmup: int, minutes: float, window: float, profile: str,
           calls: bool = False) -> dict:
    """Run the steps in this process (the memory manager was chosen by the
    parent through the environment) and return the figures."""
    plugin = os.environ.get("NUMBA_CUDA_MEMORY_MANAGER") == "numba_streamsafe"
    stats = None
    counts = None
    if plugin:
        import numba_streamsafe as nss

        stats = nss.memory_stats
        if calls:
            counts = _count_calls(nss.get_runtime())

    simulator = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
    n = 64 if simulator else 1 << 14
    threads = 32 if simulator else 256

    reader = cuda.stream()
    host = np.arange(n, dtype=np.float32)
    #: Seconds of each phase of a step, per step (the launch's is "launch").
    phases: dict[str, list[float]] = {name: [] for name in PHASES}
    launch_times = phases["launch"]
    clock = time.perf_counter

    def step(i: int) -> bool:
        t = [clock()]
        s = cuda.stream()
        if TRACE:
            h = getattr(s, "handle", s)
            print(f"step {i}: stream {getattr(h, 'value', h)}", file=sys.stderr)
        t.append(clock())
        src = cuda.to_device(host, stream=s)
        t.append(clock())
        dst = cuda.device_array(n, np.float32, stream=s)
        k = float(i % 7)
        t.append(clock())
        scale[(n + threads - 1) // threads, threads, s](src, dst, k)
        t.append(clock())
        if i & 1:
            handoff = cuda.event()
            handoff.record(s)
            handoff.wait(reader)
            on = reader
        else:
            on = s
        t.append(clock())
        copy = cuda.device_array(n, np.float32, stream=on)
        t.append(clock())
        copy.copy_to_device(dst, stream=on)
        t.append(clock())
        back = copy.copy_to_host(stream=on)
        t.append(clock())
        on.synchronize()
        t.append(clock())
        right = back[0] == k and back[-1] == host[-1] * 2 + k
        del src, dst, copy, s
        t.append(clock())
        for name, a, b in zip(PHASES, t[:-1], t[1:], strict=True):
            phases[name].append(b - a)
        return bool(right)

    if TRACE:
        print(f"reader {reader}", file=sys.stderr)
    for i in range(warmup):
        step(i)
    cuda.synchronize()
    for times in phases.values():
        times.clear()
    if counts is not None:
        counts.clear()
    out: dict = {"plugin": plugin}
    if minutes <= 0:
        before = stats() if stats else {}
        prof = None
        if profile:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        wrong = 0
        start = time.perf_counter()
        for i in range(steps):
            wrong += not step(i)
        keys = _clock_keys() if plugin else None  # before the device synchronise prunes them
        cuda.synchronize()
        elapsed = time.perf_counter() - start
        if prof is not None:
            import pstats

            prof.disable()
            prof.dump_stats(profile + ".pstats")  # for pstats on the same Python
            with open(profile, "w") as f:
                for order in ("tottime", "cumulative"):
                    pstats.Stats(prof, stream=f).sort_stats(order).print_stats(50)
        after = stats() if stats else {}
        out.update(steps=steps, steps_per_s=steps / elapsed, wrong=wrong,
                   launch_us=statistics.median(launch_times) * 1e6,
                   events_recorded=after.get("events_recorded", 0)
                   - before.get("events_recorded", 0),
                   waits_inserted=after.get("waits_inserted", 0)
                   - before.get("waits_inserted", 0),
                   events_held=after.get("events.in_use"),
                   clock_keys=keys,
                   phase_us={name: statistics.median(v) * 1e6 for name, v in phases.items()})
        if counts is not None:
            for key, count in counts.most_common(20):
                print(f"{count / steps:6.2f} per step  {key}", file=sys.stderr)
        return out
    windows = []
    end = time.perf_counter() + minutes * 60
    i = 0
    while time.perf_counter() < end:
        for times in phases.values():
            times.clear()
        wrong = 0
        w0 = time.perf_counter()
        count = 0
        while time.perf_counter() - w0 < window:
            wrong += not step(i)
            i += 1
            count += 1
        keys = _clock_keys()  # before the device synchronise prunes them
        cuda.synchronize()
        st = stats() if stats else {}
        free, total = cuda.current_context().get_memory_info()
        windows.append({
            "steps_per_s": count / (time.perf_counter() - w0),
            "launch_us": statistics.median(launch_times) * 1e6,
            "allocated_bytes": st.get("allocated_bytes.all.current"),
            "pool_used_bytes": st.get("pool_used_bytes.current"),
            "device_used_bytes": total - free,
            "events_held": st.get("events.in_use"),
            "events_recorded": st.get("events_recorded"),
            "clock_keys": keys,
            "wrong": wrong,
        })
        print(json.dumps(windows[-1]), file=sys.stderr, flush=True)
    out.update(windows=windows, steps=i)
    return out


def _run_child(kind: str, args: argparse.Namespace) -> dict:
    """One process of ``kind``: under Numba's own memory manager (``without``),
    the plugin (``with``), or the floor of stream-ordered allocation
    (``bare``: ``bare_async_emm``, which orders and tracks nothing)."""
    from _installed import PLUGIN, memory_manager_env

    manager = {"without": None, "with": PLUGIN, "bare": "bare_async_emm"}[kind]
    env = memory_manager_env(manager)
    cmd = [sys.executable, "-X", "faulthandler", str(HERE), "--child",
           "--steps", str(args.steps), "--warmup", str(args.warmup)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"the {kind} process exited {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _spread(xs: list[float]) -> float:
    return max(xs) - min(xs) if xs else 0.0


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    simulator = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=40 if simulator else 3000)
    parser.add_argument("--warmup", type=int, default=10 if simulator else 300)
    parser.add_argument("--minutes", type=float, default=0.0,
                        help="run under the plugin this long, in windows (0: compare)")
    parser.add_argument("--window", type=float, default=60.0, help="seconds per window")
    parser.add_argument("--profile", default="",
                        help="with --child: write cProfile's top functions to this file "
                        "(by own and by cumulative time), and the raw statistics to "
                        "FILE.pstats")
    parser.add_argument("--calls", action="store_true",
                        help="with --child: count the library's driver calls by caller")
    parser.add_argument("--bare", action="store_true",
                        help="add a third process per round under bare_async_emm "
                        "(cuMemAllocAsync and cuMemFreeAsync, nothing tracked): what "
                        "stream-ordered allocation alone costs the steps")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.steps, args.warmup, args.minutes, args.window,
                                args.profile, args.calls)))
        return {}
    if args.minutes > 0:
        from _installed import PLUGIN, memory_manager_env

        env = memory_manager_env(PLUGIN)
        cmd = [sys.executable, "-X", "faulthandler", str(HERE), "--child", "--warmup",
               str(args.warmup), "--minutes", str(args.minutes), "--window", str(args.window)]
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"the long run exited {proc.returncode}")
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        ws = res["windows"]
        first, last = ws[0], ws[-1]
        print(f"{len(ws)} windows of {args.window:.0f} s, {res['steps']} steps, "
              f"wrong {sum(w['wrong'] for w in ws)}")
        print(f"{'figure':24s} {'first':>14s} {'last':>14s} {'last/first':>10s}")
        for key in ("steps_per_s", "launch_us", "device_used_bytes", "pool_used_bytes",
                    "allocated_bytes", "events_held", "clock_keys"):
            a, b = first[key] or 0, last[key] or 0
            r = (b / a) if a else (1.0 if b == a else float("inf"))
            print(f"{key:24s} {a:14.2f} {b:14.2f} {r:10.3f}")
        _save(res)
        return res
    kinds = ["without", "with"] + (["bare"] if args.bare else [])
    per: dict[str, list[dict]] = {kind: [] for kind in kinds}
    for r in range(args.rounds):
        for kind in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
            per[kind].append(_run_child(kind, args))
    ratios = [w["steps_per_s"] / o["steps_per_s"]
              for w, o in zip(per["with"], per["without"], strict=True)]
    med = {k: statistics.median(x["steps_per_s"] for x in v) for k, v in per.items()}
    ev = statistics.median(x["events_recorded"] / x["steps"] for x in per["with"])
    wrong = sum(x["wrong"] for v in per.values() for x in v)
    print("rounds (steps/s, with / without):",
          ", ".join(f"{x:.3f}" for x in ratios))
    print(f"steps/s without the plugin {med['without']:.0f}, with it {med['with']:.0f}; "
          f"ratio median {statistics.median(ratios):.3f} (spread {_spread(ratios):.3f}); "
          f"library events recorded per step {ev:.2f}; launch call "
          f"{statistics.median(x['launch_us'] for x in per['without']):.2f} -> "
          f"{statistics.median(x['launch_us'] for x in per['with']):.2f} us; wrong {wrong}; "
          f"clock keys at the end {max(x.get('clock_keys') or 0 for x in per['with'])}")
    res = {"rounds": per, "ratios": ratios, "ratio": statistics.median(ratios),
           "events_per_step": ev, "wrong": wrong}
    if args.bare:
        bare = [b["steps_per_s"] / o["steps_per_s"]
                for b, o in zip(per["bare"], per["without"], strict=True)]
        res["bare_ratio"] = statistics.median(bare)
        print("bare_async_emm rounds (steps/s, bare / without):",
              ", ".join(f"{x:.3f}" for x in bare),
              f"median {res['bare_ratio']:.3f} (spread {_spread(bare):.3f})")
    head = f"{'phase (median us of a step)':30s} {'without':>9s} {'with':>9s} {'with - w/o':>10s}"
    print(head + (f" {'bare':>9s} {'bare - w/o':>10s}" if args.bare else ""))
    for name in PHASES:
        a, b = (statistics.median(x["phase_us"][name] for x in per[k])
                for k in ("without", "with"))
        line = f"{name:30s} {a:9.2f} {b:9.2f} {b - a:10.2f}"
        if args.bare:
            c = statistics.median(x["phase_us"][name] for x in per["bare"])
            line += f" {c:9.2f} {c - a:10.2f}"
        print(line)
    _save(res)
    return res


def _save(result: dict) -> None:
    """Write ``stream_per_step.json`` (``_harness.write_result``). The harness is
    imported here, in the parent only: its examples load the library, which
    would hook Numba in the children run without the plugin."""
    from _harness import write_result

    write_result("stream_per_step", result)


if __name__ == "__main__":
    main()
