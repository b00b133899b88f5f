"""The small suite the pytest plugin's tests run (``tests/numba/test_pytest_plugin.py``
on the simulator, ``tests/gpu/test_pytest_plugin_gpu.py`` on a GPU): one racy
test, one ordered, one racy through a helper, in a child pytest with two
pytest-xdist workers; and the checks of its outcome: exactly the racy tests
fail, each failure names its test and carries the full report (both stacks,
the allocation, the fix), and the report file's JSON lines name the tests."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

__all__ = ["SUITE", "RACY", "run_suite", "check_failures"]

SUITE = textwrap.dedent('''
    import numpy as np
    from numba import cuda

    N = 64


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


    def produce_then_consume(ordered):
        a, b = cuda.stream(), cuda.stream()
        x = cuda.device_array(N, np.float32, stream=a)
        y = cuda.device_array(N, np.float32, stream=b)
        fill[1, N, a](x, 1.0)
        if ordered:
            done = cuda.event()
            done.record(a)
            done.wait(b)
        copy[1, N, b](x, y)  # the helper's consumer
        b.synchronize()


    def test_racy():
        a, b = cuda.stream(), cuda.stream()
        x = cuda.device_array(N, np.float32, stream=a)
        y = cuda.device_array(N, np.float32, stream=b)
        fill[1, N, a](x, 2.0)
        copy[1, N, b](x, y)  # the racy test's consumer
        b.synchronize()


    def test_ordered():
        produce_then_consume(ordered=True)


    def test_racy_through_a_helper():
        produce_then_consume(ordered=False)
''')

RACY = {"test_racy", "test_racy_through_a_helper"}


def run_suite(tmp_path: Path, env: dict[str, str], *args: str
              ) -> tuple[subprocess.CompletedProcess[str], dict[str, str], list[dict]]:
    """Run the suite in a child pytest with two workers, in ``env`` (with the
    report file added); its result, each test's failure text (or "" for a
    pass) and the report file's lines."""
    (tmp_path / "test_suite.py").write_text(SUITE)
    report = tmp_path / "races.jsonl"
    report.unlink(missing_ok=True)
    junit = tmp_path / "junit.xml"
    env = {**env, "NUMBA_STREAMSAFE_REPORT_FILE": str(report)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q",
         f"--junitxml={junit}", "test_suite.py", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert junit.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    outcomes = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        failed = [c for c in case if c.tag in ("failure", "error")]
        outcomes[case.get("name", "")] = "\n".join(
            (c.get("message") or "") + "\n" + (c.text or "") for c in failed)
    lines = ([json.loads(line) for line in report.read_text().splitlines()]
             if report.exists() else [])
    return proc, outcomes, lines


def check_failures(proc: subprocess.CompletedProcess[str], outcomes: dict[str, str],
                   lines: list[dict]) -> None:
    """Exactly the racy tests failed, each named with its full report, and
    each race's JSON line names its test."""
    shown = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert set(outcomes) == RACY | {"test_ordered"}, shown
    failed = {name for name, text in outcomes.items() if text}
    assert failed == RACY, shown
    for name in RACY:
        text = outcomes[name]
        assert f"test_suite.py::{name} made 1 race(s)" in text, text
        # both stacks (the helper's call and the test's own line), the allocation, the fix
        assert "first (write)" in text and "second (read)" in text, text
        assert "memory allocated at:" in text and "fix: " in text, text
        assert "ev.wait(" in text, text  # plain Numba: an event, at the lines named
        if name == "test_racy_through_a_helper":
            assert "the helper's consumer" in text and "produce_then_consume(ordered=False)" \
                in text, text
        else:
            assert "the racy test's consumer" in text, text
    assert proc.returncode == 1, shown
    # One JSON line per race, naming the test that made it.
    assert sorted(line["test"].rpartition("::")[2] for line in lines) == sorted(RACY), lines
    for line in lines:
        assert line["first"]["stack"] and line["second"]["stack"] and line["allocated"], line
        assert line["fix"], line
