"""The launch protocol: preflight, the work, commit.

Every ordered operation (a tracked kernel, a tracked copy or memset, a launch
fenced by hand through :class:`~numba_streamsafe.LaunchRecorder`) goes through
these steps on one stream:

1. collect its buffers as :class:`Uses`: tracked blocks with their access
   (merged per block with the access lattice), memory no resource tracks, and
   producer streams of foreign arrays;
2. :func:`preflight`: refuse untracked memory in strict mode, then queue on
   the stream every wait the uses need (``MemoryResource.preflight``) and the
   waits for the producer streams; nothing is queued when it raises;
3. queue the work itself;
4. :func:`trace` (only a checking driver does anything) and :func:`commit`:
   record the uses against the stream's current mark
   (``MemoryResource.commit``).

The module knows nothing of Numba; the Numba layer wraps a launch in
:func:`fenced`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from numba_streamsafe.access import Access
from numba_streamsafe.blocks import Block
from numba_streamsafe.errors import StreamMisuse

if TYPE_CHECKING:
    from numba_streamsafe.runtime import DeviceRuntime

__all__ = ["Uses", "single", "preflight", "commit", "trace", "fenced", "refuse_untracked"]

T = TypeVar("T")


class Uses:
    """The buffers of one launch.

    ``blocks`` holds one ``(block, access)`` per allocation: a second use of the
    same block (the same object, or another handle of the same allocation)
    merges into the first with the access lattice (``READ | WRITE`` is
    ``READ_WRITE``). ``untracked`` names memory no resource tracks;
    ``producers`` are streams the launch must wait for as a whole (the CUDA
    Array Interface rule for a foreign array that names its stream).
    """

    __slots__ = ("blocks", "untracked", "producers")

    def __init__(self) -> None:
        self.blocks: list[tuple[Block, Access]] = []
        self.untracked: list[str] | None = None
        self.producers: list[int] | None = None

    def add(self, block: Block | None, access: Access, what: str) -> None:
        """Add a use of ``block`` (None: memory no resource tracks, named ``what``)."""
        if block is None:
            if self.untracked is None:
                self.untracked = []
            self.untracked.append(what)
            return
        blocks = self.blocks
        for i, (b, a) in enumerate(blocks):
            if b is block or (b.ptr == block.ptr and b.generation == block.generation
                              and b.device == block.device):
                blocks[i] = (b, Access(a | access))
                return
        blocks.append((block, access))

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


def single(block: Block | None, access: Access, what: str) -> Uses:
    """:class:`Uses` of one buffer."""
    uses = Uses()
    uses.add(block, access, what)
    return uses


def refuse_untracked(what: list[str], remedy: str) -> StreamMisuse:
    """The strict-mode error for memory no resource tracks; ``remedy`` ends the advice."""
    return StreamMisuse(
        f"{', '.join(what)}: memory not allocated by numba_streamsafe cannot be ordered in "
        "strict mode. Allocate it through numba_streamsafe (or set "
        f"NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe), {remedy}"
    )


def preflight(rt: DeviceRuntime, stream: int, uses: Uses, strict: bool, owner: object = None,
              remedy: str = "or launch in permissive mode") -> None:
    """Queue on ``stream`` every wait that ``uses`` need, before the work is queued.

    ``owner`` is the stream's owning object (None for a raw handle): it stays
    alive while the marks the stream waited for are in use.

    Raises
    ------
    StreamMisuse
        Untracked memory when ``strict`` (``remedy`` ends the advice), or a
        resource that cannot track. Nothing is queued.
    UseAfterFree, StaleContext
        A block was freed, or made before a context reset. Nothing is queued.
    """
    if uses.untracked and strict:
        raise refuse_untracked(uses.untracked, remedy)
    if uses.blocks:
        rt.resource.preflight(uses.blocks, stream, owner)
    if uses.producers:
        for producer in uses.producers:
            rt.order_after_stream(stream, producer)


def commit(rt: DeviceRuntime, stream: int, uses: Uses, owner: object = None) -> None:
    """Record ``uses`` on ``stream`` after the work is queued: later uses on other
    streams wait for it, and the blocks' frees too."""
    if uses.blocks:
        rt.resource.commit(uses.blocks, stream, owner)


def trace(rt: DeviceRuntime, stream: int, uses: Uses, label: str) -> None:
    """Tell a checking driver (the simulated one) what the work on ``stream`` touches."""
    driver = rt.driver
    if driver.traces_accesses:
        driver.trace_access(stream, [(b.ptr, b.nbytes, a) for b, a in uses.blocks], label)


def fenced(rt: DeviceRuntime, stream: int, uses: Uses, label: str, strict: bool,
           owner: object, work: Callable[..., T], *args: object, tracking: bool = True) -> T:
    """Run ``work(*args)``, which queues one launch or copy on ``stream``, between
    :func:`preflight` and :func:`commit`, and :func:`trace` it.

    ``owner`` (the user's stream object, or None) is kept alive while recorded
    uses refer to the stream. With ``tracking`` False the work runs unfenced
    (the Numba layer's switch that shows races); a checking driver is told
    about the accesses either way.

    The three steps are written out here rather than called: this runs on every
    tracked launch and copy.

    Raises
    ------
    StreamMisuse
        Untracked memory when ``strict``; nothing is queued.
    """
    blocks = uses.blocks
    driver = rt.driver
    if not tracking:
        result = work(*args)
        if driver.traces_accesses:
            driver.trace_access(stream, [(b.ptr, b.nbytes, a) for b, a in blocks], label)
        return result
    if uses.untracked and strict:
        raise refuse_untracked(uses.untracked, _REMEDY)
    resource = rt.resource
    if blocks:
        resource.preflight(blocks, stream, owner)
    if uses.producers:
        for producer in uses.producers:
            rt.order_after_stream(stream, producer)
    result = work(*args)
    if driver.traces_accesses:
        driver.trace_access(stream, [(b.ptr, b.nbytes, a) for b, a in blocks], label)
    if blocks:
        resource.commit(blocks, stream, owner)
    return result


_REMEDY = ("pass mode='permissive', or allow_foreign=True for arrays whose producer names its "
           "stream")
