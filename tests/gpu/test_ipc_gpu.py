"""IPC mode on a GPU (``NUMBA_STREAMSAFE_IPC=1`` with the plugin selected): an
array written by a tracked kernel on another stream than its allocation's is
exported with Numba's ``get_ipc_handle`` and read by a spawned process; the
same program without the setting is refused with the message that names it.
Each runs in a fresh interpreter (the setting is read when the runtime is built)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

PROGRAM = textwrap.dedent("""
    import multiprocessing as mp
    import numpy as np
    from numba import cuda
    import numba_streamsafe as nss

    def child(handle, q):
        with handle as arr:
            q.put(arr.copy_to_host())

    @nss.tracked_kernel
    def fill(out: nss.Write, v):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = v + i

    if __name__ == "__main__":
        a, b = cuda.stream(), cuda.stream()
        x = cuda.device_array(1 << 16, np.int64, stream=a)   # the plugin's allocation
        fill[256, 256, b](x, 7)                               # written on another stream
        cuda.synchronize()
        try:
            handle = x.get_ipc_handle()
        except Exception as exc:
            print("REFUSED", type(exc).__name__, exc)
            raise SystemExit(0)
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(handle, q))
        p.start()
        got = q.get(timeout=120)
        p.join()
        ok = bool((got == 7 + np.arange(1 << 16)).all())
        print("READ", ok, p.exitcode)
""")


def _run(tmp_path, child_env, **env):
    script = tmp_path / "ipc_program.py"
    script.write_text(PROGRAM)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, env=child_env(NUMBA_CUDA_MEMORY_MANAGER="numba_streamsafe",
                                                     **env))


def test_an_exported_tracked_array_is_read_by_another_process(tmp_path, child_env):
    proc = _run(tmp_path, child_env, NUMBA_STREAMSAFE_IPC="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "READ True 0" in proc.stdout, proc.stdout + proc.stderr[-3000:]


def test_without_ipc_mode_export_is_refused_with_the_setting_named(tmp_path, child_env):
    proc = _run(tmp_path, child_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "REFUSED" in proc.stdout and "NUMBA_STREAMSAFE_IPC=1" in proc.stdout, proc.stdout
