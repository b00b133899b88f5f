"""Shared pieces of the benchmarks: target set-up, timing, results as JSON.

Puts ``examples/`` on the import path: the benchmarks time the examples' kernels
(``kernels_sort``, ``kernels_join``) and data (``data``), and ``target`` picks
the GPU, or the simulator without one, before ``numba.cuda`` loads.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import data  # noqa: E402,F401  (imports target, then the examples' kernels)
import target  # noqa: E402  (picks GPU or simulator before numba.cuda loads)
from numba import cuda  # noqa: E402

SIMULATOR = target.SIMULATOR

__all__ = ["SIMULATOR", "median_time", "ratio_of_medians", "write_result", "device_name",
           "cuda"]


def device_name() -> str:
    if SIMULATOR:
        return "CUDA simulator (simulated driver)"
    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)


def median_time(fn: Callable[[], Any], repeats: int, sync: Callable[[], None] = cuda.synchronize
                ) -> tuple[float, list[float]]:
    """Median wall seconds of ``fn()`` followed by ``sync()``, over ``repeats`` runs."""
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def ratio_of_medians(per: dict[str, list[float]], num: str, den: str) -> float:
    """Median over rounds of ``per[num][r] / per[den][r]``: two variants timed
    side by side, round by round, in one process."""
    return statistics.median(a / b for a, b in zip(per[num], per[den], strict=True))


def write_result(name: str, payload: dict[str, Any]) -> Path:
    """Write ``payload`` to ``$NSS_BENCH_DIR/<name>.json`` (default: ./bench-results)."""
    out = Path(os.environ.get("NSS_BENCH_DIR", "bench-results"))
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    payload = {"benchmark": name, "device": device_name(), **payload}
    path.write_text(json.dumps(payload, indent=2, default=float))
    return path
