"""The plain-Numba program of ``tests/programs/plain_numba.py`` on a GPU, with
the plugin selected (``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe``): the same
program the simulator test runs unchanged. ``NSS_PLAIN_TRIALS`` rounds
(default 100) tracked, interleaved with as many untracked (the negative
control): 0 wrong tracked, at least 70 % wrong untracked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
TRIALS = int(os.environ.get("NSS_PLAIN_TRIALS", "100"))

CHILD = """
    import plain_numba
    plain_numba.run(True, 1, 1)   # compile
    wrong = {{True: 0, False: 0}}
    for i in range({trials}):
        for tracked in (True, False):
            wrong[tracked] += plain_numba.run(tracked, i + 2, 2000)  # 2 ms
    print("RESULT", wrong[True], wrong[False])
"""


def test_plain_numba_program_on_the_gpu(child_env):
    env = child_env(NUMBA_CUDA_MEMORY_MANAGER="numba_streamsafe")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "programs"), env["PYTHONPATH"]])
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD.format(trials=TRIALS))],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    tracked, untracked = (int(v) for v in line.split()[1:])
    report = (f"plain-numba-program tracked_wrong={tracked}/{TRIALS} "
              f"untracked_wrong={untracked}/{TRIALS}")
    print(report)
    if os.environ.get("NSS_RACE_REPORT"):
        with open(os.environ["NSS_RACE_REPORT"], "a") as f:
            f.write(report + "\n")
    assert tracked == 0, report
    assert untracked >= 0.7 * TRIALS, "the race did not show untracked: " + report
