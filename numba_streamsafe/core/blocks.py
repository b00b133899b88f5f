"""Blocks: the unit of allocation and of dependency tracking."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = ["Block", "BlockId", "BlockState", "Generation", "next_generation"]

#: A generation number. Every allocation gets a fresh one, so a handle to a
#: freed block never matches the block that later reuses its address.
Generation = int

_generations = itertools.count(1)


def next_generation() -> Generation:
    """Return a process-wide unique, increasing generation.

    ``itertools.count`` hands out each value once even across threads: its
    ``__next__`` runs in C without releasing the GIL.
    """
    return next(_generations)


#: :func:`next_generation` without its Python frame (the counter's C
#: ``__next__``), for the allocation hot path.
next_generation_fast = _generations.__next__


class BlockId(NamedTuple):
    """Full identity of a block: address, generation and device ordinal.

    Attributes
    ----------
    ptr : int
        Device address of the block's first byte.
    generation : Generation
        Unique per allocation (an address handed out again gets a new one).
    device : int
        Device ordinal.
    """

    ptr: int
    generation: Generation
    device: int


class BlockState(enum.Enum):
    """Life cycle of a block."""

    LIVE = "live"
    #: The free is queued on the alloc stream; the bytes count as pending.
    FREED = "freed"


@dataclass(eq=False, slots=True)
class Block:
    """A device allocation handed out by a memory resource.

    Attributes
    ----------
    ptr : int
        Device address of the first byte.
    nbytes : int
        Size in bytes.
    device : int
        Device ordinal.
    stream : int
        Handle of the stream the allocation (and later the free) is ordered on.
    tag : str
        Caller's label, for logs and error messages.
    generation : Generation
        Unique per allocation; guards against address reuse.
    epoch : int
        Context epoch of the owning runtime when the block was made.
    state : BlockState
        ``LIVE`` until :meth:`MemoryResource.deallocate` succeeds.
    borrowed : bool
        True for memory another library allocated, tracked by the resource
        while a producer lends it (``AsyncResource.borrow``): never freed by
        the library, only released.
    keep : object
        Of a borrowed block: what keeps the memory alive (the producer's
        objects) until the release is complete; None otherwise.
    allocated, freed : tuple
        The user's stacks where the block was allocated (or borrowed) and
        where its free was asked for, as
        :func:`~numba_streamsafe.core.sites.capture_stack` captures them,
        kept only where races are reported; empty otherwise.
    """

    ptr: int
    nbytes: int
    device: int
    stream: int
    tag: str
    generation: Generation
    epoch: int = 0
    state: BlockState = BlockState.LIVE
    #: Keeps the alloc stream's owning object alive until the free is queued.
    stream_owner: Any = field(default=None, repr=False)
    borrowed: bool = False
    keep: Any = field(default=None, repr=False)
    allocated: tuple = field(default=(), repr=False)
    freed: tuple = field(default=(), repr=False)

    @property
    def id(self) -> BlockId:
        return BlockId(self.ptr, self.generation, self.device)

    def __contains__(self, address: int) -> bool:
        return self.ptr <= address < self.ptr + self.nbytes

    def describe(self) -> str:
        return (
            f"{'borrowed ' if self.borrowed else ''}block {self.tag!r} at {self.ptr:#x} "
            f"({self.nbytes} B, generation "
            f"{self.generation}, stream {self.stream:#x}, device {self.device})"
        )


def check_block(obj: Any, what: str) -> Block:
    """``obj`` if it is a :class:`Block`, else
    :class:`~numba_streamsafe.core.errors.InvalidArgument`."""
    if not isinstance(obj, Block):
        from numba_streamsafe.core.errors import InvalidArgument

        raise InvalidArgument(
            f"{what}: {obj!r} ({type(obj).__name__}) is not a Block; pass the Block that "
            "allocate() returned (numba_streamsafe.block_of(array) finds an array's block)"
        )
    return obj


def positive_size(nbytes: Any, tag: str) -> int:
    """``nbytes`` as a positive Python int (NumPy integers accepted), else
    :class:`~numba_streamsafe.core.errors.InvalidArgument`."""
    import operator

    from numba_streamsafe.core.errors import InvalidArgument

    value = None
    if not isinstance(nbytes, (bool, float)) and type(nbytes).__name__ != "bool_":
        try:
            value = operator.index(nbytes)
        except TypeError:
            value = None
    if value is None or value <= 0:
        raise InvalidArgument(
            f"cannot allocate {nbytes!r} bytes for {tag!r}: the size must be a positive int"
        )
    return int(value)


def check_int(name: str, value: Any, low: int, high: int | None = None, what: str = "") -> None:
    """Refuse ``value`` unless it is an int (not a bool) from ``low`` to ``high``
    (no upper bound when None), with :class:`~numba_streamsafe.core.errors.InvalidArgument`
    naming ``name``; ``what`` says what the value means."""
    if (not isinstance(value, int) or isinstance(value, bool) or value < low
            or (high is not None and value > high)):
        from numba_streamsafe.core.errors import InvalidArgument

        span = f"from {low} to {high}" if high is not None else f">= {low}"
        raise InvalidArgument(f"{name} must be an int {span}{what}, got {value!r}")
