"""LoggingResource: one ``logging`` record per allocate, free and error."""

from __future__ import annotations

import logging
from typing import Any

from numba_streamsafe.core.blocks import Block
from numba_streamsafe.core.errors import UseAfterFree
from numba_streamsafe.resources.base import DeferringAdaptor, MemoryResource

__all__ = ["LoggingResource"]


class LoggingResource(DeferringAdaptor):
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

    def _free_queued(self, block: Block) -> None:
        self._free(block, "free (finalizer)")
