"""IPC mode (``AsyncResource(ipc=True)``, ``NUMBA_STREAMSAFE_IPC=1``) on the
simulated driver: blocks are ``cuMemAlloc`` allocations, tracked as any
block, and freed with ``cuMemFree`` only after their uses on every stream."""

from __future__ import annotations

import pytest

from numba_streamsafe._driver.sim import SimDriver
from numba_streamsafe.core.access import Access
from numba_streamsafe.core.errors import InvalidArgument
from numba_streamsafe.core.settings import Settings
from numba_streamsafe.diagnostics.recorder import LaunchRecorder
from numba_streamsafe.resources import AsyncResource
from numba_streamsafe.runtime import DeviceRuntime


def _launch(rt, stream, block, access, label):
    rec = LaunchRecorder(rt, stream)
    rec.use(block, access, label)
    rec.preflight()
    rt.driver.trace_access(stream, [(block.ptr, block.nbytes, access)], label)
    rec.commit()


def test_ipc_blocks_are_legacy_allocations_freed_after_their_uses():
    sim = SimDriver()
    res = AsyncResource(sim, ipc=True)
    rt = DeviceRuntime(res)
    a, b = sim.create_stream(), sim.create_stream()
    x = res.allocate(4096, a, "x")
    assert sim.calls["cuMemAlloc"] == 1 and sim.calls["cuMemAllocAsync"] == 0
    _launch(rt, a, x, Access.WRITE, "writer on a")
    _launch(rt, b, x, Access.READ, "reader on b")
    res.deallocate(x)
    rt.reap()
    assert sim.calls["cuMemFree"] + len(res._reaper.kept.blocks) >= 1
    assert sim.calls["cuMemFreeAsync"] == 0
    y = res.allocate(1 << 27, a, "large: not kept")   # over reuse_bytes: freed at once
    _launch(rt, b, y, Access.WRITE, "writer on b")
    res.deallocate(y)
    assert sim.calls["cuMemFree"] >= 1
    assert sim.hazards == []


def test_default_mode_uses_the_pool():
    sim = SimDriver()
    res = AsyncResource(sim)
    res.deallocate(res.allocate(4096, 0, "x"))
    assert not res.ipc and sim.calls["cuMemAllocAsync"] == 1 and sim.calls["cuMemAlloc"] == 0


def test_option_and_setting(monkeypatch):
    with pytest.raises(InvalidArgument, match="ipc must be True or False"):
        AsyncResource(SimDriver(), ipc="yes")
    monkeypatch.setenv("NUMBA_STREAMSAFE_IPC", "1")
    assert Settings.from_env().ipc is True
    monkeypatch.setenv("NUMBA_STREAMSAFE_IPC", "off")
    assert Settings.from_env().ipc is False
