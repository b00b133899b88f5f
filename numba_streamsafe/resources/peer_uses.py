"""Uses of a device's blocks by streams of other devices: the marks they
wait for and the events they leave (:class:`~.async_resource.AsyncResource`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numba_streamsafe.resources.tracking.rules as rules
from numba_streamsafe.core.blocks import Block, BlockState
from numba_streamsafe.resources.async_state import AsyncState
from numba_streamsafe.resources.base import Use
from numba_streamsafe.resources.tracking.marks import EventPool, ForeignMark, Mark

_LIVE = BlockState.LIVE
_FREED = BlockState.FREED

__all__ = ["PeerUses"]


class PeerUses(AsyncState):
    """The calls of :class:`~.async_resource.AsyncResource` that order uses by
    other devices' streams (it holds the state)."""

    def preflight_foreign(self, uses: Sequence[Use], key: int) -> list[Mark]:
        """The marks a stream of another device must wait for before ``uses``
        (blocks of this device), sealed, each held (one more use) until
        :meth:`release_foreign`: their events stay recorded while the caller
        queues the waits on its stream (``cuStreamWaitEvent`` takes an event of
        another device). ``key`` is the stream's key in this device's state
        (``DeviceRuntime.stream_key``): uses recorded under it need no wait.

        Nothing is held when this raises (a block freed or stale).
        """
        if self._deferred:
            self._drain()
        with self._lock:
            held: list[Mark] = []
            try:
                entries = rules.resolve(self._table, uses, "preflight")
                for mark in rules.needed_locked(entries, key):
                    if isinstance(mark, ForeignMark) and mark.stale:
                        continue
                    if not any(m is mark for m in held):
                        self.marks.seal(mark)
                        mark.refs += 1
                        held.append(mark)
            except BaseException:
                for mark in held:
                    self.marks.release(mark)
                raise
            return held

    def release_foreign(self, held: Sequence[Mark]) -> None:
        """Drop the holds of :meth:`preflight_foreign` (the waits are queued)."""
        with self._lock:
            for mark in held:
                self.marks.release(mark)

    def commit_foreign(self, uses: Sequence[Use], key: int, event: Any, pool: EventPool,
                       owner: Any = None) -> None:
        """Record ``uses`` of this device's blocks by a stream of another device,
        known here as ``key``, whose launch ``event`` (of ``pool``, that device's
        event pool) was recorded after the work: later uses and the blocks'
        frees on this device wait for it. ``owner`` (the stream's object) is kept
        alive while a use refers to it. On an error the event goes back to ``pool``.
        """
        try:
            with self._lock:
                entries = rules.resolve(self._table, uses, "commit")
                mark = ForeignMark(key, owner, event, pool)
                rules.commit_locked(self.marks, entries, key, None, False, False, mark)
        except BaseException:
            pool.release(event)
            raise
        if not mark.refs:
            mark.give_back()

    def block_events(self, block: Block) -> tuple[Mark, dict[int, Mark]]:
        """Diagnostics: ``(last_write_mark, {read_stream: read_mark})`` of a live
        block; of a block whose ranges were used apart (:meth:`block_ranges`),
        its newest write mark and the newest read mark of each stream."""
        with self._lock:
            return self._table.entry(block, "block_events").newest()  # type: ignore[no-any-return]

    def block_ranges(self, block: Block) -> tuple[tuple[int, int, dict[int, Mark],
                                                        dict[int, Mark]], ...]:
        """Diagnostics: the dependency state of a live block by byte range:
        ``(lo, hi, {stream: write mark}, {stream: read mark})`` per range, in
        order (one range while every use covered the whole block)."""
        with self._lock:
            return self._table.entry(block, "block_ranges").uses()  # type: ignore[no-any-return]
