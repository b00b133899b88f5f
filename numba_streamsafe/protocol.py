"""The launch protocol: preflight, the work, commit.

Every ordered operation (a tracked kernel, a tracked copy or memset, a launch
fenced by hand through :class:`~numba_streamsafe.LaunchRecorder`) goes through
these steps on one stream:

1. collect its buffers as :class:`Uses`: tracked blocks with their access
   (merged per block with the access lattice), memory no resource tracks, and
   producer streams of foreign arrays;
2. :func:`preflight`: refuse untracked memory in strict mode, then queue on
   the stream every wait the uses need (``MemoryResource.preflight``) and the
   waits for the producer streams; nothing is queued when it raises;
3. queue the work itself;
4. :func:`trace` (only a checking driver does anything) and :func:`commit`:
   record the uses against the stream's current mark
   (``MemoryResource.commit``).

Blocks of another device than the launch runtime's (section 7 of
``docs/architecture.md``) are looked for only while runtimes of several
devices are installed (``DeviceRuntime.multi_device``). A kernel or memset
needs peer access to them (:class:`~numba_streamsafe.core.errors.PeerAccessRequired`
otherwise, before anything is queued); a copy (:class:`CopyUses`) does not.
Their device's resource gives the marks the launch stream waits for
(``preflight_foreign``), and records the launch after the work against an
event of the launch stream (``commit_foreign``).

The module knows nothing of Numba; the Numba layer wraps a launch in
:func:`fenced`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from numba_streamsafe.core import tracehook
from numba_streamsafe.core.access import Access
from numba_streamsafe.core.blocks import Block
from numba_streamsafe.core.errors import InvalidArgument, PeerAccessRequired, StreamMisuse
from numba_streamsafe.core.sites import capture_stack
from numba_streamsafe.core.uses import CopyUses, Uses
from numba_streamsafe.resources.tracking.marks import set_work

if TYPE_CHECKING:
    from numba_streamsafe.runtime import DeviceRuntime

__all__ = ["single", "preflight", "commit", "trace", "fenced",
           "refuse_untracked", "access_list", "PERMISSIVE_REMEDY"]

T = TypeVar("T")


def single(block: Block | None, access: Access, what: str, copy: bool = False,
           span: tuple[int, int] | None = None) -> Uses:
    """:class:`Uses` of one buffer (of a copy when ``copy``): the bytes
    ``span = (lo, hi)`` of ``block``, all of it by default."""
    uses = CopyUses() if copy else Uses()
    if span is None:
        uses.add(block, access, what)
    else:
        uses.add(block, access, what, span[0], span[1])
    return uses


def refuse_untracked(what: list[str], remedy: str) -> StreamMisuse:
    """The strict-mode error for memory no resource tracks; ``remedy`` ends the advice."""
    if os.environ.get("NUMBA_CUDA_MEMORY_MANAGER", "").strip() == "numba_streamsafe":
        # The plugin is selected already: the memory came from elsewhere.
        source = ("It came from another allocator (CuPy, PyTorch, or Numba before the plugin "
                  "was selected). Allocate it through numba_streamsafe (device_array, "
                  "to_device) or Numba's calls, import it with an ordering, ")
    else:
        source = ("Allocate it through numba_streamsafe (or set "
                  "NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe), ")
    return StreamMisuse(
        f"{', '.join(what)}: memory not allocated by numba_streamsafe cannot be ordered in "
        f"strict mode. {source}{remedy}"
    )


def preflight(rt: DeviceRuntime, stream: int, uses: Uses, strict: bool, owner: object = None,
              remedy: str = "or launch in permissive mode") -> None:
    """Queue on ``stream`` every wait that ``uses`` need, before the work is queued.

    ``owner`` is the stream's owning object (None for a raw handle): it stays
    alive while the marks the stream waited for are in use.

    Raises
    ------
    StreamMisuse
        Untracked memory when ``strict`` (``remedy`` ends the advice), or a
        resource that cannot track. Nothing is queued.
    UseAfterFree, StaleContext
        A block was freed, or made before a context reset. Nothing is queued.
    """
    if uses.untracked and strict:
        raise refuse_untracked(uses.untracked, remedy)
    blocks = uses.blocks
    if blocks:
        if rt.multi_device and _spans_devices(rt.device, blocks):
            _preflight_across(rt, stream, uses, owner)
        else:
            rt.resource.preflight(blocks, stream, owner)
    if uses.producers:
        for producer in uses.producers:
            rt.order_after_stream(stream, producer)


def commit(rt: DeviceRuntime, stream: int, uses: Uses, owner: object = None) -> None:
    """Record ``uses`` on ``stream`` after the work is queued: later uses on other
    streams wait for it, and the blocks' frees too."""
    blocks = uses.blocks
    if blocks:
        if rt.multi_device and _spans_devices(rt.device, blocks):
            _commit_across(rt, stream, uses, owner)
        else:
            rt.resource.commit(blocks, stream, owner)


def trace(rt: DeviceRuntime, stream: int, uses: Uses, label: str) -> None:
    """Tell a checking driver (the simulated one) what the work on ``stream`` touches."""
    driver = rt.driver
    if driver.traces_accesses:
        driver.trace_access(stream, access_list(uses), label, copy=uses.copy,
                            stack=capture_stack(), library=uses.library)


def access_list(uses: Uses) -> list[tuple[Any, ...]]:
    """What a checking driver is told the work touches, with the argument
    names when they were kept."""
    if uses.actual is not None:
        return uses.actual
    names = uses.names
    if names is not None and len(names) == len(uses.blocks):
        return [(b.ptr + lo, hi - lo, a, n)
                for (b, a, lo, hi), n in zip(uses.blocks, names, strict=True)]
    return [(b.ptr + lo, hi - lo, a) for b, a, lo, hi in uses.blocks]


# ------------------------------------------------------------ several devices
def _spans_devices(device: int, blocks: list[tuple[Block, Access, int, int]]) -> bool:
    """Whether a block of ``blocks`` belongs to another device than ``device``."""
    for block, *_ in blocks:
        if block.device != device:
            return True
    return False


def _by_device(rt: DeviceRuntime, uses: Uses
               ) -> tuple[list[tuple[Block, Access, int, int]],
                          dict[int, list[tuple[Block, Access, int, int]]]]:
    """The uses of ``rt``'s device, and those of each other device."""
    local: list[tuple[Block, Access, int, int]] = []
    foreign: dict[int, list[tuple[Block, Access, int, int]]] = {}
    for use in uses.blocks:
        if use[0].device == rt.device:
            local.append(use)
        else:
            foreign.setdefault(use[0].device, []).append(use)
    return local, foreign


def _peer_runtime(rt: DeviceRuntime, device: int, uses: Uses,
                  blocks: list[tuple[Block, Access, int, int]]) -> DeviceRuntime:
    """The installed runtime of ``device``, after checking that a launch on ``rt``
    may use its ``blocks``.

    Raises
    ------
    PeerAccessRequired
        A kernel or memset (not a copy) and no peer access from ``rt``'s device.
    InvalidArgument
        No runtime of ``device`` is installed.
    """
    if not uses.copy and device not in rt.peers:
        names = "; ".join(use[0].describe() for use in blocks[:3])
        raise PeerAccessRequired(
            f"a launch on device {rt.device} was given memory of device {device} ({names}), "
            f"and device {rt.device} has no peer access to device {device}. Enable it with "
            f"numba_streamsafe.enable_peer_access({rt.device}, {device}) where the GPUs "
            f"support it, or copy the array to device {rt.device} first "
            "(numba_streamsafe.copy needs no peer access); nothing was queued",
            rt.device, device)
    peer = rt.runtime_of(device)
    if peer is None:
        raise InvalidArgument(
            f"a launch on device {rt.device} was given memory of device {device}, whose runtime "
            "is not installed, so its uses cannot be ordered; install it (set_runtime, or "
            "get_runtime(device) for the process-wide one) before using its arrays elsewhere")
    return peer


def _preflight_across(rt: DeviceRuntime, stream: int, uses: Uses, owner: object) -> None:
    """:func:`preflight` of uses that span devices: the launch stream waits for the
    marks each foreign device's resource names (``cuStreamWaitEvent`` across
    devices) and for the local ones; nothing is queued on it when this raises."""
    local, foreign = _by_device(rt, uses)
    peers = [(_peer_runtime(rt, d, uses, blocks), blocks) for d, blocks in sorted(foreign.items())]
    key = rt.stream_key(stream)
    held: list[tuple[DeviceRuntime, list[Any]]] = []
    try:
        for peer, blocks in peers:
            with peer.activate():
                held.append((peer, peer.resource.preflight_foreign(blocks, key)))
        rt.resource.preflight(local, stream, owner)  # refuses a resource that cannot track
        wait = rt.driver.stream_wait_event
        for _, marks in held:
            for mark in marks:
                wait(stream, mark.handle)
    finally:
        for peer, marks in held:
            if marks:
                with peer.activate():
                    peer.resource.release_foreign(marks)


def _commit_across(rt: DeviceRuntime, stream: int, uses: Uses, owner: object) -> None:
    """:func:`commit` of uses that span devices: the local ones against the
    stream's mark; those of each other device against an event recorded now
    on the launch stream (of the launch device's pool)."""
    local, foreign = _by_device(rt, uses)
    resource = rt.resource
    if local:
        resource.commit(local, stream, owner)
    pool = resource.events
    if pool is None:
        raise StreamMisuse(f"{type(resource).__name__} records no events, so a launch on device "
                           f"{rt.device} cannot be ordered before uses on other devices; build "
                           "the runtime on AsyncResource")
    key = rt.stream_key(stream)
    for device, blocks in sorted(foreign.items()):
        peer = _peer_runtime(rt, device, uses, blocks)
        event = pool.record(stream)
        with peer.activate():
            peer.resource.commit_foreign(blocks, key, event, pool, owner)


def fenced(rt: DeviceRuntime, stream: int, uses: Uses, label: str, strict: bool,
           owner: object, work: Callable[..., T], *args: object, tracking: bool = True) -> T:
    """Run ``work(*args)``, which queues one launch or copy on ``stream``, between
    :func:`preflight` and :func:`commit`, and :func:`trace` it.

    ``owner`` (the user's stream object, or None) is kept alive while recorded
    uses refer to the stream. With ``tracking`` False the work runs unfenced
    (the Numba layer's switch that shows races); a checking driver is told
    about the accesses either way.

    The resource runs the work between its preflight and commit
    (``MemoryResource.fenced``).

    Raises
    ------
    StreamMisuse
        Untracked memory when ``strict``; nothing is queued.
    """
    capture = rt.capture
    if capture is not None and (capture.handle == stream or stream <= 1):
        # A graph records it, or refuses it on the legacy stream (graphs.py).
        return capture.record(stream, uses, label, strict, work, args)  # type: ignore[no-any-return]
    tracer = tracehook.active
    if tracer is not None:
        return tracer.fenced(rt, stream, uses, label, strict, owner, work, args, tracking)
    blocks = uses.blocks
    if not tracking:
        return _unfenced(rt, stream, uses, label, work, args)
    if uses.untracked and strict:
        raise refuse_untracked(uses.untracked, PERMISSIVE_REMEDY)
    if rt.multi_device and blocks and _spans_devices(rt.device, blocks):
        return _fenced_across(rt, stream, uses, label, owner, work, args)
    if uses.producers or rt.driver.traces_accesses:
        work, args = _in_order, (rt, stream, uses, label, work, args)  # type: ignore[assignment]
    if not blocks:
        return work(*args)
    if rt.observing:  # the race reports name the work, the user's stack, who queued it
        set_work((label, capture_stack(), uses, uses.library))
        try:
            return rt.resource.fenced(blocks, stream, owner, work, args)  # type: ignore[no-any-return]
        finally:
            set_work(None)
    return rt.resource.fenced(blocks, stream, owner, work, args)  # type: ignore[no-any-return]


def _in_order(rt: DeviceRuntime, stream: int, uses: Uses, label: str, work: Callable[..., T],
              args: tuple[object, ...]) -> T:
    """The work as the resource runs it between preflight and commit: after
    the producer streams, and shown to a checking driver."""
    if uses.producers:
        _order_after(rt, stream, uses.producers)
    result = work(*args)
    trace(rt, stream, uses, label)
    return result


def _unfenced(rt: DeviceRuntime, stream: int, uses: Uses, label: str, work: Callable[..., T],
              args: tuple[object, ...]) -> T:
    """The work with the ordering switched off; a checking driver still sees it."""
    result = work(*args)
    trace(rt, stream, uses, label)
    return result


def _order_after(rt: DeviceRuntime, stream: int, producers: list[int]) -> None:
    """Make ``stream`` wait for everything queued so far on each producer stream."""
    for producer in producers:
        rt.order_after_stream(stream, producer)


def _fenced_across(rt: DeviceRuntime, stream: int, uses: Uses, label: str, owner: object,
                   work: Callable[..., T], args: tuple[object, ...]) -> T:
    """:func:`fenced` for uses that span devices (strict mode already checked)."""
    _preflight_across(rt, stream, uses, owner)
    if uses.producers:
        for producer in uses.producers:
            rt.order_after_stream(stream, producer)
    result = work(*args)
    trace(rt, stream, uses, label)
    _commit_across(rt, stream, uses, owner)
    return result


#: What a strict launch's refusal of untracked memory advises.
PERMISSIVE_REMEDY = ("pass mode='permissive', or allow_foreign=True for arrays whose producer "
                     "names its stream")
