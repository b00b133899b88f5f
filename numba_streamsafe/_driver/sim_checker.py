"""The simulated driver's happens-before checker: every access of a queued
operation against the shadow of the bytes it touches (a part of
:class:`~.sim.SimDriver`)."""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable
from typing import Any

from numba_streamsafe._driver.sim_model import (
    Chunk,
    Hazard,
    Op,
    SimSystem,
    tell_watchers,
    watchers,
)
from numba_streamsafe.core.access import Access

__all__ = ["HappensBefore"]


class HappensBefore:
    """The checking calls of :class:`~.sim.SimDriver` (which holds the state)."""

    # The state and the calls of SimDriver these methods use (for type checkers).
    system: SimSystem
    device: int
    hazards: list[Hazard]
    _lock: Any
    _bases: list[int]
    _chunks: dict[int, Chunk]
    _enqueue: Any
    _host_op: Any
    _ordered: Any
    can_access: Any

    def _chunk_at(self, address: int) -> Chunk | None:
        i = bisect.bisect_right(self._bases, address) - 1
        if i < 0:
            return None
        chunk = self._chunks[self._bases[i]]
        if address >= chunk.base + chunk.capacity:
            return None
        return chunk

    def _owner_of(self, address: int) -> tuple[int, Chunk | None]:
        """The device whose memory holds ``address`` (this one first) and its chunk."""
        chunk = self._chunk_at(address)
        if chunk is not None:
            return self.device, chunk
        for device, driver in self.system.drivers.items():
            if driver is not self:
                chunk = driver._chunk_at(address)
                if chunk is not None:
                    return device, chunk
        return self.device, None

    def trace_access(self, stream: int, accesses: Iterable[tuple[Any, ...]],
                     label: str, *, copy: bool = False, site: str | None = None) -> None:
        """Check a kernel or copy on ``stream`` that touches ``accesses``:
        ``(ptr, nbytes, access)`` or ``(ptr, nbytes, access, argument name)``.
        ``site`` is the ``file:line`` of the user's call, for the reports.

        Memory of another device of the system is checked too; a kernel
        (``copy`` False) that touches it without peer access
        (:meth:`enable_peer_access`) is a ``no-peer-access`` hazard.

        Raises
        ------
        RaceDetected
            Inside ``numba_streamsafe.race_check()``: this work conflicts
            with earlier work it is not ordered after (after every access
            of it was checked).
        """
        with self._lock:
            op = self._enqueue(stream, label, "launch")
            if site is not None:
                op = dataclasses.replace(op, site=site)
            self._trace(accesses, op, peer_checked=not copy)
        if watchers:
            tell_watchers(self.system)

    def trace_host_access(self, accesses: Iterable[tuple[int, int, Access]], label: str) -> None:
        """Check a host-side access (for example reading results after a sync)."""
        with self._lock:
            self._trace(accesses, self._host_op(label))

    def _trace(self, accesses: Iterable[tuple[Any, ...]], op: Op,
               peer_checked: bool = False) -> None:
        base = op
        for entry in accesses:
            ptr, nbytes, access = entry[0], entry[1], entry[2]
            op = dataclasses.replace(base, param=entry[3]) if len(entry) > 3 else base
            device, chunk = self._owner_of(ptr)
            if chunk is None or not chunk.live:
                self.hazards.append(Hazard("use-after-free", ptr, "the free", str(op)))
                continue
            if peer_checked and device != self.device and not self.can_access(device):
                self.hazards.append(Hazard(
                    "no-peer-access", ptr, f"memory of device {device}",
                    f"{op} of device {self.device}, which has no peer access to it"))
            if ptr + nbytes > chunk.base + chunk.nbytes:
                self.hazards.append(Hazard("out-of-bounds", ptr, f"allocation of {chunk.nbytes} B",
                                           str(op)))
            self._check(chunk, ptr, nbytes, access, op)

    def _check(self, chunk: Chunk, ptr: int, nbytes: int, access: Access, op: Op) -> None:
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
                self._conflict(found, last, kind, part)
            if write:
                for read in part[3].values():
                    if read.stream != op.stream:
                        self._conflict(found, read, "write-after-read", part)
                part[2] = op
                part[3] = {}
            else:
                part[3][op.stream] = op
        shadow.join(i - 1, j + 1)
        for earlier, (kind, first, end) in found.values():
            if not self._ordered(earlier, op):
                self.hazards.append(Hazard(kind, chunk.base + first, str(earlier), str(op),
                                           earlier.side(), op.side(), end - first))

    @staticmethod
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

    def assert_no_hazards(self) -> None:
        """Raise ``AssertionError`` listing every hazard seen so far."""
        if self.hazards:
            shown = "\n  ".join(str(h) for h in self.hazards[:10])
            raise AssertionError(f"{len(self.hazards)} hazard(s):\n  {shown}")
