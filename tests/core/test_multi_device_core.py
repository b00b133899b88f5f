"""docs/architecture.md section 7: more than one device, on two simulated devices.

Two :class:`~numba_streamsafe._driver.sim.SimDriver` share one
:class:`~numba_streamsafe._driver.sim.SimSystem` (one happens-before model), each
under its own runtime, both installed. A launch on device 0 that is given a
block of device 1 is refused without peer access, changing nothing; with peer
access it is ordered across the devices (the checker finds no hazard, and the
same program unfenced is the negative control that shows it). Copies between
devices need no peer access; a block's free on its device waits for a use
from the other.
"""

from __future__ import annotations

import collections
import random

import pytest

from numba_streamsafe import (
    Access,
    AsyncResource,
    DeviceRuntime,
    DriverError,
    InvalidArgument,
    LoggingResource,
    PeerAccessRequired,
    StreamMisuse,
    StreamSafeError,
)
from numba_streamsafe._driver.sim import SimDriver, SimSystem
from numba_streamsafe.core.uses import CopyUses, Uses
from numba_streamsafe.diagnostics.recorder import LaunchRecorder
from numba_streamsafe.protocol import fenced
from numba_streamsafe.resources.tracking.marks import ForeignMark
from numba_streamsafe.runtime import (
    clear_runtimes,
    enable_peer_access,
    get_runtime,
    installed_runtime,
    set_runtime,
    sole_runtime,
)
from tests.helpers.programs import launch, snapshot

R, W, RW = Access.READ, Access.WRITE, Access.READ_WRITE


class Two:
    """Two simulated devices of one system, each with its installed runtime."""

    def __init__(self, stack=AsyncResource) -> None:
        self.system = SimSystem()
        self.sims = [SimDriver(d, backing=False, system=self.system) for d in (0, 1)]
        self.rts = [DeviceRuntime(stack(sim)) for sim in self.sims]
        self.streams = [(sim.create_stream(), sim.create_stream()) for sim in self.sims]

    @property
    def hazards(self):
        return self.system.hazards

    def calls(self) -> list[collections.Counter]:
        return [collections.Counter(sim.calls) for sim in self.sims]


@pytest.fixture(params=["async", "logging"])
def two(request):
    stack = AsyncResource if request.param == "async" else (
        lambda sim: LoggingResource(AsyncResource(sim)))
    t = Two(stack)
    old = [set_runtime(rt, d) for d, rt in enumerate(t.rts)]
    try:
        yield t
    finally:
        clear_runtimes()
        for d, rt in enumerate(old):
            if rt is not None:
                set_runtime(rt, d)


def copy(rt: DeviceRuntime, stream: int, dst, src, *, fenced_: bool = True) -> None:
    """A tracked copy of ``src`` into ``dst`` (either of any device) on ``stream``."""
    uses = CopyUses()
    uses.add(src, R, "src")
    uses.add(dst, W, "dst")
    fenced(rt, stream, uses, "copy", True, None, rt.driver.copy_async, dst.ptr, src.ptr,
           min(dst.nbytes, src.nbytes), stream, tracking=fenced_)


def _uses(*pairs) -> Uses:
    uses = Uses()
    for block, access in pairs:
        uses.add(block, access, block.tag)
    return uses


# -------------------------------------------------------------- the registry
def test_runtimes_of_several_devices_know_each_other(two):
    rt0, rt1 = two.rts
    assert rt0.multi_device and rt1.multi_device and sole_runtime() is None
    assert installed_runtime(1) is rt1 and rt0.runtime_of(1) is rt1 and rt1.runtime_of(1) is rt1
    clear_runtimes()
    assert not rt0.multi_device and sole_runtime() is None
    set_runtime(rt1, 1)
    assert sole_runtime() is rt1 and not rt1.multi_device


def test_stream_keys_are_negative_unique_and_end_with_the_stream(two):
    rt0, rt1 = two.rts
    (s0, _), _ = two.streams
    k = rt0.stream_key(s0)
    assert k < 0 and rt0.stream_key(s0) == k and rt0.stream_key(0) != rt1.stream_key(0)
    rt0.destroy_stream(s0)
    assert rt0.stream_key(s0) != k, "a stream at a destroyed one's handle gets a new key"


def test_peer_access_is_recorded_and_checked(two):
    rt0, rt1 = two.rts
    enable_peer_access(0, 1)
    assert rt0.peers == {1} and rt1.peers == set()
    assert two.sims[0].can_access(1) and not two.sims[1].can_access(0)
    enable_peer_access(0, 1)  # idempotent
    with pytest.raises(InvalidArgument, match="to itself"):
        rt0.enable_peer_access(rt0)
    # By device numbers: the advice names devices, not runtimes.
    with pytest.raises(InvalidArgument, match=r"enable_peer_access\(1, 1\).*two different "
                                              r"devices"):
        enable_peer_access(1, 1)
    assert rt1.peers == set()
    with pytest.raises(DriverError, match="not a peer"):
        two.sims[0].enable_peer_access(5)


# ------------------------------------------------------------ refusal, no peer
@pytest.mark.parametrize("access", [R, W, RW])
def test_cross_device_use_without_peer_access_is_refused_and_changes_nothing(two, access):
    rt0, rt1 = two.rts
    (s0, _), (s1, _) = two.streams
    x0 = rt0.allocate(256, s0, "x0")
    y1 = rt1.allocate(256, s1, "y1")
    launch(rt1, s1, [(y1, W)])
    before = (two.calls(), snapshot(rt0.resource, x0), snapshot(rt1.resource, y1))
    rec = LaunchRecorder(rt0, s0)
    rec.read(x0)
    rec.use(y1, access, "y1")
    with pytest.raises(PeerAccessRequired) as err:
        rec.preflight()
    assert isinstance(err.value, StreamMisuse) and isinstance(err.value, StreamSafeError)
    assert (err.value.device, err.value.peer) == (0, 1)
    text = str(err.value)
    assert "enable_peer_access(0, 1)" in text and "copy" in text and "nothing was queued" in text
    rec.abandon()
    ran = []
    uses = Uses()
    uses.add(y1, access, "y1")
    with pytest.raises(PeerAccessRequired):
        fenced(rt0, s0, uses, "k", True, None, lambda: ran.append(1))
    assert ran == [], "the work was not queued"
    assert (two.calls(), snapshot(rt0.resource, x0), snapshot(rt1.resource, y1)) == before
    assert two.hazards == []


def test_a_block_of_a_device_without_an_installed_runtime_is_refused(two):
    rt0, _ = two.rts
    (s0, _), _ = two.streams
    sim2 = SimDriver(2, backing=False, system=two.system)
    rt2 = DeviceRuntime(AsyncResource(sim2))  # owned, not installed
    z = rt2.allocate(256, 0, "z")
    rt0.peers.add(2)
    ran = []
    with pytest.raises(InvalidArgument, match="not installed"):
        fenced(rt0, s0, _uses((z, R)), "k", True, None,
               lambda: ran.append(1))
    assert ran == []


def test_without_peer_access_the_simulator_reports_a_kernels_access(two):
    """The model: a kernel of device 0 touching device 1's memory without peer
    access is a hazard; a copy is not."""
    rt0, rt1 = two.rts
    (s0, _), (s1, _) = two.streams
    y1 = rt1.allocate(256, s1, "y1")
    two.sims[1].stream_synchronize(s1)
    two.sims[0].trace_access(s0, [(y1.ptr, 256, R)], "copy of y1", copy=True)
    assert two.hazards == []
    two.sims[0].trace_access(s0, [(y1.ptr, 256, R)], "kernel reading y1")
    assert [h.kind for h in two.hazards] == ["no-peer-access"]
    assert "device 1" in str(two.hazards[0])


def test_an_event_is_recorded_only_on_its_devices_streams(two):
    (s0, _), (s1, _) = two.streams
    ev = two.sims[0].event_create()
    with pytest.raises(DriverError, match="belongs to device 0"):
        two.sims[1].event_record(ev, s1)
    two.sims[0].event_record(ev, s0)
    two.sims[1].stream_wait_event(s1, ev)  # waits across devices are allowed
    assert two.sims[0].live_events == 1 and two.sims[1].live_events == 0
    two.sims[1].event_destroy(ev)
    assert two.sims[0].events_destroyed == 1


# ------------------------------------------------------------- with peer access
def _producer_consumer(two, fenced_: bool) -> list[str]:
    """Device 1 writes y1 on its stream; device 0 reads it, then writes x0 from
    it; device 1 reads x0 and then overwrites y1 (after device 0's read)."""
    rt0, rt1 = two.rts
    (s0, _), (s1, t1) = two.streams
    x0 = rt0.allocate(256, s0, "x0")
    y1 = rt1.allocate(256, s1, "y1")
    launch(rt1, s1, [(y1, W)], fenced=fenced_, label="produce y1 on 1")
    launch(rt0, s0, [(y1, R), (x0, W)], fenced=fenced_, label="consume y1 on 0")
    launch(rt1, t1, [(x0, R)], fenced=fenced_, label="read x0 on 1")
    launch(rt1, t1, [(y1, W)], fenced=fenced_, label="overwrite y1 on 1")
    return [h.kind for h in two.hazards]


def test_with_peer_access_uses_across_devices_are_ordered(two):
    enable_peer_access(0, 1)
    enable_peer_access(1, 0)
    waits = two.sims[0].calls["cuStreamWaitEvent"]
    assert _producer_consumer(two, fenced_=True) == []
    assert two.sims[0].calls["cuStreamWaitEvent"] > waits, "device 0's stream waited"


def test_negative_control_unfenced_uses_across_devices_race(two):
    enable_peer_access(0, 1)
    enable_peer_access(1, 0)
    kinds = _producer_consumer(two, fenced_=False)
    assert "read-after-write" in kinds and "write-after-read" in kinds, kinds


def test_negative_control_the_waits_matter(two, monkeypatch):
    """Fenced but with the cross-device waits dropped: the hazards come back, so
    the waits (not the commit alone) order the devices."""
    enable_peer_access(0, 1)
    enable_peer_access(1, 0)
    for sim in two.sims:
        real = sim.stream_wait_event

        def wait(stream, event, sim=sim, real=real):
            if two.system.event_devices[event] != sim.device:
                return None  # a wait on another device's event: skipped
            return real(stream, event)

        monkeypatch.setattr(sim, "stream_wait_event", wait)
    assert "read-after-write" in _producer_consumer(two, fenced_=True)


def test_a_launch_records_a_mark_of_its_stream_in_the_foreign_block(two):
    rt0, rt1 = two.rts
    enable_peer_access(0, 1)
    (s0, _), (s1, _) = two.streams
    y1 = rt1.allocate(256, s1, "y1")
    launch(rt0, s0, [(y1, R)])
    lw, reads = rt1.resource.tracker.block_events(y1)
    key = rt0.stream_key(s0)
    assert lw.stream == s1 and list(reads) == [key]
    mark = reads[key]
    assert isinstance(mark, ForeignMark) and mark.pool is rt0.resource.events
    assert mark.handle is not None and mark.refs == 1
    in_use = rt0.resource.events.in_use
    launch(rt0, s0, [(y1, W)])  # same stream: no wait on its own read; replaces it
    lw, reads = rt1.resource.tracker.block_events(y1)
    assert isinstance(lw, ForeignMark) and lw.stream == key and reads == {}
    assert rt0.resource.events.in_use == in_use, "the replaced mark's event went back to 0's pool"
    assert two.hazards == []


def test_a_device_synchronise_does_not_cover_another_devices_use(two):
    """The program synchronising device 1 completes device 1's work only: a
    free on device 1 still waits for device 0's read of the block."""
    rt0, rt1 = two.rts
    enable_peer_access(0, 1)
    (s0, _), (s1, _) = two.streams
    y1 = rt1.allocate(256, s1, "y1")
    launch(rt1, s1, [(y1, W)])
    launch(rt0, s0, [(y1, R)], label="slow read of y1 on 0")
    tracker = rt1.resource.tracker
    point = tracker.program_point_all()
    two.sims[1].synchronize()
    tracker.program_completed_all(point)
    waits = two.calls()[1]["cuStreamWaitEvent"]
    rt1.deallocate(y1)
    assert two.calls()[1]["cuStreamWaitEvent"] == waits + 1, "the free waits for device 0"
    z1 = rt1.allocate(256, s1, "z1")
    launch(rt1, s1, [(z1, W)])
    assert two.hazards == []


# ------------------------------------------------------------------ frees
@pytest.mark.parametrize("free", ["deallocate", "defer_free"])
def test_a_free_on_one_device_waits_for_a_use_from_the_other(two, free):
    rt0, rt1 = two.rts
    enable_peer_access(0, 1)
    (s0, _), (s1, _) = two.streams
    y1 = rt1.allocate(256, s1, "y1")
    launch(rt1, s1, [(y1, W)])
    launch(rt0, s0, [(y1, R)], label="slow read of y1 on 0")
    getattr(rt1, free)(y1)
    rt1.flush()
    z1 = rt1.allocate(256, s1, "z1")  # may get y1's address once the free is ordered
    launch(rt1, s1, [(z1, W)])
    assert two.hazards == []
    rt0.reap()
    rt1.reap()
    assert rt0.resource.events.in_use == 0 and rt1.resource.events.in_use == 0


def test_negative_control_a_free_not_ordered_after_the_other_devices_use(two):
    rt0, rt1 = two.rts
    enable_peer_access(0, 1)
    (s0, _), (s1, _) = two.streams
    y1 = rt1.allocate(256, s1, "y1")
    launch(rt1, s1, [(y1, W)])
    two.sims[1].stream_synchronize(s1)
    launch(rt0, s0, [(y1, R)], fenced=False, label="untracked read of y1 on 0")
    rt1.deallocate(y1)
    assert "write-after-read" in [h.kind for h in two.hazards]


def test_a_device_reset_leaves_its_marks_in_other_devices_inert(two):
    rt0, rt1 = two.rts
    enable_peer_access(0, 1)
    (s0, _), (s1, _) = two.streams
    y1 = rt1.allocate(256, s1, "y1")
    launch(rt0, s0, [(y1, W)])
    two.sims[0].reset_context()
    rt0.reset()  # its events are gone, its work complete
    waits = two.sims[1].calls["cuStreamWaitEvent"]
    launch(rt1, s1, [(y1, R)])
    rt1.deallocate(y1)
    assert two.sims[1].calls["cuStreamWaitEvent"] == waits, "no wait on a destroyed event"
    assert two.hazards == []


# ------------------------------------------------------------------ copies
def test_copies_between_devices_are_ordered_and_need_no_peer_access(two):
    rt0, rt1 = two.rts
    (s0, t0), (s1, t1) = two.streams
    x0 = rt0.allocate(256, s0, "x0")
    y1 = rt1.allocate(256, s1, "y1")
    launch(rt0, s0, [(x0, W)], label="write x0 on 0")
    launch(rt1, t1, [(y1, R)], label="read y1 on 1")
    copy(rt1, s1, y1, x0)  # on device 1: waits for x0's write and y1's read
    copy(rt0, t0, x0, y1)  # back on device 0: waits for the first copy
    launch(rt1, t1, [(y1, W)], label="overwrite y1 on 1")  # after the copy read it
    assert two.hazards == [] and rt0.peers == set() and rt1.peers == set()
    lw, _ = rt0.resource.tracker.block_events(x0)
    assert lw.stream == t0
    _, reads = rt1.resource.tracker.block_events(y1)
    assert reads == {}  # overwritten


def test_negative_control_untracked_copies_between_devices_race(two):
    rt0, rt1 = two.rts
    (s0, _), (s1, _) = two.streams
    x0 = rt0.allocate(256, s0, "x0")
    y1 = rt1.allocate(256, s1, "y1")
    launch(rt0, s0, [(x0, W)], label="write x0 on 0")
    copy(rt1, s1, y1, x0, fenced_=False)
    assert "read-after-write" in [h.kind for h in two.hazards]
    assert "no-peer-access" not in [h.kind for h in two.hazards]


def test_a_copy_moves_the_bytes_across_devices():
    system = SimSystem()
    a, b = SimDriver(0, system=system), SimDriver(1, system=system)
    x = a.alloc_async(64, 0)
    y = b.alloc_async(64, 0)
    a.buffer(x, 64)[:] = 7
    b.copy_async(y, x, 64, 0)
    assert (b.buffer(y, 64) == 7).all()
    assert [h.kind for h in system.hazards] == ["read-after-write"], (
        "device 1's default stream is not ordered after device 0's allocation")


# ------------------------------------------------------- random programs
def _random_program(two, rng: random.Random, fenced_: bool, steps: int = 30) -> None:
    rts = two.rts
    streams = [s for pair in two.streams for s in pair]
    blocks = [rts[d].allocate(256, two.streams[d][0], f"b{d}{i}") for d in (0, 1) for i in range(3)]
    for rt in rts:
        rt.driver.synchronize()
    for _ in range(steps):
        d = rng.randrange(2)
        stream = rng.choice(two.streams[d])
        picked = rng.sample(blocks, rng.randint(1, 3))
        uses = [(b, rng.choice([R, W, RW])) for b in picked]
        if rng.random() < 0.2 and len(picked) >= 2:
            copy(rts[d], stream, picked[0], picked[1], fenced_=fenced_)
        else:
            launch(rts[d], stream, uses, fenced=fenced_)
    del streams
    for b in blocks:
        rts[b.device].deallocate(b)


@pytest.mark.parametrize("seed", range(20))
def test_random_programs_on_two_devices_are_ordered(two, seed):
    enable_peer_access(0, 1)
    enable_peer_access(1, 0)
    _random_program(two, random.Random(seed), fenced_=True)
    assert two.hazards == [], "\n".join(str(h) for h in two.hazards[:5])


def test_random_programs_unfenced_race(two):
    enable_peer_access(0, 1)
    enable_peer_access(1, 0)
    for seed in range(5):
        _random_program(two, random.Random(seed), fenced_=False)
    assert two.hazards


def test_the_default_runtimes_of_two_simulated_devices_share_a_system(monkeypatch):
    monkeypatch.setenv("NUMBA_STREAMSAFE_DRIVER", "sim")
    from numba_streamsafe.core.settings import reload_settings

    reload_settings()
    old = [installed_runtime(d) for d in (0, 1)]
    clear_runtimes()
    try:
        rt0, rt1 = get_runtime(0), get_runtime(1)
        assert rt0.driver.system is rt1.driver.system
        assert rt0.multi_device and rt1.multi_device
    finally:
        clear_runtimes()
        for d, rt in enumerate(old):
            if rt is not None:
                set_runtime(rt, d)
        monkeypatch.undo()
        reload_settings()


def test_in_check_mode_a_use_across_devices_of_new_memory_records_nothing_on_no_stream():
    """Check mode: a kernel on device 1 reads a block just allocated on device
    0. New memory is ready for every stream, so there is nothing to wait for
    and no event to record (its mark has no stream); the launch goes ahead."""
    t = Two(lambda sim: AsyncResource(sim, check=True))
    for d, rt in enumerate(t.rts):
        set_runtime(rt, d)
    try:
        enable_peer_access(1, 0)
        (a0, _), (a1, _) = t.streams
        x = t.rts[0].allocate(256, a0, "x")
        t.sims[0].synchronize()  # the simulator's model: the allocation complete
        recorded = t.calls()[0]["cuEventRecord"]
        launch(t.rts[1], a1, [(x, R)])
        assert t.calls()[0]["cuEventRecord"] == recorded
        assert t.hazards == []
    finally:
        clear_runtimes()
