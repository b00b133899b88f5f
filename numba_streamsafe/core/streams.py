"""One normal form for the stream objects users hold.

:func:`stream_handle` turns a Numba ``Stream``, a ``cuda.core`` ``Stream``, any
object with ``__cuda_stream__``, a raw integer handle or None (the default
stream) into the integer ``CUstream`` value the driver takes.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from numba_streamsafe.core.errors import InvalidArgumentType

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
