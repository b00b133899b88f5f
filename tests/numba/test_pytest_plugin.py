"""The pytest plugin (``numba_streamsafe.pytest_plugin``) on the simulator.

The small suite of :mod:`tests.helpers.plugin_suite` (one racy test, one
ordered, one racy through a helper) runs in a child pytest with two
pytest-xdist workers, once under the simulator's checker (transparent mode
off, so plain Numba's races stay) and once in check mode: exactly the racy
tests fail, each failure names its test and carries the full report, and the
report file's JSON lines name the tests. Without the flag nothing fails: the
plugin is inert until asked for. Where the library is not Numba's memory
manager, Numba's own arrays are not its own: their races fail nothing, and
the run says so.
"""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from numba_streamsafe.pytest_plugin import NAME
from tests.helpers.plugin_suite import check_failures, run_suite

MODES = {
    "simulator": {"NUMBA_STREAMSAFE_TRANSPARENT": "0"},
    "check": {"NUMBA_STREAMSAFE_MODE": "check", "NUMBA_STREAMSAFE_CHECK_REPORT": "exit"},
}


def _env(child_env, mode: str) -> dict[str, str]:
    return child_env(NUMBA_ENABLE_CUDASIM="1", NUMBA_CUDA_MEMORY_MANAGER="numba_streamsafe",
                     **MODES[mode])


@pytest.mark.parametrize("mode", sorted(MODES))
def test_with_the_plugin_exactly_the_racy_tests_fail_and_are_named(tmp_path, child_env, mode):
    check_failures(*run_suite(tmp_path, _env(child_env, mode), "-p", NAME))


@pytest.mark.skipif(not any(ep.name == NAME for ep in entry_points(group="pytest11")),
                    reason="the package's entry points are not installed (pip install -e .)")
def test_the_entry_point_is_inert_until_the_flag_asks(tmp_path, child_env):
    proc, outcomes, _ = run_suite(tmp_path, _env(child_env, "simulator"))
    assert outcomes and not any(outcomes.values()), proc.stdout[-3000:]
    check_failures(*run_suite(tmp_path, _env(child_env, "simulator"), "--streamsafe"))


def test_without_the_memory_manager_the_run_says_numbas_arrays_are_not_checked(tmp_path,
                                                                              child_env):
    env = child_env(NUMBA_ENABLE_CUDASIM="1", NUMBA_STREAMSAFE_TRANSPARENT="0")
    proc, outcomes, _ = run_suite(tmp_path, env, "-p", NAME, "-v")  # -v: the header
    shown = proc.stdout[-4000:] + proc.stderr[-2000:]
    # Numba's own arrays are no block of the library's here: the racy tests pass ...
    assert outcomes and not any(outcomes.values()), shown
    # ... and the header and the first test of each worker say why, and what to set.
    assert "on the library's arrays only, Numba's own need " \
           "NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe" in proc.stdout, shown
    assert "the library is not Numba's memory manager in this process" in proc.stdout, shown


def test_the_entry_points_module_imports_nothing_of_the_package(child_env):
    """Every pytest session of the environment loads the entry point: it
    imports neither the package nor Numba until the plugin is asked for."""
    code = ("import sys, _numba_streamsafe_pytest\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('numba_streamsafe', 'numba', 'numpy')))")
    proc = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout


def test_the_entry_point_is_the_small_module_named_as_the_plugin():
    tomllib = pytest.importorskip("tomllib")
    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["pytest11"] == {NAME: "_numba_streamsafe_pytest"}


def test_a_refused_setting_stops_only_the_sessions_that_ask_for_the_plugin(tmp_path, child_env):
    """A misspelt variable of the package's is refused where the plugin is
    asked for, and leaves alone a session that does not ask (the entry point
    loaded as pytest loads it from the metadata: ``-p`` with autoloading off)."""
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert True\n")
    env = child_env(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", NUMBA_STREAMSAFE_MODEE="check")

    def session(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
             "-p", "_numba_streamsafe_pytest", "test_plain.py", *args],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    quiet = session()
    assert quiet.returncode == 0 and "1 passed" in quiet.stdout, quiet.stdout + quiet.stderr
    asked = session("--streamsafe")
    assert asked.returncode != 0, asked.stdout
    assert "NUMBA_STREAMSAFE_MODEE" in asked.stdout + asked.stderr, asked.stdout + asked.stderr
