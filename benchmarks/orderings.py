"""How a benchmark run of the sort -> join pipeline orders its streams.

``Ordering`` is the product: numba_streamsafe's memory and no ordering code at
all (tracked kernels and copies order themselves). ``Unordered`` is the race.
``DeviceSync`` and ``HandEvents`` are what users write without the library, to
compare against. :mod:`ordered_pipeline` takes any of them.
"""

from __future__ import annotations

from typing import Any

import _harness  # noqa: F401  (puts examples/ on the path, picks the target)
import numpy as np
from numba import cuda

import numba_streamsafe as nss


class Ordering:
    """How a run orders its streams and where its memory comes from.

    The default is the product: memory from numba_streamsafe and no ordering
    code at all (tracked kernels and copies order themselves). The other
    kinds exist to compare against, with tracking turned off:
    ``DeviceSync`` (a device-wide synchronize after every stage) and
    ``HandEvents`` (hand-placed events at exactly the cross-stream edges).
    Those keep every buffer alive until the run ends, as hand-ordered code must.
    """

    tracking = True

    def __init__(self, allocator: str = "streamsafe") -> None:
        if allocator not in ("streamsafe", "numba"):
            raise ValueError(f"allocator must be 'streamsafe' or 'numba', got {allocator!r}")
        self.allocator = allocator
        self.kept: list[Any] = []

    def alloc(self, shape: Any, dtype: Any, stream: Any, tag: str) -> Any:
        if self.allocator == "numba":
            return self.keep(cuda.device_array(shape, dtype, stream=stream))
        return self.keep(nss.device_array(shape, dtype, stream=stream, tag=tag))

    def upload(self, host: np.ndarray, stream: Any, tag: str, into: Any = None) -> Any:
        """Copy ``host`` to a new device array (or into ``into``) on ``stream``."""
        if self.allocator == "numba":
            return self.keep(cuda.to_device(host, stream=stream, to=into))
        return self.keep(nss.to_device(host, stream=stream, to=into, tag=tag))

    def upload_for(self, host: np.ndarray, consumer: Any, upload: Any, tag: str) -> Any:
        """Copy ``host`` on the ``upload`` stream into an array allocated on ``consumer``.

        The array is freed on ``consumer`` once it is dropped, so its free never
        holds up the upload stream. Later work on ``consumer`` is ordered after
        the copy (a stage boundary for :class:`DeviceSync`).
        """
        out = self.alloc(host.shape, host.dtype, consumer, tag)
        self.wait(upload, self.mark(consumer))  # a stream-ordered allocation precedes its use
        self.upload(host, upload, tag, into=out)
        self.wait(consumer, self.mark(upload))
        self.stage()
        return out

    def keep(self, array: Any) -> Any:
        return array

    def mark(self, stream: Any) -> Any:
        """After the work queued on ``stream`` so far: a token others can wait for."""
        return None

    def wait(self, stream: Any, token: Any) -> None:
        """Order later work on ``stream`` after ``token``."""

    def stage(self) -> None:
        """The end of a pipeline stage."""

    def finish(self) -> None:
        """The run is over and synchronised: release what it kept."""
        self.kept.clear()


class Unordered(Ordering):
    """No ordering at all: the race the library prevents."""

    tracking = False


class _Manual(Ordering):
    tracking = False

    def keep(self, array: Any) -> Any:
        self.kept.append(array)
        return array


class DeviceSync(_Manual):
    """A device-wide synchronize after every stage."""

    def stage(self) -> None:
        nss.get_runtime().driver.synchronize()  # cuCtxSynchronize (or the model's)


class HandEvents(_Manual):
    """One event per cross-stream edge, placed by hand (through the runtime's
    driver, so the simulated driver checks them too)."""

    def __init__(self, allocator: str = "streamsafe") -> None:
        super().__init__(allocator)
        self.events: list[Any] = []

    def mark(self, stream: Any) -> Any:
        rt = nss.get_runtime()
        event = rt.driver.event_create()
        rt.driver.event_record(event, rt.stream_handle(stream))
        self.events.append(event)
        return event

    def wait(self, stream: Any, token: Any) -> None:
        if token is not None:
            rt = nss.get_runtime()
            rt.driver.stream_wait_event(rt.stream_handle(stream), token)

    def finish(self) -> None:
        super().finish()
        driver = nss.get_runtime().driver
        for event in self.events:
            driver.event_destroy(event)
        self.events.clear()


class NumbaEvents(Ordering):
    """One Numba event per cross-stream edge (``cuda.event()``, recorded and
    waited for through Numba) and every buffer kept until the run ends: a
    program that orders itself as a user writes it. Tracked: the library
    sees the events (transparent mode's hooks) and queues none of its own
    waits; in check mode it finds no race."""

    def __init__(self, allocator: str = "streamsafe") -> None:
        super().__init__(allocator)

    def keep(self, array: Any) -> Any:
        self.kept.append(array)
        return array

    def mark(self, stream: Any) -> Any:
        event = cuda.event() if _harness.SIMULATOR else cuda.event(timing=False)
        event.record(stream)
        return event

    def wait(self, stream: Any, token: Any) -> None:
        if token is not None:
            token.wait(stream)

    def finish(self) -> None:
        cuda.synchronize()  # Numba's: the buffers' frees come after all their uses
        super().finish()


class CuPyEvents(NumbaEvents):
    """One CuPy event per cross-stream edge, recorded and waited for through
    CuPy on the Numba streams' handles (``cupy.cuda.ExternalStream``): a mixed
    program that orders itself with another library. The library learns the
    events from the driver observer (``NUMBA_STREAMSAFE_OBSERVE``, on in check
    mode); without it the waits are its own."""

    def __init__(self, allocator: str = "streamsafe") -> None:
        super().__init__(allocator)
        import cupy

        self.cupy = cupy

    def _stream(self, stream: Any) -> Any:
        return self.cupy.cuda.ExternalStream(nss.get_runtime().stream_handle(stream))

    def mark(self, stream: Any) -> Any:
        event = self.cupy.cuda.Event(disable_timing=True)
        event.record(self._stream(stream))
        return event

    def wait(self, stream: Any, token: Any) -> None:
        if token is not None:
            self._stream(stream).wait_event(token)

    def finish(self) -> None:
        self.cupy.cuda.runtime.deviceSynchronize()
        self.kept.clear()


ORDERINGS = {"tracked": Ordering, "unordered": Unordered, "sync": DeviceSync,
             "events": HandEvents, "numba-events": NumbaEvents, "cupy-events": CuPyEvents}
