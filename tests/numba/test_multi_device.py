"""docs/architecture.md section 7 in the Numba layer: tracked kernels, copies
and frees on two simulated devices.

Two :class:`~numba_streamsafe._driver.sim.SimDriver` of one
:class:`~numba_streamsafe._driver.sim.SimSystem`, each under its installed
runtime; :func:`numba_streamsafe.use_device` chooses the device on Numba's
CUDA simulator (which has one). The simulated driver checks happens-before
across the devices: tracked, no hazard; with tracking off on both devices,
the hazard (the negative control).
"""

from __future__ import annotations

import collections
import contextlib
import gc

import numpy as np
import pytest
from numba import cuda

import numba_streamsafe as nss
from numba_streamsafe import PeerAccessRequired, Read, Write, tracked_kernel
from numba_streamsafe._driver.sim import SimDriver, SimSystem
from numba_streamsafe.numba import target
from numba_streamsafe.resources import AsyncResource
from numba_streamsafe.runtime import (
    DeviceRuntime,
    clear_runtimes,
    installed_devices,
    installed_runtime,
    set_runtime,
)

N = 256
GRID, BLOCK = 2, 32


@tracked_kernel
def fill(out: Write, value):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < out.size:
        out[i] = value
        i += step


@tracked_kernel
def add(src: Read, dst: Write, k):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < src.size:
        dst[i] = src[i] + k
        i += step


@pytest.fixture
def two():
    """Runtimes of simulated devices 0 and 1 (one system), installed; streams
    ``a`` (device 0's work) and ``b`` (device 1's)."""
    if not target.SIMULATOR:
        pytest.skip("needs Numba's CUDA simulator")
    system = SimSystem()
    rts = [DeviceRuntime(AsyncResource(SimDriver(d, system=system))) for d in (0, 1)]
    old = [installed_runtime(d) for d in (0, 1)]
    clear_runtimes()
    for d, rt in enumerate(rts):
        set_runtime(rt, d)
    try:
        yield system, rts, cuda.stream(), cuda.stream()
    finally:
        gc.collect()
        clear_runtimes()
        for d, rt in enumerate(old):
            if rt is not None:
                set_runtime(rt, d)


def _calls(rts) -> list[collections.Counter]:
    return [collections.Counter(rt.driver.calls) for rt in rts]


@contextlib.contextmanager
def untracked():
    with nss.tracking(False, 0), nss.tracking(False, 1):
        yield


def test_use_device_chooses_where_arrays_and_launches_go(two):
    _, (rt0, rt1), a, b = two
    x = nss.device_array(N, np.int64, stream=a)
    with nss.use_device(1):
        assert target.current_device() == 1 and target.launch_runtime() is rt1
        y = nss.device_array(N, np.int64, stream=b)
        fill[GRID, BLOCK, b](y, 3)
    assert target.current_device() == 0 and target.launch_runtime() is rt0
    assert nss.block_of(x).device == 0 and nss.block_of(y).device == 1
    assert rt0.stats().live_blocks == 1 and rt1.stats().live_blocks == 1
    assert rt1.driver.calls["cuMemAllocAsync"] == 1


def test_a_kernel_given_another_devices_array_without_peer_access_is_refused(two):
    system, rts, a, b = two
    with nss.use_device(1):
        y = nss.device_array(N, np.int64, stream=b)
        fill[GRID, BLOCK, b](y, 3)
    x = nss.device_array(N, np.int64, stream=a)
    before = (_calls(rts), rts[0].stats(), rts[1].stats(),
              rts[1].resource.block_events(nss.block_of(y))[0])
    with pytest.raises(PeerAccessRequired, match=r"enable_peer_access\(0, 1\)") as err:
        add[GRID, BLOCK, a](y, x, 1)
    assert "copy" in str(err.value)
    with pytest.raises(PeerAccessRequired):
        nss.memset(y, 0, stream=a)
    after = (_calls(rts), rts[0].stats(), rts[1].stats(),
             rts[1].resource.block_events(nss.block_of(y))[0])
    assert after == before, "nothing queued, no state changed"
    assert system.hazards == []


@pytest.mark.parametrize("tracked", [True, False], ids=["tracked", "untracked"])
def test_with_peer_access_a_consumer_waits_for_the_other_devices_producer(two, tracked):
    system, (rt0, rt1), a, b = two
    nss.enable_peer_access(0, 1)
    nss.enable_peer_access(1, 0)
    with untracked() if not tracked else contextlib.nullcontext():
        with nss.use_device(1):
            y = nss.device_array(N, np.int64, stream=b)
            fill[GRID, BLOCK, b](y, 5)                 # producer on device 1
        x = nss.device_array(N, np.int64, stream=a)
        add[GRID, BLOCK, a](y, x, 1)                   # consumer on device 0
        with nss.use_device(1):
            fill[GRID, BLOCK, b](y, 9)                 # must wait for device 0's read
        out = nss.copy_to_host(x, stream=a)
    np.testing.assert_array_equal(out, np.full(N, 6))
    kinds = {h.kind for h in system.hazards}
    if tracked:
        assert kinds == set(), system.hazards
        assert rt0.driver.calls["cuStreamWaitEvent"] >= 1
    else:
        assert {"read-after-write", "write-after-read"} <= kinds, system.hazards


@pytest.mark.parametrize("tracked", [True, False], ids=["tracked", "untracked"])
def test_copies_between_devices_are_ordered(two, tracked):
    system, (rt0, rt1), a, b = two
    with untracked() if not tracked else contextlib.nullcontext():
        x = nss.device_array(N, np.int64, stream=a)
        fill[GRID, BLOCK, a](x, 4)
        with nss.use_device(1):
            y = nss.device_array(N, np.int64, stream=b)
            nss.copy(y, x, stream=b)                   # device 1 waits for x's write
            z = nss.device_array(N, np.int64, stream=b)
            add[GRID, BLOCK, b](y, z, 1)
            out = nss.copy_to_host(z, stream=b)
        fill[GRID, BLOCK, a](x, 0)                     # after device 1's copy read x
    np.testing.assert_array_equal(out, np.full(N, 5))
    assert rt0.peers == set() and rt1.peers == set(), "copies need no peer access"
    kinds = {h.kind for h in system.hazards}
    assert "no-peer-access" not in kinds
    if tracked:
        assert kinds == set(), system.hazards
        assert rt1.driver.calls["cuMemcpyAsync"] == 1
    else:
        assert {"read-after-write", "write-after-read"} <= kinds, system.hazards


def test_copy_to_host_and_to_device_of_another_devices_array(two):
    system, rts, a, b = two
    with nss.use_device(1):
        y = nss.device_array(N, np.int64, stream=b)
        fill[GRID, BLOCK, b](y, 2)
    np.testing.assert_array_equal(nss.copy_to_host(y, stream=a), np.full(N, 2))
    nss.to_device(np.arange(N, dtype=np.int64), stream=a, to=y)
    with nss.use_device(1):
        np.testing.assert_array_equal(nss.copy_to_host(y, stream=b), np.arange(N))
    assert system.hazards == []


@pytest.mark.parametrize("tracked", [True, False], ids=["tracked", "untracked"])
def test_a_free_on_one_device_waits_for_a_use_from_the_other(two, tracked):
    system, (rt0, rt1), a, b = two
    nss.enable_peer_access(0, 1)
    with nss.use_device(1):
        y = nss.device_array(N, np.int64, stream=b)
        fill[GRID, BLOCK, b](y, 1)
        b.synchronize()
        rt1.driver.stream_synchronize(rt1.stream_handle(b))
    x = nss.device_array(N, np.int64, stream=a)
    with untracked() if not tracked else contextlib.nullcontext():
        add[GRID, BLOCK, a](y, x, 1)                   # device 0 reads y
    del y
    gc.collect()
    with nss.use_device(1):
        z = nss.device_array(N, np.int64, stream=b)   # drains y's free, on device 1
        fill[GRID, BLOCK, b](z, 7)
    kinds = [h.kind for h in system.hazards]
    if tracked:
        assert kinds == [], system.hazards
    else:
        assert "write-after-read" in kinds, system.hazards
    assert rt1.stats().frees == 1


def test_stats_of_both_devices(two):
    _, (rt0, rt1), a, b = two
    x = nss.device_array(N, np.int64, stream=a)
    with nss.use_device(1):
        y = nss.device_array(2 * N, np.int64, stream=b)
    assert nss.get_runtime(0).stats().live_bytes == x.nbytes
    assert nss.get_runtime(1).stats().live_bytes == y.nbytes


def test_device_id_takes_a_numba_device_or_a_raw_cudevice():
    class NumbaDevice:
        id = 3

    class RawCUdevice:
        def __int__(self) -> int:
            return 2

    assert target.device_id(NumbaDevice()) == 3
    assert target.device_id(RawCUdevice()) == 2
    assert target.device_id(object()) == 0  # the simulator's device has no ordinal


PLUGIN_SCRIPT = """
from numba_streamsafe.numba.emm import StreamSafeMemoryManager
from numba_streamsafe.runtime import get_runtime


class Context:
    def __init__(self, device):
        self.device = device


class NumbaDevice:
    id = 1


class RawCUdevice:
    def __int__(self):
        return 2


for device, ordinal in ((NumbaDevice(), 1), (RawCUdevice(), 2)):
    manager = StreamSafeMemoryManager(context=Context(device))
    assert manager.runtime is get_runtime(ordinal), (device, ordinal)
    assert manager.runtime.device == ordinal
a, b = get_runtime(1), get_runtime(2)
assert a.driver.system is b.driver.system and a.multi_device
print("OK")
"""


def test_the_plugin_serves_its_contexts_device(child_env):
    """Numba makes one plugin per context: each uses its context's device's
    runtime, whether the context holds a Numba device or a raw ``CUdevice``.
    In a child interpreter: the simulator has no memory managers."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", PLUGIN_SCRIPT], capture_output=True, text=True,
                          env=child_env(NUMBA_STREAMSAFE_DRIVER="sim"), timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "OK", done.stderr[-3000:]


def test_a_stream_made_on_one_device_is_refused_for_work_on_another(two):
    """As on a GPU, where a stream belongs to its device's context: with the
    plugin's routing, the simulator's streams remember their device."""
    from numba_streamsafe.numba import emm, sim_plugin  # noqa: F401 - emm: companion

    sim_plugin.install()
    try:
        with nss.use_device(1):
            s1 = cuda.stream()
            y = nss.device_array(N, np.int64, stream=s1)
            fill[GRID, BLOCK, s1](y, 3)                  # its own device: fine
        x = nss.device_array(N, np.int64)
        with pytest.raises(nss.StreamMisuse, match=r"made on device 1.*use_device\(0\)"):
            fill[GRID, BLOCK, s1](x, 1)
        s0 = cuda.stream()
        fill[GRID, BLOCK, s0](x, 1)
        assert (nss.copy_to_host(x, stream=s0) == 1).all()
    finally:
        sim_plugin.uninstall()


# ------------------------------------------------- per-device switches
def _race_on(device: int, stream_pair) -> None:
    """On ``device``: a write of y on one stream, then a read of y on another."""
    s, t = stream_pair
    with nss.use_device(device):
        y = nss.device_array(N, np.int64, stream=s)
        z = nss.device_array(N, np.int64, stream=s)
        nss.memset(y, 0, stream=s)
        nss.memset(z, 0, stream=s)
        sync = nss.get_runtime(device).driver.synchronize  # the host waits: seen by the checker
        sync()
        fill[GRID, BLOCK, s](y, 5)
        add[GRID, BLOCK, t](y, z, 1)                   # reads y: waits for s when tracked
        sync()


def _streams_of(device: int):
    with nss.use_device(device):
        return cuda.stream(), cuda.stream()


def test_tracking_switches_the_device_of_the_current_context(two):
    """``with use_device(1), tracking(False):`` turns device 1 off and leaves
    device 0 tracked, for work on device 0 inside the block too."""
    from numba_streamsafe.numba.launch.policy import launch_policy

    system, (rt0, rt1), _, _ = two
    p0, p1 = launch_policy(rt0), launch_policy(rt1)
    on0, on1 = _streams_of(0), _streams_of(1)
    with nss.use_device(1), nss.tracking(False):
        assert (p0.tracking, p1.tracking) == (True, False)
        _race_on(0, on0)                               # device 0: still ordered
        assert system.hazards == []
        _race_on(1, on1)                               # device 1: the race
        assert "read-after-write" in {h.kind for h in system.hazards}, system.hazards
    assert (p0.tracking, p1.tracking) == (True, True)
    with nss.tracking(False):                          # outside use_device: device 0
        assert (p0.tracking, p1.tracking) == (False, True)
    with nss.tracking(False, 1):                       # named
        assert (p0.tracking, p1.tracking) == (True, False)
    system.hazards.clear()
    _race_on(1, on1)
    assert system.hazards == []


@pytest.mark.parametrize("device", [-1, 7, 1.0, True, "1"])
def test_tracking_refuses_a_device_that_is_not_an_ordinal(two, device):
    with pytest.raises(nss.InvalidArgument, match=r"there is no device .*this process has 2"):
        with nss.tracking(False, device):
            pass


@pytest.mark.parametrize("enabled", ["no", "False", 0, None])
def test_tracking_takes_only_true_or_false(two, enabled):
    from numba_streamsafe.numba.launch.policy import launch_policy

    _, rts, _, _ = two
    with pytest.raises(nss.InvalidArgument, match="True or False") as info:
        with nss.tracking(enabled, 1):
            pass
    assert repr(enabled) in str(info.value)
    assert all(launch_policy(rt).tracking is True for rt in rts)


NOT_ORDINALS = ["0", -1, 1.5, True, np.int64(-1), np.float64(0.0)]


@pytest.mark.parametrize("device", NOT_ORDINALS, ids=repr)
def test_what_is_not_a_device_ordinal_is_refused_and_builds_no_runtime(two, device):
    """``get_runtime``, ``memory_stats`` and ``set_runtime`` take an int >= 0:
    anything else is refused and makes no phantom device (one keyed by a str
    broke ``installed_devices()``, which sorts them, at exit)."""
    _, rts, _, _ = two
    calls = [lambda: nss.get_runtime(device), lambda: nss.memory_stats(device),
             lambda: set_runtime(rts[0], device)]
    for call in calls:
        with pytest.raises(nss.InvalidArgument, match=r"int >= 0") as info:
            call()
        assert repr(device) in str(info.value)
    assert installed_devices() == [0, 1]
    assert [installed_runtime(d) for d in (0, 1)] == rts


def test_use_device_refuses_a_negative_device(two):
    with pytest.raises(nss.InvalidArgument, match="no device -1"):
        with nss.use_device(-1):
            pass
    assert installed_devices() == [0, 1]


@pytest.mark.parametrize("device", [np.int64(1), np.uint8(1)], ids=repr)
def test_a_numpy_integer_names_a_device(two, device):
    _, rts, _, _ = two
    assert nss.get_runtime(device) is rts[1]
    assert nss.memory_stats(device) == nss.memory_stats(1)
    assert installed_devices() == [0, 1] and all(type(d) is int for d in installed_devices())


def test_transparent_false_covers_every_device_of_the_thread(two):
    """Transparent mode is the thread's: ``transparent(False)`` entered on device
    0 leaves plain Numba work on device 1 unordered too (the checker reports
    it); with the mode on, neither device races."""
    from numba_streamsafe.numba import emm, sim_plugin  # noqa: F401 - emm: companion
    from tests.helpers.sim_kernels import copy as plain_copy
    from tests.helpers.sim_kernels import fill as plain_fill

    system, _, _, _ = two

    def program(device: int) -> None:
        with nss.use_device(device):
            s, t = cuda.stream(), cuda.stream()
            x = cuda.device_array(N, np.int64, stream=s)
            y = cuda.device_array(N, np.int64, stream=s)
            cuda.synchronize()                           # the plugin shows it to the checker
            plain_fill[GRID * 4, BLOCK, s](x, 3)
            plain_copy[GRID * 4, BLOCK, t](x, y)
            cuda.synchronize()
            assert (y.copy_to_host() == 3).all()

    sim_plugin.install()
    try:
        for device in (0, 1):
            program(device)
        assert system.hazards == []
        with nss.transparent(False):
            program(1)
            on_1 = list(system.hazards)
            system.hazards.clear()
            program(0)
            on_0 = list(system.hazards)
    finally:
        sim_plugin.uninstall()
    assert {h.kind for h in on_1} == {"read-after-write"}, on_1
    assert {h.kind for h in on_0} == {"read-after-write"}, on_0

