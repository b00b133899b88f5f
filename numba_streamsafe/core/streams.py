"""One normal form for the stream objects users hold, and who made each stream.

:func:`stream_handle` turns a Numba ``Stream``, a ``cuda.core`` ``Stream``, any
object with ``__cuda_stream__``, a raw integer handle or None (the default
stream) into the integer ``CUstream`` value the driver takes.

The race reports name each stream's creator: the library that made it and
the user's line where it was made (a :class:`StreamOrigin`). They are kept
here per stream handle (a stream is its handle to CUDA, whichever objects
wrap it): :func:`note_stream_created` records a creation, which whoever sees
one calls (the Numba layer for ``numba.cuda.stream()``, the runtime for the
streams it makes for the simulator's stream objects, a driver-level observer
for any library's ``cuStreamCreate``); :func:`note_stream_seen` records a
handle first met wrapped (``numba.cuda.external_stream(ptr)``) where no
creation is known; :func:`stream_origin` reads it back when a race is
reported. Each call is a dictionary operation (and a stack capture where no
stack is given), safe from any thread.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from numba_streamsafe.core.errors import InvalidArgumentType
from numba_streamsafe.core.sites import Stack, capture_stack, resolve_stack

__all__ = [
    "StreamRef",
    "stream_handle",
    "owns_handle",
    "default_stream_handle",
    "is_default_stream",
    "resource_stream",
    "LEGACY_DEFAULT",
    "CU_STREAM_LEGACY",
    "PER_THREAD_DEFAULT",
    "MAX_DEFAULT_STREAM",
    "StreamOrigin",
    "note_stream_created",
    "note_stream_seen",
    "forget_stream",
    "stream_origin",
]

#: Handle values of the default streams: the legacy default stream (0, or
#: ``CU_STREAM_LEGACY``) and the per-thread one (``CU_STREAM_PER_THREAD``).
LEGACY_DEFAULT = 0
CU_STREAM_LEGACY = 1
PER_THREAD_DEFAULT = 2
#: Every handle up to this one names a default stream.
MAX_DEFAULT_STREAM = 2


#: A stream as the library carries it: ``(handle, owner)``, the driver handle and
#: the object that keeps the stream alive (the user's stream object; None for a
#: raw handle or the default stream). A plain tuple: one is made per launch.
StreamRef = tuple[int, Any]


def is_default_stream(handle: int) -> bool:
    """True for the handles of the default streams (0, 1 and 2)."""
    return 0 <= handle <= MAX_DEFAULT_STREAM


def default_stream_handle() -> int:
    """The default stream Numba uses: per-thread when Numba's configuration
    says so (``NUMBA_CUDA_PER_THREAD_DEFAULT_STREAM``), else the legacy one.

    Once Numba is imported its configuration decides (Numba reads the variable
    when it loads its configuration, not at every launch); before that, the
    environment variable does.
    """
    config = sys.modules.get("numba.core.config")
    flag = getattr(config, "CUDA_PER_THREAD_DEFAULT_STREAM", None)
    if flag is None:
        flag = os.environ.get("NUMBA_CUDA_PER_THREAD_DEFAULT_STREAM", "0") not in ("", "0")
    return PER_THREAD_DEFAULT if flag else LEGACY_DEFAULT


def stream_handle(stream: Any) -> int | None:
    """The integer handle of ``stream``, or None if the object carries none.

    Raises
    ------
    InvalidArgumentType
        ``stream`` is of a kind that names no stream (a float, a string...),
        or a negative handle (a ``TypeError`` and a ``ValueError`` too).
    """
    if stream is None:
        return default_stream_handle()
    if isinstance(stream, int) and not isinstance(stream, bool):
        if stream < 0:
            raise InvalidArgumentType(f"stream handle must be non-negative, got {stream}")
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        version_handle = proto() if callable(proto) else proto
        return int(version_handle[1])
    # PyTorch (torch.cuda.Stream, ExternalStream): cuda_stream; CuPy
    # (cupy.cuda.Stream, ExternalStream): ptr. Both ints.
    for name in ("cuda_stream", "ptr"):
        number = getattr(stream, name, None)
        if isinstance(number, int) and not isinstance(number, bool) and number >= 0:
            return number
    handle = getattr(stream, "handle", _MISSING)
    if handle is not _MISSING:
        if handle is None:
            return None
        value: Any = getattr(handle, "value", handle)  # ctypes.c_void_p
        return int(value or 0)
    if type(stream).__module__.startswith("numba.cuda.simulator"):
        return None
    raise InvalidArgumentType(
        f"cannot use {type(stream).__name__!r} as a CUDA stream; pass a numba.cuda stream, "
        "a cuda.core, PyTorch or CuPy stream, an object with __cuda_stream__, an int handle "
        "or None"
    )


_MISSING = object()


def owns_handle(stream: Any) -> bool:
    """Whether ``stream`` is an object whose handle lives as long as it does
    (``numba.cuda.stream()``, a CuPy or PyTorch stream it made): once it
    dies, the handle may name a new stream. False for a raw handle, a default
    stream, and a wrapper of a handle made elsewhere (``cuda.external_stream``,
    CuPy's and PyTorch's ``ExternalStream``): two such objects of one handle
    are one stream, and either may be dropped while the stream lives on."""
    if stream is None or isinstance(stream, int):
        return False
    if getattr(stream, "external", False) is True:  # numba.cuda.external_stream
        return False
    return type(stream).__name__ != "ExternalStream"


def resource_stream(stream: Any, call: str, runtime_call: str = "allocate(nbytes, stream)") -> int:
    """``stream`` as the driver handle a memory resource takes (an int, not a
    bool, >= 0).

    Raises
    ------
    InvalidArgumentType
        ``stream`` is anything else (a stream object, a string...): the
        message says to go through the runtime's ``runtime_call``, which
        takes any stream.
    """
    if isinstance(stream, int) and not isinstance(stream, bool) and stream >= 0:
        return int(stream)
    raise InvalidArgumentType(
        f"{call}: stream {stream!r} ({type(stream).__name__}) is not a stream handle: a memory "
        "resource takes a stream's driver handle, an int >= 0. Go through the runtime, which "
        "takes any stream (a numba.cuda stream, a cuda.core, PyTorch or CuPy stream, an int "
        f"handle or None): numba_streamsafe.get_runtime().{runtime_call}; or pass the handle: "
        "numba_streamsafe.get_runtime().stream_handle(stream)"
    )


# ------------------------------------------------------------ who made a stream
class StreamOrigin:
    """Who made a stream, as the race reports name it. Immutable.

    Attributes
    ----------
    library : str or None
        The library that made it (``"numba"``, ``"cupy"``, ``"torch"``,
        ``"cuda.core"``...); None where only a wrapping of it was seen.
    stack : tuple of (str, int)
        The user's frames where it was made (or first seen), innermost
        first (:func:`~numba_streamsafe.core.sites.user_stack`); empty where
        not known. Given as :func:`~numba_streamsafe.core.sites.capture_stack`
        captured it, it is resolved into pairs when first read (a stream is
        made far more often than a report names it).
    how : str
        ``"made"``, or how the handle was first met where its creation was
        not seen (say ``"wrapped by numba.cuda.external_stream()"``).
    """

    __slots__ = ("library", "_stack", "how")

    library: str | None
    how: str
    _stack: Any  # as captured, or resolved (see ``stack``)

    def __init__(self, library: str | None, stack: Any = (), how: str = "made") -> None:
        object.__setattr__(self, "library", library)
        object.__setattr__(self, "_stack", stack or ())
        object.__setattr__(self, "how", how)

    @property
    def stack(self) -> Stack:
        stack = self._stack
        if stack and stack[0].__class__ is not tuple:  # captured: resolved once
            stack = resolve_stack(stack)
            object.__setattr__(self, "_stack", stack)
        return stack  # type: ignore[no-any-return]

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"StreamOrigin is immutable: cannot set {name!r}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not StreamOrigin:
            return NotImplemented
        return (self.library, self.stack, self.how) == (
            other.library, other.stack, other.how)  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((self.library, self.stack, self.how))

    def __repr__(self) -> str:
        return f"StreamOrigin(library={self.library!r}, stack={self.stack!r}, how={self.how!r})"

    def __reduce__(self) -> tuple:
        # Copied and pickled resolved (a captured stack holds code objects).
        return (StreamOrigin, (self.library, self.stack, self.how))


#: Stream handle -> its origin (the newest creation noted for the handle).
_origins: dict[int, StreamOrigin] = {}


def note_stream_created(handle: int, library: str, stack: Stack | None = None) -> StreamOrigin:
    """Note that ``library`` made the stream ``handle``, where the user's
    ``stack`` says (None: the calling thread's stack now, which is right
    when called from inside the creating call). It replaces what was known
    of the handle: CUDA gives a destroyed stream's handle to a new stream.

    Parameters
    ----------
    handle : int
        The ``CUstream`` value.
    library : str
        Who made it: ``"numba"``, ``"cupy"``, ``"torch"``, ``"cuda.core"``...
    stack : tuple of (str, int), optional
        ``(file, line)`` of the user's frames, innermost first.

    Returns
    -------
    StreamOrigin
        What is now known of the handle.
    """
    origin = StreamOrigin(library, capture_stack() if stack is None else stack)
    _origins[handle] = origin
    return origin


def note_stream_seen(handle: int, how: str, stack: Stack | None = None,
                     library: str | None = None) -> StreamOrigin:
    """Note the stream ``handle`` met ``how`` (say ``"wrapped by
    numba.cuda.external_stream()"``) at the user's ``stack`` (None: now),
    unless its creation (or an earlier sight) is known already, which is kept.

    Returns
    -------
    StreamOrigin
        What is now known of the handle.
    """
    known = _origins.get(handle)
    if known is not None:
        return known
    origin = StreamOrigin(library, capture_stack() if stack is None else stack, how)
    return _origins.setdefault(handle, origin)


def forget_stream(handle: int, origin: StreamOrigin | None = None) -> None:
    """Forget the origin of ``handle`` (its stream was destroyed); with
    ``origin``, only while that is still the one known (a newer stream of
    the handle keeps its own)."""
    if origin is None or _origins.get(handle) is origin:
        _origins.pop(handle, None)


def stream_origin(handle: int | None) -> StreamOrigin | None:
    """What is known of who made the stream ``handle`` (None: nothing, or a
    default stream, or the host)."""
    if handle is None:
        return None
    return _origins.get(handle)
