"""Stream capture on the simulated driver: the captures under way, the rules
CUDA enforces while they last, and the graphs they make.

:class:`Captures` owns that state for one simulated device; the driver calls
it with its lock held and keeps the driver calls themselves (their names,
their fault injection, the stream checks).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from numba_streamsafe._driver.base import CUDA_ERROR_INVALID_HANDLE
from numba_streamsafe.core.errors import DriverError
from numba_streamsafe.core.streams import CU_STREAM_LEGACY, LEGACY_DEFAULT

__all__ = ["Captures", "SimGraph", "CUDA_ERROR_ILLEGAL_STATE",
           "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
           "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"]

#: ``CUDA_ERROR_ILLEGAL_STATE`` and the stream-capture errors.
CUDA_ERROR_ILLEGAL_STATE = 401
CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900
CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901
CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906


@dataclass
class _Capture:
    """A stream being captured: the work recorded so far, the capturing thread,
    and why the capture was invalidated (None while it is valid)."""

    ops: list[tuple[Any, ...]]
    thread: int
    invalid: str | None = None


@dataclass(eq=False)
class SimGraph:
    """A captured graph of the simulated driver (or its executable): the stream
    it was captured on and the work recorded, in stream order."""

    stream: int
    ops: tuple[tuple[Any, ...], ...]
    executable: bool = False
    destroyed: bool = False


class Captures:
    """The captures under way on one simulated device and its live graphs.

    Its truth value says whether any capture is under way (the driver asks on
    every call that a capture could forbid).
    """

    def __init__(self) -> None:
        self._active: dict[int, _Capture] = {}
        #: Graphs and executables made and not yet destroyed.
        self.live_graphs = 0

    def __bool__(self) -> bool:
        return bool(self._active)

    def clear(self) -> None:
        """End every capture, its work lost (a context reset)."""
        self._active.clear()

    def begin(self, stream: int, default: bool) -> None:
        """Start recording ``stream`` for the calling thread (``default``: it is a
        default stream, which CUDA cannot capture)."""
        if default:
            raise DriverError("cuStreamBeginCapture", CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                              f"stream {stream:#x} is a default stream")
        if stream in self._active:
            raise DriverError("cuStreamBeginCapture", CUDA_ERROR_ILLEGAL_STATE,
                              f"stream {stream:#x} is already capturing")
        self._active[stream] = _Capture([], threading.get_ident())

    def record(self, stream: int, op: tuple[Any, ...]) -> None:
        """Record one operation of ``stream``'s capture."""
        capture = self._active.get(stream)
        if capture is None:
            raise DriverError("capture", CUDA_ERROR_ILLEGAL_STATE,
                              f"stream {stream:#x} is not capturing")
        capture.ops.append(op)

    def end(self, stream: int) -> SimGraph:
        """End the capture of ``stream``: its graph, or the invalidation's error."""
        capture = self._active.pop(stream, None)
        if capture is None:
            raise DriverError("cuStreamEndCapture", CUDA_ERROR_ILLEGAL_STATE,
                              f"stream {stream:#x} is not capturing")
        if capture.invalid is not None:
            raise DriverError("cuStreamEndCapture", CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                              f"the capture of stream {stream:#x} was invalidated: "
                              f"{capture.invalid}")
        self.live_graphs += 1
        return SimGraph(stream, tuple(capture.ops))

    def refuse_outside(self, stream: int | None, call: str) -> None:
        """Refuse ``call`` on ``stream`` (None: the whole device) where CUDA refuses
        it during a capture, invalidating the captures it concerns: other work on
        a capturing stream, work on the legacy default stream (from any thread),
        a device-wide synchronise from a capturing thread."""
        active = self._active
        if stream is not None and stream in active:
            hit = [active[stream]]
            code = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
            why = (f"{call} on stream {stream:#x} while it is captured, outside the capture "
                   "(nothing but captured work may be queued on a capturing stream)")
        elif stream is None or stream in (LEGACY_DEFAULT, CU_STREAM_LEGACY):
            me = threading.get_ident()
            hit = [c for c in active.values() if stream is not None or c.thread == me]
            if not hit:
                return
            code = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
            what = "the legacy default stream" if stream is not None else "the whole device"
            why = f"{call} on {what} would depend on a stream being captured"
        else:
            return
        for capture in hit:
            if capture.invalid is None:
                capture.invalid = why
        raise DriverError(call, code, why)

    def instantiate(self, graph: SimGraph) -> SimGraph:
        """The executable of a live graph."""
        if graph.executable or graph.destroyed:
            raise DriverError("cuGraphInstantiate", CUDA_ERROR_INVALID_HANDLE,
                              "not a live graph")
        self.live_graphs += 1
        return SimGraph(graph.stream, graph.ops, executable=True)

    def check_launch(self, graph_exec: SimGraph) -> None:
        """Refuse a replay of anything but a live executable."""
        if not graph_exec.executable or graph_exec.destroyed:
            raise DriverError("cuGraphLaunch", CUDA_ERROR_INVALID_HANDLE,
                              "not a live executable graph")

    def destroy(self, graph: SimGraph | None, graph_exec: SimGraph | None) -> None:
        """Destroy a graph and its executable (either may be None)."""
        for g in (graph, graph_exec):
            if g is not None:
                if g.destroyed:
                    raise DriverError("cuGraphDestroy", CUDA_ERROR_INVALID_HANDLE,
                                      "the graph was destroyed already")
                g.destroyed = True
                self.live_graphs -= 1
