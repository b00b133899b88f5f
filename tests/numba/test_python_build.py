"""The pure-Python build (``NUMBA_STREAMSAFE_BUILD=python``: the ``py3-none-any`` wheel).

An installation that was built without the compiled engine by choice says so and does
not warn of a missing engine; one whose engine could not be compiled still warns. A value
of the build variable that ``setup.py`` does not take stops the build with one line.
``scripts/wheels.py`` (``nox -s wheel``, run by CI) builds both wheels, checks their tags
and contents, and runs the README's snippet from each in a fresh environment.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from numba_streamsafe.compiled import PYTHON_BUILD_MARK

#: Imports the package as a program would, then prints where from and the report's
#: engine state (``python -m numba_streamsafe``).
_PROBE = ("import json, numba_streamsafe, numba_streamsafe.__main__ as report; "
          "print(json.dumps({'file': numba_streamsafe.__file__, "
          "'engine': report._engine()['state']}))")


def _probe(child_env, path, cwd) -> tuple[dict, str]:
    """Run :data:`_PROBE` in a child with the package from ``path``: its answer, its stderr."""
    env = child_env(PYTHONPATH=str(path))
    env.pop("NUMBA_STREAMSAFE_PURE_PYTHON", None)
    proc = subprocess.run([sys.executable, "-c", _PROBE], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.parametrize("marked", [True, False], ids=["python-build", "compile-failed"])
def test_a_build_without_the_engine_warns_only_when_it_was_not_chosen(
        marked, child_env, repo_root, tmp_path):
    # The package's source with nothing compiled, as an install from either wheel lays it.
    copy = tmp_path / "numba_streamsafe"
    shutil.copytree(repo_root / "numba_streamsafe", copy, ignore=shutil.ignore_patterns(
        "*.so", "*.c", "__pycache__", PYTHON_BUILD_MARK))
    if marked:
        (copy / PYTHON_BUILD_MARK).write_text("built with NUMBA_STREAMSAFE_BUILD=python\n")
    out, stderr = _probe(child_env, tmp_path, tmp_path)
    assert out["file"] == str(copy / "__init__.py")
    warned = "compiled engine is not built" in stderr
    if marked:
        assert not warned, stderr
        assert out["engine"].startswith("not built: the pure-Python wheel (py3-none-any)")
    else:
        assert warned, stderr
        assert out["engine"].startswith("WARNING: not built")


def test_a_build_variable_that_names_no_build_stops_the_build_with_one_line(
        child_env, repo_root):
    pytest.importorskip("setuptools")
    proc = subprocess.run([sys.executable, "setup.py", "--name"], cwd=repo_root,
                          env=child_env(NUMBA_STREAMSAFE_BUILD="pyhton"),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and not proc.stdout
    (line,) = proc.stderr.strip().splitlines()
    for said in ("NUMBA_STREAMSAFE_BUILD", "'pyhton'", "'python'", "py3-none-any", "'compiled'"):
        assert said in line, (said, line)


def test_the_report_calls_a_compiled_engine_compiled(child_env, repo_root, tmp_path):
    """Where every engine module is built, the report says the engine is
    compiled: it imports each engine module itself, those a program imports
    only on first use among them (the event hooks' module)."""
    from numba_streamsafe.compiled import engine_builds, pure_python

    if pure_python or not all(b.startswith("compiled")
                              for b in engine_builds(load=True).values()):
        pytest.skip("the engine is not compiled in this checkout (or not in use)")
    out, _ = _probe(child_env, repo_root, tmp_path)
    assert out["engine"].startswith("compiled"), out
