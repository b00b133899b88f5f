"""BudgetResource: a byte limit on what a resource stack holds."""

from __future__ import annotations

import threading
from typing import Any

from numba_streamsafe.blocks import Block
from numba_streamsafe.errors import InvalidArgument, OutOfBudget
from numba_streamsafe.resources.base import MemoryResource, ResourceAdaptor

__all__ = ["BudgetResource"]


class BudgetResource(ResourceAdaptor):
    """Refuse allocations that would take ``bytes_outstanding()`` past ``limit``.

    Pending frees count against the limit until reaped; before refusing, the
    resource reaps them once.

    Raises
    ------
    OutOfBudget
        With the bytes requested, the bytes remaining and the limit.
    """

    def __init__(self, upstream: MemoryResource, limit: int) -> None:
        if limit <= 0:
            raise InvalidArgument(f"budget limit must be positive, got {limit}")
        super().__init__(upstream)
        self.limit = limit
        self._lock = threading.Lock()

    def allocate(self, nbytes: int, stream: int, tag: str = "", *, stream_owner: Any = None
                 ) -> Block:
        if not isinstance(nbytes, int) or isinstance(nbytes, bool):
            # Checked before the arithmetic below, which would raise TypeError.
            raise InvalidArgument(
                f"cannot allocate {nbytes!r} bytes for {tag!r}: the size must be a positive int"
            )
        with self._lock:
            if self.upstream.bytes_outstanding() + nbytes > self.limit:
                self.upstream.reap_pending()
                remaining = self.limit - self.upstream.bytes_outstanding()
                if nbytes > remaining:
                    raise OutOfBudget(nbytes, remaining, self.limit)
            return self.upstream.allocate(nbytes, stream, tag, stream_owner=stream_owner)

    @property
    def remaining(self) -> int:
        """Bytes that can still be allocated without reaping."""
        return self.limit - self.upstream.bytes_outstanding()
