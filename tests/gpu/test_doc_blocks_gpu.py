"""The code blocks of the docs that need a library the simulator runs lack (CuPy,
PyTorch, cuda.core, Dask and dask-cuda's ``LocalCUDACluster``) run on a GPU,
each in a process of its own after ``tests/helpers/doc_prelude.py``, with the
plugin selected. A block whose library is not installed is skipped with the
reason."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "_doc_blocks", ROOT / "tests" / "numba" / "test_doc_blocks.py")
assert _spec is not None and _spec.loader is not None
doc_blocks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(doc_blocks)

#: What a block needs on the GPU: the module to import.
GPU_MODULES = {"cupy": "cupy", "torch": "torch", "dask_cuda": "dask_cuda",
               "cuda.core": "cuda.core", "distributed": "distributed", "rmm": "rmm"}
GPU_BLOCKS = [(k, c) for k, c in doc_blocks.BLOCKS
              if any(re.search(rf"\b{re.escape(n)}\b", c) for n in GPU_MODULES)]


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # cuda.core: a parent package without it
        return False


def test_the_library_blocks_are_found():
    assert len(GPU_BLOCKS) >= 6 and any("LocalCUDACluster" in c for _, c in GPU_BLOCKS)


@pytest.mark.parametrize("where,code", GPU_BLOCKS, ids=[k for k, _ in GPU_BLOCKS])
def test_block_runs_on_the_gpu(gpu, where, code, tmp_path):
    for name, module in GPU_MODULES.items():
        if re.search(rf"\b{re.escape(name)}\b", code) and not _installed(module):
            pytest.skip(f"{where} needs {module}")
    if "use_device(1)" in code and len(gpu.gpus) < 2:
        pytest.skip(f"{where} needs 2 GPUs")
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_ENABLE_CUDASIM", "NUMBA_STREAMSAFE_DRIVER")}
    env.update(DOC_GPU="1", NUMBA_CUDA_MEMORY_MANAGER="numba_streamsafe")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", doc_blocks._script(code)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "BLOCK OK" in proc.stdout, (
        f"{where} failed on the GPU:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
