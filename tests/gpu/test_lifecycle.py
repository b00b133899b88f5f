"""Life cycle on a real GPU: interpreter exit, ``cuda.close()``, context reset,
dropped streams and frees from other threads (docs/architecture.md section 5).

What needs a fresh interpreter (the exit, the close, the reset) runs in a child
process with the repository importable; the child must exit 0 and print no
traceback, no ``Exception ignored`` and no error to stderr. Numba's performance
warnings are turned off there, so that a clean exit prints nothing at all.
"""

from __future__ import annotations

import gc
import re
import subprocess
import sys
import textwrap
import threading
import traceback
import weakref
from pathlib import Path

import numpy as np
import pytest

import numba_streamsafe as nss

pytestmark = pytest.mark.gpu

HERE = Path(__file__).resolve().parent
N = 1 << 20
GRID, BLOCK = 512, 256
BAD_STDERR = re.compile(r"Exception ignored|Traceback|Error")

PRELUDE = textwrap.dedent(r'''
    import gc
    import importlib.util
    import sys
    import threading

    import numpy as np
    from numba import cuda

    import numba_streamsafe as nss

    N = 1 << 16
    G, B = 256, 256


    def load_kernels():
        """A fresh copy of tests/gpu/kernels.py: new dispatchers, compiled on first use."""
        spec = importlib.util.spec_from_file_location("kernels", sys.argv[1])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module


    def install_plugin():
        from numba_streamsafe.numba.emm import StreamSafeMemoryManager

        cuda.set_memory_manager(StreamSafeMemoryManager)  # before the context exists
''')


def run_child(child_env, code: str, *args: str) -> subprocess.CompletedProcess:
    env = child_env(NUMBA_DISABLE_PERFORMANCE_WARNINGS="1")
    return subprocess.run([sys.executable, "-c", code, str(HERE / "kernels.py"), *args],
                          env=env, capture_output=True, text=True, timeout=300)


def assert_clean(proc: subprocess.CompletedProcess, marker: str, *, silent: bool = False) -> None:
    out = f"--- exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    assert proc.returncode == 0, out
    assert marker in proc.stdout.splitlines(), out
    bad = [line for line in proc.stderr.splitlines() if BAD_STDERR.search(line)]
    assert bad == [], out
    if silent:
        assert proc.stderr.strip() == "", out


# ------------------------------------------------------------ interpreter exit
EXIT_CHILD = PRELUDE + textwrap.dedent(r'''
    plugin = sys.argv[2] == "plugin"
    if plugin:
        install_plugin()
    k = load_kernels()
    a, b = cuda.stream(), cuda.stream()
    xs = [nss.device_array(N, np.int32, stream=s) for s in (a, b, a, b)]
    k.fill[G, B, a](xs[0], 1)
    k.copy[G, B, b](xs[0], xs[1])
    k.slow_fill[G, B, a](xs[2], 3, 2000)  # still running when the interpreter exits
    k.copy[G, B, b](xs[2], xs[3])  # queued behind it on b
    if plugin:
        e = cuda.device_array(N, dtype=np.int32)  # Numba's array, from the plugin
        k.copy[G, B, a](xs[1], e)
    dropped = nss.device_array(N, np.int32, stream=a)  # a free left queued at exit
    k.fill[G, B, b](dropped, 5)
    del dropped


    class Holder:
        pass


    h = Holder()
    h.cycle = h  # freed only by the collector, during shutdown
    h.array = nss.device_array(N, np.int32, stream=b)
    k.fill[G, B, a](h.array, 6)
    del h
    keep = []  # an array allocated on another thread
    t = threading.Thread(target=lambda: keep.append(nss.device_array(N, np.int32, stream=a)))
    t.start()
    t.join()
    print("EXIT CHILD OK", flush=True)
''')


@pytest.mark.parametrize("how", ["library", "plugin"])
def test_arrays_alive_at_interpreter_exit(gpu, child_env, how):
    proc = run_child(child_env, EXIT_CHILD, how)
    assert_clean(proc, "EXIT CHILD OK", silent=True)


# ------------------------------------------------------------------ cuda.close()
CLOSE_CHILD = PRELUDE + textwrap.dedent(r'''
    install_plugin()
    rt = nss.get_runtime()
    k = load_kernels()
    a, b = cuda.stream(), cuda.stream()
    x = nss.device_array(N, np.int32, stream=a)  # the library's own array
    y = cuda.device_array(N, dtype=np.int32)  # Numba's, from the plugin
    assert nss.block_of(x) is not None and nss.block_of(y) is not None
    k.fill[G, B, a](x, 4)
    k.copy[G, B, b](x, y)
    epoch = rt.epoch
    cuda.close()  # with both arrays alive and work in flight
    assert rt.epoch == epoch + 1, (rt.epoch, epoch)
    assert rt.bytes_outstanding() == 0, rt.stats()
    # The default stream: refusing an old array must need no new context.
    for name, arr in (("library", x), ("plugin", y)):
        for what in ("launch", "copy"):
            try:
                if what == "launch":
                    k.fill[G, B](arr, 5)
                else:
                    nss.copy_to_host(arr)
            except nss.StaleContext as exc:
                text = str(exc)
                assert "context was reset" in text and "Allocate it again" in text, text
                print(f"STALE {name} {what}: {text}", flush=True)
            else:
                raise AssertionError(f"{what} of the {name} array from before close was accepted")
    del x, y, arr
    gc.collect()
    rt.flush()  # the finalizers' frees of stale blocks do nothing
    rt.reap()
    assert rt.bytes_outstanding() == 0, rt.stats()
    print("CLOSE OK", flush=True)

    if sys.argv[2] == "reuse":
        k2 = load_kernels()  # Numba's kernels compiled before close() belong to the old context
        u, v = cuda.stream(), cuda.stream()
        p = nss.device_array(N, np.int32, stream=u)
        q = cuda.device_array(N, dtype=np.int32)
        k2.slow_fill[G, B, u](p, 9, 500)
        k2.copy[G, B, v](p, q)
        out = nss.copy_to_host(q, stream=v)
        v.synchronize()
        assert (out == 9).all(), out[:8]
        del p, q
        gc.collect()
        rt.flush()
        rt.reap()
        assert rt.bytes_outstanding() == 0, rt.stats()
        print("REUSE AFTER CLOSE OK", flush=True)
''')

#: Numba alone: can it make a new context after ``cuda.close()``?
NUMBA_REOPEN_PROBE = textwrap.dedent(r'''
    from numba import cuda

    cuda.stream()
    cuda.close()
    cuda.stream()
    print("NUMBA REOPENS", flush=True)
''')


def test_close_with_live_arrays_makes_them_stale(gpu, child_env):
    proc = run_child(child_env, CLOSE_CHILD, "stale")
    assert_clean(proc, "CLOSE OK")
    assert proc.stdout.count("STALE ") == 4, proc.stdout


def test_allocations_and_launches_work_after_close(gpu, child_env):
    probe = run_child(child_env, NUMBA_REOPEN_PROBE)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        pytest.skip(f"Numba alone cannot make a context after cuda.close() here: {last}")
    proc = run_child(child_env, CLOSE_CHILD, "reuse")
    assert_clean(proc, "REUSE AFTER CLOSE OK")


# --------------------------------------------------------------- context reset
RESET_CHILD = PRELUDE + textwrap.dedent(r'''
    install_plugin()
    rt = nss.get_runtime()
    k = load_kernels()
    a, b = cuda.stream(), cuda.stream()
    x = nss.device_array(N, np.int32, stream=a)
    y = cuda.device_array(N, dtype=np.int32, stream=b)
    k.fill[G, B, a](x, 4)
    k.copy[G, B, b](x, y)
    cuda.synchronize()
    epoch = rt.epoch
    cuda.current_context().reset()
    assert rt.epoch == epoch + 1 and rt.bytes_outstanding() == 0, rt.stats()
    for arr in (x, y):
        try:
            nss.copy_to_host(arr, stream=a)
        except nss.StaleContext as exc:
            print("STALE:", exc, flush=True)
        else:
            raise AssertionError("an array from before the reset was accepted")
    del x, y, arr
    gc.collect()
    # Numba unloaded its modules in the reset: kernels need a fresh copy.
    k2 = load_kernels()
    for i in range(3):
        p = nss.device_array(N, np.int32, stream=a)
        q = cuda.device_array(N, dtype=np.int32, stream=b)
        r = nss.to_device(np.arange(N, dtype=np.int32), stream=b)
        k2.slow_fill[G, B, a](p, 10 + i, 500)
        k2.copy[G, B, b](p, q)  # after the slow fill on a
        k2.copy[G, B, a](r, p)  # after b's read of p
        out_q = nss.copy_to_host(q, stream=b)
        out_p = nss.copy_to_host(p, stream=b)
        b.synchronize()
        assert (out_q == 10 + i).all(), (i, out_q[:8])
        assert (out_p == np.arange(N)).all(), (i, out_p[:8])
        del p, q, r
    gc.collect()
    rt.flush()
    rt.reap()
    assert rt.bytes_outstanding() == 0, rt.stats()
    print("RESET OK", flush=True)
''')


def test_context_reset_then_reuse(gpu, child_env):
    proc = run_child(child_env, RESET_CHILD)
    assert_clean(proc, "RESET OK")
    assert proc.stdout.count("STALE:") == 2, proc.stdout


# ------------------------------------------------------------- dropped streams
def _numba_frees(gpu) -> None:
    """Run Numba's own queued frees (a dropped Stream is destroyed there)."""
    gpu.current_context().deallocations.clear()


def test_a_dropped_stream_object_lives_while_its_blocks_do(gpu, fresh_runtime):
    rt = fresh_runtime
    drv = rt.driver
    s = gpu.stream()
    alive = weakref.ref(s)
    h = rt.stream_handle(s)
    raw = rt.allocate(4096, s, "raw block on s")
    drv.memset_async(raw.ptr, 0x5A, raw.nbytes, h)
    del s
    gc.collect()
    _numba_frees(gpu)
    assert alive() is not None, "a live block keeps its alloc stream alive"
    drv.check_stream(h)
    assert drv.copy_to_host(raw.ptr, raw.nbytes, h) == b"\x5a" * raw.nbytes
    rt.deallocate(raw)  # queued on s
    gc.collect()
    assert alive() is not None, "a queued free keeps its stream alive until reaped"
    rt.reap()
    gc.collect()
    assert alive() is None, "after the reap nothing keeps the stream object alive"
    _numba_frees(gpu)  # Numba destroys the stream now
    assert rt.bytes_outstanding() == 0


def test_arrays_on_a_dropped_stream_stay_usable(gpu, kernels, fresh_runtime):
    rt = fresh_runtime
    s, t = gpu.stream(), gpu.stream()
    x = nss.device_array(N, np.int32, stream=s)
    y = nss.device_array(N, np.int32, stream=t)
    kernels.slow_fill[GRID, BLOCK, s](x, 7, 500)
    del s
    gc.collect()
    _numba_frees(gpu)
    kernels.copy[GRID, BLOCK, t](x, y)  # waits for the slow fill on the dropped stream
    kernels.fill[GRID, BLOCK, t](x, 8)
    out_y = nss.copy_to_host(y, stream=t)
    out_x = nss.copy_to_host(x, stream=t)
    t.synchronize()
    assert (out_y == 7).all() and (out_x == 8).all()
    del x  # its free is queued on the dropped stream
    gc.collect()
    rt.flush()
    rt.reap()
    gc.collect()
    _numba_frees(gpu)
    assert rt.bytes_outstanding() == y.nbytes
    z = nss.device_array(N, np.int32, stream=t)  # the pool and the runtime still work
    kernels.copy[GRID, BLOCK, t](y, z)
    assert (nss.copy_to_host(z, stream=t) == 7).all()
    t.synchronize()


# ------------------------------------------------------ frees from other threads
WHO = ["worker drops, main flushes", "worker drops and flushes", "worker allocates, main drops"]


@pytest.mark.parametrize("who", WHO)
def test_frees_from_another_thread_return_the_memory(gpu, kernels, fresh_runtime, who):
    rt = fresh_runtime
    gpu.synchronize()
    gc.collect()
    rt.flush()
    rt.reap()
    start = rt.bytes_outstanding()
    s = gpu.stream()
    box: list = []
    errors: list[str] = []
    deferred_in_worker: list[int] = []

    def make() -> list:
        arrays = [nss.device_array(N // 8, np.int32, stream=s) for _ in range(8)]
        for i, arr in enumerate(arrays):
            kernels.fill[GRID, BLOCK, s](arr, i)
        return arrays

    def worker() -> None:
        try:
            if who == "worker allocates, main drops":
                box.append(make())
                return
            arrays = box.pop()  # the last references move to this thread
            del arrays  # Numba's finalizers run here
            gc.collect()
            deferred_in_worker.append(rt.resource.stats().deferred)
            if who == "worker drops and flushes":
                rt.flush()  # the driver's frees are made from this thread
                rt.reap()
        except BaseException:
            errors.append(traceback.format_exc())

    if who != "worker allocates, main drops":
        box.append(make())
    th = threading.Thread(target=worker)
    th.start()
    th.join()
    assert errors == [], errors[0]
    if who == "worker allocates, main drops":
        assert len(box[0]) == 8 and rt.bytes_outstanding() == start + 8 * (N // 8) * 4
        box.clear()
        gc.collect()
    else:
        assert deferred_in_worker == [8], "the finalizers queued the frees on the worker"
    if who == "worker drops and flushes":
        assert rt.bytes_outstanding() == start, "freed and reaped on the worker"
    rt.flush()
    rt.reap()
    assert rt.bytes_outstanding() == start
    assert rt.resource.stats().deferred == 0 and rt.resource.events.in_use == 0
