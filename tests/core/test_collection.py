"""The test suites can share one pytest run: collecting ``tests/core`` and
``tests/gpu`` must not import ``numba.cuda``, or ``tests/numba`` (collected
after them) could no longer turn Numba's CUDA simulator on and would skip."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
MODULES = sorted(p for d in ("core", "gpu") for p in (TESTS / d).glob("*.py")
                 if p.name.startswith("test_") or p.name == "conftest.py")

CHECK = """
import importlib.util, sys
sys.path[:0] = [{repo!r}, {folder!r}]
spec = importlib.util.spec_from_file_location("collected", {path!r})
spec.loader.exec_module(importlib.util.module_from_spec(spec))
print("numba.cuda" in sys.modules)
"""


@pytest.mark.slow
@pytest.mark.parametrize("path", MODULES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_collecting_does_not_import_numba_cuda(path):
    code = CHECK.format(repo=str(TESTS.parent), folder=str(path.parent), path=str(path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", (
        f"importing {path.name} imports numba.cuda: import the Numba layer inside the tests "
        "(nss.tracked_kernel, fixtures), not at module level"
    )


ALL_IN_ONE = """
import importlib.util, sys
sys.path[:0] = [{repo!r}, {core!r}, {gpu!r}]
for path in {paths!r}:
    spec = importlib.util.spec_from_file_location("collected", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    if "numba.cuda" in sys.modules:
        print("IMPORTS", path)
        break
else:
    print("NONE")
"""


def test_collecting_the_suites_in_one_process_does_not_import_numba_cuda():
    """The default run's variant of the test above: every module in one child,
    one after another (the first that imports ``numba.cuda`` is named)."""
    code = ALL_IN_ONE.format(repo=str(TESTS.parent), core=str(TESTS / "core"),
                             gpu=str(TESTS / "gpu"), paths=[str(p) for p in MODULES])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "NONE", (
        f"{out.stdout.strip()}: importing it imports numba.cuda: import the Numba layer inside "
        "the tests (nss.tracked_kernel, fixtures), not at module level"
    )
