"""Who made each of Numba's streams, for the race reports.

:func:`install` notes each stream ``numba.cuda.stream()`` makes, and each
handle ``numba.cuda.external_stream(ptr)`` wraps, in the core's registry of
stream origins (:func:`numba_streamsafe.core.streams.note_stream_created`),
with the user's stack at the call. Streams are rarely made: the hook costs
one stack capture per stream, nothing per launch.

* On a GPU, Numba's ``Context.create_stream`` and
  ``Context.create_external_stream`` are hooked. A created stream's origin
  is forgotten when its object dies (Numba destroys the stream then, and
  CUDA may hand the handle to another). An external stream's handle keeps
  what was known of it (another library's creation, seen by a driver-level
  observer); where nothing was, it is noted as wrapped there.
* On Numba's CUDA simulator a stream object carries no handle: its
  construction keeps the user's stack on the object (``_nss_origin``), and
  the runtime notes it when it makes the object's stream
  (:meth:`~numba_streamsafe.stream_registry.StreamRegistry.handle`).

Streams made before the Numba layer was first imported are not noted.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any

from numba_streamsafe.core.hazards import NUMBA
from numba_streamsafe.core.sites import user_stack
from numba_streamsafe.core.streams import (
    forget_stream,
    note_stream_created,
    note_stream_seen,
    stream_handle,
)
from numba_streamsafe.numba.scope import SIMULATOR

__all__ = ["install", "WRAPPED"]

#: How a handle met through ``numba.cuda.external_stream`` is described.
WRAPPED = "wrapped by numba.cuda.external_stream()"

_lock = threading.Lock()
_installed = False


def install() -> None:
    """Note the origin of every stream Numba makes from now on (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
        if SIMULATOR:
            from numba.cuda.simulator import api

            api.stream.__init__ = _sim_init  # type: ignore[method-assign]
        else:
            from numba.cuda.cudadrv.driver import Context

            Context.create_stream = _created(  # type: ignore[method-assign]
                Context.create_stream)
            Context.create_external_stream = _wrapped(  # type: ignore[method-assign]
                Context.create_external_stream)


def _sim_init(self: Any) -> None:
    """The simulator's stream, with the user's stack where it was made."""
    self._nss_origin = user_stack()


def _created(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def create_stream(self: Any) -> Any:
        stream = original(self)
        handle = stream_handle(stream)
        if handle is not None:
            origin = note_stream_created(handle, NUMBA)
            weakref.finalize(stream, forget_stream, handle, origin)
        return stream
    return create_stream


def _wrapped(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def create_external_stream(self: Any, ptr: Any) -> Any:
        stream = original(self, ptr)
        if isinstance(ptr, int) and ptr > 2:
            note_stream_seen(ptr, WRAPPED)
        return stream
    return create_external_stream
