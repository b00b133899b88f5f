"""Fixtures of the Numba-layer tests, which run on the CPU.

Kernels run in Numba's CUDA simulator over the library's simulated driver,
whose happens-before checker records every unordered pair of accesses
(``rt.driver.hazards``). The simulator must be chosen before ``numba.cuda``
is first imported, so it is switched on here, at collection, when nothing
has imported ``numba.cuda`` yet. Doing so also makes ``tests/gpu`` skip
itself in the same run: on a GPU machine run that suite on its own
(``pytest -m gpu tests/gpu``).

Tests that need no simulator (``test_emm.py``, ``test_ptx.py``) start their
own interpreter without it.
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

if "numba.cuda" not in sys.modules:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    _config = sys.modules.get("numba.core.config")
    if _config is not None:  # numba was imported, numba.cuda was not: re-read the variable
        _config.reload_config()

from numba import config as _numba_config  # noqa: E402
from numba import cuda  # noqa: E402, F401 - fixes the simulator choice for this process

from numba_streamsafe._driver.sim import SimDriver  # noqa: E402
from numba_streamsafe.resources import AsyncResource  # noqa: E402
from numba_streamsafe.runtime import DeviceRuntime, clear_runtimes, set_runtime  # noqa: E402

#: True when this process runs Numba's CUDA simulator.
SIMULATOR = bool(_numba_config.ENABLE_CUDASIM)

_NO_SIM = ("numba.cuda was imported without NUMBA_ENABLE_CUDASIM=1 before tests/numba/conftest.py "
           "ran, so Numba's CUDA simulator is off in this process; run tests/numba on its own "
           "or set NUMBA_ENABLE_CUDASIM=1")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (run: pytest -m gpu tests/gpu)")


def _child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_ENABLE_CUDASIM", "NUMBA_CUDA_MEMORY_MANAGER",
                        "NUMBA_STREAMSAFE_DRIVER")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def child_env():
    """Environment maker for a child interpreter: no simulator, the repo importable.

    ``child_env(NAME="value")`` adds variables.
    """
    return _child_env


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture
def rt():
    """A fresh runtime over a fresh simulated driver, installed as device 0's."""
    if not SIMULATOR:
        pytest.skip(_NO_SIM)
    runtime = DeviceRuntime(AsyncResource(SimDriver()))
    old = set_runtime(runtime, 0)
    try:
        yield runtime
    finally:
        gc.collect()
        if old is not None:
            set_runtime(old, 0)
        else:
            clear_runtimes()


@pytest.fixture
def checked(rt, monkeypatch):
    """Device 0's runtime in check mode: a checking resource over a simulated
    driver, with the plugin selected (plain Numba's work is seen)."""
    from numba_streamsafe.core.settings import reload_settings
    from numba_streamsafe.numba import emm, sim_plugin  # noqa: F401 - emm: companion

    monkeypatch.setenv("NUMBA_STREAMSAFE_MODE", "check")
    reload_settings()
    runtime = DeviceRuntime(AsyncResource(SimDriver(), reuse_bytes=0, check=True))
    old = set_runtime(runtime, 0)
    sim_plugin.install()
    try:
        yield runtime
    finally:
        sim_plugin.uninstall()
        gc.collect()
        set_runtime(old, 0)
        monkeypatch.delenv("NUMBA_STREAMSAFE_MODE")
        reload_settings()


@pytest.fixture
def streams(rt):
    """Two simulator streams ``a`` and ``b`` (each a distinct stream of ``rt``'s driver)."""
    a, b = cuda.stream(), cuda.stream()
    assert rt.stream_handle(a) != rt.stream_handle(b)
    return a, b
