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

    Attributes
    ----------
    complete : bool
        False (the default): an access is checked against the bytes' last
        write and the reads since it, so a race is reported where its two
        accesses meet with no write between them. True: also against the
        earlier accesses the last write was not ordered after, so a pair that
        races only because an earlier pair did is reported too (a read, an
        unordered write of those bytes, then a write ordered after that one
        but not after the read). Still not every racing pair: an access that
        a later write is ordered after is dropped, though a third access may
        be ordered after that write and not after it (a read on ``a``, a
        write on ``b`` ordered after it, a write on ``c`` unordered with
        both), and only each stream's newest read is kept. Every pair either
        mode reports races.
    """

    def __init__(self, hazards: list[Hazard], ordered: Callable[[Op, Op], bool]) -> None:
        self.hazards = hazards
        self._ordered = ordered
        self.complete = False

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
        before: dict[int, bool] = {}  # earlier op -> whether it happens before op
        write = bool(access & Access.WRITE)
        kind = "read-after-write" if access == Access.READ else "write-after-write"
        complete = self.complete
        for part in shadow.parts[i:j]:
            writes, reads = part[2], part[3]
            for earlier in writes.values():
                _conflict(found, earlier, kind, part)
            if write:
                for read in reads.values():
                    if read.stream != op.stream:
                        _conflict(found, read, "write-after-read", part)
                if complete:  # what the write is not ordered after stays, to meet later ones
                    part[2] = {s: e for s, e in writes.items()
                               if not self._before(before, e, op)}
                    part[3] = {s: e for s, e in reads.items()
                               if not self._before(before, e, op)}
                    part[2][op.stream] = op
                else:
                    part[2] = {op.stream: op}
                    part[3] = {}
            else:
                reads[op.stream] = op
        shadow.join(i - 1, j + 1)
        for earlier, (kind, first, end) in found.values():
            if not self._before(before, earlier, op):
                self.hazards.append(Hazard(kind, chunk.base + first, str(earlier), str(op),
                                           earlier.side(), op.side(), end - first,
                                           chunk.allocated, chunk.freed))

    def _before(self, known: dict[int, bool], earlier: Op, op: Op) -> bool:
        """Whether ``earlier`` happens before ``op``, asked once per earlier op
        (``known``)."""
        found = known.get(id(earlier))
        if found is None:
            found = known[id(earlier)] = self._ordered(earlier, op)
        return found

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
