"""The debug guard's queued frees, their violations, and its context reset
(a part of :class:`~.guard.DebugGuardResource`)."""

from __future__ import annotations

import logging
from typing import Any

from numba_streamsafe.core.blocks import Block, BlockState
from numba_streamsafe.core.errors import (
    OutOfBounds,
)
from numba_streamsafe.resources.base import DeferringAdaptor, MemoryResource

__all__ = ["GuardQueue"]

_log = logging.getLogger("numba_streamsafe")


class GuardQueue(DeferringAdaptor):
    """The queued-free and reset calls of :class:`~.guard.DebugGuardResource`
    (which holds the state)."""

    # The state and the calls these methods use (for type checkers).
    upstream: MemoryResource
    _lock: Any
    _live: Any
    _quarantine: Any
    _violations: Any
    _free: Any

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
