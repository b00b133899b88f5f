"""LaunchRecorder: preflight and commit around one launch or copy."""

from __future__ import annotations

import enum
import reprlib
import warnings
from typing import TYPE_CHECKING, Any

from numba_streamsafe.access import Access, as_access
from numba_streamsafe.blocks import Block
from numba_streamsafe.errors import InvalidArgument, InvalidArgumentType, StreamMisuse

if TYPE_CHECKING:
    from numba_streamsafe.runtime import DeviceRuntime

__all__ = ["LaunchRecorder", "RecorderMode", "UncommittedLaunchWarning"]


class RecorderMode(str, enum.Enum):
    """What a recorder does with memory that no resource of the runtime tracks."""

    #: Refuse it at preflight: every buffer must be tracked.
    STRICT = "strict"
    #: Skip it: no ordering is applied to that buffer.
    PERMISSIVE = "permissive"


def refuse_untracked(what: list[str], remedy: str) -> StreamMisuse:
    """The strict-mode error for memory no resource tracks; ``remedy`` ends the advice."""
    return StreamMisuse(
        f"{', '.join(what)}: memory not allocated by numba_streamsafe cannot be ordered in "
        "strict mode. Allocate it through numba_streamsafe (or set "
        f"NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe), {remedy}"
    )


class UncommittedLaunchWarning(RuntimeWarning):
    """A recorder with registered uses was dropped without :meth:`LaunchRecorder.commit`."""


class _Phase(enum.Enum):
    RECORDING = 0
    PREFLIGHTED = 1
    COMMITTED = 2


class LaunchRecorder:
    """Collect the buffers of one launch, then fence it.

    Use it in three steps::

        rec = runtime.recorder(stream)
        rec.read(src_block); rec.write(dst_block)
        rec.preflight()      # queue cross-stream waits, before any work
        ...                  # enqueue the kernel or copy on ``stream``
        rec.commit()         # record one event after it, for every block

    Registrations of one block merge by ``(ptr, generation, device)`` with the
    access lattice, so ``read(b); write(b)`` is one read-write use.

    Parameters
    ----------
    runtime : DeviceRuntime
        Runtime whose resource tracks the blocks.
    stream : int
        Handle of the stream the launch is queued on.
    mode : RecorderMode or str
        Policy for untracked memory (registered as ``None``).
    """

    __slots__ = ("runtime", "stream", "mode", "_uses", "_untracked", "_producers", "_phase")

    def __init__(self, runtime: DeviceRuntime, stream: int,
                 mode: RecorderMode | str = RecorderMode.STRICT) -> None:
        self.runtime = runtime
        self.stream = stream
        self.mode = mode if mode.__class__ is RecorderMode else RecorderMode(mode)
        self._uses: dict[tuple[int, int, int], list[Any]] = {}
        self._untracked: list[str] = []
        self._producers: list[int] = []
        self._phase = _Phase.RECORDING

    # ------------------------------------------------------------ registration
    def use(self, block: Block | None, access: Access | str, what: str = "buffer") -> None:
        """Register ``access`` to ``block``; ``None`` marks memory no resource tracks.

        Parameters
        ----------
        block : Block or None
            A block of the runtime's resource (``runtime.allocate``,
            :func:`numba_streamsafe.block_of`), or None for untracked memory.
        access : Access or str
            ``Access.READ``/``WRITE``/``READ_WRITE``, or ``"r"``, ``"w"``, ``"rw"``.
        what : str
            Name of the buffer in error messages.

        Raises
        ------
        StreamMisuse
            After :meth:`preflight`: a use must be known before the waits are queued.
        InvalidArgumentType
            ``block`` is neither a Block nor None.
        InvalidArgument
            ``access`` names no access kind.

        Nothing is registered when this raises.
        """
        if self._phase is not _Phase.RECORDING:
            raise StreamMisuse(
                f"cannot record {what} after preflight: its waits would not be queued. "
                "Register every buffer before calling preflight()"
            )
        if access.__class__ is not Access:
            try:
                access = as_access(access)
            except ValueError as exc:
                raise InvalidArgument(f"cannot record {what}: {exc}") from None
        if block is None:
            self._untracked.append(what)
            return
        if block.__class__ is not Block and not isinstance(block, Block):
            raise InvalidArgumentType(
                f"cannot record {what!r}: got {type(block).__name__} {reprlib.repr(block)}, "
                "not a Block. Pass the Block of the memory (runtime.allocate(...), or "
                "numba_streamsafe.block_of(array) for an array), or None for memory no "
                "resource tracks"
            )
        key = (block.ptr, block.generation, block.device)
        slot = self._uses.get(key)
        if slot is None:
            self._uses[key] = [block, access]
        else:
            slot[1] = Access(slot[1] | access)

    def read(self, block: Block | None, what: str = "buffer") -> None:
        self.use(block, Access.READ, what)

    def write(self, block: Block | None, what: str = "buffer") -> None:
        self.use(block, Access.WRITE, what)

    def read_write(self, block: Block | None, what: str = "buffer") -> None:
        self.use(block, Access.READ_WRITE, what)

    def wait_for_stream(self, producer: int) -> None:
        """Order the launch after all work queued so far on ``producer``.

        This is the CUDA Array Interface rule for a foreign array whose
        producer named a ``stream``.
        """
        if self._phase is not _Phase.RECORDING:
            raise StreamMisuse("cannot add a producer stream after preflight()")
        if producer != self.stream:
            self._producers.append(producer)

    @property
    def uses(self) -> list[tuple[Block, Access]]:
        """The merged uses, one per block."""
        return [(b, a) for b, a in self._uses.values()]

    # ------------------------------------------------------------------ phases
    def preflight(self) -> None:
        """Queue every wait the registered uses need on the launch stream.

        Nothing is queued when this raises.

        Raises
        ------
        StreamMisuse
            Strict mode and untracked memory; a resource that cannot track;
            a second preflight.
        UseAfterFree
            A registered block was freed.
        """
        if self._phase is not _Phase.RECORDING:
            raise StreamMisuse("preflight() was already called; make a new recorder per launch")
        if self._untracked and self.mode is RecorderMode.STRICT:
            raise refuse_untracked(self._untracked, "or use a permissive recorder")
        runtime = self.runtime
        if self._uses:
            runtime.resource.prepare_launch(self.uses, self.stream)
        for producer in self._producers:
            runtime.order_after_stream(self.stream, producer)
        self._phase = _Phase.PREFLIGHTED

    def commit(self) -> None:
        """Record one event on the launch stream into every registered block.

        Call it after the launch or copy is queued.

        Raises
        ------
        StreamMisuse
            If :meth:`preflight` was not called first (an empty recorder needs none).
        """
        if self._phase is _Phase.COMMITTED:
            raise StreamMisuse("commit() was already called; make a new recorder per launch")
        if self._phase is not _Phase.PREFLIGHTED:
            if not self._uses and not self._producers:
                self._phase = _Phase.COMMITTED
                return
            raise StreamMisuse(
                "commit() without preflight(): the launch was not ordered after earlier uses. "
                "Call preflight() before queueing the work, then commit()"
            )
        if self._uses:
            self.runtime.resource.commit_launch(self.uses, self.stream)
        self._phase = _Phase.COMMITTED

    def abandon(self) -> None:
        """Drop the recorder without recording events: the work was never queued.

        Waits already queued by :meth:`preflight` stay (they only delay the stream).
        """
        self._phase = _Phase.COMMITTED

    def __del__(self) -> None:
        try:
            if self._uses and self._phase is not _Phase.COMMITTED:
                warnings.warn(
                    f"a LaunchRecorder with {len(self._uses)} use(s) on stream {self.stream:#x} "
                    "was dropped without commit(); later uses of those blocks are not ordered "
                    "after this launch",
                    UncommittedLaunchWarning,
                    stacklevel=1,
                )
        except Exception:
            pass
