"""Freed bytes not yet back in the pool: blocks kept for same-stream reuse, and
the ledger of frees queued per stream.

Part of the engine (:mod:`numba_streamsafe.compiled`), written in Cython's
pure-Python mode (C declarations in ``freed.pxd``): the resource calls it on
every allocation and free.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cython

__all__ = ["KeptBlocks", "PendingFrees", "COMPILED"]

#: Whether this module runs compiled (else it runs as Python source).
COMPILED: bool = cython.compiled


@cython.cclass
class PendingFrees:
    """Bytes whose free is queued on each stream, with the stream's owning object
    (kept alive until the stream is synchronised), and the objects that keep
    released borrowed memory alive until then. Callers hold their lock."""


    def __init__(self) -> None:
        #: stream -> [bytes whose free is queued there, the stream's owner,
        #: objects kept alive until the stream completes (a list, or None)]
        self.slots = {}
        self.nbytes = 0

    def __bool__(self) -> bool:
        return bool(self.slots)

    def add(self, stream: Any, nbytes: Any, owner: Any, keep: Any = None) -> None:
        """Count ``nbytes`` freed on ``stream``; hold ``keep`` (when not None)
        until the stream's slot is released."""
        self.nbytes += nbytes
        slot = self.slots.get(stream)
        if slot is None:
            self.slots[stream] = slot = [nbytes, owner, None]
        else:
            slot[0] += nbytes
            if slot[1] is None:
                slot[1] = owner
        if keep is not None:
            if slot[2] is None:
                slot[2] = [keep]
            else:
                slot[2].append(keep)

    def take_all(self) -> dict[int, list[Any]]:
        """Every stream's slot, no longer listed (still counted until released)."""
        slots = dict(self.slots)
        self.slots.clear()
        return slots

    def take(self, stream: Any) -> dict[int, list[Any]]:
        """``stream``'s slot alone, as :meth:`take_all` does."""
        slot = self.slots.pop(stream, None)
        return {} if slot is None else {stream: slot}

    def put_back(self, items: list[tuple[int, list[Any]]]) -> None:
        """List taken slots again (their bytes are still counted)."""
        for stream, (n, owner, keep) in items:
            slot = self.slots.setdefault(stream, [0, None, None])
            slot[0] += n
            if slot[1] is None:
                slot[1] = owner
            if keep:
                slot[2] = keep if slot[2] is None else slot[2] + keep

    def release(self, nbytes: Any) -> None:
        """Stop counting ``nbytes`` taken earlier: their frees have run."""
        self.nbytes -= nbytes

    def release_stream(self, stream: Any) -> list[Any] | None:
        """Stop counting ``stream``'s bytes: its frees have run. Returns the
        slot, so that the caller drops what it kept alive outside its lock."""
        slot = self.slots.pop(stream, None)
        if slot is not None:
            self.nbytes -= slot[0]
        return slot

    def per_stream(self) -> dict[int, int]:
        return {s: slot[0] for s, slot in self.slots.items() if slot[0]}

    def clear(self) -> None:
        self.slots.clear()
        self.nbytes = 0


@cython.cclass
class KeptBlocks:
    """Freed blocks kept for the next allocation of the same size on the same
    stream, oldest first, up to a byte limit. Callers hold their lock.

    A kept block's free is complete in stream order on its own stream (its
    cross-stream waits were queued when it was freed), so an allocation on that
    stream may take it without a driver call. A block kept *idle* (every use of
    it complete when it was freed, as the host saw) needs no ordering at all:
    :meth:`taken_idle` tells the allocation that takes it.
    """


    def __init__(self, limit: Any) -> None:
        self.limit = limit
        #: (stream, nbytes) -> addresses, oldest first.
        self.blocks = {}
        #: stream -> its owning object, alive while blocks are kept for it.
        self.owners = {}
        self.nbytes = 0
        #: Addresses of the blocks kept idle.
        self.idle = set()

    def __bool__(self) -> bool:
        return bool(self.blocks)

    def take(self, stream: Any, nbytes: Any) -> int | None:
        """The address of a kept block of ``nbytes`` on ``stream``, or None."""
        key = (stream, nbytes)
        ptrs = self.blocks.get(key)
        if not ptrs:
            return None
        ptr = ptrs.pop()
        if not ptrs:
            del self.blocks[key]
        self.nbytes -= nbytes
        return ptr

    def put(self, stream: Any, nbytes: Any, ptr: Any, owner: Any, idle: bool = False) -> None:
        if idle:
            self.idle.add(ptr)
        ptrs = self.blocks.get((stream, nbytes))
        if ptrs is None:
            self.blocks[(stream, nbytes)] = [ptr]
        else:
            ptrs.append(ptr)
        self.nbytes += nbytes
        if owner is not None:
            self.owners[stream] = owner

    def taken_idle(self, ptr: Any) -> bool:
        """Whether the block at ``ptr``, just taken (:meth:`take`), was kept idle."""
        if ptr in self.idle:
            self.idle.discard(ptr)
            return True
        return False

    def has_stream(self, stream: Any) -> bool:
        return any(s == stream for s, _ in self.blocks)

    def free_oldest(self, limit: Any, free: Callable[[int, int], None],
                    pending: PendingFrees) -> None:
        """Queue the frees (``free(ptr, stream)``) of the oldest kept blocks until
        at most ``limit`` bytes stay kept; the freed bytes become ``pending``.

        A failing free raises; what was freed is pending, the rest stays kept.
        """
        owners = self.owners
        for key in list(self.blocks):
            if self.nbytes <= limit:
                break
            stream, nbytes = key
            ptrs = self.blocks[key]
            while ptrs and self.nbytes > limit:
                free(ptrs[-1], stream)
                self.idle.discard(ptrs.pop())
                self.nbytes -= nbytes
                pending.add(stream, nbytes, owners.get(stream))
            if not ptrs:
                del self.blocks[key]
                if limit and not self.has_stream(stream):
                    owners.pop(stream, None)
        if not self.blocks:
            owners.clear()

    def free_stream(self, stream: Any, free: Callable[[int, int], None],
                    pending: PendingFrees) -> None:
        """Queue the frees of every block kept on ``stream``; they become ``pending``."""
        owner = self.owners.get(stream)
        for key in [k for k in self.blocks if k[0] == stream]:
            nbytes = key[1]
            ptrs = self.blocks[key]
            while ptrs:
                free(ptrs[-1], stream)
                self.idle.discard(ptrs.pop())
                self.nbytes -= nbytes
                pending.add(stream, nbytes, owner)
            del self.blocks[key]
        self.owners.pop(stream, None)

    def per_stream(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for (s, nbytes), ptrs in self.blocks.items():
            out[s] = out.get(s, 0) + nbytes * len(ptrs)
        return out

    def clear(self) -> list[int]:
        """Forget every kept block and return their addresses."""
        ptrs = [ptr for ptrs in self.blocks.values() for ptr in ptrs]
        self.blocks.clear()
        self.idle.clear()
        self.owners.clear()
        self.nbytes = 0
        return ptrs
