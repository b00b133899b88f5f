"""BudgetResource: a byte limit on what a resource stack holds."""

from __future__ import annotations

import numbers
import threading
from typing import Any

from numba_streamsafe.core.blocks import Block
from numba_streamsafe.core.errors import InvalidArgument, InvalidArgumentType, OutOfBudget
from numba_streamsafe.resources.base import MemoryResource, ResourceAdaptor

__all__ = ["BudgetResource"]


class BudgetResource(ResourceAdaptor):
    """Refuse allocations that would take ``bytes_outstanding()`` past ``limit``.

    Pending frees count against the limit until reaped; before refusing, the
    resource reaps them once.

    Parameters
    ----------
    upstream : MemoryResource
    limit : int
        Bytes, positive: a Python int or a NumPy integer (kept as an int).
        Not a bool, a float (not even a whole one) or a string.

    Raises
    ------
    InvalidArgumentType
        At construction, a ``limit`` that is not an int.
    InvalidArgument
        At construction, a ``limit`` below 1.
    OutOfBudget
        On allocation, with the bytes requested, the bytes remaining and the limit.
    """

    def __init__(self, upstream: MemoryResource, limit: int) -> None:
        # numbers.Integral covers int and NumPy's integers; bool is refused
        # although it is an int (True would be a budget of one byte).
        value: object = limit  # checked at run time whatever the annotation says
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise InvalidArgumentType(
                f"budget limit must be an int number of bytes, got {type(limit).__name__} "
                f"{limit!r}; pass for example limit=1 << 30, converting with int() where needed"
            )
        if value <= 0:
            raise InvalidArgument(
                f"budget limit must be a positive number of bytes, got {limit}; pass at least 1"
            )
        super().__init__(upstream)
        self.limit: int = int(value)
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
