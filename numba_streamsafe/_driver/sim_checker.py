"""The simulated driver's happens-before checker: every access of a queued
operation against the shadow of the bytes it touches (:class:`HappensBefore`,
held by :class:`~.sim.SimDriver`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from numba_streamsafe._driver.sim_model import Chunk, Hazard, Op
from numba_streamsafe.core.access import Access

__all__ = ["HappensBefore"]


class HappensBefore:
    """Checks each access against the earlier accesses of its bytes and
    reports, in ``hazards``, those it is not ordered after. The caller holds
    the system's lock around every call.

    Parameters
    ----------
    hazards : list of Hazard
        Where hazards are reported (the system's list, shared by its devices).
    ordered : callable
        ``ordered(earlier, later)``: whether the operation ``earlier`` happens
        before ``later`` (the driver's clocks).
    """

    def __init__(self, hazards: list[Hazard], ordered: Callable[[Op, Op], bool]) -> None:
        self.hazards = hazards
        self._ordered = ordered

    def report(self, kind: str, ptr: int, earlier: str, later: str,
               chunk: Chunk | None = None, op: Op | None = None) -> None:
        """Report a hazard found outside the shadows (a use after free, an
        access out of bounds or without peer access). With the ``chunk``
        the access was to and its ``op``, a use after free names the free
        as its first side and both sides' stacks, and every hazard the
        memory's allocation (and free)."""
        if chunk is None:
            self.hazards.append(Hazard(kind, ptr, earlier, later))
            return
        first = second = None
        if kind == "use-after-free" and op is not None and chunk.free_op is not None:
            first, second = chunk.free_op.side(), op.side()
        self.hazards.append(Hazard(kind, ptr, earlier, later, first, second, 0,
                                   chunk.allocated, chunk.freed if not chunk.live else ()))

    def check(self, chunk: Chunk, ptr: int, nbytes: int, access: Access, op: Op) -> None:
        """Check ``op``'s ``access`` to ``nbytes`` at ``ptr`` against the earlier
        accesses of those bytes, then record it. One hazard per earlier
        access it is not ordered after, over the bytes both touch."""
        lo = max(ptr - chunk.base, 0)
        hi = min(lo + nbytes, chunk.capacity)
        if lo >= hi:
            return
        shadow = chunk.shadow
        i, j = shadow.cover(lo, hi)
        # earlier op -> [kind, first byte, end] of the bytes it conflicts over
        found: dict[int, tuple[Op, list[Any]]] = {}
        write = bool(access & Access.WRITE)
        for part in shadow.parts[i:j]:
            last = part[2]
            if last is not None:
                kind = "read-after-write" if access == Access.READ else "write-after-write"
                _conflict(found, last, kind, part)
            if write:
                for read in part[3].values():
                    if read.stream != op.stream:
                        _conflict(found, read, "write-after-read", part)
                part[2] = op
                part[3] = {}
            else:
                part[3][op.stream] = op
        shadow.join(i - 1, j + 1)
        for earlier, (kind, first, end) in found.values():
            if not self._ordered(earlier, op):
                self.hazards.append(Hazard(kind, chunk.base + first, str(earlier), str(op),
                                           earlier.side(), op.side(), end - first,
                                           chunk.allocated, chunk.freed))

    def assert_none(self) -> None:
        """Raise ``AssertionError`` listing every hazard seen so far."""
        if self.hazards:
            shown = "\n  ".join(str(h) for h in self.hazards[:10])
            raise AssertionError(f"{len(self.hazards)} hazard(s):\n  {shown}")


def _conflict(found: dict[int, tuple[Op, list[Any]]], earlier: Op, kind: str,
              part: list[Any]) -> None:
    """Note that ``earlier`` touched the bytes of ``part`` (widening its span)."""
    seen = found.get(id(earlier))
    if seen is None:
        found[id(earlier)] = (earlier, [kind, part[0], part[1]])
    else:
        span = seen[1]
        span[1] = min(span[1], part[0])
        span[2] = max(span[2], part[1])
