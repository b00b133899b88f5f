"""Freed bytes on their way back to the pool (and memory given back when
an allocation runs out), streams retired, a context reset, and the figures
of :class:`~.async_resource.AsyncResource`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from numba_streamsafe._driver.base import CUDA_ERROR_OUT_OF_MEMORY
from numba_streamsafe.core.blocks import Block, BlockState
from numba_streamsafe.core.errors import DriverError, OutOfMemory
from numba_streamsafe.resources.async_state import AsyncState
from numba_streamsafe.resources.base import ResourceStats

_log = logging.getLogger("numba_streamsafe")
_LIVE = BlockState.LIVE
_FREED = BlockState.FREED

__all__ = ["Reaping"]


class Reaping(AsyncState):
    """The reaping, retiring and accounting calls of
    :class:`~.async_resource.AsyncResource` (which holds the state)."""

    def bytes_outstanding(self) -> int:
        with self._lock:
            return self._table.live_bytes + self._pending.nbytes + self._kept.nbytes

    @property
    def live_bytes(self) -> int:
        return self._table.live_bytes

    @property
    def pending_bytes(self) -> int:
        """Bytes freed by their owner and not yet back in the pool (queued
        frees and blocks kept for reuse)."""
        return self._pending.nbytes + self._kept.nbytes

    def pending_per_stream(self) -> dict[int, int]:
        """Bytes freed and not yet back in the pool (queued frees and kept
        blocks), per stream."""
        with self._lock:
            out = self._pending.per_stream()
            for s, n in self._kept.per_stream().items():
                out[s] = out.get(s, 0) + n
            return out

    def reap_pending(self) -> None:
        self._drain()
        with self._reap_lock:
            with self._lock:
                if self._kept:
                    self._kept.free_oldest(0, self._free, self._pending)
                drained = self._pending.take_all()
                self.marks.forget_unused()
            self._sync_pending(drained)

    def _sync_pending(self, drained: dict[int, list[Any]]) -> None:
        """Synchronise the streams of ``drained`` pending frees and stop counting
        them; caller holds the reap lock. On a failure the rest stays pending."""
        items = list(drained.items())
        for i, (stream, (nbytes, _owner, _keep)) in enumerate(items):
            try:
                self.driver.stream_synchronize(stream)
            except BaseException:
                with self._lock:
                    self._pending.put_back(items[i:])
                raise
            with self._lock:
                self._pending.release(nbytes)

    def reap_completed(self) -> None:
        """Release the pending bytes of streams that have gone idle, without waiting.

        An idle stream (``cuStreamQuery``) has run every free queued on it.
        Called every few allocations, so that pending bytes stay bounded in a
        program that never reaps. Does nothing while another thread reaps or
        retires a stream.
        """
        if not self._reap_lock.acquire(blocking=False):
            return
        try:
            with self._lock:
                streams = list(self._pending.slots)
            for stream in streams:
                try:
                    idle = self.driver.stream_query(stream)
                except DriverError:
                    continue
                if idle:
                    with self._lock:
                        slot = self._pending.release_stream(stream)
                    del slot  # what it kept alive goes outside the lock
        finally:
            self._reap_lock.release()

    def find(self, address: int) -> Block | None:
        with self._lock:
            return self._table.find(address)

    def retire_stream(self, stream: int, destroy: Callable[[int], None] | None = None) -> None:
        """End ``stream``'s history, then call ``destroy(stream)`` if given
        (``DeviceRuntime.destroy_stream`` passes the driver's destroy).

        Runs queued frees, records the event of the stream's open mark (so
        uses recorded on the stream can still be waited for once it is gone),
        synchronises the stream's pending frees (a destroyed stream can no
        longer be synchronised), and renames the stream in every mark and read
        that refers to it and forgets which marks it waited for: a new stream
        that gets the same handle inherits nothing. The reap lock is held
        throughout, ``destroy`` included, so no concurrent reap synchronises the
        stream after it is gone. If ``destroy`` raises, the history is kept.
        """
        self._drain()
        with self._reap_lock:
            with self._lock:
                self.marks.retire(stream)
                if self._kept.has_stream(stream):
                    self._kept.free_stream(stream, self._free, self._pending)
                pending = self._pending.take(stream)
            self._sync_pending(pending)
            with self._lock:
                # Under the lock: no launch sees the handle between the destroy
                # and the forgetting. A failed destroy leaves the history as it was.
                if destroy is not None:
                    destroy(stream)
                self._table.forget_stream(stream)

    def blocks_on_stream(self, stream: int) -> list[Block]:
        """Live blocks allocated on ``stream``."""
        with self._lock:
            return self._table.on_stream(stream)

    def stats(self) -> ResourceStats:
        with self._lock:
            return ResourceStats(
                live_bytes=self._table.live_bytes,
                pending_bytes=self._pending.nbytes + self._kept.nbytes,
                peak_bytes=self._peak,
                live_blocks=self._table.blocks,
                allocations=self._allocations,
                frees=self._frees,
                deferred=len(self._deferred),
                events_in_use=self.events.in_use,
                events_idle=self.events.idle,
            )

    def counters(self) -> dict[str, int]:
        """The figures behind :func:`numba_streamsafe.memory_stats` (see there)."""
        with self._lock:
            kept = self._kept.nbytes
            return {
                "live_bytes": self._table.live_bytes,
                "live_peak": self._live_peak,
                "live_blocks": self._table.blocks,
                "allocated_bytes": self._allocated_bytes,
                "freed_bytes": self._freed_bytes,
                "allocations": self._allocations,
                "frees": self._frees,
                "pending_bytes": self._pending.nbytes,
                "kept_bytes": kept,
                "outstanding_peak": self._peak,
                "deferred_frees": len(self._deferred),
                "waits": self.marks.waits,
                "events_recorded": self.events.recorded,
                "events_in_use": self.events.in_use,
                "same_stream_uses": self.marks.same_stream,
            }

    def reset_peaks(self) -> None:
        """Start the peak figures again from the current ones."""
        with self._lock:
            self._live_peak = self._table.live_bytes
            self._peak = self._table.live_bytes + self._pending.nbytes + self._kept.nbytes

    def _retry_after_oom(self, nbytes: int, stream: int) -> int:
        """Out of memory: give back everything we can, then try once more."""
        self.flush()
        try:
            self.reap_pending()
        except DriverError:
            pass
        self._trim_quietly()
        try:
            return self._alloc(nbytes, stream)
        except DriverError as exc:
            if exc.code != CUDA_ERROR_OUT_OF_MEMORY:
                raise
            # The failed attempt can leave the pool holding what it reserved:
            # hand it back, so the caller's next (smaller) allocation can work.
            self._trim_quietly()
            with self._lock:
                live = self._table.live_bytes
                pending = self._pending.nbytes + self._kept.nbytes
            raise OutOfMemory(nbytes, live, pending, str(exc)) from None

    def _trim_quietly(self) -> None:
        try:
            self.driver.pool_trim(0)
        except DriverError as exc:
            _log.warning("pool trim after out-of-memory failed: %s", exc)

    def _alloc_legacy(self, nbytes: int, stream: int) -> int:
        """IPC mode: an exportable ``cuMemAlloc`` allocation (ready at once)."""
        return self.driver.alloc(nbytes)

    def _alloc_upstream(self, nbytes: int, stream: int) -> int:
        """An allocation of the upstream, with this device's context current (an
        RMM resource of one device allocates on the current device)."""
        with self.driver.activate():
            return self.options.upstream.allocate(nbytes, stream)

    def _free_upstream(self, ptr: int, stream: int) -> None:
        """The upstream's give-back, with this device's context current."""
        with self.driver.activate():
            self.options.upstream.deallocate(ptr, stream)

    def _free_legacy(self, ptr: int, stream: int) -> None:
        """IPC mode: free after everything queued on ``stream`` (the block's uses,
        which its waits ordered there) is done: ``cuMemFree`` is not stream-ordered."""
        self.driver.stream_synchronize(stream)
        self.driver.free(ptr)

    def _make_room(self, nbytes: int) -> bool:
        """Free the oldest kept blocks until ``nbytes`` more fit under
        ``reuse_bytes``; False if a free failed. Caller holds the lock."""
        try:
            self._kept.free_oldest(self.reuse_bytes - nbytes, self._free,
                                   self._pending)
        except DriverError:
            return False
        return True

    # ---------------------------------------------------------------- lifecycle
    @property
    def epoch(self) -> int:
        return self._table.epoch

    def reset_context(self) -> None:
        """Free every live block synchronously, forget all state and advance the epoch.

        Borrowed blocks are forgotten, not freed (their memory is their
        producer's); an upstream's blocks go back to it. Driver errors are ignored:
        when the context is already gone, so is its memory. Handles from before are refused with
        :class:`~numba_streamsafe.core.errors.StaleContext`.
        """
        with self._lock:
            entries = self._table.clear()
            for entry in entries:
                entry.release(self.marks)
            self.marks.clear()
            self._pending.clear()
            kept = self._kept.clear()
            self._deferred.clear()
        for entry in entries:
            entry.block.state = BlockState.FREED
            entry.block.stream_owner = None
            entry.block.keep = None
        owned = [entry.block.ptr for entry in entries if not entry.block.borrowed]
        upstream = self.options.upstream
        for ptr in owned + kept:
            try:
                if upstream is None:
                    self.driver.free(ptr)
                else:  # the upstream's memory goes back to it (its stream order is gone)
                    upstream.deallocate(ptr, 0)
            except DriverError:
                pass
            except Exception as exc:  # the upstream's own error: its context is gone too
                _log.warning("%s: giving back %#x at a context reset failed: %s",
                             upstream.name if upstream is not None else "driver", ptr, exc)
        self.events.forget()
