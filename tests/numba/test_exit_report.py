"""The process's own report of its races, for CI: an unmodified plain Numba
program, racy or ordered, run on the simulator in a child interpreter.

* Check mode with ``NUMBA_STREAMSAFE_CHECK_REPORT=exit``: the races are
  summarised on standard error in full, and the exit status is 1 when any
  was found, 0 when none.
* The simulator's checker in ordering mode (``NUMBA_STREAMSAFE_TRANSPARENT=0``
  leaves plain Numba unordered): the hazards no race check collected are
  summarised at exit; the status is the program's, or 1 with ``exit``.
* ``NUMBA_STREAMSAFE_REPORT_FILE``: one JSON line per race, with both sides,
  their stacks and streams, the allocation and the fix.
* Races a ``race_check`` block collected are that block's, not the exit
  report's; the program's own exit handlers still run when the status is set.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

PROGRAM = textwrap.dedent('''
    import atexit
    import sys

    import numpy as np
    from numba import cuda

    import numba_streamsafe as nss

    N = 64
    atexit.register(print, "the program's exit handler ran")


    @cuda.jit
    def fill(out, v):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = v


    @cuda.jit
    def copy(src, dst):
        i = cuda.grid(1)
        if i < src.size:
            dst[i] = src[i]


    def main(how):
        a, b = cuda.stream(), cuda.stream()
        x = cuda.device_array(N, np.float32, stream=a)
        y = cuda.device_array(N, np.float32, stream=b)
        fill[1, N, a](x, 1.0)
        if how == "ordered":
            done = cuda.event()
            done.record(a)
            done.wait(b)
        if how == "in a race check":
            with nss.race_check(stop_at_first=False) as check:
                copy[1, N, b](x, y)
            print("the block collected", len(check.hazards))
        else:
            copy[1, N, b](x, y)  # the consumer
        b.synchronize()
        print("done")


    main(sys.argv[1])
''')


def _run(tmp_path, child_env, how: str, **settings: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "program.py").write_text(PROGRAM)
    env = child_env(NUMBA_ENABLE_CUDASIM="1", NUMBA_CUDA_MEMORY_MANAGER="numba_streamsafe",
                    **settings)
    proc = subprocess.run([sys.executable, "program.py", how], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert "done" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "the program's exit handler ran" in proc.stdout, proc.stdout  # it still runs
    return proc


CHECK_EXIT = {"NUMBA_STREAMSAFE_MODE": "check", "NUMBA_STREAMSAFE_CHECK_REPORT": "exit"}
SIMULATOR = {"NUMBA_STREAMSAFE_TRANSPARENT": "0"}


@pytest.mark.parametrize("settings, status", [
    (CHECK_EXIT, 1),
    (SIMULATOR, 0),
    ({**SIMULATOR, "NUMBA_STREAMSAFE_CHECK_REPORT": "exit"}, 1),
], ids=["check-mode exit", "simulator", "simulator exit"])
def test_a_racy_program_is_summarised_at_exit_with_the_status_asked(tmp_path, child_env,
                                                                     settings, status):
    report = tmp_path / "races.jsonl"
    proc = _run(tmp_path, child_env, "racy", NUMBA_STREAMSAFE_REPORT_FILE=str(report),
                **settings)
    assert proc.returncode == status, proc.stderr[-3000:]
    err = proc.stderr
    if "NUMBA_STREAMSAFE_MODE" in settings:
        assert "numba_streamsafe check mode: 1 race(s) found:" in err, err
    else:
        assert "numba_streamsafe: the simulator's checker found 1 race(s) that no race " \
               "check collected:" in err, err
        assert ("NUMBA_STREAMSAFE_CHECK_REPORT=exit" in err) == (status == 0), err
    # In full: both stacks with their source lines, the allocation, the fix.
    assert "copy[1, N, b](x, y)  # the consumer" in err and "main(sys.argv[1])" in err, err
    assert "memory allocated at:" in err and "ev.wait(" in err, err
    lines = [json.loads(text) for text in report.read_text().splitlines()]
    assert len(lines) == 1, lines
    race = lines[0]
    assert race["kind"] == "read-after-write" and race["test"] is None
    for side in ("first", "second"):
        assert race[side]["stack"][0][0].endswith("program.py"), race[side]
        assert race[side]["stream_origin"]["library"] == "numba", race[side]
        assert race[side]["library"] == "numba"
    assert race["allocated"] and race["fix"] and "ev.record(" in race["fix"]


@pytest.mark.parametrize("settings", [CHECK_EXIT, {**SIMULATOR,
                                                   "NUMBA_STREAMSAFE_CHECK_REPORT": "exit"}],
                         ids=["check-mode exit", "simulator exit"])
def test_an_ordered_program_exits_zero(tmp_path, child_env, settings):
    proc = _run(tmp_path, child_env, "ordered", **settings)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if "NUMBA_STREAMSAFE_MODE" in settings:
        assert "numba_streamsafe check mode: no race found" in proc.stderr
    else:
        assert "race" not in proc.stderr, proc.stderr


def test_races_a_race_check_collected_are_its_own(tmp_path, child_env):
    """The block reports its race (the program looked at it): the exit
    report leaves it out, and the status stays 0."""
    proc = _run(tmp_path, child_env, "in a race check", **CHECK_EXIT)
    assert "the block collected 1" in proc.stdout, proc.stdout
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no race found outside the race checks (1 more reported by race checks)" in \
        proc.stderr, proc.stderr
