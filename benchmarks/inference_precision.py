"""Precision of the access inference over the test corpus (tests/helpers/inference_corpus.py).

Prints one line per parameter the inference does not get exactly, then the
counts: exact, over-approximated (safe: costs waits) and under-approximated
(unsafe: must be 0). Runs on the CPU (Numba's CUDA simulator when no GPU).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]
if "NUMBA_ENABLE_CUDASIM" not in os.environ:
    try:
        import ctypes

        ctypes.CDLL("libcuda.so.1")
    except OSError:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

from tests.helpers.inference_corpus import CORPUS, score  # noqa: E402


def main() -> int:
    rows = score()
    counts = {"exact": 0, "over": 0, "under": 0}
    for kernel, param, want, have, verdict in rows:
        counts[verdict] += 1
        if verdict != "exact":
            print(f"  {verdict:5s} {kernel}({param}): true {want}, inferred {have}")
    total = len(rows)
    print(f"kernels {len(CORPUS)}, array parameters {total}")
    print(f"{'verdict':<8} {'count':>6} {'share':>7}")
    for verdict, n in counts.items():
        print(f"{verdict:<8} {n:>6} {n / total:>7.1%}")
    return 0 if counts["under"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
