"""Check mode and ordering mode on mixed programs (``mixed_program.py``):
plain Numba kernels on CuPy's, PyTorch's and cuda.core's streams, ordered by
those libraries (events, stream, event and device synchronises, PyTorch's
``wait_stream``) or by a Numba event on second ``external_stream`` objects of
the handles, and CuPy's copies and fills into the library's memory.

* check mode, ordered: no race is reported (the driver observer told the
  library what the other libraries ordered);
* check mode, the ordering left out (the negative control): every case's
  race is reported, naming the consumer's line where it is Numba's;
* ordering mode with the observer, ordered: no wrong value, and the waits the
  other libraries' ordering made needless are skipped.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PROGRAM = HERE / "mixed_program.py"

#: The race each case has without its ordering (the consumer reads what the
#: producer wrote; CuPy's copy and fill write what Numba read).
KIND = {"copy": "write-after-read", "memset": "write-after-read"}


def _run(env: dict[str, str], ordered: bool) -> tuple[dict[tuple[str, str], list[str]], str]:
    proc = subprocess.run([sys.executable, "-X", "faulthandler", str(PROGRAM),
                           "ordered" if ordered else "unordered"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=400)
    crash = proc.stderr.find("Fatal Python error")
    assert proc.returncode in (0, 1), (proc.stdout[-3000:]
                                       + proc.stderr[max(crash, 0):][:3000] if crash >= 0
                                       else proc.stderr[-4000:])
    rows = {(line.split()[1], line.split()[2]): line.split()[3:]
            for line in proc.stdout.splitlines() if line.startswith("CASE ")}
    assert rows, proc.stdout + proc.stderr[-3000:]
    assert "OBSERVER running" in proc.stdout, proc.stdout
    return rows, proc.stdout


def _consumer_lines() -> set[str]:
    return {str(i + 1) for i, line in enumerate(PROGRAM.read_text().splitlines())
            if "reads x: s2 after s1?" in line or "CuPy writes x: not after s1?" in line}


@pytest.fixture
def check_env(child_env):
    return child_env(NUMBA_STREAMSAFE_MODE="check", NUMBA_STREAMSAFE_CHECK_REPORT="exit",
                     NUMBA_CUDA_MEMORY_MANAGER="numba_streamsafe")


def test_check_mode_reports_nothing_where_another_library_orders(gpu, check_env, race_report):
    rows, out = _run(check_env, ordered=True)
    for (lib, case), (kinds, lines, wrong) in sorted(rows.items()):
        race_report(f"mixed ordered {lib} {case}: {kinds} {lines} wrong={wrong}")
    reported = {k: v for k, v in rows.items() if v[0] != "-"}
    assert reported == {}, out


def test_check_mode_reports_every_race_when_the_ordering_is_left_out(gpu, check_env,
                                                                     race_report):
    rows, out = _run(check_env, ordered=False)
    consumer = _consumer_lines()
    for (lib, case), (kinds, lines, wrong) in sorted(rows.items()):
        race_report(f"mixed unordered {lib} {case}: {kinds} {lines} wrong={wrong}")
        assert KIND.get(case, "read-after-write") in kinds.split(","), (lib, case, out)
        if case not in KIND:  # the consumer is Numba's: its line is named
            assert set(lines.split(",")) & consumer, (lib, case, lines)


def test_ordering_mode_follows_another_librarys_ordering(gpu, child_env, race_report):
    env = child_env(NUMBA_STREAMSAFE_OBSERVE="1", NUMBA_CUDA_MEMORY_MANAGER="numba_streamsafe")
    rows, out = _run(env, ordered=True)
    wrong = {k: v for k, v in rows.items() if v[2] != "0"}
    assert wrong == {}, out
    waits = next(line for line in out.splitlines() if line.startswith("WAITS "))
    queued, skipped = map(int, waits.split()[1:])
    race_report(f"mixed ordering mode: {len(rows)} cases, 0 wrong, waits queued {queued}, "
                f"skipped {skipped}")
    assert skipped >= len([k for k in rows if k[1] not in KIND]), out
