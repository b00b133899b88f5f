"""The sort -> join pipeline's probe stage replayed as a CUDA graph, against
the same stage launched eagerly (tracked), side by side in one process.

The stage, on one stream: clear the match count, probe every batch of keys
against the hash table (``hash_probe``), count every batch's matches
(``count_matches``): ``1 + 2 * batches`` tracked operations. The table and the
batches are built and uploaded once, before. Each round times, interleaved,
the host time of queuing the stage eagerly and of one ``g.launch()`` of its
graph (the time until the calls return; the GPU work is waited for outside
the timer), and the wall time of each with its synchronize. Ratios are
medians of per-round ratios. Both results are checked against NumPy every
round. On the simulator the run is short and the figures mean nothing; the
check and the hazard count do.

``--race`` is the negative control instead: a graph on stream ``a`` that
copies ``x`` into ``y`` is replayed right after a slow writer of ``x`` on
stream ``b``, ``--trials`` times with the ordering and as often with it off
(``nss.tracking(False)``), rounds interleaved. With the ordering the replay
waits for the writer: never wrong, no hazard. Without it the replay reads
``x`` early: wrong in most trials on a GPU (at least 70 % is required), and a
hazard in every trial on the simulator (where work runs in order, so the
checker shows the race). Exits non-zero when the ordered replay is wrong or
the race does not show.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from _harness import SIMULATOR, cuda, device_name, ratio_of_medians, write_result
from data import expected_probe, make_relations
from kernels_join import build_table, count_matches, hash_probe
from kernels_sort import copy_into
from target import hazards_now, host_sync, launch_shape

import numba_streamsafe as nss
from numba_streamsafe import Write, tracked_kernel


@tracked_kernel
def slow_fill(out: Write, value, spins):
    """Sleep ``spins`` microseconds, then set every element to ``value``
    (``spins`` is 0 on the simulator, which has no ``nanosleep``)."""
    for _ in range(spins):
        cuda.nanosleep(1000)
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < out.size:
        out[i] = value
        i += step


def race(trials: int, n: int, spins: int) -> dict:
    """The negative control (``--race``): wrong results and hazards of a replay
    racing a slow writer on another stream, with the ordering and without."""
    a, b = cuda.stream(), cuda.stream()
    x = nss.device_array(n, np.int64, stream=a)
    y = nss.device_array(n, np.int64, stream=a)
    g_fill, b_fill = launch_shape(n)
    slow_fill[g_fill, b_fill, b](x, 0, 0)           # compiled before the capture
    copy_into[g_fill, b_fill, a](x, y)
    cuda.synchronize()
    with nss.graph(a) as graph:
        copy_into[g_fill, b_fill, a](x, y)
    wrong = {"ordered": 0, "ordering off": 0}
    hazards = {"ordered": 0, "ordering off": 0}
    for i in range(trials):
        for label, tracking in (("ordered", True), ("ordering off", False)):
            value = 2 * i + (1 if tracking else 2)
            before = hazards_now()
            with nss.tracking(tracking):
                slow_fill[g_fill, b_fill, b](x, value, spins)
                graph.launch()
            host_sync(a)   # the next trial starts after this one (the checker knows too)
            host_sync(b)
            if hazards_now() > before:
                hazards[label] += 1
                if tracking:
                    print(f"  ordered trial {i}: {nss.get_runtime().driver.hazards[before]}")
            wrong[label] += not bool((nss.copy_to_host(y, stream=a) == value).all())
    graph.close()
    print(f"graph replay racing a slow writer on another stream, {trials} trials, {n} elements, "
          f"on {device_name()}:")
    for label in wrong:
        print(f"  {label:13s} wrong {wrong[label]}/{trials}  trials with a hazard "
              f"{hazards[label]}/{trials}")
    shown = hazards["ordering off"] == trials if SIMULATOR else \
        wrong["ordering off"] >= 0.7 * trials
    result = {"trials": trials, "n": n, "spins": spins, "wrong": wrong, "hazards": hazards,
              "race_shown": shown}
    write_result("graph_replay_race", result)
    if wrong["ordered"] or hazards["ordered"]:
        raise SystemExit("graph replay race: the ordered replay was wrong or showed a hazard")
    if not shown:
        raise SystemExit("graph replay race: the race did not show with the ordering off, so "
                         "the control shows nothing; raise --spins")
    return result


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2_000 if SIMULATOR else 1 << 20)
    parser.add_argument("--batches", type=int, default=4 if SIMULATOR else 32)
    parser.add_argument("--rounds", type=int, default=2 if SIMULATOR else 15)
    parser.add_argument("--race", action="store_true",
                        help="the negative control: a replay racing a slow writer, with the "
                             "ordering and without")
    parser.add_argument("--trials", type=int, default=3 if SIMULATOR else 100,
                        help="trials of --race, each way")
    parser.add_argument("--spins", type=int, default=0 if SIMULATOR else 1000,
                        help="microseconds the writer of --race sleeps (0 on the simulator)")
    args = parser.parse_args()
    if args.race:
        return race(args.trials, 1 << 16 if not SIMULATOR else 256, args.spins)

    build, probe_keys = make_relations(args.n, seed=7)
    want = expected_probe(build, probe_keys)
    s = cuda.stream()
    table, mask = build_table(nss.to_device(build, stream=s), s)
    batches = np.array_split(probe_keys, args.batches)
    keys = [nss.to_device(k, stream=s) for k in batches]
    from kernels_join import ROW

    outs = [nss.device_array(k.size, ROW, stream=s) for k in batches]
    total = nss.device_array(1, np.int64, stream=s)
    shapes = [launch_shape(k.size) for k in batches]

    def stage() -> None:
        nss.memset(total, 0, stream=s)
        for d_keys, out, (g, b) in zip(keys, outs, shapes, strict=True):
            hash_probe[g, b, s](d_keys, table, out, mask)
        for out, (g, b) in zip(outs, shapes, strict=True):
            count_matches[g, b, s](out, total)

    def check() -> bool:
        got = np.concatenate([nss.copy_to_host(o, stream=s) for o in outs])
        count = int(nss.copy_to_host(total, stream=s)[0])
        return bool(np.array_equal(got, want)) and count == int((want >= 0).sum())

    hazards0 = hazards_now()
    stage()  # compiles, and fills the caches of the launch path
    cuda.synchronize()
    ok = {"eager": check()}
    with nss.graph(s) as graph:
        stage()
    graph.launch()
    cuda.synchronize()
    ok["graph"] = check()

    per: dict[str, list[float]] = {"eager host": [], "graph host": [], "eager wall": [],
                                   "graph wall": []}
    for _ in range(args.rounds):
        for label, run in (("eager", stage), ("graph", graph.launch)):
            for o in outs:
                nss.memset(o, 0xFF, stream=s)   # a stale answer cannot pass the check
            cuda.synchronize()
            start = time.perf_counter()
            run()
            queued = time.perf_counter()
            cuda.synchronize()
            done = time.perf_counter()
            per[f"{label} host"].append((queued - start) * 1e6)
            per[f"{label} wall"].append((done - start) * 1e6)
            ok[label] = ok[label] and check()
    ratio_host = ratio_of_medians(per, "graph host", "eager host")
    ratio_wall = ratio_of_medians(per, "graph wall", "eager wall")
    med = {k: statistics.median(v) for k, v in per.items()}
    hazards = hazards_now() - hazards0
    ops = 1 + 2 * args.batches
    print(f"graph replay of the probe stage on {device_name()}: {args.n} keys, {args.batches} "
          f"batches, {ops} tracked operations, {args.rounds} rounds")
    print(f"  host time: eager {med['eager host']:9.1f} us  graph {med['graph host']:9.1f} us  "
          f"graph / eager {ratio_host:.3f}")
    print(f"  wall time: eager {med['eager wall']:9.1f} us  graph {med['graph wall']:9.1f} us  "
          f"graph / eager {ratio_wall:.3f}")
    print(f"  results right: eager {ok['eager']}  graph {ok['graph']};  hazards {hazards}")
    result = {"n": args.n, "batches": args.batches, "operations": ops, "rounds": args.rounds,
              "us": med, "samples_us": per, "ratio_host": ratio_host, "ratio_wall": ratio_wall,
              "correct": ok, "hazards": hazards}
    write_result("graph_replay", result)
    if not all(ok.values()) or hazards:
        raise SystemExit("graph replay: a result was wrong or a hazard was found")
    return result


if __name__ == "__main__":
    main()
