"""Memory statistics of a device's runtime, named after PyTorch's where the
meaning is the same (``torch.cuda.memory_stats``)."""

from __future__ import annotations

from typing import Any

from numba_streamsafe.core.errors import DriverError
from numba_streamsafe.runtime import DeviceRuntime, get_runtime, sole_runtime

__all__ = ["memory_stats", "reset_peak_stats", "STAT_KEYS"]

#: Every key of :func:`memory_stats`, with its meaning.
STAT_KEYS: dict[str, str] = {
    "allocated_bytes.all.current": "bytes of live blocks (allocated, not yet freed)",
    "allocated_bytes.all.peak": "most live bytes at once since the start or the last "
                                "reset_peak_stats()",
    "allocated_bytes.all.allocated": "bytes allocated in all",
    "allocated_bytes.all.freed": "bytes freed in all (queued or kept)",
    "allocation.all.current": "live blocks",
    "allocation.all.allocated": "allocations in all",
    "allocation.all.freed": "frees in all",
    "reserved_bytes.all.current": "bytes the stream-ordered pool holds from the device "
                                  "(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)",
    "reserved_bytes.all.peak": "most bytes the pool held (CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)",
    "pool_used_bytes.current": "bytes of the pool handed out (CU_MEMPOOL_ATTR_USED_MEM_CURRENT)",
    "pool_used_bytes.peak": "most bytes of the pool handed out (CU_MEMPOOL_ATTR_USED_MEM_HIGH)",
    "pending_bytes.current": "bytes freed and queued (cuMemFreeAsync) on streams not yet "
                             "synchronised",
    "kept_bytes.current": "bytes freed and kept for the next allocation of their size and stream",
    "outstanding_bytes.peak": "most live + pending + kept bytes at once",
    "deferred_frees.current": "frees queued by finalizers, run at the next allocation, "
                              "launch or flush",
    "waits_inserted": "cross-stream waits queued (cuStreamWaitEvent)",
    "waits_skipped": "cross-stream waits not queued because the program's own "
                     "synchronisation (Numba events, synchronize) already ordered the use",
    "events_recorded": "events recorded to order other streams after a stream",
    "events.in_use": "events held by marks that later work may wait for",
    "same_stream_uses": "uses of a block on the stream of its last writer: no wait needed",
    "upstream": "where new memory comes from (a name, not a figure): cuMemAllocAsync (the "
                "device's stream-ordered pool), cuMemAlloc (IPC; untracked with "
                "NUMBA_STREAMSAFE_RESOURCE=direct), rmm (the resource's class), or the "
                "class of a resource of one's own; the "
                "reserved_bytes and pool_used_bytes figures are the device pool's",
}


def _runtime(device: int | None) -> DeviceRuntime:
    if device is None:
        rt = sole_runtime()
        return rt if rt is not None else get_runtime(0)
    return get_runtime(device)


def _pool(driver: Any, name: str) -> int:
    get = getattr(driver, "get_pool_attribute", None)
    if get is None:
        return 0
    try:
        return int(get(name))
    except DriverError:
        return 0


def memory_stats(device: int | None = None) -> dict[str, Any]:
    """A flat dict of the memory figures of ``device``'s runtime (default: the
    only installed runtime, else device 0's); keys and meanings in
    :data:`STAT_KEYS`.

    The ``allocated_bytes``, ``allocation`` and ``reserved_bytes`` keys mean
    what they mean in ``torch.cuda.memory_stats()``; the others are this
    library's. A resource that does not track (``NUMBA_STREAMSAFE_RESOURCE=direct``)
    reports zeros for the waits, events and same-stream uses.

    Frees queued by arrays dropped since the last allocation are carried out
    first, so the bytes of an array that is gone no longer count as allocated
    (unless ``defer_cleanup`` holds them).

    Parameters
    ----------
    device : int, optional
        The device ordinal (default: the only installed runtime, else 0).

    Returns
    -------
    dict of str to int (and ``"upstream"`` to str)
        One figure per key of :data:`STAT_KEYS`; ``"upstream"`` names where
        new memory comes from.
    """
    rt = _runtime(device)
    rt.flush()
    tracker = rt.resource.tracker
    counters = getattr(tracker, "counters", None)
    if counters is not None:
        c = counters()
    else:
        s = rt.resource.stats()
        c = {"live_bytes": s.live_bytes, "live_peak": s.peak_bytes, "live_blocks": s.live_blocks,
             "allocated_bytes": 0, "freed_bytes": 0, "allocations": s.allocations,
             "frees": s.frees, "pending_bytes": s.pending_bytes, "kept_bytes": 0,
             "outstanding_peak": s.peak_bytes, "deferred_frees": s.deferred, "waits": 0,
             "waits_skipped": 0,
             "events_recorded": 0, "events_in_use": s.events_in_use, "same_stream_uses": 0}
    driver = rt.driver
    return {
        "allocated_bytes.all.current": c["live_bytes"],
        "allocated_bytes.all.peak": c["live_peak"],
        "allocated_bytes.all.allocated": c["allocated_bytes"],
        "allocated_bytes.all.freed": c["freed_bytes"],
        "allocation.all.current": c["live_blocks"],
        "allocation.all.allocated": c["allocations"],
        "allocation.all.freed": c["frees"],
        "reserved_bytes.all.current": _pool(driver, "RESERVED_MEM_CURRENT"),
        "reserved_bytes.all.peak": _pool(driver, "RESERVED_MEM_HIGH"),
        "pool_used_bytes.current": _pool(driver, "USED_MEM_CURRENT"),
        "pool_used_bytes.peak": _pool(driver, "USED_MEM_HIGH"),
        "pending_bytes.current": c["pending_bytes"],
        "kept_bytes.current": c["kept_bytes"],
        "outstanding_bytes.peak": c["outstanding_peak"],
        "deferred_frees.current": c["deferred_frees"],
        "waits_inserted": c["waits"],
        "waits_skipped": c["waits_skipped"],
        "events_recorded": c["events_recorded"],
        "events.in_use": c["events_in_use"],
        "same_stream_uses": c["same_stream_uses"],
        "upstream": getattr(tracker, "upstream_name", type(tracker).__name__),
    }


def reset_peak_stats(device: int | None = None) -> None:
    """Start every ``*.peak`` figure of :func:`memory_stats` again from its
    current value (the pool's high-water marks too).

    Parameters
    ----------
    device : int, optional
        The device ordinal (default: the only installed runtime, else 0)."""
    rt = _runtime(device)
    reset = getattr(rt.resource.tracker, "reset_peaks", None)
    if reset is not None:
        reset()
    for name in ("RESERVED_MEM_HIGH", "USED_MEM_HIGH"):
        try:
            rt.driver.set_pool_attribute(name, 0)
        except DriverError:
            pass
