"""Multi-stream programs for the core tests, run with or without the library's fences.

A *program step on the GPU* is::

    rec = LaunchRecorder(rt, s); rec.read(b) ...; rec.preflight()
    driver.trace_access(s, accesses, label)        # the kernel, as the simulator sees it
    rec.commit()

:func:`launch` does exactly that, or only the ``trace_access`` when ``fenced``
is False. :func:`execute` runs a whole :class:`Program` on a fresh
:class:`~numba_streamsafe._driver.sim.SimDriver`; the same program run unfenced
(no recorder, and so frees that wait for nothing) is the negative control
that shows the simulator's hazard checker can fail.

Programs come from :func:`random_program` (seeded ``random.Random``) or from
the Hypothesis strategy :func:`program_strategy`.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from numba_streamsafe._driver.sim import SimDriver
from numba_streamsafe.core.access import Access
from numba_streamsafe.core.blocks import Block
from numba_streamsafe.diagnostics.recorder import LaunchRecorder
from numba_streamsafe.resources import AsyncResource
from numba_streamsafe.runtime import DeviceRuntime

__all__ = [
    "launch",
    "accounting",
    "snapshot",
    "Launch",
    "Free",
    "Realloc",
    "Renew",
    "HostSync",
    "ProgramSync",
    "DeviceSync",
    "Reap",
    "Retire",
    "Reset",
    "Program",
    "Run",
    "execute",
    "cleanup",
    "random_program",
    "program_strategy",
    "SIZES",
]

#: Buffer sizes. Every size up to 256 B lands in a 256 B chunk of the simulated
#: pool, so a re-allocation ordered after a free gets the freed address back.
SIZES = (16, 100, 200, 256, 256, 512, 1000)


# --------------------------------------------------------------------- one step
def launch(rt: DeviceRuntime, stream: int, uses: Sequence[tuple[Block, Access]], *,
           fenced: bool = True, label: str = "kernel") -> None:
    """Queue one kernel on ``stream`` that makes ``uses``; fence it unless ``fenced`` is False."""
    rec = None
    if fenced:
        rec = LaunchRecorder(rt, stream)
        for block, access in uses:
            rec.use(block, access)
        rec.preflight()
    handle = rt.stream_handle(stream)
    rt.driver.trace_access(handle, [(b.ptr, b.nbytes, Access(a)) for b, a in uses], label)
    if rec is not None:
        rec.commit()


def accounting(resource: Any) -> tuple:
    """Bytes outstanding and the resource's stats without the event-pool figures."""
    stats = resource.stats()
    return (resource.bytes_outstanding(),
            dataclasses.replace(stats, events_in_use=0, events_idle=0))


def snapshot(resource: Any, *blocks: Block, events: bool = True) -> tuple:
    """What a refused call must leave unchanged: bytes outstanding, the stats
    and the dependency state of ``blocks`` (marks by identity, with their counts).

    ``events=False`` leaves out the event-pool figures (a lazy mark may be
    sealed, taking an event, by a call that then fails; that is no leak: the
    mark's users give the event back).
    """
    stats = resource.stats()
    if not events:
        stats = dataclasses.replace(stats, events_in_use=0, events_idle=0)
    deps = []
    for block in blocks:
        last_write, reads = resource.tracker.block_events(block)
        deps.append((id(last_write), last_write.refs, last_write.stream,
                     tuple(sorted((s, id(m), m.refs) for s, m in reads.items()))))
    return resource.bytes_outstanding(), stats, tuple(deps)


# ------------------------------------------------------------------- programs
@dataclass(frozen=True)
class Launch:
    """A kernel on stream ``stream`` using ``(buffer, access)`` pairs (freed buffers skipped)."""

    stream: int
    uses: tuple[tuple[int, Access], ...]


@dataclass(frozen=True)
class Free:
    """Free buffer ``buf`` (nothing when it is already freed)."""

    buf: int


@dataclass(frozen=True)
class Realloc:
    """Free ``buf`` if live, then allocate it again on ``stream`` with ``nbytes``."""

    buf: int
    stream: int
    nbytes: int


@dataclass(frozen=True)
class Renew:
    """Free ``buf`` if live, then allocate its size again on its stream: the
    free-then-allocate cycle of a temporary (nothing when it is freed)."""

    buf: int


@dataclass(frozen=True)
class HostSync:
    """The host synchronises with ``stream``."""

    stream: int


@dataclass(frozen=True)
class ProgramSync:
    """The host synchronises with ``stream`` and the library learns it, as
    transparent mode notes Numba's ``stream.synchronize()``: the uses queued
    there so far are complete."""

    stream: int


@dataclass(frozen=True)
class DeviceSync:
    """A device-wide synchronise the library learns, as transparent mode notes
    Numba's ``cuda.synchronize()``: every use queued so far is complete (the
    destroyed streams' too)."""


@dataclass(frozen=True)
class Reap:
    """``rt.reap()``: synchronise the streams with queued frees."""


@dataclass(frozen=True)
class Retire:
    """Free the buffers allocated on ``stream``, destroy it through the runtime and
    put a new stream in its place (the simulated driver hands out the destroyed
    handle again, as CUDA may)."""

    stream: int


@dataclass(frozen=True)
class Reset:
    """A context reset: the runtime forgets every block (the buffers are gone), the
    simulated context destroys its streams, events and memory, and new streams
    take the old handles."""


Step = Launch | Free | Realloc | Renew | HostSync | ProgramSync | DeviceSync | Reap | Retire | Reset


@dataclass(frozen=True)
class Program:
    n_streams: int
    #: Initial size and stream index of each buffer.
    sizes: tuple[int, ...]
    homes: tuple[int, ...]
    steps: tuple[Step, ...]


class StreamOwner:
    """Stands for the user's object owning a stream handle."""

    def __init__(self, handle: int) -> None:
        self.handle = handle


@dataclass
class Run:
    """The state after :func:`execute`."""

    sim: SimDriver
    res: AsyncResource
    rt: DeviceRuntime
    streams: list[int]
    blocks: list[Block | None]
    owners: list[Any] = field(default_factory=list)
    #: Allocations that got an address freed earlier in the program.
    reused: int = 0
    freed_ptrs: set[int] = field(default_factory=set)
    #: Streams created at the handle of a destroyed one.
    recycled: int = 0
    #: Frees go through the finalizer-safe queue (``defer_free``), run at the
    #: next allocation, as a dropped Numba array's do.
    deferred: bool = False


def execute(program: Program, *, fenced: bool = True, fences: str = "lazy",
            deferred: bool = False) -> Run:
    """Run ``program`` on a fresh simulated device and return the final state;
    with ``deferred``, frees are queued (``defer_free``) rather than run."""
    sim = SimDriver(backing=False)
    res = AsyncResource(sim, fences=fences)
    rt = DeviceRuntime(res)
    streams = [sim.create_stream() for _ in range(program.n_streams)]
    # One owning object per stream, as a user's stream objects: blocks freed on
    # a stream with an owner may be kept and reused there (reuse_bytes).
    owners = [StreamOwner(h) for h in streams]
    blocks: list[Block | None] = [
        res.allocate(n, streams[h], f"buf{i}", stream_owner=owners[h])
        for i, (n, h) in enumerate(zip(program.sizes, program.homes, strict=True))
    ]
    run = Run(sim, res, rt, streams, blocks, owners, deferred=deferred)
    for k, step in enumerate(program.steps):
        if isinstance(step, Launch):
            uses = [(blocks[i], a) for i, a in step.uses if blocks[i] is not None]
            if uses:
                launch(rt, streams[step.stream], uses, fenced=fenced, label=f"step{k}")
        elif isinstance(step, Free):
            _free(run, step.buf)
        elif isinstance(step, Realloc):
            _free(run, step.buf)
            block = res.allocate(step.nbytes, streams[step.stream], f"buf{step.buf}@{k}",
                                 stream_owner=owners[step.stream])
            if block.ptr in run.freed_ptrs:
                run.reused += 1
            blocks[step.buf] = block
        elif isinstance(step, Renew):
            old = blocks[step.buf]
            if old is not None:
                _free(run, step.buf)
                home = streams.index(old.stream)
                block = res.allocate(old.nbytes, old.stream, f"buf{step.buf}@{k}",
                                     stream_owner=owners[home])
                if block.ptr in run.freed_ptrs:
                    run.reused += 1
                blocks[step.buf] = block
        elif isinstance(step, HostSync):
            sim.stream_synchronize(streams[step.stream])
        elif isinstance(step, ProgramSync):
            # As transparent mode's hook of a stream's synchronise tells it.
            clock, _ = res.tracker.program_sync_clock(streams[step.stream])
            sim.stream_synchronize(streams[step.stream])
            res.tracker.program_completed(clock, streams[step.stream])
        elif isinstance(step, DeviceSync):
            point = res.tracker.program_point_all()
            sim.synchronize()
            res.tracker.program_completed_all(point)
        elif isinstance(step, Reap):
            rt.reap()
        elif isinstance(step, Retire):
            _retire(run, step.stream)
        elif isinstance(step, Reset):
            _reset(run)
        else:  # pragma: no cover - a new step kind without a case here
            raise TypeError(step)
    return run


def _free(run: Run, buf: int) -> None:
    block = run.blocks[buf]
    if block is not None:
        if run.deferred:
            run.res.defer_free(block)
        else:
            run.rt.deallocate(block)
        run.freed_ptrs.add(block.ptr)
        run.blocks[buf] = None


def _new_stream(run: Run, i: int, old: set[int]) -> None:
    handle = run.sim.create_stream()
    run.recycled += handle in old
    run.streams[i] = handle
    run.owners[i] = StreamOwner(handle)


def _retire(run: Run, i: int) -> None:
    handle = run.streams[i]
    for buf, block in enumerate(run.blocks):
        if block is not None and block.stream == handle:
            _free(run, buf)
    run.rt.destroy_stream(handle)
    _new_stream(run, i, {handle})


def _reset(run: Run) -> None:
    run.rt.reset()
    for i, block in enumerate(run.blocks):
        if block is not None:
            run.freed_ptrs.add(block.ptr)
            run.blocks[i] = None
    run.sim.reset_context()
    old = set(run.streams)
    for i in range(len(run.streams)):
        _new_stream(run, i, old)


def cleanup(run: Run) -> None:
    """Free every live buffer and reap."""
    for i in range(len(run.blocks)):
        _free(run, i)
    run.rt.reap()


# ------------------------------------------------------------------ generators
_KINDS = ("launch",) * 12 + ("free",) * 2 + ("realloc",) * 4 + ("sync",) * 2 + (
    "reap", "reap", "retire", "reset", "program sync", "device sync")


def random_program(rng: random.Random, *, max_steps: int = 25) -> Program:
    """A random program of 3-4 streams, 2-6 buffers and 1-``max_steps`` steps."""
    n_streams = rng.randint(3, 4)
    n_bufs = rng.randint(2, 6)
    sizes = tuple(rng.choice(SIZES) for _ in range(n_bufs))
    homes = tuple(rng.randrange(n_streams) for _ in range(n_bufs))
    steps: list[Step] = []
    for _ in range(rng.randint(1, max_steps)):
        kind = rng.choice(_KINDS)
        if kind == "launch":
            bufs = rng.sample(range(n_bufs), rng.randint(1, min(3, n_bufs)))
            steps.append(Launch(rng.randrange(n_streams),
                                tuple((b, rng.choice(list(Access))) for b in bufs)))
        elif kind == "free":
            steps.append(Free(rng.randrange(n_bufs)))
        elif kind == "realloc":
            steps.append(Realloc(rng.randrange(n_bufs), rng.randrange(n_streams),
                                 rng.choice(SIZES)))
        elif kind == "sync":
            steps.append(HostSync(rng.randrange(n_streams)))
        elif kind == "program sync":
            steps.append(ProgramSync(rng.randrange(n_streams)))
        elif kind == "device sync":
            steps.append(DeviceSync())
        elif kind == "retire":
            steps.append(Retire(rng.randrange(n_streams)))
        elif kind == "reset":
            steps.append(Reset())
        else:
            steps.append(Reap())
    return Program(n_streams, sizes, homes, tuple(steps))


def program_strategy(max_steps: int = 25, *, renew: bool = False
                     ) -> st.SearchStrategy[Program]:
    """Hypothesis strategy for the programs :func:`random_program` makes; with
    ``renew``, :class:`Renew` steps too (as often as launches)."""

    @st.composite
    def build(draw: Any) -> Program:
        n_streams = draw(st.integers(3, 4))
        n_bufs = draw(st.integers(2, 6))
        sizes = draw(st.lists(st.sampled_from(SIZES), min_size=n_bufs, max_size=n_bufs))
        homes = draw(st.lists(st.integers(0, n_streams - 1), min_size=n_bufs, max_size=n_bufs))
        stream = st.integers(0, n_streams - 1)
        buf = st.integers(0, n_bufs - 1)
        uses = st.lists(st.tuples(buf, st.sampled_from(list(Access))), min_size=1, max_size=3,
                        unique_by=lambda u: u[0]).map(tuple)
        a_launch = st.builds(Launch, stream, uses)
        # one_of picks a branch uniformly: repeat the common kinds to weight them
        # (as _KINDS does for random_program).
        a_free = st.builds(Free, buf)
        a_realloc = st.builds(Realloc, buf, stream, st.sampled_from(SIZES))
        a_sync = st.builds(HostSync, stream)
        step = st.one_of(*[a_launch] * 12, a_free, a_free, *[a_realloc] * 4, a_sync, a_sync,
                         st.just(Reap()), st.just(Reap()), st.builds(Retire, stream),
                         st.just(Reset()), st.builds(ProgramSync, stream), st.just(DeviceSync()),
                         *([st.builds(Renew, buf)] * (12 if renew else 0)))
        steps = draw(st.lists(step, min_size=1, max_size=max_steps))
        return Program(n_streams, tuple(sizes), tuple(homes), tuple(steps))

    return build()
