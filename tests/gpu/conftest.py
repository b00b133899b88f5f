"""GPU tests: they run only on a real CUDA GPU, with Numba's CUDA target.

Run them on their own: ``pytest -m gpu tests/gpu``. Every test here is
skipped, with the reason: "no CUDA GPU found (...)" when the CUDA driver
reports no device; otherwise when Numba's CUDA simulator is on in this
process (``tests/numba`` turns it on when collected in the same run) or
Numba cannot use the GPU.

Nothing here imports ``numba.cuda`` at collection: ``tests/numba/conftest.py``
may still have to choose the simulator for the rest of the run. Test modules
get Numba's ``cuda`` and the kernels (``kernels.py``) through fixtures.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (run: pytest -m gpu tests/gpu)")


def find_gpu() -> str | None:
    """None when the CUDA driver reports at least one device, else why not.

    Asks the driver library itself (``cuInit``, ``cuDeviceGetCount``) through
    ctypes, so it imports nothing of Numba and answers the same whether or not
    Numba's CUDA simulator is on. The reason starts with "no CUDA GPU found".
    """
    import ctypes

    names = ("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so.1", "libcuda.so")
    lib = None
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if lib is None:
        return ("no CUDA GPU found (the CUDA driver library, "
                f"{' or '.join(names)}, cannot be loaded)")
    status = lib.cuInit(0)
    if status != 0:
        return f"no CUDA GPU found (cuInit failed with CUDA error {status})"
    count = ctypes.c_int(0)
    status = lib.cuDeviceGetCount(ctypes.byref(count))
    if status != 0 or count.value < 1:
        return f"no CUDA GPU found (the CUDA driver reports {count.value} devices)"
    return None


def skip_reason(simulator: bool, no_gpu: str | None) -> str | None:
    """Why the GPU suite skips, or None when it can run.

    ``no_gpu`` is :func:`find_gpu`'s answer: with no GPU that is the reason,
    simulator or not. With a GPU, the reason is Numba's CUDA simulator when
    it is on in this process.
    """
    if no_gpu is not None:
        return no_gpu
    if simulator:
        return ("a CUDA GPU is present, but Numba's CUDA simulator is on in this process "
                "(NUMBA_ENABLE_CUDASIM=1, or tests/numba collected in the same run); run "
                "pytest -m gpu tests/gpu on its own")
    return None


def _why_no_gpu() -> str | None:
    from numba import config

    why = skip_reason(bool(config.ENABLE_CUDASIM), find_gpu())
    if why is not None:
        return why
    try:
        from numba import cuda

        if not cuda.is_available():
            return ("a CUDA GPU is present, but Numba cannot use it "
                    "(numba.cuda.is_available() is False)")
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
def cupy(gpu):
    """CuPy, where it is installed and can compile its own kernels here.

    A CuPy built for one CUDA major version in an environment of the other
    (``cupy-cuda13x`` beside numba-cuda's ``cu12`` NVRTC) imports, but its
    NVRTC fails on the CUDA headers it finds: the tests that read through
    CuPy are skipped there, naming CuPy's error, rather than failing on it.
    """
    cupy = pytest.importorskip("cupy")
    try:
        (cupy.arange(4, dtype=cupy.float32) * 2 + 1).sum().item()
    except Exception as exc:  # CuPy's CompileException, or its driver's error
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        pytest.skip(f"CuPy {cupy.__version__} cannot compile its kernels here: {first}")
    return cupy


@pytest.fixture(scope="session")
def kernels(gpu):
    """``tests/gpu/kernels.py``, imported under a name no other module uses."""
    spec = importlib.util.spec_from_file_location("nss_gpu_kernels", HERE / "kernels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def installed(rt, cuda):
    """``rt`` installed as device 0's runtime inside the block; afterwards the
    device is synchronised, ``rt``'s frees run and the runtime before it is back."""
    from numba_streamsafe.runtime import clear_runtimes, set_runtime

    old = set_runtime(rt, 0)
    try:
        yield rt
    finally:
        cuda.synchronize()
        gc.collect()
        rt.flush()
        rt.reap()
        if old is not None:
            set_runtime(old, 0)
        else:
            clear_runtimes()


@pytest.fixture
def fresh_runtime(gpu):
    """An owned runtime over the CUDA driver, installed as device 0's for one test."""
    from numba_streamsafe._driver.cuda import CudaDriver
    from numba_streamsafe.resources import AsyncResource
    from numba_streamsafe.runtime import DeviceRuntime

    with installed(DeviceRuntime(AsyncResource(CudaDriver(0))), gpu) as rt:
        yield rt


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


@pytest.fixture(scope="session")
def race_report():
    """``race_report(line)``: print a race test's summary line and append it to
    ``$NSS_RACE_REPORT`` when that is set (the GPU scripts collect them)."""

    def report(line: str) -> None:
        print(line)
        path = os.environ.get("NSS_RACE_REPORT")
        if path:
            with open(path, "a") as f:
                f.write(line + "\n")

    return report
