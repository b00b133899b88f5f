"""LoggingResource: one ``logging`` record per allocate, free and error."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from numba_streamsafe.blocks import Block
from numba_streamsafe.errors import UseAfterFree
from numba_streamsafe.resources.base import MemoryResource, ResourceAdaptor, Use
from numba_streamsafe.resources.deferred import DeferredFrees

__all__ = ["LoggingResource"]


class LoggingResource(ResourceAdaptor):
    """Log every allocation and free of ``upstream``.

    Records carry ``tag``, ``nbytes``, ``stream``, ``generation`` and ``ptr``
    as ``extra`` fields, so handlers can format or filter on them.

    Frees queued by :meth:`defer_free` (a Numba array's finalizer) wait in
    this resource's own queue, since logging takes locks and a finalizer must
    not; they are freed and logged ("free (finalizer) ...") at the next safe
    point: an allocation, a launch, :meth:`flush` or :meth:`reap_pending`.

    Parameters
    ----------
    upstream : MemoryResource
        The resource whose calls are logged; tracking calls are forwarded.
    logger : logging.Logger, optional
        Defaults to the ``numba_streamsafe.alloc`` logger.
    level : int
        Level of the allocate / free records; errors log at ``ERROR``.
    """

    def __init__(self, upstream: MemoryResource, logger: logging.Logger | None = None,
                 level: int = logging.DEBUG) -> None:
        super().__init__(upstream)
        self.logger = logger or logging.getLogger("numba_streamsafe.alloc")
        self.level = level
        self._deferred = DeferredFrees()

    def _extra(self, block: Block) -> dict[str, Any]:
        return {"tag": block.tag, "nbytes": block.nbytes, "stream": block.stream,
                "generation": block.generation, "ptr": block.ptr}

    def allocate(self, nbytes: int, stream: int, tag: str = "", *, stream_owner: Any = None
                 ) -> Block:
        if self._deferred:
            self._drain()
        try:
            block = self.upstream.allocate(nbytes, stream, tag, stream_owner=stream_owner)
        except Exception as exc:
            self.logger.error("allocate %s B for %r on stream %#x failed: %s", nbytes, tag,
                              stream, exc, extra={"tag": tag, "nbytes": nbytes,
                                                  "stream": stream, "generation": None,
                                                  "ptr": None})
            raise
        self.logger.log(self.level, "allocate %s", block.describe(), extra=self._extra(block))
        return block

    def deallocate(self, block: Block) -> None:
        self._free(block, "free")

    def _free(self, block: Block, what: str) -> None:
        try:
            self.upstream.deallocate(block)
        except UseAfterFree as exc:
            # A queued block that is no longer live (freed explicitly, or of a
            # reset context) is dropped by the drain: not an error to log.
            if what == "free":
                self._log_failure(block, what, exc)
            raise
        except Exception as exc:
            self._log_failure(block, what, exc)
            raise
        self.logger.log(self.level, "%s %s", what, block.describe(), extra=self._extra(block))

    def _log_failure(self, block: Block, what: str, exc: Exception) -> None:
        self.logger.error("%s of %s failed: %s", what, block.describe(), exc,
                          extra=self._extra(block))

    # ----------------------------------------------------------- deferred frees
    def defer_free(self, block: Block) -> None:
        """Queue ``block`` to be freed and logged at the next safe point.

        Takes no lock and makes no driver call (finalizer-safe).
        """
        self._deferred.push(block)

    def _drain(self) -> None:
        self._deferred.drain(lambda block: self._free(block, "free (finalizer)"))

    def flush(self) -> None:
        """Free (and log) every queued block, then flush the upstream."""
        self._drain()
        self.upstream.flush()

    def reap_pending(self) -> None:
        """Free (and log) every queued block, then reap the upstream's pending frees."""
        self._drain()
        self.upstream.reap_pending()

    def prepare_launch(self, uses: Sequence[Use], stream: int) -> None:
        if self._deferred:
            self._drain()
        self.upstream.prepare_launch(uses, stream)

    @contextlib.contextmanager
    def hold_frees(self) -> Iterator[None]:
        with self._deferred.hold(), self.upstream.hold_frees():
            yield

    def reset_context(self) -> None:
        """Reset the upstream and forget the queued blocks (they are stale)."""
        self.upstream.reset_context()
        self._deferred.clear()
