"""The Numba EMM plugin, in a child interpreter.

Numba's CUDA simulator has no memory managers, so these checks run in a
fresh interpreter without ``NUMBA_ENABLE_CUDASIM`` and with the library's
simulated driver (``NUMBA_STREAMSAFE_DRIVER=sim``): Numba's real CUDA
target is imported, no GPU is touched, and each check prints ``OK <name>``
or ``FAIL <name>`` with its traceback.
"""

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(r'''
    import gc
    import traceback

    import numba
    from numba import cuda
    from numba.cuda.cudadrv.driver import MemoryPointer

    import numba_streamsafe as nss
    from numba_streamsafe import StaleContext, StreamSafeError, get_runtime
    from numba_streamsafe._driver.sim import SimDriver
    from numba_streamsafe.numba.emm import StreamSafeMemoryManager

    CHECKS = []


    def check(fn):
        CHECKS.append(fn)
        return fn


    @check
    def not_simulated():
        assert not numba.config.ENABLE_CUDASIM
        assert isinstance(get_runtime().driver, SimDriver)


    @check
    def base_class():
        assert issubclass(StreamSafeMemoryManager, cuda.HostOnlyCUDAMemoryManager)
        assert cuda.HostOnlyCUDAMemoryManager in StreamSafeMemoryManager.__bases__
        assert StreamSafeMemoryManager(context=None).interface_version == 1


    @check
    def package_plugin_attribute():
        import numba_streamsafe
        assert numba_streamsafe._numba_memory_manager is StreamSafeMemoryManager


    @check
    def set_memory_manager():
        # Numba instantiates the class with context=None and checks interface_version.
        cuda.set_memory_manager(StreamSafeMemoryManager)
        from numba.cuda.cudadrv import driver
        assert driver._memory_manager is StreamSafeMemoryManager


    @check
    def memalloc():
        rt = get_runtime()
        mm = StreamSafeMemoryManager(context=None)
        mm.initialize()
        assert mm.runtime is rt
        before = rt.bytes_outstanding()
        ptr = mm.memalloc(1024)
        assert isinstance(ptr, MemoryPointer)
        assert ptr.size == 1024
        block = ptr._nss_block
        assert block.nbytes == 1024 and block.tag == "numba"
        assert rt.find(block.ptr) is block
        assert rt.find(block.ptr + 1023) is block
        assert ptr.device_pointer_value == block.ptr
        assert rt.bytes_outstanding() == before + 1024


    @check
    def memalloc_zero():
        rt = get_runtime()
        mm = StreamSafeMemoryManager(context=None)
        before = (rt.bytes_outstanding(), rt.stats().allocations)
        ptr = mm.memalloc(0)
        assert isinstance(ptr, MemoryPointer)
        assert ptr.size == 0
        assert not ptr.device_pointer_value
        assert not hasattr(ptr, "_nss_block")
        assert (rt.bytes_outstanding(), rt.stats().allocations) == before


    @check
    def logging_resource_logs_finalizer_frees():
        import logging

        from numba_streamsafe import AsyncResource, DeviceRuntime, LoggingResource, set_runtime

        records = []

        class Keep(logging.Handler):
            def emit(self, record):
                records.append(record)

        logger = logging.getLogger("tests.emm.alloc")
        logger.addHandler(Keep())
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        rt = DeviceRuntime(LoggingResource(AsyncResource(SimDriver()), logger=logger))
        old = set_runtime(rt, 0)
        try:
            mm = StreamSafeMemoryManager(context=None)
            ptr = mm.memalloc(4096)
            block = ptr._nss_block
            del ptr
            gc.collect()
            # queued by the finalizer, which must not log (logging takes locks)
            assert [r.getMessage().split()[0] for r in records] == ["allocate"]
            assert rt.find(block.ptr) is block
            rt.flush()
            assert rt.find(block.ptr) is None
            assert [r.getMessage().split()[0] for r in records] == ["allocate", "free"]
            assert "(finalizer)" in records[1].getMessage()
            assert (records[1].generation, records[1].nbytes) == (block.generation, 4096)
        finally:
            set_runtime(old, 0)


    @check
    def free_on_drop():
        rt = get_runtime()
        rt.flush()
        rt.reap()
        base = rt.bytes_outstanding()
        mm = StreamSafeMemoryManager(context=None)
        ptr = mm.memalloc(4096)
        block = ptr._nss_block
        assert rt.bytes_outstanding() == base + 4096
        del ptr
        gc.collect()
        assert rt.find(block.ptr) is block  # queued, not yet freed: finalizers take no lock
        rt.flush()
        assert rt.find(block.ptr) is None
        assert rt.bytes_outstanding() == base + 4096  # pending until reaped
        rt.reap()
        assert rt.bytes_outstanding() == base


    @check
    def explicit_free_and_views():
        rt = get_runtime()
        rt.flush()
        rt.reap()
        mm = StreamSafeMemoryManager(context=None)
        ptr = mm.memalloc(4096)
        block = ptr._nss_block
        view = ptr.view(1024)  # Numba's owned view: a weak proxy of the owner
        assert view.device_pointer_value == block.ptr + 1024
        frees = rt.stats().frees
        assert ptr._finalizer.alive
        ptr.free()  # MemoryPointer.free(): the free is queued, once
        assert not ptr._finalizer.alive
        rt.flush()
        assert rt.find(block.ptr) is None
        assert rt.stats().frees == frees + 1
        del ptr, view
        gc.collect()
        assert rt.stats().deferred == 0  # dropping it afterwards queues nothing more
        rt.flush()
        assert rt.stats().frees == frees + 1


    @check
    def defer_cleanup_holds_frees():
        rt = get_runtime()
        rt.flush()
        rt.reap()
        base = rt.bytes_outstanding()
        mm = StreamSafeMemoryManager(context=None)
        ptr = mm.memalloc(512)
        with mm.defer_cleanup():
            del ptr
            gc.collect()
            rt.flush()
            rt.reap()
            assert rt.bytes_outstanding() == base + 512
            with mm.defer_cleanup():  # nests
                rt.flush()
            rt.flush()
            assert rt.bytes_outstanding() == base + 512
        rt.flush()
        rt.reap()
        assert rt.bytes_outstanding() == base


    @check
    def memory_info():
        rt = get_runtime()
        mm = StreamSafeMemoryManager(context=None)
        info = mm.get_memory_info()
        free, total = info
        assert (info.free, info.total) == (free, total)
        assert total == rt.driver.capacity
        assert 0 <= free <= total
        assert (free, total) == rt.driver.mem_info()


    @check
    def no_ipc():
        mm = StreamSafeMemoryManager(context=None)
        ptr = mm.memalloc(64)
        try:
            mm.get_ipc_handle(ptr)
        except StreamSafeError as exc:
            assert "IPC" in str(exc), exc
        else:
            raise AssertionError("get_ipc_handle did not raise")


    @check
    def stream_scope_allocation():
        rt = get_runtime()
        mm = StreamSafeMemoryManager(context=None)
        h = rt.driver.create_stream()
        with nss.stream_scope(h):
            ptr = mm.memalloc(256)
        assert ptr._nss_block.stream == h
        outside = mm.memalloc(256)
        assert outside._nss_block.stream == rt.stream_handle(None)


    @check
    def reset_advances_epoch():
        rt = get_runtime()
        mm = StreamSafeMemoryManager(context=None)
        ptr = mm.memalloc(128)
        old = ptr._nss_block
        epoch = rt.epoch
        mm.reset()
        assert rt.epoch == epoch + 1
        assert rt.find(old.ptr) is None
        try:
            rt.deallocate(old)
        except StaleContext as exc:
            assert "reset" in str(exc), exc
        else:
            raise AssertionError("deallocate of a block from before the reset did not raise")
        del ptr
        gc.collect()
        rt.flush()  # the old finalizer is harmless
        fresh = mm.memalloc(128)
        assert fresh._nss_block.epoch == rt.epoch
        assert rt.bytes_outstanding() == 128


    @check
    def device_array_through_plugin():
        # With the plugin installed, Numba's own device arrays would come from
        # the runtime; building one needs a context, so only the pointer path
        # is checked here: a DeviceNDArray over a plugin pointer resolves to its block.
        from numba.cuda.cudadrv.devicearray import DeviceNDArray
        import numpy as np
        from numba_streamsafe.numba import target
        rt = get_runtime()
        mm = StreamSafeMemoryManager(context=None)
        ptr = mm.memalloc(64)
        arr = DeviceNDArray((16,), (4,), np.dtype(np.int32), stream=0, gpu_data=ptr)
        assert target.resolve(rt, arr)[1] is ptr._nss_block
        block = ptr._nss_block
        del ptr, arr
        gc.collect()
        rt.flush()
        assert rt.find(block.ptr) is None


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

NAMES = ["not_simulated", "base_class", "package_plugin_attribute", "set_memory_manager",
         "memalloc", "memalloc_zero", "logging_resource_logs_finalizer_frees", "free_on_drop",
         "explicit_free_and_views",
         "defer_cleanup_holds_frees", "memory_info",
         "no_ipc", "stream_scope_allocation", "reset_advances_epoch",
         "device_array_through_plugin"]


@pytest.fixture(scope="module")
def child(child_env, repo_root):
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=repo_root,
                          env=child_env(NUMBA_STREAMSAFE_DRIVER="sim"),
                          capture_output=True, text=True, timeout=300)
    return proc


def test_child_ran_every_check(child):
    assert child.returncode == 0, child.stdout + child.stderr
    assert "DONE" in child.stdout.splitlines(), child.stdout + child.stderr
    seen = [line.split()[1] for line in child.stdout.splitlines()
            if line.startswith(("OK ", "FAIL "))]
    assert seen == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_plugin(child, name):
    lines = child.stdout.splitlines()
    assert f"OK {name}" in lines, child.stdout + child.stderr

