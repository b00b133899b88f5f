"""Check mode on a GPU: the program runs on the real driver, exactly as
written, while a happens-before model follows everything it orders.

:class:`CheckingDriver` wraps a driver (the CUDA one; any driver in tests) and
passes every call to it. The calls that order work or end memory's life are
mirrored into a :class:`~numba_streamsafe._driver.sim.SimDriver` that keeps no
bytes (``backing=False``), under the real stream and event handles and the
real addresses:

* streams: created, destroyed, synchronised, queried idle (the host is then
  ordered after them); a stream first seen elsewhere (one Numba, CuPy or
  PyTorch made) is adopted with its real flags, so the legacy default stream
  orders it when it is blocking, as CUDA does;
* events: created, recorded, waited for, synchronised, queried complete;
* memory: each allocation is ready for every stream (a write by the host, as
  Numba's own ``cuMemAlloc`` makes it), each free a write of all of it on its
  stream (so a free while another stream still uses the memory is a hazard)
  after which any use is a use after free;
* the work itself: every kernel and copy the library sees (tracked kernels,
  and in transparent mode Numba's plain launches, copies and fills) is told
  with :meth:`trace_access`, as on the simulator, with the user's line.

Ordering the program makes through Numba itself (its events, stream and
device synchronises, which do not pass through this driver) is told with the
``program_*`` calls by the Numba layer's hooks. The model reports each
unordered pair of conflicting accesses as the simulator's checker does
(``hazards()``, :func:`numba_streamsafe.race_check`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from numba_streamsafe._driver.sim import LEGACY_STREAM, Hazard, SimDriver, SimSystem

__all__ = ["CheckingDriver", "event_key"]

#: ``CU_STREAM_LEGACY``: another name of the legacy default stream.
_CU_STREAM_LEGACY = 1


def event_key(event: Any) -> int:
    """The integer handle of a CUDA event (a ``CUevent`` of ``cuda.bindings``,
    a ctypes pointer, or an int)."""
    value = getattr(event, "value", None)  # a ctypes c_void_p
    if value is not None and not isinstance(event, int):
        return int(value)
    return int(event)


class CheckingDriver:
    """A driver that runs every call on ``real`` and mirrors what orders work
    into a model of its own (``model``, a :class:`SimDriver` without bytes).

    Parameters
    ----------
    real : Driver
        The driver that runs the program (:class:`~._driver.cuda.CudaDriver`).
    system : SimSystem, optional
        The system the model joins: one happens-before model across the
        devices of a process (their memory, events and host clock).
    """

    traces_accesses = True
    observes_program = True

    def __init__(self, real: Any, *, system: SimSystem | None = None) -> None:
        self.real = real
        self.device: int = real.device
        #: The model: no bytes, handles never recycled (the real driver hands them out).
        self.model = SimDriver(real.device, backing=False, recycle_streams=False, system=system)
        #: The model's system: its hazards, and what :func:`race_check` watches.
        self.system = self.model.system
        self.supports_direct_launch: bool = real.supports_direct_launch

    def __getattr__(self, name: str) -> Any:
        # Every call this class does not mirror goes to the real driver as it is.
        if name == "real":
            raise AttributeError(name)
        return getattr(self.real, name)

    def __repr__(self) -> str:
        return f"<CheckingDriver of device {self.device} over {type(self.real).__name__}>"

    # ----------------------------------------------------------- the model
    def _stream(self, stream: int) -> int:
        """The model's handle of the real ``stream``, adopted with its real
        flags (read each time: CUDA gives a destroyed stream's handle to new ones)."""
        if stream == _CU_STREAM_LEGACY:
            return LEGACY_STREAM
        if stream > 2:
            self.model.adopt_stream(stream, self.real.stream_blocking(stream))
        return stream

    def _event(self, event: Any) -> int:
        key = event_key(event)
        self.model.adopt_event(key)
        return key

    @property
    def hazards(self) -> list[Hazard]:
        """Every hazard the model found (the system's list)."""
        return self.model.hazards

    def assert_no_hazards(self) -> None:
        """Raise ``AssertionError`` listing every hazard found so far."""
        self.model.assert_no_hazards()

    def trace_access(self, stream: int, accesses: Iterable[tuple[Any, ...]], label: str, *,
                     copy: bool = False, site: str | None = None) -> None:
        """Check a kernel or copy the program queued on ``stream`` (see
        :meth:`SimDriver.trace_access`)."""
        self.model.trace_access(self._stream(stream), accesses, label, copy=copy, site=site)

    # ------------------------------------------------------------- streams
    def create_stream(self, blocking: bool = False) -> int:
        handle: int = self.real.create_stream(blocking)
        self.model.adopt_stream(handle, blocking)
        return handle

    def destroy_stream(self, stream: int) -> None:
        self.real.destroy_stream(stream)
        if stream > 2 and self.model.knows_stream(stream):
            self.model.destroy_stream(stream)

    def stream_synchronize(self, stream: int) -> None:
        self.real.stream_synchronize(stream)
        self.program_stream_synchronize(stream)

    def stream_query(self, stream: int) -> bool:
        idle: bool = self.real.stream_query(stream)
        if idle:  # the host saw it idle: ordered after its work
            self.program_stream_synchronize(stream)
        return idle

    def synchronize(self) -> None:
        self.real.synchronize()
        self.program_synchronize()

    # -------------------------------------------------------------- events
    def event_create(self) -> Any:
        event = self.real.event_create()
        self._event(event)
        return event

    def event_destroy(self, event: Any) -> None:
        self.real.event_destroy(event)
        key = event_key(event)
        if key in self.system.events:
            self.model.event_destroy(key)

    def event_record(self, event: Any, stream: int) -> None:
        self.real.event_record(event, stream)
        self.program_event_record(event, stream)

    def stream_wait_event(self, stream: int, event: Any) -> None:
        self.real.stream_wait_event(stream, event)
        self.program_stream_wait(stream, event)

    def event_synchronize(self, event: Any) -> None:
        self.real.event_synchronize(event)
        self.program_event_synchronize(event)

    def event_query(self, event: Any) -> bool:
        done: bool = self.real.event_query(event)
        if done:  # the host saw it complete: ordered after it
            self.program_event_synchronize(event)
        return done

    # -------------------------------------------------------------- memory
    def alloc_async(self, nbytes: int, stream: int) -> int:
        ptr: int = self.real.alloc_async(nbytes, stream)
        # Ready for every stream, as Numba's own allocator (cuMemAlloc) makes
        # it: a program written for it uses new memory on any stream, and that
        # the library's pool allocates in stream order is not the program's race.
        self.model.mirror_alloc(ptr, nbytes, "cuMemAllocAsync")
        return ptr

    def alloc(self, nbytes: int) -> int:
        ptr: int = self.real.alloc(nbytes)
        self.model.mirror_alloc(ptr, nbytes, "cuMemAlloc")
        return ptr

    def free_async(self, ptr: int, stream: int) -> None:
        self.real.free_async(ptr, stream)
        self.model.mirror_free(ptr, self._stream(stream), "cuMemFreeAsync")

    def free(self, ptr: int) -> None:
        self.real.free(ptr)
        self.model.mirror_free(ptr, None, "cuMemFree")

    # ------------------------ the ordering made (by the program through Numba,
    # or through this driver's own calls above): the model's half of each
    def program_event_record(self, event: Any, stream: int) -> None:
        """The program recorded ``event`` on ``stream`` (the call is made)."""
        self.model.event_record(self._event(event), self._stream(stream))

    def program_stream_wait(self, stream: int, event: Any) -> None:
        """The program made ``stream`` wait for ``event``."""
        self.model.stream_wait_event(self._stream(stream), self._event(event))

    def program_event_synchronize(self, event: Any) -> None:
        """The host waited for ``event`` (a synchronise, or a query that found it complete)."""
        self.model.event_synchronize(self._event(event))

    def program_stream_synchronize(self, stream: int) -> None:
        """The host waited for ``stream`` (a synchronise, a query that found it
        idle, or a synchronous copy on it)."""
        self.model.stream_synchronize(self._stream(stream))

    def program_synchronize(self) -> None:
        """The host waited for the whole device."""
        self.model.synchronize()
