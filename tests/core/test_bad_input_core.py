"""Bad input to the core gives a typed error that says what to do.

A refused call raises a :class:`~numba_streamsafe.StreamSafeError` subclass
and changes nothing. Also here: the reason the GPU suite gives when it skips,
read from ``tests/gpu/conftest.py`` without importing ``numba.cuda``.
"""

from __future__ import annotations

import collections
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from numba_streamsafe import Access, BudgetResource, InvalidArgument, LaunchRecorder, RecorderMode
from numba_streamsafe.core.errors import InvalidArgumentType
from numba_streamsafe.runtime import DeviceRuntime

TESTS = Path(__file__).resolve().parents[1]


# ---------------------------------------------------- 3. recorder.use(...)
@pytest.mark.parametrize("thing", ["x", 0x7000, object(), np.zeros(4)],
                         ids=["str", "int", "object", "ndarray"])
def test_recorder_use_of_what_is_not_a_block_is_refused(rt, sim, thing):
    stream = sim.create_stream()
    block = rt.allocate(64, stream, "kept")
    rec = LaunchRecorder(rt, stream)
    rec.write(block, "kept")
    before = collections.Counter(sim.calls)
    with pytest.raises(InvalidArgumentType) as info:
        rec.use(thing, Access.READ, "input")
    message = str(info.value)
    assert type(thing).__name__ in message and "'input'" in message
    assert "Block" in message and "None" in message  # what to pass instead
    assert collections.Counter(sim.calls) == before
    # The recorder is as it was: its one use, and it still runs its protocol.
    assert rec.uses == [(block, Access.WRITE)]
    rec.preflight()
    rec.commit()


@pytest.mark.parametrize("method", ["read", "write", "read_write"])
def test_recorder_shortcuts_refuse_what_is_not_a_block(rt, sim, method):
    rec = LaunchRecorder(rt, sim.create_stream())
    with pytest.raises(InvalidArgumentType, match="Block"):
        getattr(rec, method)("x")
    assert rec.uses == []


@pytest.mark.parametrize("access", ["zz", 7, None])
def test_recorder_use_with_an_unknown_access_is_invalid_argument(rt, sim, access):
    stream = sim.create_stream()
    block = rt.allocate(64, stream)
    rec = LaunchRecorder(rt, stream)
    with pytest.raises(InvalidArgument, match="access kind"):
        rec.use(block, access)
    assert rec.uses == []
    rt.deallocate(block)


# ------------------------------------------------ 5. BudgetResource(limit=)
@pytest.mark.parametrize("limit", [1.5, "4096", True, None, 4096.0, np.float64(4096)],
                         ids=["float", "str", "bool", "None", "whole-float", "np-float"])
def test_budget_limit_must_be_an_int(res, limit):
    with pytest.raises(InvalidArgumentType, match="limit") as info:
        BudgetResource(res, limit)
    assert type(limit).__name__ in str(info.value) and "int" in str(info.value)


@pytest.mark.parametrize("limit", [-1, 0, np.int64(-4096)])
def test_budget_limit_must_be_positive(res, limit):
    with pytest.raises(InvalidArgument, match="positive"):
        BudgetResource(res, limit)


@pytest.mark.parametrize("limit", [4096, np.int64(4096), np.uint32(4096), np.int8(64)])
def test_budget_limit_accepts_numpy_integers(res, limit):
    budget = BudgetResource(res, limit)
    assert budget.limit == int(limit) and type(budget.limit) is int
    assert budget.remaining == int(limit)


# ------------------------------------ 6. mode= of a runtime and a recorder
BAD_MODES = ["bogus", "Strict", 1]


@pytest.mark.parametrize("mode", BAD_MODES)
def test_runtime_mode_must_be_strict_or_permissive(res, mode):
    with pytest.raises(InvalidArgument, match="mode") as info:
        DeviceRuntime(res, mode=mode)
    message = str(info.value)
    assert repr(mode) in message and "'strict'" in message and "'permissive'" in message
    assert isinstance(info.value, ValueError)  # as the enum's own refusal was


@pytest.mark.parametrize("mode", BAD_MODES)
def test_recorder_mode_must_be_strict_or_permissive(rt, sim, mode):
    stream = sim.create_stream()
    before = collections.Counter(sim.calls)
    with pytest.raises(InvalidArgument, match="LaunchRecorder") as info:
        LaunchRecorder(rt, stream, mode=mode)
    assert repr(mode) in str(info.value) and "'permissive'" in str(info.value)
    assert collections.Counter(sim.calls) == before


@pytest.mark.parametrize("mode", ["strict", "permissive", RecorderMode.PERMISSIVE])
def test_modes_are_taken_by_value_or_member(res, sim, mode):
    rt = DeviceRuntime(res, mode=mode)
    assert rt.mode is RecorderMode(mode)
    assert LaunchRecorder(rt, sim.create_stream(), mode=mode).mode is RecorderMode(mode)
    assert LaunchRecorder(rt, sim.create_stream()).mode is rt.mode


# ------------------------------------------- 10. the GPU suite's skip reason
def _gpu_conftest():
    """``tests/gpu/conftest.py`` as a plain module (not a pytest plugin)."""
    spec = importlib.util.spec_from_file_location("nss_gpu_conftest_probe",
                                                  TESTS / "gpu" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_skip_reason_says_no_gpu_when_there_is_none():
    conftest = _gpu_conftest()
    missing = "no CUDA GPU found (libcuda.so.1 cannot be loaded)"
    for simulator in (True, False):
        assert conftest.skip_reason(simulator=simulator, no_gpu=missing) == missing


def test_gpu_skip_reason_names_the_simulator_when_a_gpu_is_present():
    reason = _gpu_conftest().skip_reason(simulator=True, no_gpu=None)
    assert reason is not None and "simulator" in reason and "no CUDA GPU" not in reason
    assert "pytest -m gpu tests/gpu" in reason


def test_gpu_probe_does_not_import_numba_cuda():
    path = str(TESTS / "gpu" / "conftest.py")
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('c', {path!r})\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "m.find_gpu()\n"
            "print('numba.cuda' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.slow  # end to end (CI runs it); the default run stays under a minute
def test_gpu_suite_skips_with_no_gpu_on_a_machine_without_one():
    if _gpu_conftest().find_gpu() is None:
        pytest.skip("a CUDA GPU is present: the GPU suite runs here")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}  # as when tests/numba is in the run
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                          str(TESTS / "gpu" / "test_gpu_basic.py")],
                         capture_output=True, text=True, timeout=300, env=env,
                         cwd=TESTS.parent)
    skipped = [line for line in out.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skipped, out.stdout + out.stderr
    assert all("no CUDA GPU found" in line for line in skipped), "\n".join(skipped)
    assert not any("simulator" in line for line in skipped), "\n".join(skipped)
