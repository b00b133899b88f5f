"""DebugGuardResource: canaries around every block, poison and quarantine after the free."""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from numba_streamsafe.core.access import Access
from numba_streamsafe.core.blocks import Block, BlockState, next_generation
from numba_streamsafe.core.errors import (
    DriverError,
    InvalidArgument,
    OutOfBounds,
    StaleContext,
    StreamSafeError,
    UseAfterFree,
)
from numba_streamsafe.resources.base import DeferringAdaptor, MemoryResource, Use

__all__ = ["DebugGuardResource"]

_log = logging.getLogger("numba_streamsafe")

#: The guard width must keep the inner pointer aligned for every CUDA scalar
#: and vector type (``double2``, ``complex128``...).
_GUARD_ALIGN = 16


class _Guarded:
    """One allocation: the upstream (outer) block and the block handed out (inner)."""

    __slots__ = ("outer", "inner")

    def __init__(self, outer: Block, inner: Block) -> None:
        self.outer = outer
        self.inner = inner


def _check_byte(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 255:
        raise InvalidArgument(f"{name} must be a byte value from 0 to 255, got {value!r}")
    return value


class DebugGuardResource(DeferringAdaptor):
    """Catch out-of-bounds writes and uses after free, for debugging.

    Every allocation of ``nbytes`` takes ``nbytes + 2 * guard_bytes`` from
    ``upstream`` (the *outer* block) and hands out the *inner* block: the
    ``nbytes`` in the middle, with a generation of its own. The two guard
    regions around it are filled with the ``canary`` byte, on the allocation
    stream; the inner bytes are left as the upstream gave them.

    :meth:`deallocate` first reads both guards back to the host, ordered after
    every recorded use of the block. A guard byte that is no longer the canary
    means something wrote outside the block: :class:`~numba_streamsafe.core.errors.OutOfBounds`
    is raised and the block stays live, so it can be inspected (and later freed
    with :meth:`discard`). A clean block has its inner bytes filled with the
    ``poison`` byte and joins a FIFO *quarantine* of ``quarantine`` blocks; the
    upstream frees a block only when it leaves the quarantine (the oldest, when
    a newer one arrives and the quarantine is full) or on
    :meth:`release_quarantine`. Until then its address is not handed out
    again, so a stray use of the freed block reads poison instead of another
    allocation's data, and a use through the library
    (:meth:`preflight`, a recorder) is refused with
    :class:`~numba_streamsafe.core.errors.UseAfterFree`.

    Parameters
    ----------
    upstream : MemoryResource
        Where the outer blocks come from; normally an
        :class:`~numba_streamsafe.resources.AsyncResource` (or decorators over one).
    guard_bytes : int
        Width of each guard region. A non-negative multiple of 16, so the
        inner pointer keeps the alignment every CUDA type needs; the default
        256 keeps the 256-byte alignment of ``cuMemAllocAsync``. 0 disables
        the canaries (poison and quarantine remain).
    canary : int
        Byte the guards are filled with. A stray write of this very value is
        not detected.
    poison : int
        Byte the inner range is filled with when the block is freed.
    quarantine : int
        Freed blocks held back from the upstream, oldest freed first. 0 frees
        at once (after poisoning).
    driver : Driver, optional
        Backend that fills and reads the guards; found under ``upstream``
        when omitted. It must provide ``memset_async`` and ``copy_to_host``.

    Notes
    -----
    * Tracking calls (:meth:`preflight`, :meth:`commit`) take inner blocks and
      track the outer block upstream; :meth:`find` returns the inner block for
      an address in its range and None for an address in a guard.
    * :meth:`bytes_outstanding` and :meth:`stats` are the upstream's: they
      count the guards and the quarantined blocks, which the device still holds.
    * :meth:`defer_free` queues the inner block here (no lock, no driver call),
      so a block freed by a finalizer is checked and quarantined like any
      other at the next safe point. A corrupted guard found then is logged and
      raised by the next :meth:`flush` or :meth:`reap_pending`.
    * Every free synchronises the allocation stream (to read the guards), and
      frees are serialised: this is a debugging tool, not a fast path.
    """

    def __init__(self, upstream: MemoryResource, *, guard_bytes: int = 256,
                 canary: int = 0xA5, poison: int = 0xDD, quarantine: int = 16,
                 driver: Any = None) -> None:
        if (not isinstance(guard_bytes, int) or isinstance(guard_bytes, bool)
                or guard_bytes < 0 or guard_bytes % _GUARD_ALIGN):
            raise InvalidArgument(
                f"guard_bytes must be a non-negative multiple of {_GUARD_ALIGN} (so the "
                f"block handed out stays aligned), got {guard_bytes!r}; 256 is the default"
            )
        if not isinstance(quarantine, int) or isinstance(quarantine, bool) or quarantine < 0:
            raise InvalidArgument(
                f"quarantine must be a non-negative int (the freed blocks held back), "
                f"got {quarantine!r}"
            )
        super().__init__(upstream)
        self.guard_bytes = guard_bytes
        self.canary = _check_byte("canary", canary)
        self.poison = _check_byte("poison", poison)
        self.quarantine = quarantine
        drv = driver if driver is not None else getattr(upstream, "driver", None)
        missing = [name for name in ("memset_async", "copy_to_host")
                   if not callable(getattr(drv, name, None))]
        if drv is None or missing:
            raise InvalidArgument(
                f"DebugGuardResource needs a driver with memset_async and copy_to_host to fill "
                f"and check the guards, but {type(drv).__name__} lacks {', '.join(missing)}; "
                "build the stack on CudaDriver or SimDriver, or pass driver="
            )
        self.driver = drv
        self._lock = threading.RLock()
        #: inner ptr -> the live allocation.
        self._live: dict[int, _Guarded] = {}
        self._quarantine: collections.deque[_Guarded] = collections.deque()
        self._violations: list[OutOfBounds] = []

    # ------------------------------------------------------------ allocation
    def allocate(self, nbytes: int, stream: int, tag: str = "", *, stream_owner: Any = None
                 ) -> Block:
        """Allocate ``nbytes`` between two canary-filled guards, ordered on ``stream``.

        Returns
        -------
        Block
            The inner block: ``nbytes`` at ``guard_bytes`` past the upstream
            block's start, with a fresh generation.

        Raises
        ------
        InvalidArgument
            ``nbytes`` is not a positive int.
        DriverError, OutOfMemory, ...
            As the upstream raises; a failure to fill the guards frees the
            upstream block again, so nothing stays allocated.
        """
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes <= 0:
            raise InvalidArgument(
                f"cannot allocate {nbytes!r} bytes for {tag!r}: the size must be a positive int"
            )
        if self._deferred:
            self._drain()
        g = self.guard_bytes
        outer = self.upstream.allocate(nbytes + 2 * g, stream, tag, stream_owner=stream_owner)
        try:
            if g:
                s = outer.stream
                self.driver.memset_async(outer.ptr, self.canary, g, s)
                self.driver.memset_async(outer.ptr + g + nbytes, self.canary, g, s)
                if self.upstream.supports_tracking():
                    # The fills are writes of the block: later uses on other
                    # streams must be ordered after them.
                    self.upstream.commit(((outer, Access.WRITE),), s)
        except BaseException:
            try:
                self.upstream.deallocate(outer)
            except Exception as exc:  # the first error is the one to report
                _log.warning("freeing %s after its guards could not be filled failed: %s",
                             outer.describe(), exc)
            raise
        inner = Block(outer.ptr + g, nbytes, outer.device, outer.stream, tag, next_generation(),
                      outer.epoch, stream_owner=stream_owner)
        with self._lock:
            clash = self._live.get(inner.ptr)
            if clash is not None:
                raise StreamSafeError(
                    f"the upstream returned {outer.describe()}, whose inner range is still live "
                    f"as {clash.inner.describe()}; the upstream resource is corrupt, report this"
                )
            self._live[inner.ptr] = _Guarded(outer, inner)
        return inner

    # ------------------------------------------------------------ validation
    def _entry(self, block: Block, what: str) -> _Guarded:
        """The live allocation whose inner block is ``block``; raises if there is none."""
        entry = self._live.get(block.ptr)
        if entry is not None:
            inner = entry.inner
            if inner is block or (inner.generation == block.generation
                                  and inner.device == block.device
                                  and inner.epoch == block.epoch):
                return entry
        raise self._not_live(block, what)

    def _not_live(self, block: Block, what: str) -> StreamSafeError:
        epoch = self.epoch
        if block.epoch != epoch:
            return StaleContext(
                f"{what}: {block.describe()} was made before the CUDA context was reset "
                f"(epoch {block.epoch}, now {epoch}); it no longer exists. "
                "Allocate it again in the current context."
            )
        if block.device != self.device:
            return InvalidArgument(
                f"{what}: {block.describe()} belongs to device {block.device}, but this "
                f"resource serves device {self.device}; use that device's runtime"
            )
        with self._lock:
            held = any(e.inner is block or (e.inner.ptr == block.ptr
                                            and e.inner.generation == block.generation)
                       for e in self._quarantine)
        if held:
            return UseAfterFree(
                f"{what}: {block.describe()} was freed; DebugGuardResource holds it in "
                f"quarantine with its bytes poisoned ({self.poison:#04x}). Do not use a block "
                "after deallocate; keep the array alive while it is in use."
            )
        entry = self._live.get(block.ptr)
        now = (f"; the address now holds generation {entry.inner.generation}"
               if entry is not None else "")
        return UseAfterFree(
            f"{what}: {block.describe()} is not a live block of this DebugGuardResource "
            f"(already freed{now}, or allocated by another resource). Do not use a block "
            "after deallocate, and free each block through the resource that allocated it."
        )

    def _outer(self, block: Block, what: str) -> Block:
        entry = self._live.get(block.ptr)
        if entry is not None and entry.inner is block:
            return entry.outer
        if block.borrowed:
            return block  # another library's memory, tracked by the upstream: no guards
        return self._entry(block, what).outer

    def _outer_uses(self, uses: Sequence[Use], what: str) -> list[Use]:
        """``uses`` of inner blocks as uses of their outer blocks: the same bytes,
        offset by the front guard."""
        out: list[Use] = []
        for use in uses:
            block, access = use[0], use[1]
            outer = self._outer(block, what)
            shift = block.ptr - outer.ptr
            if len(use) > 2:
                out.append((outer, access, use[2] + shift, use[3] + shift))  # type: ignore[misc]
            else:
                out.append((outer, access, shift, shift + block.nbytes))
        return out

    # ---------------------------------------------------------------- tracking
    def preflight(self, uses: Sequence[Use], stream: int, owner: Any = None) -> None:
        if self._deferred:
            self._drain()
        self.upstream.preflight(self._outer_uses(uses, "preflight"), stream, owner)

    def commit(self, uses: Sequence[Use], stream: int, owner: Any = None) -> None:
        self.upstream.commit(self._outer_uses(uses, "commit"), stream, owner)

    def preflight_foreign(self, uses: Sequence[Use], key: int) -> list[Any]:
        if self._deferred:
            self._drain()
        return self.upstream.preflight_foreign(self._outer_uses(uses, "preflight"), key)

    def commit_foreign(self, uses: Sequence[Use], key: int, event: Any, pool: Any,
                       owner: Any = None) -> None:
        try:
            outers = self._outer_uses(uses, "commit")
        except BaseException:
            pool.release(event)
            raise
        self.upstream.commit_foreign(outers, key, event, pool, owner)

    def block_events(self, block: Block) -> Any:
        """The upstream's ``block_events`` diagnostics of the inner ``block``."""
        outer = self._outer(block, "block_events")
        return self.upstream.block_events(outer)  # type: ignore[attr-defined]

    def find(self, address: int) -> Block | None:
        """The live inner block containing ``address`` (or the upstream's borrowed
        block there); None in a guard, a quarantined block, or memory this
        resource did not allocate."""
        outer = self.upstream.find(address)
        if outer is None or outer.borrowed:
            return outer
        entry = self._live.get(outer.ptr + self.guard_bytes)
        if entry is None or entry.outer.generation != outer.generation:
            return None
        inner = entry.inner
        return inner if inner.ptr <= address < inner.ptr + inner.nbytes else None

    def blocks_on_stream(self, stream: int) -> list[Block]:
        """Live inner blocks allocated on ``stream`` (quarantined ones are not listed)."""
        with self._lock:
            return [e.inner for e in self._live.values() if e.inner.stream == stream]

    @property
    def live_blocks(self) -> list[Block]:
        """The inner blocks handed out and not freed (including ones whose check failed)."""
        with self._lock:
            return [e.inner for e in self._live.values()]

    @property
    def quarantined(self) -> list[Block]:
        """The freed inner blocks still held back, oldest first."""
        with self._lock:
            return [e.inner for e in self._quarantine]

    # ------------------------------------------------------------------ freeing
    def deallocate(self, block: Block) -> None:
        """Check the guards of ``block``, then poison it and put it in quarantine.

        The check is ordered after every recorded use of the block: the
        allocation stream waits for them, reads both guards back and is
        synchronised. When the quarantine overflows, its oldest block is freed
        upstream.

        Raises
        ------
        OutOfBounds
            A guard byte is not the canary: something wrote outside the block.
            The message names the tag, generation, side, first bad offset and
            byte. Nothing is freed; inspect the block, fix the kernel (or run
            it under compute-sanitizer with a
            :class:`~numba_streamsafe.resources.DirectResource`), then free it
            with :meth:`discard`.
        UseAfterFree
            ``block`` is not live here: already freed (quarantined or not), or
            never allocated by this resource. Nothing is changed.
        StaleContext
            ``block`` predates a context reset.
        """
        self._free(block, check=True)

    def discard(self, block: Block) -> None:
        """Free ``block`` without checking its guards (poisoned and quarantined as usual).

        For a block whose :meth:`deallocate` raised
        :class:`~numba_streamsafe.core.errors.OutOfBounds`, once it has been inspected.
        """
        self._free(block, check=False)

    def _free(self, block: Block, check: bool) -> None:
        with self._lock:
            entry = self._entry(block, "deallocate" if check else "discard")
            outer, inner = entry.outer, entry.inner
            stream = outer.stream
            tracks = self.upstream.supports_tracking()
            if tracks:
                # The allocation stream waits for every recorded use of the block.
                self.upstream.preflight(((outer, Access.READ_WRITE),), stream)
            else:
                self.driver.synchronize()  # untracked uses: wait for the whole device
            if check and self.guard_bytes:
                self._check_guards(outer, inner)
            self.driver.memset_async(inner.ptr, self.poison, inner.nbytes, stream)
            if tracks:
                self.upstream.commit(((outer, Access.WRITE),), stream)
            # The block is poisoned: from here on nothing raises for it.
            del self._live[inner.ptr]
            inner.state = BlockState.FREED
            inner.stream_owner = None
            self._quarantine.append(entry)
            self._evict(self.quarantine)

    def _check_guards(self, outer: Block, inner: Block) -> None:
        """Read both guards on the allocation stream; raise OutOfBounds if one is touched."""
        g = self.guard_bytes
        stream = outer.stream
        sides = (("before", outer.ptr, -g),
                 ("after", inner.ptr + inner.nbytes, inner.nbytes))
        bad = []
        for side, ptr, base in sides:
            data = np.frombuffer(self.driver.copy_to_host(ptr, g, stream), dtype=np.uint8)
            wrong = np.flatnonzero(data != self.canary)
            if wrong.size:
                first = int(wrong[0])
                bad.append((side, base + first, int(data[first]), int(wrong.size)))
        if not bad:
            return
        parts = []
        for side, offset, value, count in bad:
            where = (f"{-offset} B before its start" if side == "before"
                     else f"{offset - inner.nbytes} B past its end")
            parts.append(
                f"the guard {side} it has {count} of {g} byte(s) changed, the first at block "
                f"offset {offset} ({where}, address {inner.ptr + offset:#x}) holding "
                f"{value:#04x} instead of the canary {self.canary:#04x}"
            )
        side, offset, value, _ = bad[0]
        exc = OutOfBounds(
            f"out-of-bounds write on block {inner.tag!r} (generation {inner.generation}, "
            f"{inner.nbytes} B at {inner.ptr:#x}, stream {inner.stream:#x}): "
            + "; ".join(parts)
            + ". Something wrote outside the block: check the kernel's index bounds, or run "
            "it under compute-sanitizer. The block was left live for inspection; free it "
            "with discard()."
        )
        exc.block = inner  # type: ignore[attr-defined]
        exc.tag = inner.tag  # type: ignore[attr-defined]
        exc.generation = inner.generation  # type: ignore[attr-defined]
        exc.side = side  # type: ignore[attr-defined]
        exc.offset = offset  # type: ignore[attr-defined]
        exc.value = value  # type: ignore[attr-defined]
        exc.sides = tuple(b[0] for b in bad)  # type: ignore[attr-defined]
        raise exc

    def _evict(self, keep: int) -> None:
        """Free quarantined blocks upstream, oldest first, until ``keep`` remain.

        Caller holds the lock. A driver failure leaves the block at the head of
        the quarantine for the next eviction, logged, and stops.
        """
        q = self._quarantine
        while len(q) > keep:
            entry = q[0]
            try:
                self.upstream.deallocate(entry.outer)
            except UseAfterFree:
                pass  # already gone upstream (a context reset below us)
            except DriverError as exc:
                _log.warning("freeing quarantined %s failed, will retry: %s",
                             entry.inner.describe(), exc)
                return
            q.popleft()

    def release_quarantine(self) -> None:
        """Free every quarantined block upstream, oldest first.

        Raises
        ------
        DriverError
            From the upstream; the blocks not yet freed stay quarantined, so the
            call can be retried.
        """
        with self._lock:
            q = self._quarantine
            while q:
                entry = q[0]
                try:
                    self.upstream.deallocate(entry.outer)
                except UseAfterFree:
                    pass
                q.popleft()

    def retire_stream(self, stream: int, destroy: Callable[[int], None] | None = None) -> None:
        """Make ``stream`` safe to destroy: free the quarantined blocks allocated on it
        (their frees are ordered there), then let the upstream retire it (and
        call ``destroy``)."""
        with self._lock:
            q = self._quarantine
            kept: collections.deque[_Guarded] = collections.deque()
            try:
                while q:
                    entry = q[0]
                    if entry.outer.stream == stream:
                        try:
                            self.upstream.deallocate(entry.outer)
                        except UseAfterFree:
                            pass
                    else:
                        kept.append(entry)
                    q.popleft()
            finally:
                kept.extend(q)
                self._quarantine = kept
        self.upstream.retire_stream(stream, destroy)

    # ----------------------------------------------------------- deferred frees
    def _free_queued(self, block: Block) -> None:
        """Check and free the inner ``block`` that a finalizer queued."""
        self._free(block, check=True)

    def _queued_error(self, block: Block, exc: Exception) -> bool:
        """A queued block with a corrupted guard: logged, kept live, raised at flush."""
        if not isinstance(exc, OutOfBounds):
            return False
        with self._lock:
            self._violations.append(exc)
        _log.error("deferred free: %s", exc)
        return True

    def _raise_violations(self) -> None:
        with self._lock:
            found, self._violations = self._violations, []
        if not found:
            return
        if len(found) == 1:
            raise found[0]
        raise OutOfBounds(
            f"{len(found)} blocks freed by their finalizers had corrupted guards (each was "
            f"logged and left live); the first: {found[0]}"
        ) from found[0]

    def flush(self) -> None:
        """Free every queued block (checking it), then flush the upstream.

        Raises
        ------
        OutOfBounds
            A queued block had a corrupted guard (it was left live).
        """
        super().flush()
        self._raise_violations()

    def reap_pending(self) -> None:
        """Free the queued blocks, then reap the upstream's pending frees.

        Raises
        ------
        OutOfBounds
            As :meth:`flush`.
        """
        super().reap_pending()
        self._raise_violations()

    # ---------------------------------------------------------------- lifecycle
    def reset_context(self) -> None:
        """Reset the upstream, then forget every live, quarantined and queued block."""
        super().reset_context()
        with self._lock:
            entries = list(self._live.values()) + list(self._quarantine)
            self._live.clear()
            self._quarantine.clear()
            self._violations = []
        for entry in entries:
            entry.inner.state = BlockState.FREED
            entry.inner.stream_owner = None
