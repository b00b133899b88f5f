"""A runtime's streams: handles and the objects that own them, stream
creation and destruction (the stream's history retired first), and ordering
one stream after another (a part of :class:`~.runtime.DeviceRuntime`)."""

from __future__ import annotations

import weakref
from typing import Any

from numba_streamsafe._driver.base import Driver
from numba_streamsafe.core.errors import StreamMisuse
from numba_streamsafe.core.streams import (
    MAX_DEFAULT_STREAM,
    StreamRef,
    is_default_stream,
    stream_handle,
)
from numba_streamsafe.resources import (
    MemoryResource,
)

__all__ = ["RuntimeStreams"]


class RuntimeStreams:
    """The stream calls of :class:`~.runtime.DeviceRuntime` (which holds the state)."""

    # The state these methods use (for type checkers).
    driver: Driver
    resource: MemoryResource
    device: int
    _checked_handles: set[int]
    _destroyed: set[int]
    _keys: Any
    _stream_lock: Any
    _stream_objects: Any
    _dead_streams: Any

    def stream_ref(self, stream: Any) -> StreamRef:
        """``(handle, owner)`` of ``stream``: its driver handle
        (:meth:`stream_handle`) and the object that keeps it alive (None for a
        raw handle or the default stream). The one place a user's stream is
        resolved; the owner is what the tracker keeps alive while it relies on
        the handle."""
        owner = None if stream is None or isinstance(stream, int) else stream
        return self.stream_handle(stream), owner

    def stream_handle(self, stream: Any) -> int:
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
            elif stream.__class__ is int and handle > MAX_DEFAULT_STREAM and \
                    handle not in self._checked_handles:
                # A bare handle is checked once: one never created is refused here,
                # not by whichever driver call meets it first.
                self.driver.check_stream(handle)
                self._checked_handles.add(handle)
            return handle
        with self._stream_lock:
            handle = self._stream_objects.get(stream)
            if handle is not None:
                return handle
        device = getattr(stream, "_nss_device", self.device)
        if device != self.device:
            raise StreamMisuse(
                f"stream {stream!r} was made on device {device}, and work on device "
                f"{self.device} cannot be queued on it (a stream belongs to its device's "
                f"context); make a stream under use_device({self.device}) for this work")
        if self._dead_streams:
            self._destroy_dead_streams()
        with self._stream_lock:
            handle = self._stream_objects.get(stream)
            if handle is None:
                # Numba's cuda.stream() makes blocking streams: so does its stand-in here.
                handle = self.driver.create_stream(blocking=True)
                self._stream_objects[stream] = handle
                # When the object dies, so does its stream (no use refers to it then:
                # a recorded use keeps its stream object alive).
                weakref.finalize(stream, self._dead_streams.append, handle)
        return handle

    def _destroy_dead_streams(self) -> None:
        """Destroy the streams made for stream objects that have died, as a
        GPU's stream objects destroy theirs (:meth:`destroy_stream`: their
        histories retired first)."""
        while True:
            try:
                handle = self._dead_streams.popleft()
            except IndexError:
                return
            try:
                self.destroy_stream(handle)
            except StreamMisuse:
                pass  # a raw allocation on it outlived the object: the stream stays

    def destroy_stream(self, stream: Any) -> None:
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
        handle = self.stream_handle(stream)
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
        self._checked_handles.discard(handle)

    def order_after_stream(self, stream: int, producer: int) -> None:
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
