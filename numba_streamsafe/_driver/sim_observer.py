"""The simulated driver's stand-in for the driver observer: another library on
the simulated device.

Its calls run on the :class:`~numba_streamsafe._driver.sim.SimDriver` it
belongs to (so the happens-before checker sees the true order of things) and
are noted as CUPTI's callbacks note another library's calls on a GPU
(:mod:`numba_streamsafe._driver.observer`'s records), for a tracking resource
that observes (``AsyncResource(observe=True)``) to drain. Tests use it to run
programs whose ordering comes from "foreign" calls, and to hold check mode's
reports against the checker's hazards.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from numba_streamsafe._driver import observer
from numba_streamsafe._driver.observer import KINDS
from numba_streamsafe.core.access import Access

__all__ = ["SimObserver"]


class SimObserver:
    """Another library's calls on one simulated device, run and noted.

    Parameters
    ----------
    driver : SimDriver
        The device the calls run on.
    """

    #: It sees only the calls made through it, not Numba's (which transparent
    #: mode's hooks follow on the simulator).
    whole_process = False

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self._records: list[tuple[Any, ...]] = []
        self._lock = threading.Lock()
        #: Records dropped (never: the stand-in's buffer has no bound).
        self.lost = 0
        #: Calls noted over the observer's life.
        self.calls = 0

    # ---------------------------------------------------------- the observer's side
    def pending(self) -> bool:
        """Whether records wait to be drained."""
        return bool(self._records)

    def drain(self) -> list[tuple[Any, ...]]:
        """The records since the last drain, oldest first (see
        :meth:`numba_streamsafe._driver.observer.Slot.drain`)."""
        with self._lock:
            out, self._records = self._records, []
        return out

    def _note(self, kind: int, stream: int = 0, event: int = 0, dst: int = 0, src: int = 0,
              nbytes: int = 0, flags: int = 0, stack: bool = False, api: str = "") -> None:
        frames: list[tuple[Any, int]] | None = None
        if stack:  # the caller's frames, as the observer keeps them with the GIL held
            frames = []
            frame = sys._getframe(2)
            while frame is not None and len(frames) < 16:
                frames.append((frame.f_code, frame.f_lineno))
                frame = frame.f_back  # type: ignore[assignment]
        with self._lock:
            self._records.append((kind, api or KINDS[kind], stream, event, dst, src, nbytes, flags,
                                  threading.get_ident(), frames))
            self.calls += 1

    # ----------------------------------------------------------- the library's calls
    def create_stream(self, blocking: bool = False) -> int:
        """A stream of the library (``cuStreamCreate``)."""
        stream = self.driver.create_stream(blocking=blocking)
        self._note(observer.STREAM_CREATED, stream, stack=True)
        return stream

    def destroy_stream(self, stream: int) -> None:
        """``cuStreamDestroy`` of one of the library's streams."""
        self._note(observer.STREAM_DESTROYED, stream)
        self.driver.destroy_stream(stream)

    def event_create(self) -> int:
        """An event of the library (not noted: CUPTI's notes skip creation too)."""
        return int(self.driver.event_create())

    def event_destroy(self, event: int) -> None:
        self._note(observer.EVENT_DESTROY, event=event)
        self.driver.event_destroy(event)

    def event_record(self, event: int, stream: int) -> None:
        self.driver.event_record(event, stream)
        self._note(observer.EVENT_RECORD, stream, event)

    def stream_wait_event(self, stream: int, event: int) -> None:
        self.driver.stream_wait_event(stream, event)
        self._note(observer.STREAM_WAIT, stream, event)

    def stream_synchronize(self, stream: int) -> None:
        self.driver.stream_synchronize(stream)
        self._note(observer.STREAM_SYNC, stream)

    def event_synchronize(self, event: int) -> None:
        self.driver.event_synchronize(event)
        self._note(observer.EVENT_SYNC, event=event)

    def event_query(self, event: int) -> bool:
        """Whether ``event`` completed (noted only when it did, as CUPTI notes
        a query that returned ``CUDA_SUCCESS``)."""
        done = bool(self.driver.event_query(event))
        if done:
            self._note(observer.EVENT_QUERY, event=event)
        return done

    def synchronize(self) -> None:
        """A device synchronise (``cudaDeviceSynchronize``: ``cuCtxSynchronize``)."""
        self.driver.synchronize()
        self._note(observer.CTX_SYNC)

    def copy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """``cuMemcpyAsync`` of device memory (``dst`` or ``src`` 0: host memory)."""
        if dst and src:
            self.driver.copy_async(dst, src, nbytes, stream)
        elif dst:
            self.driver.trace_access(stream, [(dst, nbytes, Access.WRITE)], "cuMemcpyHtoDAsync",
                                     copy=True)
        elif src:
            self.driver.trace_access(stream, [(src, nbytes, Access.READ)], "cuMemcpyDtoHAsync",
                                     copy=True)
        self._note(observer.COPY, stream, dst=dst, src=src, nbytes=nbytes, stack=True,
                   api="cuMemcpyAsync")

    def memset_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        """``cuMemsetD8Async``."""
        self.driver.memset_async(ptr, value, nbytes, stream)
        self._note(observer.MEMSET, stream, dst=ptr, nbytes=nbytes, stack=True,
                   api="cuMemsetD8Async")

