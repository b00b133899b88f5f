"""What the plugin adds to a program's start: its import, and the first launch
of plain ``cuda.jit`` kernels against Numba's own compile of them.

Each round runs two processes, one without the plugin and one with it
(``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe``), taking turns. Each
process imports ``numba.cuda`` (timed), then ``numba_streamsafe`` where the
plugin is selected (timed on its own: the import Numba's plugin loader
makes), makes its arrays, and launches each of the kernels below once, timing
that first launch to its end (``cuda.synchronize()``): Numba's typing,
lowering, NVVM, linking and module load, and with the plugin also the
access inference and the launch plan. In the plugin's process the library's
own parts of those launches are timed where they run (the access inference,
``numba_streamsafe.numba.accesses.inference``; the launch plan,
``launch_plan.build_plan``), and its share is their sum against Numba's first
launches of the same kernels in the process without the plugin.

Prints, per kernel and in total: the first launch without and with the
plugin (medians over rounds), the library's part and its share; the plugin's
import; then the whole-process difference. Target: a share of at most 0.10.
The library is byte-compiled first, as pip installs it (``_installed.py``).

    python benchmarks/first_launch.py [--rounds R]
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

HERE = Path(__file__).resolve()

#: Plain kernels of the shapes programs launch first: elementwise, a shared
#: memory reduction, a stencil, atomics, a tiled product, a device function.
SOURCE = '''
from numba import cuda, float32, int32

@cuda.jit
def axpy(a, x, y, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]

@cuda.jit
def block_sum(x, partial):
    tile = cuda.shared.array(128, float32)
    i = cuda.grid(1)
    t = cuda.threadIdx.x
    tile[t] = x[i] if i < x.size else 0.0
    cuda.syncthreads()
    s = 64
    while s > 0:
        if t < s:
            tile[t] += tile[t + s]
        cuda.syncthreads()
        s //= 2
    if t == 0:
        partial[cuda.blockIdx.x] = tile[0]

@cuda.jit
def stencil(u, v):
    i, j = cuda.grid(2)
    if 0 < i < u.shape[0] - 1 and 0 < j < u.shape[1] - 1:
        v[i, j] = 0.25 * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1])

@cuda.jit
def histogram(x, bins):
    i = cuda.grid(1)
    if i < x.size:
        b = int32(x[i] * bins.size) % bins.size
        cuda.atomic.add(bins, b, 1)

@cuda.jit
def matmul(a, b, c):
    sa = cuda.shared.array((16, 16), float32)
    sb = cuda.shared.array((16, 16), float32)
    x, y = cuda.grid(2)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    acc = float32(0.0)
    for k in range((a.shape[1] + 15) // 16):
        sa[tx, ty] = a[x, ty + k * 16] if x < a.shape[0] and ty + k * 16 < a.shape[1] else 0
        sb[tx, ty] = b[tx + k * 16, y] if y < b.shape[1] and tx + k * 16 < b.shape[0] else 0
        cuda.syncthreads()
        for m in range(16):
            acc += sa[tx, m] * sb[m, ty]
        cuda.syncthreads()
    if x < c.shape[0] and y < c.shape[1]:
        c[x, y] = acc

@cuda.jit(device=True)
def clamp(v, lo, hi):
    return min(max(v, lo), hi)

@cuda.jit
def clip(x, out, lo, hi):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = clamp(x[i], lo, hi)
'''


def _child() -> dict:
    t0 = time.perf_counter()
    import numpy as np
    from numba import cuda

    cuda.current_context()  # the context and the memory manager, before any kernel
    t_numba = time.perf_counter() - t0
    plugin = os.environ.get("NUMBA_CUDA_MEMORY_MANAGER") == "numba_streamsafe"
    t_import = 0.0
    ours: dict[str, float] = {}
    if plugin:
        # The plugin is imported when Numba makes its memory manager (above);
        # time a fresh import of it in a process of its own for the figure.
        t_import = float(os.environ.get("NSS_FIRST_LAUNCH_IMPORT", "0"))
        from _first_launch_work import time_first_launch_work

        current = [""]

        def add(label: str, seconds: float) -> None:
            key = f"{current[0]}:{label}"
            ours[key] = ours.get(key, 0.0) + seconds

        time_first_launch_work(add)
    namespace: dict = {}
    exec(compile(SOURCE, "first_launch_kernels", "exec"), namespace)
    n = 1 << 12
    x = cuda.to_device(np.random.default_rng(0).random(n, dtype=np.float32))
    y = cuda.to_device(np.ones(n, np.float32))
    out = cuda.device_array(n, np.float32)
    partial = cuda.device_array(n // 128, np.float32)
    u = cuda.to_device(np.ones((64, 64), np.float32))
    v = cuda.device_array((64, 64), np.float32)
    bins = cuda.to_device(np.zeros(16, np.int32))
    c = cuda.device_array((64, 64), np.float32)
    launches = {
        "axpy": lambda k: k[n // 128, 128](np.float32(2.0), x, y, out),
        "block_sum": lambda k: k[n // 128, 128](x, partial),
        "stencil": lambda k: k[(4, 4), (16, 16)](u, v),
        "histogram": lambda k: k[n // 128, 128](x, bins),
        "matmul": lambda k: k[(4, 4), (16, 16)](u, u, c),
        "clip": lambda k: k[n // 128, 128](x, out, np.float32(0.2), np.float32(0.8)),
    }
    cuda.synchronize()
    first: dict[str, float] = {}
    for name, go in launches.items():
        if plugin:
            current[0] = name
        s = time.perf_counter()
        go(namespace[name])
        cuda.synchronize()
        first[name] = time.perf_counter() - s
    right = abs(float(partial.copy_to_host().sum()) - float(x.copy_to_host().sum())) < 1e-2 * n
    return {"plugin": plugin, "numba_import_and_context": t_numba, "plugin_import": t_import,
            "first": first, "ours": ours, "right": right}


def _import_time(env: dict) -> float:
    """Seconds of ``import numba_streamsafe`` after ``numba.cuda``, in a process
    of its own where the plugin is not selected (so Numba does not import it
    first)."""
    from _installed import memory_manager_env

    env = memory_manager_env(None, env)
    code = ("import time, numba.cuda; t = time.perf_counter(); import numba_streamsafe; "
            "print(time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _run(plugin: bool) -> dict:
    from _installed import PLUGIN, memory_manager_env

    env = memory_manager_env(PLUGIN if plugin else None)
    if plugin:
        env["NSS_FIRST_LAUNCH_IMPORT"] = str(_import_time(env))
    s = time.perf_counter()
    proc = subprocess.run([sys.executable, "-X", "faulthandler", str(HERE), "--child"],
                          env=env, capture_output=True, text=True)
    whole = time.perf_counter() - s
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"the {'plugin' if plugin else 'plain'} process exited "
                         f"{proc.returncode}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["whole"] = whole
    return res


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child()))
        return {}
    from _installed import byte_compile_library

    byte_compile_library()  # as pip installs it: the import is then timed as users meet it
    runs: dict[str, list[dict]] = {"without": [], "with": []}
    for r in range(args.rounds):
        for plugin in ((False, True) if r % 2 == 0 else (True, False)):
            runs["with" if plugin else "without"].append(_run(plugin))
    names = list(runs["without"][0]["first"])
    med = statistics.median
    print(f"first launch of {len(names)} plain kernels, medians of {args.rounds} rounds "
          "(ms): without the plugin, with it, the library's inference and plan, share")
    tot_numba = tot_ours = 0.0
    rows = {}
    for name in names:
        a = med(x["first"][name] for x in runs["without"])
        b = med(x["first"][name] for x in runs["with"])
        inf = med(x["ours"].get(f"{name}:inference", 0.0) for x in runs["with"])
        plan = med(x["ours"].get(f"{name}:plan", 0.0) for x in runs["with"])
        tot_numba += a
        tot_ours += inf + plan
        rows[name] = {"without": a, "with": b, "inference": inf, "plan": plan,
                      "share": (inf + plan) / a}
        print(f"  {name:10s} {a * 1e3:8.1f} {b * 1e3:8.1f}   inference {inf * 1e3:6.2f}  "
              f"plan {plan * 1e3:5.2f}   share {(inf + plan) / a:.3f}")
    share = tot_ours / tot_numba
    imp = med(x["plugin_import"] for x in runs["with"])
    whole = [w["whole"] - o["whole"] for w, o in zip(runs["with"], runs["without"], strict=True)]
    print(f"  total      {tot_numba * 1e3:8.1f} ms of Numba's first launches; the library's "
          f"part {tot_ours * 1e3:.2f} ms: share {share:.3f} (target <= 0.10)")
    spread = max(whole) - min(whole)
    print(f"plugin import after numba.cuda: {imp * 1e3:.1f} ms (median); whole process with - "
          f"without: median {med(whole) * 1e3:.0f} ms, spread {spread * 1e3:.0f} ms; "
          f"right: {all(x['right'] for v in runs.values() for x in v)}")
    res = {"kernels": rows, "share": share, "plugin_import_s": imp, "whole_diff_s": whole,
           "runs": runs}
    # The harness in the parent only: its examples load the library (the children
    # time imports, and run without it half the time).
    from _harness import write_result

    write_result("first_launch", res)
    return res


if __name__ == "__main__":
    main()
