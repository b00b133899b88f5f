"""Every ``python`` code block of the README and of the documentation (``docs/``)
runs: each in a process of its own on Numba's CUDA simulator, after
``doc_prelude.py`` (the names the fragments use), and the simulated driver must
see no race. A block that needs what this machine lacks (CuPy, PyTorch,
dask-cuda, cuda.core on a GPU) is skipped with the reason.
``tests/gpu/test_doc_blocks_gpu.py`` runs those on a GPU."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRELUDE = Path(__file__).parents[1] / "helpers" / "doc_prelude.py"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
NEEDS = {"cupy": "cupy", "torch": "torch", "dask_cuda": "dask_cuda",
         "cuda.core": "a GPU (cuda.core)", "CUDA_VISIBLE_DEVICES": "a cluster of GPUs",
         "distributed": "distributed", "plot": "matplotlib", "rmm": "rmm",
         "numba_cuda_mlir": "a GPU (numba-cuda-mlir has no simulator)"}
#: Modules whose absence skips a block (the others need a GPU whatever is installed).
MODULES = {
    "cupy": "cupy", "torch": "torch", "dask_cuda": "dask_cuda", "distributed": "distributed",
    "plot": "matplotlib", "rmm": "rmm"}



def _blocks() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        if "_build" in page.parts:
            continue
        text = page.read_text()
        for i, m in enumerate(re.finditer(r"```python\n(.*?)```", text, re.S)):
            out.append((f"{page.relative_to(ROOT)}#{i + 1}", m.group(1)))
    return out


BLOCKS = _blocks()


def _missing(code: str) -> str | None:
    for name, what in NEEDS.items():
        if re.search(rf"\b{re.escape(name)}\b", code):
            module = MODULES.get(name)
            if module is None or importlib.util.find_spec(module) is None:
                return what
    return None


def _script(code: str) -> str:
    return (PRELUDE.read_text() + "\n# ---- the block ----\n" + code +
            "\nimport numba_streamsafe as _nss\n"
            "from numba_streamsafe.runtime import installed_runtime as _ir\n"
            "_h = [h for d in (0, 1) if (r := _ir(d)) is not None"
            " for h in getattr(r.driver, 'hazards', [])]\n"
            "assert not _h, _h[:3]\nprint('BLOCK OK')\n")


def test_the_pages_have_blocks():
    assert len(BLOCKS) >= 10 and any(k.startswith("README") for k, _ in BLOCKS)


@pytest.mark.parametrize("where,code", BLOCKS, ids=[k for k, _ in BLOCKS])
def test_block_runs(where, code, tmp_path):
    missing = _missing(code)
    if missing:
        pytest.skip(f"{where} needs {missing}")
    script = _script(code)
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "NUMBA_STREAMSAFE_DRIVER": "sim",
           "DOC_DEVICES": "2" if "use_device(1)" in code else "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0 and "BLOCK OK" in proc.stdout, (
        f"{where} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")

