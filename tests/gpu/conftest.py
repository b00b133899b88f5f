"""GPU tests: they run only on a real CUDA GPU, with Numba's CUDA target.

Run them on their own: ``pytest -m gpu tests/gpu``. Every test here is
skipped, with the reason, when Numba's CUDA simulator is on in this process
(``tests/numba`` turns it on when collected in the same run) or when no GPU
is available.

Nothing here imports ``numba.cuda`` at collection: ``tests/numba/conftest.py``
may still have to choose the simulator for the rest of the run. Test modules
get Numba's ``cuda`` and the kernels (``kernels.py``) through fixtures.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (run: pytest -m gpu tests/gpu)")


def _why_no_gpu() -> str | None:
    from numba import config

    if config.ENABLE_CUDASIM:
        return ("Numba's CUDA simulator is on in this process (NUMBA_ENABLE_CUDASIM=1, or "
                "tests/numba collected in the same run); run pytest -m gpu tests/gpu on its own")
    try:
        from numba import cuda

        if not cuda.is_available():
            return "no CUDA GPU is available (numba.cuda.is_available() is False)"
    except Exception as exc:  # a broken driver install is "no GPU" for this suite
        return f"the CUDA target cannot start: {type(exc).__name__}: {exc}"
    return None


@pytest.fixture(scope="session", autouse=True)
def gpu():
    """Numba's ``cuda`` module on a real GPU; skips the test otherwise."""
    why = _why_no_gpu()
    if why is not None:
        pytest.skip(why)
    from numba import cuda

    return cuda


@pytest.fixture(scope="session")
def kernels(gpu):
    """``tests/gpu/kernels.py``, imported under a name no other module uses."""
    spec = importlib.util.spec_from_file_location("nss_gpu_kernels", HERE / "kernels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def fresh_runtime(gpu):
    """An owned runtime over the CUDA driver, installed as device 0's for one test."""
    from numba_streamsafe._driver.cuda import CudaDriver
    from numba_streamsafe.resources import AsyncResource
    from numba_streamsafe.runtime import DeviceRuntime, clear_runtimes, set_runtime

    rt = DeviceRuntime(AsyncResource(CudaDriver(0)))
    old = set_runtime(rt, 0)
    try:
        yield rt
    finally:
        gpu.synchronize()
        gc.collect()
        rt.flush()
        rt.reap()
        if old is not None:
            set_runtime(old, 0)
        else:
            clear_runtimes()


@pytest.fixture(scope="session")
def child_env():
    """Environment maker for a child interpreter on the GPU: no simulator, the
    repo importable. ``child_env(NAME="value")`` adds variables."""

    def make(**extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("NUMBA_ENABLE_CUDASIM", "NUMBA_CUDA_MEMORY_MANAGER",
                            "NUMBA_STREAMSAFE_DRIVER")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        env.update(extra)
        return env

    return make
