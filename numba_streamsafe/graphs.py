"""CUDA graphs of tracked work.

``with numba_streamsafe.graph(stream) as g:`` captures the tracked launches,
copies and fills queued on ``stream`` (stream capture, thread-local mode);
``g.launch()`` replays them as one ordered operation.

The rules:

- One stream is captured, so the graph is a chain in stream order: no fence
  is needed inside it, and none is queued while capturing. Nothing is
  preflighted or committed while capturing either (captured work does not
  run): the uses of every captured operation are merged into the graph's
  :class:`~numba_streamsafe.core.uses.Uses` (``READ | WRITE`` is
  ``READ_WRITE``), and each :meth:`Graph.launch` runs the launch protocol
  once with them: the replay waits for the outside work its arrays conflict
  with, is queued as one ``cuGraphLaunch``, and is recorded as the last
  writer (or a reader) of its arrays, so later outside work waits for it.
- Before the capture begins, queued frees are flushed and the capture
  stream's open mark is sealed (its event recorded outside the capture), so
  no wait of another stream ever records an event inside the capture. Frees
  are held while capturing.
- Refused while capturing (:class:`GraphCaptureError`, nothing queued):
  allocations on the capture stream or on the legacy default stream (CUDA
  would invalidate the capture); any tracked work on the legacy default
  stream (it would depend on the capture); copies between host and device
  memory on the capture stream (upload before a replay, download after it);
  work queued on the capture stream by another thread; foreign arrays that
  name a producer stream; a second capture on the same device; several
  devices' runtimes installed; default streams as the capture stream.
- The graph keeps the arrays of the captured work (and the work's other
  arguments) referenced, so their memory stays allocated while the graph
  exists, whether the launch went through Numba or straight to
  ``cuLaunchKernel`` (whose packed parameters hold only addresses).
  :meth:`Graph.close` (or collecting the graph) destroys the graph and lets
  them go. New inputs: copy into the captured arrays (a tracked copy,
  ordered before the next replay), then launch again.
- Work on other streams during the capture is not captured and runs, and is
  ordered, as usual.
- A replay may be queued on another stream than the capture's; it is then
  ordered on that stream only, as CUDA orders a graph launch.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any

from numba_streamsafe.core.errors import DriverError, GraphCaptureError
from numba_streamsafe.core.uses import Uses
from numba_streamsafe.protocol import access_list, fenced, refuse_untracked
from numba_streamsafe.runtime import DeviceRuntime

__all__ = ["Graph", "GraphCaptureError", "graph"]


class Graph:
    """Tracked work captured on one stream, replayed with :meth:`launch`.

    Made by :func:`graph`; usable once its ``with`` block has ended.

    Attributes
    ----------
    uses : Uses
        Every buffer the captured work reads or writes, merged.
    operations : int
        Ordered operations captured (launches, copies, fills).
    replays : int
        Replays queued so far.

    Notes
    -----
    The graph holds every argument of the captured work until :meth:`close`,
    so the arrays it reads and writes cannot be freed (and their memory
    reused) while it may still be replayed. An array freed explicitly
    (``DeviceRuntime.deallocate``) makes the next replay raise
    :class:`~numba_streamsafe.core.errors.UseAfterFree`, with nothing queued.
    """

    def __init__(self, rt: DeviceRuntime, stream: Any, strict: bool) -> None:
        self.rt = rt
        self.stream = stream
        self.handle, self.owner = rt.stream_ref(stream)
        self.strict = strict
        self.uses = Uses()
        self.operations = 0
        self.replays = 0
        self._thread = threading.get_ident()
        self._graph: Any = None
        self._exec: Any = None
        self._held: list[tuple[Any, ...]] = []
        self._frees: Any = None

    # ----------------------------------------------------------------- capture
    def __enter__(self) -> Graph:
        rt = self.rt
        if rt.multi_device:
            raise GraphCaptureError("a graph captures the work of one device; with runtimes of "
                                    "several devices installed, launch the work eagerly")
        if rt.capture is not None:
            raise GraphCaptureError("a graph is already being captured on this device; end "
                                    "that capture first (captures do not nest)")
        rt.flush()  # queued frees go out before the capture, not inside it
        _seal_open_mark(rt.resource, self.handle)
        frees = rt.resource.hold_frees()
        frees.__enter__()
        try:
            rt.driver.begin_capture(self.handle)
        except BaseException:
            frees.__exit__(None, None, None)
            raise
        self._frees = frees
        rt.start_capture(self)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        rt = self.rt
        rt.end_capture(self)
        frees, self._frees = self._frees, None
        try:
            graph = rt.driver.end_capture(self.handle)
        except DriverError as err:
            self._held.clear()
            if exc_type is not None:
                return  # the user's error goes on; the capture is gone with it
            raise GraphCaptureError(
                f"the capture of stream {self.handle:#x} failed ({err}): an operation inside "
                "it broke it, such as a synchronisation or work on the legacy default "
                "stream. Keep host synchronisation and default-stream work out of the "
                "`with numba_streamsafe.graph(...)` block") from err
        finally:
            if frees is not None:
                frees.__exit__(None, None, None)
        if exc_type is not None:
            self._held.clear()
            rt.driver.graph_destroy(graph, None)
            return
        self._graph = graph
        self._exec = rt.driver.graph_instantiate(graph)

    def record(self, stream: int, uses: Uses, label: str, strict: bool, work: Any,
               args: tuple[Any, ...]) -> Any:
        """Capture one ordered operation queued on the capture stream (called by
        :func:`~numba_streamsafe.protocol.fenced` in place of the protocol).

        Raises
        ------
        GraphCaptureError
            Work on the legacy default stream, another thread, or a foreign
            array that names its producer stream.
        StreamMisuse
            Untracked memory in strict mode.
        """
        if stream != self.handle:
            raise GraphCaptureError(
                f"{label}: tracked work on the legacy default stream ({stream:#x}) while stream "
                f"{self.handle:#x} is being captured would depend on the capture, which CUDA "
                "refuses (and the capture would be lost); queue it on another stream, or "
                "after the capture")
        if threading.get_ident() != self._thread:
            raise GraphCaptureError(
                f"{label}: another thread queued work on stream {stream:#x} while it was being "
                "captured into a graph; capture a stream from one thread only")
        if uses.untracked and strict:
            raise refuse_untracked(uses.untracked, "allocate the graph's arrays with "
                                   "numba_streamsafe before the capture")
        if uses.producers:
            raise GraphCaptureError(
                f"{label}: a foreign array that names its producer stream cannot be ordered "
                "inside a graph (the wait would be on work outside the capture); synchronise "
                "its producer, or copy it into a tracked array, before the capture")
        for block, *_ in uses.blocks:
            if block.device != self.rt.device:
                raise GraphCaptureError(f"{label}: {block.describe()} belongs to device "
                                        f"{block.device}; a graph captures one device's work")
        result = self.rt.driver.capture_work(stream, work, args, list(access_list(uses)), label,
                                             uses.copy)
        for i, (block, access, lo, hi) in enumerate(uses.blocks):
            name = uses.names[i] if uses.names is not None and i < len(uses.names) else label
            self.uses.add(block, access, name, lo, hi)
        self._held.append((work, args))  # a bound method holds its array (copies)
        self.operations += 1
        return result

    def keep(self, stream: int, objects: tuple[Any, ...]) -> None:
        """Hold ``objects`` (a launch's arguments) while the graph exists, when the
        launch was captured (queued on the capture stream): a direct launch's
        packed parameters hold only the arrays' addresses."""
        if stream == self.handle and threading.get_ident() == self._thread:
            self._held.append(objects)

    def refuse_host_copy(self, stream: int, what: str) -> None:
        """Refuse a copy between host and device memory on the capture stream.

        Raises
        ------
        GraphCaptureError
            ``stream`` is the stream being captured; nothing is queued.
        """
        if stream == self.handle:
            raise GraphCaptureError(
                f"{what}: a copy between host and device memory on stream {stream:#x}, which is "
                "being captured into a graph. A graph holds device work only: upload new "
                "inputs into the captured arrays before g.launch() (numba_streamsafe.to_device("
                "host, to=array, stream=...)), and download results after it")

    # ------------------------------------------------------------------ replay
    def launch(self, stream: Any = None) -> None:
        """Replay the graph on ``stream`` (default: the capture stream) as one
        ordered operation: it waits for the tracked work its arrays depend on,
        and later work waits for it.

        Raises
        ------
        GraphCaptureError
            The capture has not ended, failed, or the graph was closed.
        """
        if self._exec is None:
            raise GraphCaptureError(
                "the graph has no instantiated capture: launch it after its "
                "`with numba_streamsafe.graph(stream)` block ended normally, and before close()")
        rt = self.rt
        if stream is None:
            handle, owner = self.handle, self.owner
        else:
            handle, owner = rt.stream_ref(stream)
        from numba_streamsafe.numba.launch.policy import launch_policy

        fenced(rt, handle, self.uses, "graph replay", self.strict, owner, rt.driver.graph_launch,
               self._exec, handle, tracking=launch_policy(rt).tracking)
        self.replays += 1

    def close(self) -> None:
        """Destroy the graph and its executable, and let its arrays go (also
        done when the graph is collected)."""
        graph, ex = self._graph, self._exec
        self._graph = self._exec = None
        self._held.clear()
        if graph is not None or ex is not None:
            self.rt.driver.graph_destroy(graph, ex)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at shutdown the driver may be gone
            pass

    def __repr__(self) -> str:
        state = "ready" if self._exec is not None else "not instantiated"
        return (f"<Graph stream={self.handle:#x} operations={self.operations} "
                f"buffers={len(self.uses)} {state}>")


def _seal_open_mark(resource: Any, stream: int) -> None:
    """Record the event of ``stream``'s open mark now, outside the capture,
    when blocks refer to it (``AsyncResource.seal_open``): a later wait of
    another stream then records no event on the capturing stream."""
    seal = getattr(resource, "seal_open", None)
    if seal is not None:
        seal(stream)


def graph(stream: Any, *, device: int | None = None, strict: bool | None = None) -> Graph:
    """Capture the tracked work queued on ``stream`` into a CUDA graph.

    Use as ``with numba_streamsafe.graph(stream) as g: ...``, then
    ``g.launch()`` to replay it; see :mod:`numba_streamsafe.graphs` for the rules.

    Parameters
    ----------
    stream : stream object or handle
        The stream to capture (not a default stream: CUDA cannot capture those).
    device : int, optional
        The device whose runtime holds the work (default: the sole or current one).
    strict : bool, optional
        Refuse untracked memory at capture and replay (default: the runtime's mode).

    Returns
    -------
    Graph
        A context manager: the work queued on ``stream`` inside the block is
        recorded, not run; ``Graph.launch`` replays it, ordered after the
        uses of its blocks that came before.

    Raises
    ------
    GraphCaptureError
        A default stream, several devices, a capture already under way.
    """
    from numba_streamsafe.core.modes import RecorderMode
    from numba_streamsafe.runtime import get_runtime, sole_runtime

    rt = sole_runtime() if device is None else None
    if rt is None:
        rt = get_runtime(0 if device is None else device)
    handle = rt.stream_handle(stream)
    if handle <= 2:
        raise GraphCaptureError(f"stream {handle:#x} is a default stream, which CUDA cannot "
                                "capture; capture a stream made with cuda.stream()")
    if strict is None:
        strict = rt.mode is RecorderMode.STRICT
    return Graph(rt, stream, strict)
