"""Numba's CUDA simulator with the plugin selected: a plain Numba program is
tracked and checked on the CPU; race reports; the settings that could lose
safety silently. Programs run in child interpreters (the plugin is chosen
before Numba loads)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from numba import cuda

import numba_streamsafe as nss
from numba_streamsafe import (
    InvalidArgument,
    RaceDetected,
    Read,
    StreamSafeError,
    Write,
    tracked_kernel,
)
from numba_streamsafe.core.access import as_access
from numba_streamsafe.core.errors import InvalidArgumentType

ROOT = Path(__file__).resolve().parents[2]


def _child(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", **env}
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), str(ROOT / "tests" / "programs"),
                                                       full.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=300)


PLUGIN = {"NUMBA_CUDA_MEMORY_MANAGER": "numba_streamsafe"}

PROGRAM = """
    import numba_streamsafe as nss
    import plain_numba
    wrong = plain_numba.run({tracked})
    print("WRONG", wrong, "HAZARDS", len(nss.hazards()))
    for h in nss.hazards()[:3]:
        print("H", h)
"""


def _result(out: str) -> tuple[bool, int]:
    line = next(x for x in out.splitlines() if x.startswith("WRONG"))
    parts = line.split()
    return parts[1] == "True", int(parts[3])


def test_a_plain_numba_program_is_tracked_on_the_simulator():
    proc = _child(PROGRAM.format(tracked=True), **PLUGIN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wrong, hazards = _result(proc.stdout)
    assert (wrong, hazards) == (False, 0), proc.stdout


def test_the_same_program_untracked_shows_the_race():
    """The negative control: the checker sees the plain program's race."""
    proc = _child(PROGRAM.format(tracked=False), **PLUGIN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _, hazards = _result(proc.stdout)
    assert hazards > 0, proc.stdout
    assert "'copy' argument 'src'" in proc.stdout and "plain_numba.py:" in proc.stdout


def test_without_the_plugin_numbas_arrays_are_refused_not_raced():
    proc = _child(PROGRAM.format(tracked=True))
    assert proc.returncode != 0
    assert "StreamMisuse" in proc.stderr and "NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe" in \
        proc.stderr


def test_set_memory_manager_selects_the_plugin_on_the_simulator():
    proc = _child("""
        from numba import cuda
        import numba_streamsafe as nss
        import numpy as np
        cuda.set_memory_manager(nss.StreamSafeMemoryManager)
        x = cuda.device_array(8, np.int64)
        print("BLOCK", nss.block_of(x) is not None)
        cuda.set_memory_manager(object)
        y = cuda.device_array(8, np.int64)
        print("AFTER", nss.block_of(y) is not None)
    """)
    assert proc.returncode == 0, proc.stderr
    assert "BLOCK True" in proc.stdout and "AFTER False" in proc.stdout


def test_star_import_works_on_the_simulator():
    proc = _child("from numba_streamsafe import *\nprint(tracked_kernel, StreamSafeMemoryManager)",
                  **PLUGIN)
    assert proc.returncode == 0, proc.stderr
    assert "StreamSafeMemoryManager" in proc.stdout


def test_an_error_advises_no_step_already_done():
    """With the plugin set, a foreign array's refusal does not say to set it."""
    proc = _child("""
        import numpy as np
        from numba import cuda
        import numba_streamsafe as nss
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        @nss.tracked_kernel
        def fill(out: nss.Write):
            out[0] = 1

        foreign = FakeCUDAArray(np.zeros(4))   # not from any allocator the library sees
        fill[1, 1](foreign)
    """, **PLUGIN)
    assert proc.returncode != 0
    assert "StreamMisuse" in proc.stderr
    assert "set NUMBA_CUDA_MEMORY_MANAGER" not in proc.stderr
    assert "another allocator" in proc.stderr


# --------------------------------------------------------------- race_check
@tracked_kernel
def produce(out: Write, value):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = value


@tracked_kernel
def consume(src: Read, dst: Write):
    i = cuda.grid(1)
    if i < src.size:
        dst[i] = src[i]


def test_race_check_names_both_accesses_and_the_users_lines(rt, streams):
    a, b = streams
    x = nss.device_array(64, np.int64, stream=a)
    y = nss.device_array(64, np.int64, stream=b)
    line_produce = sys._getframe().f_lineno + 3
    line_consume = line_produce + 2
    with pytest.raises(RaceDetected) as info, nss.race_check():
        produce[2, 32, a](x, 1)
        with nss.tracking(False):
            consume[2, 32, b](x, y)  # raises: not ordered after produce
    err = info.value
    assert isinstance(err, StreamSafeError)
    first, second = err.hazard.first, err.hazard.second
    assert (first.label, first.param, second.label, second.param) == (
        "produce", "out", "consume", "src")
    assert first.stream == rt.stream_handle(a) and second.stream == rt.stream_handle(b)
    here = Path(__file__).name
    assert first.site.endswith(f"{here}:{line_produce}"), first.site
    assert second.site.endswith(f"{here}:{line_consume}"), second.site
    assert f"{here}:{line_produce}" in str(err) and f"{here}:{line_consume}" in str(err)


def test_race_check_passes_a_tracked_program_and_collects_without_stopping(rt, streams):
    a, b = streams
    x = nss.device_array(64, np.int64, stream=a)
    y = nss.device_array(64, np.int64, stream=b)
    with nss.race_check() as rc:
        produce[2, 32, a](x, 1)
        consume[2, 32, b](x, y)
    assert rc.hazards == []
    with nss.race_check(stop_at_first=False) as rc:
        with nss.tracking(False):
            produce[2, 32, a](x, 2)
            consume[2, 32, b](x, y)
    assert "read-after-write" in {h.kind for h in rc.hazards}  # consume reads before produce
    assert len(nss.hazards()) >= 1


# ------------------------------------------------------ no silent loss of safety
def test_the_direct_resource_warns_once():
    proc = _child("""
        import warnings
        warnings.simplefilter("always")
        import numpy as np
        import numba_streamsafe as nss
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            nss.device_array(4, np.int64)
            nss.device_array(4, np.int64)
        print("WARNINGS", sum("NOT ordered" in str(x.message) for x in w))
    """, NUMBA_STREAMSAFE_RESOURCE="direct")
    assert proc.returncode == 0, proc.stderr
    assert "WARNINGS 1" in proc.stdout


def test_set_runtime_reaches_the_plugin_after_it_allocated(rt):
    from numba_streamsafe._driver.sim import SimDriver
    from numba_streamsafe.numba.emm import StreamSafeMemoryManager
    from numba_streamsafe.resources import AsyncResource, LoggingResource
    from numba_streamsafe.runtime import DeviceRuntime, set_runtime

    mm = StreamSafeMemoryManager(context=None)
    assert mm.runtime is rt
    wrapped = DeviceRuntime(LoggingResource(AsyncResource(SimDriver())))
    set_runtime(wrapped, 0)
    assert mm.runtime is wrapped


def test_bad_access_names_and_stream_objects_are_stream_safe_errors(rt):
    x = nss.device_array(4, np.int64)
    with pytest.raises(InvalidArgument) as info:
        as_access("bogus")
    assert isinstance(info.value, ValueError)
    with pytest.raises(InvalidArgumentType) as info2:
        nss.copy_to_host(x, stream="s1")
    assert isinstance(info2.value, TypeError) and isinstance(info2.value, StreamSafeError)
