"""The parser and the comparison of scripts/suite_diff.py (numba-cuda's own
suite with and without the plugin), on logs in unittest's verbose format."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "suite_diff.py"
_spec = importlib.util.spec_from_file_location("suite_diff", SCRIPT)
suite_diff = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(suite_diff)

WITHOUT = """\
Parallel: 5. Serial: 1
test_a (numba.cuda.tests.cudapy.test_x.TestX.test_a) ... ok
test_b (numba.cuda.tests.cudapy.test_x.TestX.test_b) ... ok
test_c (numba.cuda.tests.cudapy.test_x.TestX.test_c)
Docstring of test_c ... ok
test_d (numba.cuda.tests.cudapy.test_x.TestX.test_d) ... skipped 'no cupy'
test_e (numba.cuda.tests.cudapy.test_x.TestX.test_e) ... FAIL
test_f (numba.cuda.tests.cudapy.test_x.TestX.test_f) ... expected failure
test_g (numba.cuda.tests.cudapy.test_x.TestX.test_g) ... ok
Name: numba.cuda.tests.cudapy.test_x.TestX.test_a | PID: 1 | Duration: 0.1s
======================================================================
FAIL: test_e (numba.cuda.tests.cudapy.test_x.TestX.test_e)
----------------------------------------------------------------------
Ran 7 tests in 1.0s

FAILED (failures=1, skipped=1, expected failures=1)
"""

WITH = """\
test_a (numba.cuda.tests.cudapy.test_x.TestX.test_a) ... ok
test_b (numba.cuda.tests.cudapy.test_x.TestX.test_b) ... ERROR
test_c (numba.cuda.tests.cudapy.test_x.TestX.test_c)
Docstring of test_c ... FAIL
test_d (numba.cuda.tests.cudapy.test_x.TestX.test_d) ... skipped 'no cupy'
test_e (numba.cuda.tests.cudapy.test_x.TestX.test_e) ... ok
test_f (numba.cuda.tests.cudapy.test_x.TestX.test_f) ... expected failure
"""


def test_parse_reads_every_outcome():
    got = suite_diff.parse(WITHOUT)
    base = "numba.cuda.tests.cudapy.test_x.TestX."
    assert got == {base + "test_a": "ok", base + "test_b": "ok", base + "test_c": "ok",
                   base + "test_d": "skipped", base + "test_e": "FAIL",
                   base + "test_f": "expected failure", base + "test_g": "ok"}


def test_regressions_are_passes_lost_with_the_plugin():
    worse = suite_diff.regressions(suite_diff.parse(WITHOUT), suite_diff.parse(WITH))
    base = "numba.cuda.tests.cudapy.test_x.TestX."
    assert worse == [(base + "test_b", "ERROR"), (base + "test_c", "FAIL"),
                     (base + "test_g", "missing")]


def test_report_exit_status(capsys):
    assert suite_diff.report(suite_diff.parse(WITHOUT), suite_diff.parse(WITHOUT)) == 0
    assert suite_diff.report(suite_diff.parse(WITHOUT), suite_diff.parse(WITH)) == 1
    out = capsys.readouterr().out
    assert "pass without the plugin, not with it: 3" in out
    assert "pass with the plugin, not without it: 1" in out  # test_e


def test_a_real_log():
    """A log numba.runtests wrote (numba.cuda.tests.nocuda on the simulator)."""
    text = (Path(__file__).resolve().parent / "data" / "runtests_sample.log").read_text()
    got = suite_diff.parse(text)
    assert len(got) == 44
    assert sum(1 for o in got.values() if o == "skipped") == 38
