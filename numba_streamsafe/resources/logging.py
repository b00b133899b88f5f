"""LoggingResource: one ``logging`` record per allocate, free and error."""

from __future__ import annotations

import logging
from typing import Any

from numba_streamsafe.blocks import Block
from numba_streamsafe.resources.base import MemoryResource, ResourceAdaptor

__all__ = ["LoggingResource"]


class LoggingResource(ResourceAdaptor):
    """Log every allocation and free of ``upstream``.

    Records carry ``tag``, ``nbytes``, ``stream``, ``generation`` and ``ptr``
    as ``extra`` fields, so handlers can format or filter on them.

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
        try:
            self.upstream.deallocate(block)
        except Exception as exc:
            self.logger.error("free of %s failed: %s", block.describe(), exc,
                              extra=self._extra(block))
            raise
        self.logger.log(self.level, "free %s", block.describe(), extra=self._extra(block))
