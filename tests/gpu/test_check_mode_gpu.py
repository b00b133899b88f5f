"""Check mode on a GPU (``NUMBA_STREAMSAFE_MODE=check``): the races of
``check_program.py`` are reported with the line of the racing call, for
plain Numba kernels and copies (plugin selected) and for tracked kernels and
copies; the programs that order themselves (events, an event query, stream,
event and device synchronises, a synchronous copy, the legacy default stream)
are not; and the library queues no wait of its own. The same in ordering mode
with each case in ``nss.race_check()``: the same reports, the waits queued."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PROGRAM = HERE / "check_program.py"

RACES = {"raw": "read-after-write", "war": "write-after-read", "waw": "write-after-write",
         "free_after_use": "write-after-read", "copy_after_write": "read-after-write"}
ORDERED = ("event", "event_synchronize", "event_query", "stream_synchronize",
           "device_synchronize", "synchronous_copy", "legacy_stream")


def _lines_of(case: str, marker: str) -> set[str]:
    """The lines of ``check_program.py`` in ``case``'s body that hold ``marker``
    (the plain and the tracked variant's call)."""
    lines = PROGRAM.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"def {case}("))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("def ")),
               len(lines))
    found = {str(i + 1) for i in range(start + 1, end) if marker in lines[i]}
    assert found, f"{marker!r} not in {case}"
    return found


#: The call of each race whose access the report names as the second one.
MARKERS = {"raw": "reads x: not after", "war": "writes x: not after",
           "waw": "writes x: not after", "free_after_use": "reads x on b",
           "copy_after_write": "reads x on b"}


def _run(args: list[str], env: dict[str, str], race_report, label: str, status: int = 0
         ) -> tuple[str, str]:
    """Run ``check_program.py`` with ``args``; assert that it exits with
    ``status``, that every race of :data:`RACES` is reported with its kind
    and the line of its call, and that no program of :data:`ORDERED` is.
    Returns its stdout and stderr."""
    proc = subprocess.run([sys.executable, "-X", "faulthandler", str(PROGRAM), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == status, proc.stdout[-3000:] + proc.stderr[-4000:]
    rows = {line.split()[1]: line.split()[2:] for line in proc.stdout.splitlines()
            if line.startswith("CASE ")}
    assert set(rows) == set(RACES) | set(ORDERED), proc.stdout
    for case, kinds in RACES.items():
        found, lines = rows[case]
        race_report(f"{label} {case}: {found} at check_program.py:{lines}")
        assert kinds in found.split(","), (case, rows[case], proc.stderr[-3000:])
        assert _lines_of(case, MARKERS[case]) & set(lines.split(",")), (case, rows[case])
    for case in ORDERED:
        race_report(f"{label} {case}: {rows[case][0]}")
        assert rows[case] == ["-", "-"], (case, rows[case], proc.stderr[-3000:])
    return proc.stdout, proc.stderr


def _waits(stdout: str) -> list[int]:
    """The ``WAITS n`` lines of the program's output: the library's waits."""
    return [int(line.split()[1]) for line in stdout.splitlines() if line.startswith("WAITS ")]


@pytest.mark.parametrize("kind", ["plain", "tracked"])
def test_check_mode_reports_every_race_and_no_ordered_program(gpu, child_env, race_report,
                                                               kind):
    env = {"NUMBA_STREAMSAFE_MODE": "check", "NUMBA_STREAMSAFE_CHECK_REPORT": "exit"}
    if kind == "plain":
        env["NUMBA_CUDA_MEMORY_MANAGER"] = "numba_streamsafe"
    # NUMBA_STREAMSAFE_CHECK_REPORT=exit: races were found, so the process exits with 1.
    stdout, stderr = _run([kind], child_env(**env), race_report, f"check-mode {kind}", status=1)
    assert _waits(stdout) == [0], stdout
    # The summary at exit lists the races (and only they were found), each in full.
    assert "race(s) found" in stderr, stderr[-3000:]
    assert "memory allocated at:" in stderr and "fix: " in stderr, stderr[-3000:]


@pytest.mark.parametrize("kind", ["plain", "tracked"])
def test_a_race_check_in_ordering_mode_reports_every_race_and_orders_it(gpu, child_env,
                                                                       race_report, kind):
    """``with nss.race_check():`` on a GPU in ordering mode (the default): the
    same races as check mode, with the same lines, and none in the programs
    that order themselves; the library still queues its waits (the block runs
    ordered)."""
    env = {"NUMBA_CUDA_MEMORY_MANAGER": "numba_streamsafe"} if kind == "plain" else {}
    stdout, _ = _run([kind, "block"], child_env(**env), race_report, f"race_check() {kind}")
    waits = _waits(stdout)
    assert waits and waits[0] >= len(RACES), stdout


def test_ordering_mode_reports_nothing_and_orders_the_races(gpu, child_env):
    """The negative control: the same program in ordering mode (the default)
    queues waits for the racing pairs and reports nothing (no checker runs)."""
    proc = subprocess.run([sys.executable, "-X", "faulthandler", str(PROGRAM), "tracked"],
                          cwd=ROOT, env=child_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("CASE ")]
    assert rows and all(row[2:] == ["-", "-"] for row in rows), proc.stdout
    waits = int(next(line for line in proc.stdout.splitlines()
                      if line.startswith("WAITS ")).split()[1])
    assert waits > 0
