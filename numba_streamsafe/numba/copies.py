"""Numba's copies and fills in transparent mode: each call's uses of the
library's blocks, and the call fenced with them.

:mod:`~numba_streamsafe.numba.transparent` hooks numba-cuda's driver-level
``host_to_device``, ``device_to_host``, ``device_to_device``,
``device_memset`` and ``MemoryPointer.memset`` (which ``copy_to_host``,
``copy_to_device``, ``cuda.to_device``, indexing and assignment all reach)
with the functions :func:`copy_hook` and :func:`pointer_memset_hook` make: a
call that touches a block of the library is fenced (a write of the
destination, a read of the source); any other passes through to Numba.

Part of the compiled engine (:data:`~numba_streamsafe.compiled.ENGINE`): a
program that makes a stream per step copies three times a step, and each
hooked call's own work is host time the program pays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cython

from numba_streamsafe.core.access import Access
from numba_streamsafe.core.hazards import NUMBA
from numba_streamsafe.core.streams import default_stream_handle
from numba_streamsafe.core.uses import CopyUses
from numba_streamsafe.numba import program_order, target
from numba_streamsafe.numba.launch.policy import launch_policy
from numba_streamsafe.numba.scope import FENCE, INSIDE, numba_call, per_thread
from numba_streamsafe.protocol import fenced
from numba_streamsafe.runtime import installed_runtime

__all__ = ["NumbaUses", "fence_numba", "copy_hook", "pointer_memset_hook",
           "host_waited_default", "COMPILED"]

#: Whether this module runs compiled (:func:`numba_streamsafe.compiled.engine_builds`).
COMPILED: bool = cython.compiled

_READ = Access.READ
_WRITE = Access.WRITE


class NumbaUses(CopyUses):
    """The uses of one of Numba's copies or fills, with the runtime they were
    resolved on."""

    __slots__ = ("rt",)
    library = NUMBA

    def __init__(self, rt: Any) -> None:
        super().__init__()
        self.rt = rt


@cython.cfunc
def _add(uses: Any, rt: Any, obj: Any, access: Any, name: str, size: Any) -> None:
    """Add to ``uses`` the use of the Numba device object ``obj`` (an array, a
    pointer or a view of one) over the ``size`` bytes from its pointer (None:
    all of its memory), where its memory is a block of the library (nothing
    for memory the library does not track)."""
    memory = getattr(obj, "gpu_data", obj)
    if memory is None:
        return
    block = getattr(getattr(memory, "owner", None), "_nss_block", None)
    ptr = getattr(memory, "device_pointer_value", None)
    if block is None:
        if not ptr:
            return
        block = rt.find(int(ptr))
        if block is None:
            return
    ptr = int(ptr or block.ptr)
    nbytes = getattr(memory, "size", block.nbytes) if size is None else size
    lo, hi = target.span(block, ptr, nbytes)
    uses.add(block, access, name, lo, hi)


@cython.cfunc
def _uses(dst: Any, src: Any, size: Any, write_dst: cython.bint,
          read_src: cython.bint) -> Any:
    """The uses of a copy's or fill's device operands (the write of ``dst``,
    the read of ``src``, as asked), each over the ``size`` bytes from its
    pointer (None: all of the pointer's memory), or None when none is the
    library's (or transparent mode passes the work through: inside a fenced
    operation)."""
    if per_thread.transparent == INSIDE:
        return None
    rt = target.launch_runtime()
    uses = NumbaUses(rt)
    if write_dst:
        _add(uses, rt, dst, _WRITE, "dst", size)
    if read_src:
        _add(uses, rt, src, _READ, "src", size)
    if not uses.blocks:
        return None
    return uses


def fence_numba(fence: bool, label: str, stream: Any, uses: NumbaUses,
                work: Callable[..., Any], *args: Any) -> Any:
    """Run one of Numba's copies or fills, ``work(*args)``, on ``stream`` as an
    ordered operation (``fence`` False, transparent mode's setting off: shown
    to a checking driver only)."""
    rt = uses.rt
    ref = program_order.stream_ref(rt, stream)
    tracking = fence and per_thread.transparent == FENCE and launch_policy(rt).tracking
    return fenced(rt, ref[0], uses, label, False, ref[1], numba_call, work, *args,
                  tracking=tracking)


def copy_hook(original: Callable[..., Any], *, fence: bool, label: str, write_dst: bool,
              read_src: bool, host_waits: str | None = None) -> Callable[..., Any]:
    """A hook of one of Numba's copy or fill functions, ``original``:
    ``write_dst`` and ``read_src`` say which operands it uses. ``host_waits``:
    on the default stream the call is synchronous, and the host waits for the
    stream's earlier work (``"before"``: a copy from the host) or for the copy
    itself (``"after"``: a copy to the host), which the resource is told where
    races are reported (:attr:`~numba_streamsafe.runtime.DeviceRuntime.observing`)."""
    # Numba calls these with keywords too: the parameters keep Numba's names.
    @cython.binding(True)  # a function with Numba's name and docstring
    def copy(dst: Any, src: Any, size: int, stream: Any = 0) -> Any:
        sync = host_waits if not stream else None
        if sync == "before":
            host_waited_default()
        uses = _uses(dst, src, size, write_dst, read_src) if size else None
        if uses is None:
            result = original(dst, src, size, stream)
        else:
            result = fence_numba(fence, label, stream, uses, original, dst, src, size, stream)
        if sync == "after":
            host_waited_default()
        return result

    copy.__name__ = original.__name__
    copy.__doc__ = original.__doc__
    return copy


def pointer_memset_hook(original: Callable[..., Any], *, fence: bool) -> Callable[..., Any]:
    """A hook of Numba's ``MemoryPointer.memset`` (``original``): a fill that
    writes the pointer's memory."""
    @cython.binding(True)  # a method of Numba's class: bound to the pointer
    def memset(self: Any, byte: int, count: int | None = None, stream: Any = 0) -> Any:
        uses = _uses(self, None, count, True, False)
        if uses is None:
            return original(self, byte, count, stream)
        return fence_numba(fence, "memset (Numba)", stream, uses, original, self, byte, count,
                           stream)

    memset.__doc__ = original.__doc__
    return memset


def host_waited_default() -> None:
    """A synchronous copy on the default stream: the host waits for the
    default stream (where races are reported the resource is told: the host is
    then ordered after the copy, or after the stream's earlier work). Told
    where the driver observer runs too: the copy was the library's, which it
    does not note."""
    rt = installed_runtime(target.current_device())
    if rt is not None and rt.observing and rt.capture is None:
        tracker = rt.resource.tracker
        handle = default_stream_handle()
        tracker.program_completed(tracker.program_clock(handle), handle)
