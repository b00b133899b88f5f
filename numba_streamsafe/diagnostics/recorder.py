"""LaunchRecorder: the launch protocol (:mod:`numba_streamsafe.protocol`) by hand,
for work the library does not queue itself (a kernel of another library, a copy
through another API)."""

from __future__ import annotations

import enum
import reprlib
import warnings
from typing import Any

from numba_streamsafe import protocol
from numba_streamsafe.core.access import Access, as_access
from numba_streamsafe.core.blocks import Block
from numba_streamsafe.core.errors import InvalidArgument, InvalidArgumentType, StreamMisuse
from numba_streamsafe.core.modes import RecorderMode, recorder_mode
from numba_streamsafe.core.uses import Uses
from numba_streamsafe.resources.base import Use
from numba_streamsafe.runtime import DeviceRuntime

__all__ = ["LaunchRecorder", "RecorderMode", "UncommittedLaunchWarning"]


class UncommittedLaunchWarning(RuntimeWarning):
    """A recorder with registered uses was dropped without :meth:`LaunchRecorder.commit`."""


class _Phase(enum.Enum):
    RECORDING = 0
    PREFLIGHTED = 1
    COMMITTED = 2


class LaunchRecorder:
    """The launch protocol for one launch or copy that the caller queues.

    Use it in three steps::

        rec = LaunchRecorder(runtime, stream)
        rec.read(src_block); rec.write(dst_block)
        rec.preflight()      # queue cross-stream waits, before any work
        ...                  # enqueue the kernel or copy on ``stream``
        rec.commit()         # record the launch into every block

    Registrations of one block merge with the access lattice
    (:class:`~numba_streamsafe.core.uses.Uses`), so ``read(b); write(b)`` is one
    read-write use. Tracked kernels and copies run the same protocol
    (:func:`numba_streamsafe.protocol.fenced`).

    Parameters
    ----------
    runtime : DeviceRuntime
        Runtime whose resource tracks the blocks.
    stream : stream-like
        The stream the launch is queued on: a handle, a Numba or ``cuda.core``
        stream, an object with ``__cuda_stream__``, or None (the default stream).
        A stream object is kept alive while uses recorded on it are in use.
    mode : RecorderMode or str, optional
        Policy for untracked memory (registered as ``None``): ``"strict"`` or
        ``"permissive"``; the runtime's when omitted.

    Raises
    ------
    InvalidArgument
        ``mode`` is not one of those (checked before the stream is looked up).
    """

    __slots__ = ("runtime", "stream", "owner", "mode", "_uses", "_phase")

    def __init__(self, runtime: DeviceRuntime, stream: Any = None,
                 mode: RecorderMode | str | None = None) -> None:
        if mode is None:
            mode = runtime.mode
        self.mode = mode if mode.__class__ is RecorderMode else \
            recorder_mode(mode, "LaunchRecorder(mode=...)")
        self.runtime = runtime
        self.stream, self.owner = runtime.stream_ref(stream)
        self._uses = Uses()
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
        if block is not None and block.__class__ is not Block and not isinstance(block, Block):
            raise InvalidArgumentType(
                f"cannot record {what!r}: got {type(block).__name__} {reprlib.repr(block)}, "
                "not a Block. Pass the Block of the memory (runtime.allocate(...), or "
                "numba_streamsafe.block_of(array) for an array), or None for memory no "
                "resource tracks"
            )
        self._uses.add(block, access, what)  # type: ignore[arg-type]

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
            self._uses.add_producer(producer)

    @property
    def uses(self) -> list[Use]:
        """The merged uses, one per block: ``(block, access)`` for the whole
        block, ``(block, access, lo, hi)`` for its bytes ``lo .. hi - 1``."""
        return [(b, a) if lo == 0 and hi == b.nbytes else (b, a, lo, hi)
                for b, a, lo, hi in self._uses.blocks]

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
        protocol.preflight(self.runtime, self.stream, self._uses,
                           self.mode is RecorderMode.STRICT, self.owner,
                           "or use a permissive recorder")
        self._phase = _Phase.PREFLIGHTED

    def commit(self) -> None:
        """Record the launch on the launch stream into every registered block.

        Call it after the launch or copy is queued.

        Raises
        ------
        StreamMisuse
            If :meth:`preflight` was not called first (an empty recorder needs none).
        """
        if self._phase is _Phase.COMMITTED:
            raise StreamMisuse("commit() was already called; make a new recorder per launch")
        if self._phase is not _Phase.PREFLIGHTED:
            if not self._uses.blocks and not self._uses.producers:
                self._phase = _Phase.COMMITTED
                return
            raise StreamMisuse(
                "commit() without preflight(): the launch was not ordered after earlier uses. "
                "Call preflight() before queueing the work, then commit()"
            )
        protocol.commit(self.runtime, self.stream, self._uses, self.owner)
        self._phase = _Phase.COMMITTED

    def abandon(self) -> None:
        """Drop the recorder without recording events: the work was never queued.

        Waits already queued by :meth:`preflight` stay (they only delay the stream).
        """
        self._phase = _Phase.COMMITTED

    def __del__(self) -> None:
        try:
            if self._uses.blocks and self._phase is not _Phase.COMMITTED:
                warnings.warn(
                    f"a LaunchRecorder with {len(self._uses.blocks)} use(s) on stream "
                    f"{self.stream:#x} was dropped without commit(); later uses of those blocks "
                    "are not ordered after this launch",
                    UncommittedLaunchWarning,
                    stacklevel=1,
                )
        except Exception:
            pass
