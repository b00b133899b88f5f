"""The records of a trace (:func:`numba_streamsafe.trace`): operations,
the waits between them, memory events and recorded events."""

from __future__ import annotations

from dataclasses import dataclass

from numba_streamsafe.core.access import Access

__all__ = ["Op", "Wait", "MemoryEvent", "EventRecord", "hazard_kind"]

_WRITE = Access.WRITE


@dataclass(frozen=True)
class Op:
    """A fenced launch, copy or memset.

    ``kind`` is ``"launch"``, ``"copy"`` or ``"memset"``; ``uses`` holds
    ``(argument, access name, address, nbytes)`` per span of a block used
    (its first byte and size: a view's extent); ``t0``/``t1`` are host
    times (ns since the trace began) around preflight, the work and commit;
    ``device_t0``/``device_t1`` the device times (ns) of the work when the
    trace measured them, else None. ``tracked`` is False for a launch with
    tracking switched off (no waits, nothing recorded).
    """

    id: int
    kind: str
    label: str
    device: int
    stream: int
    uses: tuple[tuple[str, str, int, int], ...]
    t0: int
    t1: int
    tracked: bool = True
    device_t0: int | None = None
    device_t1: int | None = None


@dataclass(frozen=True)
class Wait:
    """Why operation ``op`` waited (or needed no new wait) for an earlier one.

    ``stream`` (of ``device``) waits for ``on_stream``: argument ``param`` of
    ``op`` (its access ``access``) conflicts with ``after_param`` of the
    earlier operation ``after`` (id 0: the block's allocation, label
    ``"allocation"``, or a borrowed block's hand-over, label ``"borrow"``,
    or work queued before the trace began, label
    ``"(before the trace)"``), a
    ``hazard`` of ``"read-after-write"``, ``"write-after-write"`` or
    ``"write-after-read"``. ``inserted`` is True when this operation queued
    the ``cuStreamWaitEvent``; False when the stream already waited for the
    same point before (stream order covers it). ``same_stream`` marks a use
    whose earlier operation ran on the same stream: no wait at all.
    """

    op: int
    label: str
    param: str
    access: str
    device: int
    stream: int
    on_stream: int
    after: int
    after_label: str
    after_param: str
    hazard: str
    inserted: bool
    same_stream: bool
    t: int


@dataclass(frozen=True)
class MemoryEvent:
    """An allocation or free. ``what`` is ``"alloc"``, ``"free"`` (queued on
    its stream with ``cuMemFreeAsync``, after the waits its uses need),
    ``"kept"`` (kept for reuse by the next allocation of its size on its
    stream), ``"deferred"`` (a finalizer queued it; it runs at the next
    allocation, launch or flush), ``"borrow"`` or ``"release"`` (a borrowed
    block of another library's memory became tracked, or was released after
    the waits its uses need; ``AsyncResource.borrow``). ``live_bytes`` and ``pending_bytes`` are
    the resource's figures right after it."""

    what: str
    device: int
    stream: int
    ptr: int
    nbytes: int
    tag: str
    live_bytes: int
    pending_bytes: int
    t: int


@dataclass(frozen=True)
class EventRecord:
    """An event the protocol recorded on ``stream`` (sealing a mark), during ``op``."""

    op: int
    device: int
    stream: int
    t: int


def hazard_kind(waiter: Access, earlier_write: bool) -> str:
    if earlier_write:
        return "write-after-write" if waiter & _WRITE else "read-after-write"
    return "write-after-read"
