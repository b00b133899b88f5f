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


DEFAULT_STREAMS = """
    import numpy as np
    from numba import cuda
    import numba_streamsafe as nss
    from numba_streamsafe.core.errors import GraphCaptureError
    from tests.helpers.sim_kernels import tracked_copy as consume, tracked_fill as fill

    rt = nss.get_runtime()
    d = cuda.default_stream()
    print("SAME", d is cuda.default_stream(), rt.stream_handle(d),
          rt.stream_handle(cuda.legacy_default_stream()),
          rt.stream_handle(cuda.per_thread_default_stream()))
    x, y = nss.device_array(64, np.int64), nss.device_array(64, np.int64)
    b, other = cuda.stream(), cuda.stream()
    for name, first in (("DEFAULT", d), ("OTHER", other)):
        with nss.race_check(stop_at_first=False) as rc:
            with nss.tracking(False):
                fill[1, 64, first](x, 1)
                consume[1, 64, b](x, y)  # a blocking stream: after the legacy stream's work
                fill[1, 64, first](x, 2)  # and the legacy stream after it
            cuda.synchronize()
        print(name, len(rc.hazards))
    try:
        with nss.graph(d):
            pass
    except GraphCaptureError:
        print("REFUSED")
"""


@pytest.mark.parametrize("plugin", [False, True])
def test_the_default_streams_are_known_by_their_handles_with_or_without_the_plugin(plugin):
    """The simulator's own default-stream calls make a new stream object each
    call: the library knows them as CUDA's default streams, one object each,
    so the legacy stream orders blocking streams (no false race) and a graph
    is not captured on it, as on a GPU. The negative control: the same work
    on a second blocking stream races."""
    proc = _child(DEFAULT_STREAMS, NUMBA_CUDA_MEMORY_MANAGER="numba_streamsafe" if plugin else "")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "SAME True 0 0 2" in lines, proc.stdout
    assert "DEFAULT 0" in lines, proc.stdout
    assert "OTHER 2" in lines, proc.stdout
    assert "REFUSED" in lines, proc.stdout


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


# ------------------------------------------------ the start-up hook, as installed
def _installed_hook() -> bool:
    """Whether this interpreter's install (a wheel or ``pip install -e``) put the
    simulator's start-up hook in site-packages."""
    import sysconfig

    return os.path.exists(os.path.join(sysconfig.get_paths()["purelib"],
                                        "numba_streamsafe_sim.pth"))


def _bare(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """A child interpreter as a user starts one: none of the tests' paths, no
    simulator or memory manager unless ``env`` sets them."""
    full = {k: v for k, v in os.environ.items()
            if k not in ("NUMBA_ENABLE_CUDASIM", "NUMBA_CUDA_MEMORY_MANAGER", "PYTHONPATH")}
    full.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=300)


UNAWARE = """
    import sys
    import numpy as np
    from numba import cuda

    @cuda.jit
    def fill(x, v):
        i = cuda.grid(1)
        if i < x.size:
            x[i] = v

    a, b = cuda.stream(), cuda.stream()
    x = cuda.device_array(64, np.int64)
    fill[1, 64, a](x, 1)
    x.copy_to_host(stream=b)          # unordered after the fill on a
    nss = sys.modules.get("numba_streamsafe")
    print("LOADED", nss is not None, "HAZARDS", len(nss.hazards()) if nss else -1)
"""


@pytest.mark.skipif(not _installed_hook(), reason="the package is not installed in this "
                    "interpreter (pip install -e . or a wheel puts the start-up hook there)")
def test_an_installed_copy_orders_a_program_that_imports_nothing_of_it(tmp_path):
    """With only the two variables set, the installed hook loads the plugin under
    the simulator (an editable install too) and its checker sees the program."""
    proc = _bare(UNAWARE, tmp_path, NUMBA_ENABLE_CUDASIM="1", **PLUGIN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "LOADED True" in proc.stdout, proc.stdout
    with_transparent_off = _bare(UNAWARE, tmp_path, NUMBA_ENABLE_CUDASIM="1",
                                 NUMBA_STREAMSAFE_TRANSPARENT="0", **PLUGIN)
    assert "LOADED True HAZARDS 1" in with_transparent_off.stdout, with_transparent_off.stdout


@pytest.mark.skipif(not _installed_hook(), reason="the package is not installed in this "
                    "interpreter (pip install -e . or a wheel puts the start-up hook there)")
@pytest.mark.parametrize("name", ["numba_streamsafee", "numba-streamsafe"])
def test_a_misspelled_plugin_name_is_an_error_on_the_simulator(tmp_path, name):
    proc = _bare(UNAWARE, tmp_path, NUMBA_ENABLE_CUDASIM="1", NUMBA_CUDA_MEMORY_MANAGER=name)
    assert proc.returncode != 0
    assert f"Failed to use memory manager from {name}" in proc.stderr
    assert "this library's plugin is named 'numba_streamsafe'" in proc.stderr


def test_the_hook_refuses_a_name_no_module_has_and_loads_the_plugin():
    import _numba_streamsafe_autoload as hook

    with pytest.raises(RuntimeError, match="numba_streamsafee.*named 'numba_streamsafe'"):
        hook.load("numba_streamsafee")
    with pytest.raises(RuntimeError, match="No module named 'no_such_manager'"):
        hook.load("no_such_manager")
    hook.load("numba_streamsafe")        # imported already here: no error
    hook.load("numpy")                   # another library's module: found, not imported again


def test_a_dead_simulator_stream_object_takes_its_stream_with_it(rt):
    """Streams made for the simulator's stream objects are destroyed once the
    objects die, so a long program's synchronize does not slow down with them."""
    x = nss.device_array(64, np.int64)
    alive = []
    for i in range(600):
        s = cuda.stream()
        fill64[1, 64, s](x, i)
        nss.copy_to_host(x, stream=s)
        if i % 100 == 0:
            alive.append(s)          # some stay alive: their streams stay
        del s
    cuda.synchronize()
    # Each new stream destroys those of the objects that died before it: the
    # default streams, the living and the last one are left (600 without this).
    assert rt.driver.live_streams <= 3 + len(alive) + 2, rt.driver.live_streams
    for s in alive:                  # the living still work, ordered as before
        fill64[1, 64, s](x, 1)
    assert (nss.copy_to_host(x, stream=alive[0]) == 1).all()
    assert not rt.driver.hazards


@tracked_kernel
def fill64(out: Write, value):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = value


def test_an_array_from_before_cuda_close_is_refused_on_the_simulator(rt):
    """As on a GPU (the plugin's reset): cuda.close() ends the context, and an
    array made before it is refused with StaleContext, not copied back."""
    from numba_streamsafe.numba import emm, sim_plugin  # noqa: F401 - emm: companion

    sim_plugin.install()
    try:
        x = cuda.to_device(np.arange(8))
        y = nss.device_array(8, np.int64)
        epoch = rt.epoch
        cuda.close()
        assert rt.epoch == epoch + 1
        with pytest.raises(nss.StaleContext):
            x.copy_to_host()
        with pytest.raises(nss.StaleContext):
            nss.copy_to_host(y)
        z = cuda.to_device(np.arange(4))         # the new context works
        assert (z.copy_to_host() == np.arange(4)).all()
    finally:
        sim_plugin.uninstall()
