"""Error kinds raised by numba_streamsafe.

Every error says what was wrong and what to do about it. Errors are raised
before any state changes, so the call that failed can be retried once the
cause is fixed.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = [
    "StreamSafeError",
    "GraphCaptureError",
    "DriverError",
    "OutOfMemory",
    "OutOfBudget",
    "StreamMisuse",
    "InvalidArgument",
    "InvalidArgumentType",
    "InvalidSetting",
    "InvalidLaunchConfig",
    "UseAfterFree",
    "StaleContext",
    "OutOfBounds",
    "PeerAccessRequired",
    "AccessMismatch",
    "AccessWarning",
    "RaceDetected",
]


class StreamSafeError(Exception):
    """Base class of every error raised by numba_streamsafe."""


class DriverError(StreamSafeError):
    """A CUDA driver call failed.

    Attributes
    ----------
    call : str
        Name of the driver function.
    code : int
        The ``CUresult`` value (0 when the failure was not a driver status).
    """

    def __init__(self, call: str, code: int, message: str) -> None:
        super().__init__(f"{call} failed with CUDA error {code}: {message}")
        self.call = call
        self.code = code


class OutOfMemory(StreamSafeError):
    """The device could not satisfy an allocation even after freeing queued blocks.

    Attributes
    ----------
    requested, live, pending : int
        Bytes asked for, bytes held by live blocks, bytes whose free is queued.
    """

    def __init__(self, requested: int, live: int, pending: int, detail: str = "") -> None:
        super().__init__(
            f"out of device memory allocating {requested} bytes "
            f"(this library holds {live} live and {pending} pending-free bytes; "
            "queued frees were drained, the pool trimmed and the allocation retried once). "
            "Free arrays you no longer need, or allocate less."
            + (f" Driver said: {detail}" if detail else "")
        )
        self.requested = requested
        self.live = live
        self.pending = pending


class OutOfBudget(StreamSafeError):
    """A :class:`~numba_streamsafe.resources.BudgetResource` limit would be exceeded.

    Attributes
    ----------
    requested, remaining, limit : int
        Bytes asked for, bytes left under the limit after reaping, the limit.
    """

    def __init__(self, requested: int, remaining: int, limit: int) -> None:
        super().__init__(
            f"allocating {requested} bytes would exceed the budget of {limit} bytes "
            f"({remaining} bytes remain after reaping queued frees). "
            "Free blocks first, or raise the budget."
        )
        self.requested = requested
        self.remaining = remaining
        self.limit = limit


class StreamMisuse(StreamSafeError):
    """A stream, recorder or resource was used against its contract."""


class InvalidArgument(StreamSafeError, ValueError):
    """An argument has a value the call cannot accept (for example 0 bytes)."""


class InvalidLaunchConfig(InvalidArgument):
    """A launch configuration CUDA refuses (block or grid dimensions, dynamic
    shared memory); the message names the limit and the value. Raised before
    anything is queued, on the simulator and on a GPU alike."""


class InvalidArgumentType(InvalidArgument, TypeError):
    """An argument is of a type the call cannot accept (for example a float
    where an int is needed, or a scalar where an array is).

    Both a :class:`ValueError` (as every :class:`InvalidArgument`) and a
    :class:`TypeError`, so that either ``except`` catches it.
    """


class InvalidSetting(InvalidArgument):
    """A ``NUMBA_STREAMSAFE_*`` environment variable holds a value it does not
    take, or names no setting of the library. Raised when ``numba_streamsafe``
    is imported (also when Numba imports it as the memory manager), before
    anything is built.

    The message is one line: the variable, its value and the values allowed.
    Left uncaught, that line is all Python prints (no traceback, not even
    through Numba's plugin loader); :func:`show_in_one_line` arranges it.

    Attributes
    ----------
    name : str
        The variable.
    value : str
        Its value, as given.
    allowed : tuple of str
        The values it takes (for a name that is no setting: the settings).
    """

    def __init__(self, name: str, value: str, allowed: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.name = name
        self.value = value
        self.allowed = allowed


def show_in_one_line() -> None:
    """Print an uncaught :class:`InvalidSetting` as its one line, with no
    traceback: also when another error was raised while handling it (Numba's
    memory-manager loader turns every error of the plugin's import into a
    ``RuntimeError`` that names the module). Other errors print as before.
    Installed once, over whichever hook is in place."""
    previous = sys.excepthook
    if getattr(previous, "_numba_streamsafe", False):
        return

    def hook(kind: type[BaseException], error: BaseException, tb: Any) -> None:
        seen: set[int] = set()
        cause: BaseException | None = error
        while cause is not None and id(cause) not in seen:
            if isinstance(cause, InvalidSetting):
                print(f"numba_streamsafe.InvalidSetting: {cause}", file=sys.stderr)
                return
            seen.add(id(cause))
            cause = cause.__cause__ or cause.__context__
        previous(kind, error, tb)

    hook._numba_streamsafe = True  # type: ignore[attr-defined]
    sys.excepthook = hook


class UseAfterFree(StreamSafeError):
    """A block handle no longer names a live allocation.

    Raised for a stale generation (the address was freed and possibly reused),
    an unknown pointer, or a double free. Nothing is changed.
    """


class StaleContext(UseAfterFree):
    """A block belongs to a CUDA context that was reset or closed since it was made."""


class OutOfBounds(StreamSafeError):
    """A guard detected a write outside a block's bounds."""


class PeerAccessRequired(StreamMisuse):
    """A kernel (or memset) on one device was given an array of another device
    whose memory it has no peer access to. Nothing was queued.

    Enable peer access (``numba_streamsafe.enable_peer_access(device, peer)``,
    where the GPUs support it), or copy the array to the launch device
    (``numba_streamsafe.copy``, which needs no peer access).

    Attributes
    ----------
    device, peer : int
        The launch device and the device whose memory it cannot access.
    """

    def __init__(self, message: str, device: int, peer: int) -> None:
        super().__init__(message)
        self.device = device
        self.peer = peer


class AccessMismatch(StreamSafeError, ValueError):
    """A kernel parameter declared ``Read`` is written by the kernel.

    Raised at the kernel's first launch, before anything is queued. The
    attributes name the ``kernel``, the ``param`` and ``where`` (``file:line``
    of the write).
    """

    def __init__(self, kernel: str, param: str, where: str | None) -> None:
        self.kernel = kernel
        self.param = param
        self.where = where
        at = f" at {where}" if where else ""
        super().__init__(
            f"kernel {kernel!r} writes parameter {param!r}{at}, which is declared Read: other "
            f"streams would not wait for this write. Declare it ReadWrite (or Write), or pass "
            f"access='infer'"
        )


class AccessWarning(UserWarning):
    """A declared access the kernel does not need (a parameter declared
    written that the kernel never writes: it costs waits, not safety), or one
    the access check could not verify."""


class RaceDetected(StreamSafeError, AssertionError):
    """Two conflicting accesses that are not ordered, found inside
    ``numba_streamsafe.race_check()`` (or in check mode).

    ``hazard`` holds both accesses (``hazard.first``, ``hazard.second``: kernel
    or copy, argument, stream, the user's stack where each was queued); the
    message is its full report (``hazard.report()``: both stacks, where the
    memory was allocated, who made each stream, and the fix).
    """

    def __init__(self, hazard: object) -> None:
        self.hazard = hazard
        report = getattr(hazard, "report", None)
        super().__init__(report() if callable(report) else f"race: {hazard}")


class GraphCaptureError(StreamMisuse):
    """Work a CUDA graph capture cannot hold (an allocation on the captured
    stream, another thread's work, a foreign producer stream), or a graph used
    before its capture ended (:mod:`numba_streamsafe.graphs`)."""
