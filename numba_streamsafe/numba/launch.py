"""The one fenced-launch path shared by tracked kernels and tracked copies."""

from __future__ import annotations

from typing import Any, Callable, Sequence, TypeVar

from numba_streamsafe.access import Access
from numba_streamsafe.blocks import Block
from numba_streamsafe.recorder import LaunchRecorder, RecorderMode
from numba_streamsafe.runtime import DeviceRuntime

__all__ = ["fenced"]

T = TypeVar("T")


def fenced(rt: DeviceRuntime, stream: int, uses: Sequence[tuple[Block | None, Access, str]],
           producers: Sequence[int], label: str, work: Callable[[], T],
           mode: RecorderMode | None = None) -> T:
    """Run ``work`` (which queues one launch or copy on ``stream``) between
    preflight and commit.

    ``uses`` lists ``(block or None, access, what)``; ``None`` is memory the
    library did not allocate, handled by ``mode``. ``producers`` are streams
    the work must be ordered after (foreign arrays' producer streams). With
    the runtime's tracking off, ``work`` runs unfenced. A checking driver is
    told about the accesses either way.
    """
    driver = rt.driver
    if not rt.tracking:
        result = work()
        if driver.traces_accesses:
            driver.trace_access(stream, _accesses(uses), label)
        return result
    rec = LaunchRecorder(rt, stream, mode or rt.mode)
    for block, access, what in uses:
        rec.use(block, access, what)
    for producer in producers:
        rec.wait_for_stream(producer)
    try:
        rec.preflight()
    except BaseException:
        rec.abandon()  # refused before any work: not an uncommitted launch
        raise
    try:
        result = work()
    except BaseException:
        rec.abandon()
        raise
    if driver.traces_accesses:
        driver.trace_access(stream, [(b.ptr, b.nbytes, a) for b, a in rec.uses], label)
    rec.commit()
    return result


def _accesses(uses: Sequence[tuple[Block | None, Access, str]]) -> list[tuple[int, int, Access]]:
    merged: dict[int, tuple[Block, Access]] = {}
    for block, access, _ in uses:
        if block is not None:
            old = merged.get(block.ptr)
            merged[block.ptr] = (block, access if old is None else old[1] | access)
    return [(b.ptr, b.nbytes, a) for b, a in merged.values()]
