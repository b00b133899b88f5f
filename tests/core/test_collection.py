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
