"""The streams of one device's runtime: the handle of each stream the user
names (stream objects, raw handles, the default streams), the streams made
for objects that carry no handle, destruction (the stream's history retired
first), the keys other devices know a stream by, and ordering one stream
after another. :class:`StreamRegistry` is a part of
:class:`~.runtime.DeviceRuntime`."""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Any

from numba_streamsafe._driver.base import Driver
from numba_streamsafe.core.errors import StreamMisuse
from numba_streamsafe.core.streams import (
    CU_STREAM_LEGACY,
    MAX_DEFAULT_STREAM,
    StreamRef,
    forget_stream,
    is_default_stream,
    note_stream_created,
    note_stream_seen,
    stream_handle,
)
from numba_streamsafe.resources import MemoryResource
from numba_streamsafe.resources.tracking.marks import retired_stream_id

__all__ = ["StreamRegistry"]


class StreamRegistry:
    """The streams a runtime has seen on ``driver``'s device, for ``resource``.

    Parameters
    ----------
    driver : Driver
        The device's driver (its destroyed handles are refused as ints).
    resource : MemoryResource
        The runtime's resource stack: a stream's history there ends when the
        stream is destroyed.

    Notes
    -----
    Thread-safe.
    """

    def __init__(self, driver: Driver, resource: MemoryResource) -> None:
        self.driver = driver
        self.resource = resource
        self.device = resource.device
        #: The driver's destroyed stream handles, refused as ints.
        self._destroyed: set[int] = driver.destroyed_streams
        #: Bare integer handles found to name a live stream (:meth:`handle`).
        self._checked: set[int] = set()
        #: Streams made for stream objects that carry no handle (the simulator's).
        self._made: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        #: Such objects whose stream :meth:`destroy` destroyed: refused from then on.
        self._unmade: weakref.WeakSet[Any] = weakref.WeakSet()
        #: Handle made for such an object -> what appends it to ``_dead`` at its death.
        self._finalizers: dict[int, weakref.finalize] = {}
        self._lock = threading.Lock()
        #: Handles made for stream objects that have died (their finalizers
        #: append them; :meth:`handle` destroys them).
        self._dead: collections.deque[int] = collections.deque()
        #: Stream handle -> its key in other devices' state (:meth:`key`).
        self._keys: dict[int, int] = {}

    def ref(self, stream: Any) -> StreamRef:
        """``(handle, owner)`` of ``stream``: its driver handle
        (:meth:`handle`) and the object that keeps it alive (None for a
        raw handle or the default stream). The one place a user's stream is
        resolved; the owner is what the tracker keeps alive while it relies on
        the handle."""
        owner = None if stream is None or isinstance(stream, int) else stream
        return self.handle(stream), owner

    def handle(self, stream: Any) -> int:
        """The driver handle of ``stream``
        (see :func:`numba_streamsafe.core.streams.stream_handle`).

        Stream objects that carry no handle (those of Numba's CUDA simulator)
        get a blocking stream of this runtime's driver (as ``numba.cuda.stream()``
        makes on a GPU), created on first sight and kept for the object's
        lifetime; the next stream made after the object dies destroys it. An
        object marked with the device it was made on (``_nss_device``: the
        simulator's streams under :func:`~numba_streamsafe.use_device`) is
        refused by another device's runtime.
        """
        handle = stream_handle(stream)
        if handle is not None:
            destroyed = self._destroyed
            if destroyed and handle in destroyed:
                if stream.__class__ is int:
                    raise StreamMisuse(
                        f"stream {handle:#x} was destroyed (destroy_stream); its handle names "
                        "no stream any more. Pass a live stream, e.g. one from "
                        "numba.cuda.stream()"
                    )
                destroyed.discard(handle)  # a live stream object has that address now
            elif stream.__class__ is int and (handle > MAX_DEFAULT_STREAM or
                                               handle == CU_STREAM_LEGACY) and \
                    handle not in self._checked:
                # A bare handle is checked once: one never created is refused here,
                # not by whichever driver call meets it first (CU_STREAM_LEGACY too:
                # CUDA takes it, the simulated driver does not).
                self.driver.check_stream(handle)
                self._checked.add(handle)
            return handle
        with self._lock:
            handle = self._made.get(stream)
            if handle is not None:
                return handle
        if stream in self._unmade:
            raise StreamMisuse(
                f"stream {stream!r} was destroyed (destroy_stream): no work can be queued on it "
                "any more. Use a live stream, e.g. a new one from numba.cuda.stream()")
        device = getattr(stream, "_nss_device", self.device)
        if device != self.device:
            raise StreamMisuse(
                f"stream {stream!r} was made on device {device}, and work on device "
                f"{self.device} cannot be queued on it (a stream belongs to its device's "
                f"context); make a stream under use_device({self.device}) for this work")
        if self._dead:
            self._destroy_dead()
        with self._lock:
            handle = self._made.get(stream)
            if handle is None:
                # Numba's cuda.stream() makes blocking streams: so does its stand-in here.
                handle = self.driver.create_stream(blocking=True)
                self._made[stream] = handle
                _note_origin(handle, stream)
                # When the object dies, so does its stream (no use refers to it then:
                # a recorded use keeps its stream object alive).
                self._finalizers[handle] = weakref.finalize(stream, self._dead.append, handle)
        return handle

    def _destroy_dead(self) -> None:
        """Destroy the streams made for stream objects that have died, as a
        GPU's stream objects destroy theirs (:meth:`destroy_stream`: their
        histories retired first)."""
        while True:
            try:
                handle = self._dead.popleft()
            except IndexError:
                return
            self._finalizers.pop(handle, None)
            try:
                self.destroy(handle)
            except StreamMisuse:
                pass  # a raw allocation on it outlived the object: the stream stays

    def destroy(self, stream: Any) -> None:
        """Destroy a stream, refusing while blocks live on it.

        Frees queued by finalizers run first (so ``del array`` then
        ``destroy_stream`` works). The stream's history ends with it: a stream
        created later with the same handle (CUDA may reuse handles) inherits no
        waits and no uses. Work queued on the stream still completes.

        A handle (an int, as ``driver.create_stream()`` returns) is destroyed
        here. A stream object that carries its own handle (``numba.cuda.stream()``
        on a GPU, a CuPy or PyTorch stream) belongs to its library, which
        destroys the handle when the object is dropped: its history ends here,
        and the handle stays valid until then (destroying it here too would
        make the library destroy it twice, or destroy a newer stream that got
        the same handle).

        Raises
        ------
        StreamMisuse
            ``stream`` is a default stream (None, 0, 1 or 2), which cannot be
            destroyed; or live blocks are allocated on it (they are named).
        """
        handle = self.handle(stream)
        owned_elsewhere = stream.__class__ is not int and stream_handle(stream) is not None
        if is_default_stream(handle):
            raise StreamMisuse(
                f"stream {stream!r} is the default stream {handle} and cannot be destroyed; "
                "destroy only streams you created (driver.create_stream(), numba.cuda.stream())"
            )
        with self.driver.activate():
            self.resource.flush()
        on_it = self.resource.blocks_on_stream(handle)
        if on_it:
            names = "; ".join(b.describe() for b in on_it[:5])
            raise StreamMisuse(
                f"stream {handle:#x} still orders {len(on_it)} live block(s): {names}. "
                "Free them (their frees are queued on this stream) before destroying it"
            )
        # Seal the uses recorded on the stream and reap its queued frees while
        # the stream still exists (afterwards neither could be done), forget
        # its history, and destroy it with no reap in between.
        with self.driver.activate():
            self.resource.retire_stream(
                handle, None if owned_elsewhere else self.driver.destroy_stream)
        self._keys.pop(handle, None)  # other devices' uses by it keep its old key
        if not owned_elsewhere:  # destroyed here: CUDA may give its handle to another
            forget_stream(handle)
        self._checked.discard(handle)
        if stream.__class__ is not int and not owned_elsewhere:
            # A stream object whose stream was made here, and is gone now: the
            # object is refused from now on (its handle may name a new stream soon).
            with self._lock:
                self._made.pop(stream, None)
                self._unmade.add(stream)
                finalizer = self._finalizers.pop(handle, None)
            if finalizer is not None:
                finalizer.detach()  # destroyed now: not again at the object's death

    def order_after(self, stream: int, producer: int) -> None:
        """Make ``stream`` wait for everything queued so far on ``producer``."""
        if producer == stream:
            return
        pool = self.resource.events
        if pool is None:
            handle = self.driver.event_create()
            try:
                self.driver.event_record(handle, producer)
                self.driver.stream_wait_event(stream, handle)
            finally:
                self.driver.event_destroy(handle)
            return
        handle = pool.record(producer)
        try:
            self.driver.stream_wait_event(stream, handle)
        finally:
            pool.release(handle)

    def key(self, handle: int) -> int:
        """The key other devices' resources know the stream ``handle`` by, when
        they record its uses of their blocks.

        Negative and unique in the process (never a stream handle of any
        device, whose default streams share the values 0 to 2), stable until
        the stream is destroyed through :meth:`destroy` (a stream that later
        gets the handle gets a new key, so it inherits no uses) or the
        context is reset.
        """
        key = self._keys.get(handle)
        if key is None:
            with self._lock:
                key = self._keys.get(handle)
                if key is None:
                    key = self._keys[handle] = retired_stream_id()
        return key

    def reset(self) -> None:
        """The context was reset: its streams are gone, and new ones may get
        their handles (checked again, with new keys)."""
        self._checked.clear()
        self._keys.clear()


def _note_origin(handle: int, stream: Any) -> None:
    """Note who made the stream ``handle`` made for the object ``stream`` (the
    race reports name it): its library (the top package of its type), and the
    user's stack the object kept where it was made (``_nss_origin``), else
    where it is first used (now)."""
    library = type(stream).__module__.partition(".")[0] or None
    made_at = getattr(stream, "_nss_origin", None)
    if made_at is not None and library is not None:
        note_stream_created(handle, library, made_at)
    else:
        note_stream_seen(handle, "first used", library=library)
