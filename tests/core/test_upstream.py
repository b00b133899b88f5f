"""An upstream (an RMM resource) in place of the device's pool: the tracking
resource takes new memory from it and gives it back in stream order, with
every use ordered before the give-back; what it keeps for reuse never goes
back early; running out of memory is answered as the pool's is.

RMM needs a GPU, so the upstream here is RMM's Python interface over the
simulated device (``FakeRmm``: ``allocate(nbytes, stream)`` and
``deallocate(ptr, nbytes, stream)`` with RMM's stream objects replaced by
objects under the CUDA stream protocol, which RMM's ``Stream`` also takes):
the checker sees every use, allocation and give-back.
"""

from __future__ import annotations

import builtins

import pytest

import numba_streamsafe.core.settings as settings_module
from numba_streamsafe._driver.sim import SimDriver
from numba_streamsafe.core.access import Access
from numba_streamsafe.core.errors import InvalidArgument, OutOfMemory, StreamMisuse
from numba_streamsafe.resources import AsyncResource, RmmUpstream, rmm_upstream
from numba_streamsafe.runtime import default_stack


class Handle:
    """What ``RmmUpstream`` hands the resource for a stream (as RMM's ``Stream``)."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


class FakeRmm:
    """An RMM-style resource over the simulated device's pool, counting its calls."""

    def __init__(self, sim: SimDriver, limit: int | None = None) -> None:
        self.sim = sim
        self.limit = limit
        self.live: dict[int, int] = {}
        self.calls: list[tuple[str, int, int, int]] = []

    def allocate(self, nbytes: int, stream: Handle) -> int:
        if self.limit is not None and sum(self.live.values()) + nbytes > self.limit:
            raise MemoryError(f"out of memory allocating {nbytes} bytes")
        handle = stream.__cuda_stream__()[1]
        ptr = self.sim.alloc_async(nbytes, handle)
        self.live[ptr] = nbytes
        self.calls.append(("allocate", ptr, nbytes, handle))
        return ptr

    def deallocate(self, ptr: int, nbytes: int, stream: Handle) -> None:
        assert self.live.pop(ptr) == nbytes, "deallocate got another size than allocate gave"
        handle = stream.__cuda_stream__()[1]
        self.sim.free_async(ptr, handle)
        self.calls.append(("deallocate", ptr, nbytes, handle))


def _use(res, sim, block, stream, access):
    res.preflight([(block, access)], stream)
    sim.trace_access(stream, [(block.ptr, block.nbytes, access)], "kernel")
    res.commit([(block, access)], stream)


@pytest.fixture
def rmm(sim):
    return FakeRmm(sim)


@pytest.fixture
def res_rmm(sim, rmm):
    return AsyncResource(sim, upstream=RmmUpstream(rmm, stream_of=Handle), reuse_bytes=0)


def test_blocks_come_from_the_upstream_and_go_back_after_their_uses(sim, rmm, res_rmm,
                                                                    two_streams):
    a, b = two_streams
    block = res_rmm.allocate(4096, a)
    assert rmm.calls == [("allocate", block.ptr, 4096, a)]
    _use(res_rmm, sim, block, a, Access.WRITE)
    _use(res_rmm, sim, block, b, Access.READ)  # another stream reads it
    res_rmm.deallocate(block)
    res_rmm.reap_pending()
    assert rmm.calls[-1] == ("deallocate", block.ptr, 4096, a)  # on its stream, its size
    assert rmm.live == {}
    # The read on b was ordered before the give-back on a (the checker saw both).
    assert sim.hazards == []
    assert res_rmm.counters()["waits"] >= 2
    assert res_rmm.upstream_name == "rmm (FakeRmm)"


def test_without_the_library_the_give_back_races_the_read(sim, rmm, two_streams):
    """Negative control: the same program with the upstream called directly."""
    a, b = two_streams
    ptr = rmm.allocate(4096, Handle(a))
    sim.trace_access(a, [(ptr, 4096, Access.WRITE)], "kernel")
    sim.trace_access(b, [(ptr, 4096, Access.READ)], "kernel")
    rmm.deallocate(ptr, 4096, Handle(a))
    assert {h.kind for h in sim.hazards} >= {"read-after-write", "write-after-read"}


def test_kept_blocks_are_reused_before_the_upstream_is_asked(sim, rmm, two_streams):
    a, _ = two_streams
    owner = Handle(a)  # the stream's object: blocks of a stream whose owner is known are kept
    res = AsyncResource(sim, upstream=RmmUpstream(rmm, stream_of=Handle))
    first = res.allocate(1 << 16, a, stream_owner=owner)
    res.deallocate(first)
    again = res.allocate(1 << 16, a, stream_owner=owner)  # same size and stream: kept block
    assert again.ptr == first.ptr
    assert [c[0] for c in rmm.calls] == ["allocate"]
    res.deallocate(again)
    res.reap_pending()  # kept blocks go back
    assert [c[0] for c in rmm.calls] == ["allocate", "deallocate"] and rmm.live == {}
    assert sim.hazards == []


def test_running_out_of_the_upstream_hands_back_what_is_kept_and_tries_again(sim, two_streams):
    a, _ = two_streams
    rmm = FakeRmm(sim, limit=3 << 16)
    res = AsyncResource(sim, upstream=RmmUpstream(rmm, stream_of=Handle))
    owner = Handle(a)
    kept = [res.allocate(1 << 16, a, stream_owner=owner) for _ in range(3)]
    for block in kept:
        res.deallocate(block)  # kept for reuse: still the upstream's memory
    assert len(rmm.live) == 3 and res.counters()["kept_bytes"] == 3 << 16
    big = res.allocate(3 << 16, a, stream_owner=owner)  # fits once the kept blocks go back
    assert rmm.live == {big.ptr: 3 << 16}
    with pytest.raises(OutOfMemory):
        res.allocate(1 << 16, a, stream_owner=owner)
    assert sim.hazards == []


def test_the_upstream_is_checked(sim):
    with pytest.raises(InvalidArgument, match="allocate"):
        AsyncResource(sim, upstream=object())
    with pytest.raises(InvalidArgument, match="device memory resource"):
        RmmUpstream(object())
    with pytest.raises(InvalidArgument, match="ipc"):
        AsyncResource(sim, upstream=RmmUpstream(FakeRmm(sim), stream_of=Handle), ipc=True)
    upstream = RmmUpstream(FakeRmm(sim), stream_of=Handle)
    with pytest.raises(StreamMisuse, match="not an allocation"):
        upstream.deallocate(0x1000, 0)


def test_asking_for_rmm_without_rmm_is_an_error_with_advice(monkeypatch):
    real_import = builtins.__import__

    def no_rmm(name, *args, **kwargs):
        if name == "rmm" or name.startswith("rmm."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_rmm)
    with pytest.raises(InvalidArgument, match=r"numba-streamsafe\[rmm-cu13\]"):
        rmm_upstream(0)


def test_the_setting_is_read_and_refused_on_the_simulator(monkeypatch, sim):
    monkeypatch.setenv("NUMBA_STREAMSAFE_UPSTREAM", "rmm")
    settings_module.reload_settings()
    try:
        assert settings_module.settings().upstream == "rmm"
        with pytest.raises(InvalidArgument, match="needs a GPU"):
            default_stack(sim)
        for other, value in (("NUMBA_STREAMSAFE_RESOURCE", "direct"),
                             ("NUMBA_STREAMSAFE_IPC", "1")):
            monkeypatch.setenv(other, value)
            settings_module.reload_settings()
            with pytest.raises(InvalidArgument, match="unset one of them"):
                default_stack(sim)
            monkeypatch.delenv(other)
        monkeypatch.setenv("NUMBA_STREAMSAFE_UPSTREAM", "rmmm")
        with pytest.raises(InvalidArgument, match="NUMBA_STREAMSAFE_UPSTREAM"):
            settings_module.reload_settings()
    finally:
        monkeypatch.delenv("NUMBA_STREAMSAFE_UPSTREAM")
        settings_module.reload_settings()
    assert settings_module.settings().upstream == "driver"
    assert default_stack(sim).upstream_name == "cuMemAllocAsync"


def test_a_context_reset_gives_the_upstreams_memory_back_to_it(sim, rmm, two_streams):
    a, _ = two_streams
    owner = Handle(a)
    res = AsyncResource(sim, upstream=RmmUpstream(rmm, stream_of=Handle))
    live = res.allocate(1 << 12, a)
    kept = res.allocate(1 << 16, a, stream_owner=owner)
    res.deallocate(kept)  # kept for reuse: still the upstream's memory
    assert set(rmm.live) == {live.ptr, kept.ptr}
    calls = sim.calls["cuMemFree"]
    res.reset_context()
    assert rmm.live == {} and sim.calls["cuMemFree"] == calls  # RMM's, not cuMemFree


def test_a_refused_give_back_can_be_tried_again(sim, two_streams):
    a, _ = two_streams

    class Refusing(FakeRmm):
        refuse = True

        def deallocate(self, ptr, nbytes, stream):
            if self.refuse:
                raise RuntimeError("RMM refused")
            super().deallocate(ptr, nbytes, stream)

    rmm = Refusing(sim)
    upstream = RmmUpstream(rmm, stream_of=Handle)
    ptr = upstream.allocate(4096, a)
    with pytest.raises(RuntimeError, match="refused"):
        upstream.deallocate(ptr, a)
    rmm.refuse = False
    upstream.deallocate(ptr, a)  # the size was kept: the second try gives it back
    assert rmm.live == {}


def test_rmm_upstream_takes_rmms_resource_of_the_device(monkeypatch, sim):
    """``rmm_upstream`` over a stand-in ``rmm`` package: the device's resource,
    and a warning where it is RMM's default, non-stream-ordered one."""
    import sys
    import types
    import warnings

    class PoolMemoryResource(FakeRmm):
        pass

    class CudaMemoryResource(FakeRmm):
        pass

    resources = {0: PoolMemoryResource(sim), 1: CudaMemoryResource(sim)}
    mr_module = types.ModuleType("rmm.mr")
    mr_module.get_per_device_resource = resources.__getitem__
    rmm_module = types.ModuleType("rmm")
    rmm_module.mr = mr_module
    monkeypatch.setitem(sys.modules, "rmm", rmm_module)
    monkeypatch.setitem(sys.modules, "rmm.mr", mr_module)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        upstream = rmm_upstream(0)
    assert upstream.mr is resources[0] and upstream.name == "rmm (PoolMemoryResource)"
    with pytest.warns(RuntimeWarning, match="not stream-ordered"):
        assert rmm_upstream(1).mr is resources[1]


def test_check_mode_reports_the_races_of_memory_from_the_upstream(sim, rmm, two_streams):
    """Check mode over RMM's memory: the read on ``b`` of ``a``'s write and
    the give-back on ``a`` while ``b`` reads are reported (nothing is waited
    for); ordered by a synchronise of ``a`` and of ``b``, nothing is."""
    a, b = two_streams
    res = AsyncResource(sim, upstream=RmmUpstream(rmm, stream_of=Handle), reuse_bytes=0,
                        check=True)
    block = res.allocate(4096, a)
    _use(res, sim, block, a, Access.WRITE)
    _use(res, sim, block, b, Access.READ)
    res.deallocate(block)
    assert [h.kind for h in res.race_log.hazards] == ["read-after-write", "write-after-read"]
    assert res.counters()["waits"] == 0
    ordered = res.allocate(4096, a)
    _use(res, sim, ordered, a, Access.WRITE)
    res.program_completed(res.program_clock(a))
    sim.stream_synchronize(a)
    _use(res, sim, ordered, b, Access.READ)
    res.program_completed(res.program_clock(b))
    sim.stream_synchronize(b)
    res.deallocate(ordered)
    assert len(res.race_log.hazards) == 2
