"""The uses of one launch or copy: the spans of blocks it touches, with their
accesses, the memory no resource tracks and the streams it must follow.

The Numba layer resolves a launch's arguments into :class:`Uses` once; the
protocol (:mod:`numba_streamsafe.protocol`) fences the work with them.
"""

from __future__ import annotations

from numba_streamsafe.core import tracehook
from numba_streamsafe.core.access import Access
from numba_streamsafe.core.blocks import Block
from numba_streamsafe.core.hazards import NUMBA, TRACKED

__all__ = ["Uses", "CopyUses", "PlainUses"]


class Uses:
    """The buffers of one launch.

    ``blocks`` holds one ``(block, access, lo, hi)`` per span of an allocation
    used: the bytes ``lo .. hi - 1`` of ``block`` (offsets into it; a view's
    extent, the whole block for a whole array). A second use of the same span
    of the same block (the same object, or another handle of the same
    allocation) merges into the first with the access lattice (``READ |
    WRITE`` is ``READ_WRITE``); other spans of the block stay apart.
    ``untracked`` names memory no resource tracks; ``producers`` are streams
    the launch must wait for as a whole (the CUDA Array Interface rule for a
    foreign array that names its stream).
    """

    __slots__ = ("blocks", "untracked", "producers", "names", "actual")
    #: Whether the work is a copy, which reaches another device's memory
    #: without peer access (:class:`CopyUses`).
    copy = False
    #: Who queued the work, as the race reports name it (and write its fix):
    #: this library's tracked work (:class:`PlainUses`: plain Numba's).
    library = TRACKED

    def __init__(self) -> None:
        self.blocks: list[tuple[Block, Access, int, int]] = []
        self.untracked: list[str] | None = None
        self.producers: list[int] | None = None
        #: The argument names of ``blocks``, kept only while a trace records
        #: or a checking driver reports races.
        self.names: list[str] | None = [] if tracehook.keep_names else None
        #: For a checking driver: ``(ptr, nbytes, access)`` of what the work
        #: really touches, when that is more than ``blocks`` declare (a
        #: kernel's inferred accesses); None: ``blocks``.
        self.actual: list[tuple[int, int, Access]] | None = None

    def add(self, block: Block | None, access: Access, what: str, lo: int = 0,
            hi: int | None = None) -> None:
        """Add a use of the bytes ``lo .. hi - 1`` of ``block`` (default: all of
        it; None: memory no resource tracks, named ``what``)."""
        if block is None:
            if self.untracked is None:
                self.untracked = []
            self.untracked.append(what)
            return
        if hi is None:
            hi = block.nbytes
        blocks = self.blocks
        for i, (b, a, start, end) in enumerate(blocks):
            if start == lo and end == hi and (b is block or (
                    b.ptr == block.ptr and b.generation == block.generation
                    and b.device == block.device)):
                blocks[i] = (b, Access(a | access), lo, hi)
                if self.names is not None:
                    self.names[i] += "+" + what
                return
        blocks.append((block, access, lo, hi))
        if self.names is not None:
            self.names.append(what)

    def add_producer(self, stream: int) -> None:
        """Order the launch after everything queued so far on ``stream``."""
        if self.producers is None:
            self.producers = []
        if stream not in self.producers:
            self.producers.append(stream)

    def __bool__(self) -> bool:
        return bool(self.blocks or self.untracked or self.producers)

    def __len__(self) -> int:
        return len(self.blocks)


class CopyUses(Uses):
    """The buffers of a copy: blocks of another device need no peer access."""

    __slots__ = ()
    copy = True


class PlainUses(Uses):
    """The buffers of a plain Numba kernel's launch (transparent mode): the
    race reports advise an event for them, not an annotation."""

    __slots__ = ()
    library = NUMBA
