"""Check mode's reports: the races a checking resource's mark book found
(``MarkBook.races``), described as the simulator's checker describes its
hazards and handed to the race checks in progress."""

from __future__ import annotations

import threading
from typing import Any

from numba_streamsafe._driver.sim_model import Hazard, Side, tell_watchers
from numba_streamsafe.core.access import Access
from numba_streamsafe.core.sites import site_text
from numba_streamsafe.core.uses import Uses

__all__ = ["RaceLog", "describe"]

_WRITE = int(Access.WRITE)


class RaceLog:
    """The races one checking resource found, as :class:`Hazard` s (``hazards``,
    in the order found). Race checks (:func:`numba_streamsafe.race_check` and
    check mode's own) collect them as they collect a simulated system's."""

    #: The hazards here are the user's reports (as a simulated system's are
    #: unless a checking resource reports instead).
    reports = True

    def __init__(self) -> None:
        self.hazards: list[Hazard] = []
        self._lock = threading.Lock()

    def report(self, races: list[tuple[Any, ...]]) -> None:
        """Describe ``races`` (``MarkBook.take_races``) and tell the race checks
        in progress; raises :class:`~numba_streamsafe.core.errors.RaceDetected`
        where one stops at the first."""
        found = [hazard for race in races for hazard in describe(*race)]
        with self._lock:
            self.hazards.extend(found)
        tell_watchers(self)


def describe(stream: Any, mark: Any, where: tuple[Any, ...], what: Any,
             seen: dict[Any, Any] | None) -> list[Hazard]:
    """The hazards of a use on ``stream`` (``where``: ``(block, access, lo,
    hi, free)``; ``what``: its work, ``(label, site, names)``) that needs
    ``mark``, which the program does not order it after: against the last
    write of those bytes the mark's uses made (read- or write-after-write)
    and, for a write, against their last read if it came after
    (write-after-read). The earlier sides are the works the mark noted
    (``seen``, its ``Mark.seen``)."""
    block, access, lo, hi, free = where
    later_write = bool(access & _WRITE) or free
    if block is not None and free:
        lo, hi = 0, block.nbytes
    ptr = block.ptr if block is not None else 0
    if free:
        second = Side("cuMemFreeAsync", None, stream, None)
    else:
        second = _side(what, stream, ptr, lo, hi)
    out = []
    for kind, e_what, e_lo, e_hi in _earlier(seen, block, lo, hi, later_write):
        first = _side(e_what, mark.stream, ptr, e_lo, e_hi)
        first_lo, first_hi = max(lo, e_lo), min(hi, e_hi)
        out.append(Hazard(kind, ptr + first_lo, str(first), str(second), first, second,
                          max(first_hi - first_lo, 0)))
    if not out:  # what the mark's uses were is not known (no note)
        kind = "write-after-write" if later_write else "read-after-write"
        first = Side("work", None, mark.stream, None)
        out.append(Hazard(kind, ptr + lo, str(first), str(second), first, second, hi - lo))
    return out


def _earlier(seen: dict[Any, Any] | None, block: Any, lo: int, hi: int, later_write: bool
             ) -> list[tuple[str, Any, int, int]]:
    """``(kind, what, lo, hi)`` of the noted uses in ``seen`` over the bytes
    ``lo .. hi - 1`` of ``block`` that conflict with the later use: the last
    write of each span, and for a later write the last use of each span if
    it was a read (a read after the write)."""
    if not seen or block is None:
        return []
    ptr, generation = block.ptr, block.generation
    out = []
    for key, value in list(seen.items()):
        writes = type(key) is tuple and key[-1] is None
        span = key[0] if writes else key
        entry, s_lo, s_hi = span if isinstance(span, tuple) else (span, 0, span.nbytes)
        noted = entry.block  # the same allocation: not an earlier one at its address
        if (noted.ptr != ptr or noted.generation != generation or s_hi <= lo
                or s_lo >= hi):
            continue
        if writes:
            kind = "write-after-write" if later_write else "read-after-write"
            out.append((kind, value, s_lo, s_hi))
        elif later_write and not value[0] & _WRITE:
            out.append(("write-after-read", value[1], s_lo, s_hi))
    return out


def _side(what: Any, stream: Any, ptr: int, lo: int, hi: int) -> Side:
    """One side of a hazard: the work's label, the argument over those bytes,
    the stream, the user's line."""
    if what is None:
        return Side("work", None, stream, None)
    label, _, names = what
    return Side(label, _name(names, ptr, lo, hi), stream, site_text(what[1]))


def _name(names: Any, ptr: int, lo: int, hi: int) -> str | None:
    """The argument of ``names`` (a :class:`Uses`, or a direct launch's
    ``(names, arrays)``) over the bytes ``lo .. hi - 1`` of the block at ``ptr``."""
    if names is None:
        return None
    found: list[str] = []
    if isinstance(names, Uses):
        if names.names is None:
            return None
        for (b, _, b_lo, b_hi), name in zip(names.blocks, names.names, strict=False):
            if b.ptr == ptr and b_lo == lo and b_hi == hi:
                found.append(name)
    else:
        shown, arrays = names
        for k in range(0, len(arrays), 2):
            f = arrays[k]
            if f.ptr == ptr and f.lo == lo and f.hi == hi:
                found.append(shown[k // 2])
    return "+".join(found) or None
