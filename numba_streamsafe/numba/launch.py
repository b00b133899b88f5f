"""The one fenced-launch path shared by tracked kernels and tracked copies.

It performs the recorder protocol of :class:`~numba_streamsafe.LaunchRecorder`
(preflight, work, commit) directly on the resource, because it runs on every
launch and a recorder object per launch costs more than the fences.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from numba_streamsafe.access import Access
from numba_streamsafe.blocks import Block
from numba_streamsafe.recorder import refuse_untracked
from numba_streamsafe.runtime import DeviceRuntime

__all__ = ["fenced", "Uses", "single"]

T = TypeVar("T")


class Uses:
    """The buffers of one launch: tracked blocks (merged by identity with the
    access lattice), untracked arrays, and foreign producer streams."""

    __slots__ = ("blocks", "untracked", "producers")

    def __init__(self) -> None:
        self.blocks: list[tuple[Block, Access]] = []
        self.untracked: list[str] | None = None
        self.producers: list[int] | None = None

    def add(self, block: Block | None, access: Access, what: str) -> None:
        if block is None:
            if self.untracked is None:
                self.untracked = []
            self.untracked.append(what)
            return
        blocks = self.blocks
        for i, (b, a) in enumerate(blocks):
            if b is block:
                blocks[i] = (b, Access(a | access))
                return
        blocks.append((block, access))

    def add_producer(self, stream: int) -> None:
        if self.producers is None:
            self.producers = []
        self.producers.append(stream)


def fenced(rt: DeviceRuntime, stream: int, uses: Uses, label: str, strict: bool, owner: object,
           work: Callable[..., T], *args: object) -> T:
    """Run ``work(*args)`` (which queues one launch or copy on ``stream``)
    between preflight and commit.

    Untracked arrays are refused when ``strict``; the producer streams of
    foreign arrays are waited for. ``owner`` (the user's stream object, or
    None) is kept alive while recorded uses refer to the stream. With the
    runtime's tracking off, ``work`` runs unfenced. A checking driver is told
    about the accesses either way.

    Raises
    ------
    StreamMisuse
        Untracked memory in strict mode; nothing is queued.
    """
    blocks = uses.blocks
    if not rt.tracking:
        result = work(*args)
        if rt.driver.traces_accesses:
            rt.driver.trace_access(stream, [(b.ptr, b.nbytes, a) for b, a in blocks], label)
        return result
    if uses.untracked and strict:
        raise refuse_untracked(uses.untracked, "pass mode='permissive', or allow_foreign=True "
                               "for arrays whose producer names its stream")
    resource = rt.resource
    if blocks:
        resource.prepare_launch(blocks, stream, owner)
    if uses.producers:
        for producer in uses.producers:
            rt.order_after_stream(stream, producer)
    result = work(*args)
    if rt.driver.traces_accesses:
        rt.driver.trace_access(stream, [(b.ptr, b.nbytes, a) for b, a in blocks], label)
    if blocks:
        resource.commit_launch(blocks, stream, owner)
    return result


def single(block: Block | None, access: Access, what: str) -> Uses:
    """:class:`Uses` of one buffer."""
    uses = Uses()
    uses.add(block, access, what)
    return uses
