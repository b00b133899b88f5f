"""Transparent mode on a GPU: plain Numba programs with only the plugin selected.

The races of ``transparent_races.py`` run in a child interpreter with
``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe``, ``NSS_RACE_TRIALS`` trials each
(default 100) with transparent mode on, interleaved with as many with it off
(the negative control): 0 wrong on, at least 70 % wrong off. The example
``examples/plain_numba_pipeline.py`` (no import of the library) is wrong
without the plugin and right with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TRIALS = int(os.environ.get("NSS_RACE_TRIALS", "100"))


def _run(child_env, args: list[str], timeout: int = 560, **env: str
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-X", "faulthandler", *args], cwd=ROOT,
                          env=child_env(**env), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def race_lines(gpu, child_env):
    proc = _run(child_env, [str(HERE / "transparent_races.py")],
                NUMBA_CUDA_MEMORY_MANAGER="numba_streamsafe", NSS_RACE_TRIALS=str(TRIALS))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    return {line.split()[1]: line.split()[2:] for line in proc.stdout.splitlines()
            if line.startswith("CASE ")}, proc.stdout


CASES = ["tracked_write_numba_copy_to_host", "plain_read_free_reuse", "plain_write_plain_read",
         "forall_write_plain_read", "ufunc_read", "reduce_read", "gufunc_read",
         "eager_kernel_device_function", "device_copy",
         "upload_over_slow_read", "setitem_after_write", "memset_after_write",
         "pinned_copy_to_host",
         # ranges: views of one array, and arrays inside tuples
         "view_overlap_read_after_write", "view_overlap_write_after_read",
         "view_overlap_write_after_write", "view_adjacent_one_element",
         "view_strided_against_contiguous", "view_read_then_whole_free",
         "tuple_read", "tuple_write", "nested_tuple_read", "namedtuple_read"]


@pytest.mark.parametrize("case", CASES)
def test_plain_numba_race_is_ordered_in_transparent_mode(race_lines, race_report, case):
    lines, out = race_lines
    errors = [line for line in out.splitlines() if line.startswith(f"ERROR {case} ")]
    assert not errors, errors
    assert case in lines, out[-3000:]
    on, off, trials = (int(v) for v in lines[case])
    race_report(f"transparent-{case} on_wrong={on}/{trials} off_wrong={off}/{trials}")
    assert on == 0, f"{case}: {on}/{trials} wrong with transparent mode on"
    assert off >= 0.7 * trials, f"{case}: the race did not show with the mode off ({off})"


def test_plain_numba_example_is_wrong_without_the_plugin_and_right_with_it(gpu, child_env,
                                                                            race_report):
    example = str(ROOT / "examples" / "plain_numba_pipeline.py")
    without = _run(child_env, [example, "--repeat", "20"])
    with_plugin = _run(child_env, [example, "--repeat", "20"],
                       NUMBA_CUDA_MEMORY_MANAGER="numba_streamsafe")
    race_report("plain-numba-example without-plugin: " + without.stdout.strip().splitlines()[-1]
                + " | with plugin: " + with_plugin.stdout.strip().splitlines()[-1])
    assert with_plugin.returncode == 0, with_plugin.stdout + with_plugin.stderr[-3000:]
    assert "plugin loaded" in with_plugin.stdout
    assert without.returncode == 1, without.stdout + without.stderr[-3000:]


def test_waits_a_self_ordered_program_satisfies_are_skipped(gpu, child_env, race_report):
    """A plain Numba program that orders a consumer after a slow producer by
    itself (an event, an event's or the stream's or the device's
    synchronise) is right, and the library queues none of its own waits for
    that pair: each is counted as skipped. Without the program's ordering the
    library queues the wait (and the result is right)."""
    proc = _run(child_env, [str(HERE / "program_order.py")],
                NUMBA_CUDA_MEMORY_MANAGER="numba_streamsafe", NSS_RACE_TRIALS=str(TRIALS))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    rows = {line.split()[1]: [int(v) for v in line.split()[2:]]
            for line in proc.stdout.splitlines() if line.startswith("ORDER ")}
    assert len(rows) == 5, proc.stdout
    for case, (right, inserted, skipped, trials) in rows.items():
        race_report(f"program-order-{case} right={right}/{trials} waits_inserted={inserted} "
                    f"waits_skipped={skipped}")
        assert right == trials, (case, rows)
        if case == "none":
            assert inserted >= trials, (case, rows)
        else:
            assert inserted == 0 and skipped >= trials, (case, rows)
