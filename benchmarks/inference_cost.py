"""What the access check adds to a kernel's first launch: inference time
against compile time, for every kernel of the examples.

For each kernel (``examples/kernels_sort.py``, ``kernels_join.py``) and its
``ptx_signature``: the time to compile it (on a GPU: ``cuda.jit(signature)``,
which compiles eagerly to a loaded module, as a first launch does; without a
GPU: ``cuda.compile_ptx``, the front part of it) and the time to infer its
accesses from a cold cache (``numba_streamsafe.numba.accesses.inference``). Both are
medians of ``--repeats`` runs, interleaved. Prints a table and the ratio of
the totals; the target is at most 0.10.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

import target  # noqa: E402,F401 - picks the GPU, or the simulator without one

if target.SIMULATOR:
    raise SystemExit("inference_cost.py compares with Numba's compiler: run it on a GPU, or "
                     "without NUMBA_ENABLE_CUDASIM (PTX only) on a machine with the cpu extra")

import kernels_join  # noqa: E402
import kernels_sort  # noqa: E402
from numba import cuda  # noqa: E402

from numba_streamsafe.numba.accesses import inference  # noqa: E402
from numba_streamsafe.numba.launch.kernel import TrackedKernel  # noqa: E402


def _kernels() -> list[TrackedKernel]:
    out = []
    for module in (kernels_sort, kernels_join):
        for value in vars(module).values():
            if isinstance(value, TrackedKernel) and hasattr(value, "ptx_signature"):
                out.append(value)
    return out


def _gpu() -> bool:
    try:
        return bool(cuda.is_available())
    except Exception:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    gpu = _gpu()
    how = "cuda.jit(signature) (eager compile and load)" if gpu else "cuda.compile_ptx"
    rows = []
    for k in _kernels():
        compile_s, infer_s = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            if gpu:
                cuda.jit(k.ptx_signature)(k.py_func)
            else:
                cuda.compile_ptx(k.py_func, k.ptx_signature, cc=(9, 0))
            compile_s.append(time.perf_counter() - t0)
            inference._cache.clear()
            t0 = time.perf_counter()
            inference.infer_params(k.py_func)
            infer_s.append(time.perf_counter() - t0)
        rows.append((k.__name__, statistics.median(compile_s), statistics.median(infer_s)))
    print(f"first-launch cost of the access check, compile = {how}")
    print(f"{'kernel':<16} {'compile ms':>11} {'infer ms':>9} {'ratio':>7}")
    for name, c, i in rows:
        print(f"{name:<16} {c * 1e3:>11.1f} {i * 1e3:>9.2f} {i / c:>7.3f}")
    total_c = sum(c for _, c, _ in rows)
    total_i = sum(i for _, _, i in rows)
    print(f"{'total':<16} {total_c * 1e3:>11.1f} {total_i * 1e3:>9.2f} {total_i / total_c:>7.3f}")
    return 0 if total_i / total_c <= 0.10 else 1


if __name__ == "__main__":
    raise SystemExit(main())
