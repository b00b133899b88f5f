"""The numba-cuda internals the Numba layer relies on are still there.

``numba_streamsafe/numba/launch/launch_plan.py``, ``target.py`` and ``kernel.py`` read
private numba-cuda attributes and import names from numba-cuda's internal
modules. pyproject.toml names the supported releases (0.24 to 0.30; 0.30.4
runs on the GPU machine, and nox's ``numba_cuda`` session runs this test on the
oldest and the newest). A numba-cuda that renames one of them must fail
here, naming it, rather than make the direct launch path fall back silently
(several are read with ``getattr(..., default)``) or break on a GPU only.

Checked here, without a GPU, in a child interpreter on Numba's real CUDA
target (no simulator; ``child_env``):

- ``numba.cuda.types``: ``Array`` and the scalar types the direct path packs
  (``int8`` ... ``uint64``, ``float32``, ``float64``, ``boolean``,
  ``complex64``, ``complex128``); ``numba.cuda.typing.typeof``: ``typeof``,
  ``Purpose.argument``.
- ``CUDADispatcher`` (``cuda.jit``): ``targetoptions["extensions"]``,
  ``specialized``, ``overloads``, ``specializations``, and
  ``_launch_config_sensitive`` where numba-cuda has launch configurations
  (``numba.cuda.launchconfig``, from 0.30).
- ``numba.cuda.dispatcher._Kernel``: the ``argument_types`` property, and
  ``__init__`` assigning ``self._codelibrary``, ``self.debug``,
  ``self.cooperative`` and (with launch configurations)
  ``self.launch_config_sensitive`` (a compiled ``_Kernel`` needs a GPU, so
  the assignments are looked up in its source).
- ``CUDACodeLibrary``: ``get_cufunc`` and the ``_cufunc_cache`` dict;
  ``CudaPythonFunction`` (what ``get_cufunc`` returns) has a ``handle`` slot.
- ``numba.cuda.cudadrv.driver``: ``MemoryPointer``, ``binding.CUdeviceptr``,
  ``device_memset``. ``target.BlockPointer`` sets exactly the fields
  ``MemoryPointer.__init__`` sets (``context``, ``device_pointer``,
  ``handle``, ``size``, ``_cuda_memsize_``, ``is_managed``, ``refct``,
  ``_owner``, ``_finalizer``), and ``MemoryPointer``'s ``owner``,
  ``device_pointer_value`` and ``free`` (through ``_finalizer.alive`` and
  ``_finalizer()``) work on it.
- ``numba.cuda.cudadrv.devicearray.DeviceNDArray``: built over a
  ``BlockPointer`` it keeps it as ``gpu_data``, and ``_numba_type_`` types it
  (what ``launch_plan.argtypes_of`` and ``target.resolve`` read).
- What transparent mode wraps (``transparent._install_gpu``):
  ``numba.cuda.dispatcher._LaunchConfiguration``'s ``__init__(self,
  dispatcher, griddim, blockdim, stream, sharedmem)`` assigning those fields,
  its ``__call__`` and ``__getstate__``; ``CUDADispatcher.configure``; the
  driver's ``host_to_device``, ``device_to_host``, ``device_to_device`` and
  ``device_memset`` with parameters ``(dst, src_or_val, size, stream)``. The
  configuration's ``pre_launch_callbacks`` came with numba-cuda 0.30 and is
  read where present.
- ``numba.cuda.core.config``: ``CUDA_LOW_OCCUPANCY_WARNINGS``,
  ``DISABLE_PERFORMANCE_WARNINGS``; ``numba.cuda.core.errors``:
  ``NumbaPerformanceWarning`` (the direct path's low-occupancy warning).

Checked here in this process, on the simulator:
``numba.cuda.simulator.cudadrv.devicearray.FakeCUDAArray`` and its ``_ary``.

Checked on a GPU only, by ``tests/gpu/test_direct_launch.py`` (every direct
launch there is compared with Numba's own launch): that ``get_cufunc()`` loads
the function into ``_cufunc_cache`` under the device id and its ``handle`` is
the ``CUfunction`` that ``cuLaunchKernel`` takes; that ``dispatcher.overloads``
is keyed by the tuple of argument types, that a specialized dispatcher holds
its one overload there and that ``forall`` compiles into
``dispatcher.specializations``; the kernel parameter layout Numba marshals
(an array as meminfo, parent, nitems, itemsize, data, shape, strides); the
``_Kernel`` attributes on a compiled overload; ``make_array`` over
``cuda.current_context()``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

SCRIPT = textwrap.dedent(r'''
    import importlib.util
    import inspect
    import json
    import traceback
    from types import SimpleNamespace

    import numba
    import numpy as np
    from numba import cuda

    RESULTS = {}
    # Launch-configuration-sensitive kernels came with numba.cuda.launchconfig
    # (numba-cuda 0.30); before it no kernel is one, and launch_plan.py's getattr
    # defaults (False) say so.
    LAUNCH_CONFIGS = importlib.util.find_spec("numba.cuda.launchconfig") is not None


    def check(fn):
        try:
            fn()
        except Exception:
            RESULTS[fn.__name__] = traceback.format_exc(limit=3)
        else:
            RESULTS[fn.__name__] = None
        return fn


    def need(obj, name, where):
        assert hasattr(obj, name), f"{where} has no attribute {name!r}"
        return getattr(obj, name)


    @check
    def real_cuda_target():
        assert not numba.config.ENABLE_CUDASIM, "the child runs Numba's CUDA simulator"


    @check
    def types_and_typeof():
        from numba.cuda import types
        for name in ("Array", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
                     "uint64", "float32", "float64", "boolean", "complex64", "complex128"):
            need(types, name, "numba.cuda.types")
        from numba.cuda.typing import typeof as typeof_module
        need(typeof_module, "typeof", "numba.cuda.typing.typeof")
        need(need(typeof_module, "Purpose", "numba.cuda.typing.typeof"), "argument",
             "numba.cuda.typing.typeof.Purpose")


    @check
    def dispatcher_attributes():
        def probe(a):
            a[0] = 1

        dispatcher = cuda.jit(probe)
        where = type(dispatcher).__qualname__ + " (cuda.jit)"
        names = ["targetoptions", "specialized", "overloads", "specializations"]
        if LAUNCH_CONFIGS:
            names.append("_launch_config_sensitive")
        for name in names:
            need(dispatcher, name, where)
        assert "extensions" in dispatcher.targetoptions, \
            f"{where}.targetoptions has no 'extensions' key"


    @check
    def kernel_class():
        from numba.cuda import dispatcher
        kernel = need(dispatcher, "_Kernel", "numba.cuda.dispatcher")
        need(kernel, "argument_types", "numba.cuda.dispatcher._Kernel")
        source = inspect.getsource(kernel.__init__)
        names = ["_codelibrary", "debug", "cooperative"]
        if LAUNCH_CONFIGS:
            names.append("launch_config_sensitive")
        for name in names:
            assert f"self.{name} =" in source, \
                f"numba.cuda.dispatcher._Kernel.__init__ no longer sets self.{name}"


    @check
    def code_library():
        from numba.cuda.codegen import CUDACodeLibrary
        from numba.cuda.cudadrv import driver
        from numba.cuda.descriptor import cuda_target
        need(CUDACodeLibrary, "get_cufunc", "numba.cuda.codegen.CUDACodeLibrary")
        library = cuda_target.target_context.codegen().create_library("probe",
                                                                      entry_name="probe")
        assert isinstance(library, CUDACodeLibrary), type(library)
        cache = need(library, "_cufunc_cache", "numba.cuda.codegen.CUDACodeLibrary")
        assert isinstance(cache, dict), f"CUDACodeLibrary._cufunc_cache is a {type(cache)}"
        function = need(driver, "CudaPythonFunction", "numba.cuda.cudadrv.driver")
        assert "handle" in getattr(function, "__slots__", ()) or hasattr(function, "handle"), \
            "numba.cuda.cudadrv.driver.CudaPythonFunction has no 'handle'"


    @check
    def driver_names():
        from numba.cuda.cudadrv import driver
        need(driver, "MemoryPointer", "numba.cuda.cudadrv.driver")
        need(driver, "device_memset", "numba.cuda.cudadrv.driver")
        binding = need(driver, "binding", "numba.cuda.cudadrv.driver")
        need(binding, "CUdeviceptr", "numba.cuda.cudadrv.driver.binding")


    @check
    def block_pointer_matches_memory_pointer():
        from numba.cuda.cudadrv.driver import MemoryPointer, binding
        from numba_streamsafe.numba import target
        reference = MemoryPointer(None, binding.CUdeviceptr(4096), 64, finalizer=lambda: None)
        freed = []
        block = SimpleNamespace(ptr=4096, nbytes=64)
        pointer = target.BlockPointer(None, block, freed.append)
        # BlockPointer's _finalizer is a property (made when asked for), so
        # the instance holds the block and its release instead.
        ours = (set(vars(pointer)) - {"_nss_block", "_nss_defer"}) | {"_finalizer"}
        theirs = set(vars(reference))
        assert pointer._finalizer.alive, "a live BlockPointer's finalizer is not alive"
        assert ours == theirs, (f"MemoryPointer.__init__ sets {sorted(theirs)}; "
                                f"target.BlockPointer sets {sorted(ours)}")
        assert pointer.owner is pointer, "MemoryPointer.owner is not the pointer itself"
        assert pointer.device_pointer_value == 4096, pointer.device_pointer_value
        pointer.free()
        assert freed == [block], f"MemoryPointer.free() did not call _finalizer: {freed}"
        try:
            pointer.free()
        except RuntimeError:
            pass
        else:
            raise AssertionError("MemoryPointer.free() no longer checks _finalizer.alive")


    @check
    def device_array_type():
        from numba.cuda import types
        from numba.cuda.cudadrv.devicearray import DeviceNDArray
        from numba_streamsafe.numba.launch import launch_plan
        from numba_streamsafe.numba import target
        need(DeviceNDArray, "_numba_type_", "numba.cuda.cudadrv.devicearray.DeviceNDArray")
        block = SimpleNamespace(ptr=4096, nbytes=64)
        pointer = target.BlockPointer(None, block, lambda b: None)
        array = DeviceNDArray((16,), (4,), np.dtype(np.float32), gpu_data=pointer)
        assert array.gpu_data is pointer, "DeviceNDArray replaced the gpu_data it was given"
        assert array._numba_type_ == types.Array(types.float32, 1, "C"), array._numba_type_
        assert int(array.gpu_data.device_pointer) == 4096
        assert launch_plan.argtypes_of((array, 2.0)) == (array._numba_type_, types.float64)
        assert target.resolve(None, array) == (target.DEVICE, block, None)


    @check
    def occupancy_warning_names():
        from numba.cuda.core import config, errors
        need(config, "CUDA_LOW_OCCUPANCY_WARNINGS", "numba.cuda.core.config")
        need(config, "DISABLE_PERFORMANCE_WARNINGS", "numba.cuda.core.config")
        need(errors, "NumbaPerformanceWarning", "numba.cuda.core.errors")


    @check
    def transparent_hooks():
        # transparent._install_gpu wraps these; its hooks take Numba's parameters.
        from numba.cuda import dispatcher
        from numba.cuda.cudadrv import driver
        config = need(dispatcher, "_LaunchConfiguration", "numba.cuda.dispatcher")
        where = "numba.cuda.dispatcher._LaunchConfiguration"
        for name in ("__init__", "__call__", "__getstate__"):
            assert name in vars(config), f"{where} no longer defines {name}"
        params = list(inspect.signature(config.__init__).parameters)
        assert params == ["self", "dispatcher", "griddim", "blockdim", "stream", "sharedmem"], \
            f"{where}.__init__ takes {params}"
        source = inspect.getsource(config.__init__)
        for name in ("dispatcher", "griddim", "blockdim", "stream", "sharedmem"):
            assert f"self.{name} =" in source, f"{where}.__init__ no longer sets self.{name}"
        need(cuda.jit(lambda a: None), "configure", "CUDADispatcher (cuda.jit)")
        for name in ("host_to_device", "device_to_host", "device_to_device", "device_memset"):
            params = list(inspect.signature(need(driver, name, "numba.cuda.cudadrv.driver"))
                          .parameters)
            assert len(params) == 4 and params[2:] == ["size", "stream"], \
                f"numba.cuda.cudadrv.driver.{name} takes {params}"


    print("RESULTS " + json.dumps(RESULTS))
''')

CHECKS = ["real_cuda_target", "types_and_typeof", "dispatcher_attributes", "kernel_class",
          "code_library", "driver_names", "block_pointer_matches_memory_pointer",
          "device_array_type", "occupancy_warning_names", "transparent_hooks"]


@pytest.fixture(scope="module")
def child_results(child_env, repo_root) -> dict[str, str | None]:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=repo_root,
                          env=child_env(NUMBA_STREAMSAFE_DRIVER="sim"), capture_output=True,
                          text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULTS ")]
    assert proc.returncode == 0 and lines, (
        f"the checking child failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return json.loads(lines[-1][len("RESULTS "):])


@pytest.mark.parametrize("name", CHECKS)
def test_numba_cuda_internal_is_there(child_results, name):
    assert name in child_results, f"the child did not run check {name!r}"
    error = child_results[name]
    assert error is None, (
        f"a numba-cuda internal the Numba layer relies on changed ({name}); numba_streamsafe "
        "supports numba-cuda 0.24 to 0.30 (see pyproject.toml). Adapt "
        f"numba_streamsafe/numba/ or narrow the supported releases.\n{error}")


def test_simulator_array_internals():
    from numba import config

    if not config.ENABLE_CUDASIM:
        pytest.skip("Numba's CUDA simulator is off in this process")
    from numba import cuda

    try:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
    except ImportError as exc:
        pytest.fail(f"numba-cuda's simulator moved FakeCUDAArray, which target.py imports: {exc}")
    host = np.arange(4, dtype=np.float32)
    array = FakeCUDAArray(host, stream=0)
    assert getattr(array, "_ary", None) is host, (
        "FakeCUDAArray no longer keeps its host array as _ary, which target.py reads")
    assert isinstance(cuda.to_device(host), FakeCUDAArray), (
        "the simulator's cuda.to_device no longer returns a FakeCUDAArray")
