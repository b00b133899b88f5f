"""numba-cuda-mlir: the plugin on its vendored driver, and the refusals.

numba-cuda-mlir has no CUDA simulator and needs a GPU to launch anything; on
the CPU what can run is its driver's memory-manager hook: a numba-cuda-mlir
``Context`` built over a stand-in device (no GPU touched) loads the plugin
from ``NUMBA_CUDA_MEMORY_MANAGER`` as it does on a GPU, and its allocations
come from a runtime over the library's simulated driver. Those checks run in
a child interpreter (no Numba simulator) and skip where numba-cuda-mlir is not
installed (``nox -s mlir`` installs it). The refusals need no numba-cuda-mlir:
a context of its driver is told by its class's module, and a kernel written
for it by its globals, so they are checked here with stand-ins too.
``scripts/mlir_gpu_check.py`` checks the same on a GPU.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
import types

import pytest

import numba_streamsafe as nss
from numba_streamsafe import InvalidArgument, StreamSafeError
from numba_streamsafe.core.settings import reload_settings
from numba_streamsafe.numba.emm import StreamSafeMemoryManager

HAVE_MLIR = importlib.util.find_spec("numba_cuda_mlir") is not None


class _MlirContext:
    """Stands for a numba-cuda-mlir context: only its class's module tells."""

    device = types.SimpleNamespace(id=0)


_MlirContext.__module__ = "numba_cuda_mlir.numba_cuda.cudadrv.driver"


@pytest.fixture
def env(monkeypatch):
    """Set variables, then read the settings again (and again after the test)."""
    def setenv(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(name, value)
        reload_settings()

    yield setenv
    monkeypatch.undo()
    reload_settings()


@pytest.mark.parametrize("variables, named", [
    ({"NUMBA_STREAMSAFE_MODE": "check"}, "NUMBA_STREAMSAFE_MODE=check is not supported under "
                                         "numba-cuda-mlir"),
    ({"NUMBA_STREAMSAFE_MODE": "order"}, "transparent mode is not supported under "
                                         "numba-cuda-mlir"),
    ({"NUMBA_STREAMSAFE_TRANSPARENT": "0", "NUMBA_STREAMSAFE_DRIVER": "sim"},
     "numba-cuda-mlir has no CUDA simulator"),
])
def test_a_setting_mlir_cannot_work_with_is_refused(env, variables, named):
    env(**variables)
    with pytest.raises(StreamSafeError) as info:
        StreamSafeMemoryManager(context=_MlirContext())
    message = str(info.value)
    assert named in message and "\n" not in message
    # It says what to do, naming the variable to set or unset.
    assert "NUMBA_STREAMSAFE_" in message.split(":", 1)[1]


def test_a_numba_context_still_gets_the_numba_plugin():
    manager = StreamSafeMemoryManager(context=None)
    assert type(manager) is StreamSafeMemoryManager
    assert manager.interface_version == 1


def _kernel_using(module_name: str):
    """A kernel whose ``cuda`` global is a module named ``module_name``."""
    namespace = {"cuda": types.ModuleType(module_name)}
    exec(textwrap.dedent("""
        def scale(src, dst):
            i = cuda.grid(1)
            if i < src.size:
                dst[i] = src[i] * 2
    """), namespace)
    return namespace["scale"]


def test_a_tracked_kernel_written_for_mlir_is_refused():
    with pytest.raises(InvalidArgument) as info:
        nss.tracked_kernel(_kernel_using("numba_cuda_mlir.cuda"), access={"src": "r",
                                                                          "dst": "w"})
    message = str(info.value)
    assert "tracked_kernel scale" in message and "numba-cuda-mlir" in message
    assert "'cuda' is numba-cuda-mlir's" in message and "from numba import cuda" in message
    assert "\n" not in message


def test_a_tracked_kernel_of_numba_cuda_is_not_refused():
    kernel = nss.tracked_kernel(_kernel_using("numba.cuda"), access={"src": "r", "dst": "w"})
    assert kernel.accesses == {"src": nss.Read, "dst": nss.Write}
    # A module whose name only starts like numba-cuda-mlir's is not it.
    nss.tracked_kernel(_kernel_using("numba_cuda_mlirish"), access={"src": "r", "dst": "w"})


CHILD = textwrap.dedent(r'''
    import gc
    import os
    import sys
    import traceback
    from types import SimpleNamespace

    import numpy as np
    from numba_cuda_mlir import cuda
    from numba_cuda_mlir.numba_cuda.cudadrv import driver
    from numba_cuda_mlir.numba_cuda.cudadrv.devicearray import DeviceNDArray

    import numba_streamsafe as nss
    from numba_streamsafe import (AsyncResource, DeviceRuntime, InvalidArgument, StaleContext,
                                  StreamSafeError, get_runtime, set_runtime)
    from numba_streamsafe._driver.sim import SimDriver
    from numba_streamsafe.core.settings import reload_settings

    # The runtime of device 0 over the simulated driver, installed by hand: the
    # settings keep the CUDA driver (the simulated one is refused under numba-cuda-mlir).
    set_runtime(DeviceRuntime(AsyncResource(SimDriver())), 0)
    CHECKS = []


    def check(fn):
        CHECKS.append(fn)
        return fn


    def context():
        """A numba-cuda-mlir context over a stand-in device: its driver loads
        the memory manager NUMBA_CUDA_MEMORY_MANAGER names, as on a GPU."""
        return driver.Context(SimpleNamespace(id=0), None)


    def refused(variables, needle):
        saved = {k: os.environ.get(k) for k in variables}
        os.environ.update(variables)
        reload_settings()
        try:
            context()
        except StreamSafeError as exc:  # raised as it is: not Numba's "Failed to use ..."
            assert needle in str(exc), exc
        else:
            raise AssertionError(f"{variables}: the context was made")
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k)
                else:
                    os.environ[k] = v
            reload_settings()


    @check
    def loads_from_the_variable():
        from numba_streamsafe.numba.mlir.emm import MlirMemoryManager
        ctx = context()
        assert type(ctx.memory_manager) is MlirMemoryManager
        assert isinstance(ctx.memory_manager, driver.HostOnlyCUDAMemoryManager)
        assert driver._memory_manager is nss.StreamSafeMemoryManager


    @check
    def set_memory_manager():
        cuda.set_memory_manager(nss.StreamSafeMemoryManager)  # checks interface_version
        assert driver._memory_manager is nss.StreamSafeMemoryManager


    @check
    def memalloc():
        rt = get_runtime()
        before = rt.bytes_outstanding()
        ptr = context().memalloc(1024)
        assert type(ptr) is driver.MemoryPointer
        block = rt.find(ptr.device_pointer_value)
        assert block is not None and block.ptr == ptr.device_pointer_value
        assert (block.nbytes, block.tag, ptr.size) == (1024, "numba", 1024)
        assert block.stream == rt.stream_handle(None)
        assert rt.bytes_outstanding() == before + 1024


    @check
    def memalloc_zero():
        rt = get_runtime()
        before = rt.stats().allocations
        ptr = context().memalloc(0)
        assert type(ptr) is driver.MemoryPointer and ptr.size == 0
        assert not ptr.device_pointer_value
        assert rt.stats().allocations == before


    @check
    def stream_scope_allocation():
        rt = get_runtime()
        h = rt.driver.create_stream()
        ctx = context()
        with nss.stream_scope(h):
            ptr = ctx.memalloc(256)
        assert rt.find(ptr.device_pointer_value).stream == h


    @check
    def free_on_drop():
        rt = get_runtime()
        rt.flush()
        rt.reap()
        base, frees = rt.bytes_outstanding(), rt.stats().frees
        ptr = context().memalloc(4096)
        block = rt.find(ptr.device_pointer_value)
        del ptr
        gc.collect()
        assert rt.find(block.ptr) is block  # queued by the finalizer, not yet freed
        rt.flush()
        rt.reap()
        assert rt.find(block.ptr) is None
        assert (rt.bytes_outstanding(), rt.stats().frees) == (base, frees + 1)


    @check
    def explicit_free():
        rt = get_runtime()
        rt.flush()
        frees = rt.stats().frees
        ptr = context().memalloc(64)
        ptr.free()
        rt.flush()
        assert rt.stats().frees == frees + 1
        del ptr
        gc.collect()
        rt.flush()
        assert rt.stats().frees == frees + 1  # freed once


    @check
    def defer_cleanup_holds_frees():
        rt = get_runtime()
        rt.flush()
        rt.reap()
        base = rt.bytes_outstanding()
        ctx = context()
        ptr = ctx.memalloc(512)
        with ctx.memory_manager.defer_cleanup():
            del ptr
            gc.collect()
            rt.flush()
            rt.reap()
            assert rt.bytes_outstanding() == base + 512
        rt.flush()
        rt.reap()
        assert rt.bytes_outstanding() == base


    @check
    def device_array_over_a_block():
        rt = get_runtime()
        ctx = context()
        ptr = ctx.memalloc(64)
        arr = DeviceNDArray((16,), (4,), np.dtype(np.int32), gpu_data=ptr)
        assert nss.block_of(arr) is rt.find(ptr.device_pointer_value)


    @check
    def memory_info():
        free, total = context().memory_manager.get_memory_info()
        assert (free, total) == get_runtime().driver.mem_info()


    @check
    def no_ipc():
        ctx = context()
        try:
            ctx.memory_manager.get_ipc_handle(ctx.memalloc(64))
        except StreamSafeError as exc:
            assert "IPC" in str(exc) and "numba-cuda-mlir" in str(exc), exc
        else:
            raise AssertionError("get_ipc_handle did not raise")


    @check
    def reset():
        rt = get_runtime()
        ctx = context()
        ptr = ctx.memalloc(128)
        old = rt.find(ptr.device_pointer_value)
        epoch = rt.epoch
        ctx.memory_manager.reset()  # what Context.reset (cuda.close) calls first
        assert rt.epoch == epoch + 1 and rt.find(old.ptr) is None
        try:
            rt.deallocate(old)
        except StaleContext:
            pass
        else:
            raise AssertionError("a block from before the reset was freed")


    @check
    def transparent_mode_refused():
        refused({"NUMBA_STREAMSAFE_TRANSPARENT": "1"},
                "transparent mode is not supported under numba-cuda-mlir")


    @check
    def check_mode_refused():
        refused({"NUMBA_STREAMSAFE_MODE": "check"},
                "NUMBA_STREAMSAFE_MODE=check is not supported under numba-cuda-mlir")


    @check
    def simulated_driver_refused():
        refused({"NUMBA_STREAMSAFE_DRIVER": "sim"}, "numba-cuda-mlir has no CUDA simulator")


    @check
    def tracked_kernel_refused():
        def scale(src, dst):
            i = cuda.grid(1)
            if i < src.size:
                dst[i] = src[i] * 2

        try:
            nss.tracked_kernel(scale, access={"src": "r", "dst": "w"})
        except InvalidArgument as exc:
            assert "numba-cuda-mlir" in str(exc), exc
        else:
            raise AssertionError("a kernel written for numba-cuda-mlir became a tracked kernel")


    for fn in CHECKS:
        try:
            fn()
        except BaseException:
            print(f"FAIL {fn.__name__}")
            traceback.print_exc()
        else:
            print(f"OK {fn.__name__}")
    print("DONE")
''')

NAMES = ["loads_from_the_variable", "set_memory_manager", "memalloc", "memalloc_zero",
         "stream_scope_allocation", "free_on_drop", "explicit_free",
         "defer_cleanup_holds_frees", "device_array_over_a_block", "memory_info", "no_ipc",
         "reset", "transparent_mode_refused", "check_mode_refused", "simulated_driver_refused",
         "tracked_kernel_refused"]


@pytest.fixture(scope="module")
def child(child_env, repo_root):
    if not HAVE_MLIR:
        pytest.skip("numba-cuda-mlir is not installed (nox -s mlir installs it)")
    return subprocess.run([sys.executable, "-c", CHILD], cwd=repo_root,
                          env=child_env(NUMBA_CUDA_MEMORY_MANAGER="numba_streamsafe",
                                        NUMBA_STREAMSAFE_TRANSPARENT="0"),
                          capture_output=True, text=True, timeout=300)


def test_child_ran_every_check(child):
    assert child.returncode == 0, child.stdout + child.stderr
    assert "DONE" in child.stdout.splitlines(), child.stdout + child.stderr
    seen = [line.split()[1] for line in child.stdout.splitlines()
            if line.startswith(("OK ", "FAIL "))]
    assert seen == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_under_mlir(child, name):
    assert f"OK {name}" in child.stdout.splitlines(), child.stdout + child.stderr
