"""libcuda's entry points that the engine calls itself: ``cuEventRecord``,
``cuStreamWaitEvent`` and ``cuLaunchKernel``, looked up in the libcuda this
process has loaded, called as C with no Python object made.

Part of the engine (:mod:`numba_streamsafe.compiled`), written in Cython's
pure-Python mode (C declarations in ``libcuda.pxd``, which the mark book and
the direct launch cimport). Run as Python, no entry point is found (every
call answers "not done") and the callers use the driver layer's methods
(:class:`~numba_streamsafe._driver.cuda.CudaDriver`), which also handle what
these calls refuse: another context current on the thread, an error to raise.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import cython

__all__ = ["entry_point", "loaded", "record_event", "wait_event", "launch_entry", "COMPILED"]

#: Whether this module runs compiled (else it runs as Python source).
COMPILED: bool = cython.compiled

_looked = cython.declare(cython.bint, False)
_cu_record = cython.declare(cython.size_t, 0)
_cu_wait = cython.declare(cython.size_t, 0)
_cu_launch = cython.declare(cython.size_t, 0)
_entries: dict[str, int] = {}


def entry_point(name: str) -> int:
    """The address of libcuda's ``name`` (one of this module's three) when
    libcuda is loaded in this process and the module runs compiled, else 0.
    Looked up until libcuda is loaded (by the process's first CUDA call)."""
    global _looked, _cu_record, _cu_wait, _cu_launch
    if not _looked and COMPILED:
        try:
            lib = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_NOW)
            for sym in ("cuEventRecord", "cuStreamWaitEvent", "cuLaunchKernel"):
                _entries[sym] = ctypes.cast(getattr(lib, sym), ctypes.c_void_p).value or 0
            _looked = True
        except (OSError, AttributeError):
            _entries.clear()
        _cu_record = _entries.get("cuEventRecord", 0)
        _cu_wait = _entries.get("cuStreamWaitEvent", 0)
        _cu_launch = _entries.get("cuLaunchKernel", 0)
    return _entries.get(name, 0)


def loaded() -> bool:
    """Whether the entry points were found: compiled, with libcuda loaded."""
    return _cu_launch != 0 or entry_point("cuLaunchKernel") != 0


@cython.cfunc
@cython.exceptval(check=False)
def _handles(event: Any, stream: Any, out: cython.p_size_t) -> cython.bint:
    """``event`` and ``stream`` as the addresses libcuda takes, into ``out[0]``
    and ``out[1]``; False for a value that is none (the driver layer then
    makes the call)."""
    try:
        out[0] = int(event)
        out[1] = int(stream)
    except (TypeError, OverflowError, ValueError):
        return False
    return True


@cython.ccall
@cython.exceptval(check=False)
def record_event(event: Any, stream: Any) -> cython.int:
    """``cuEventRecord(event, stream)``; nonzero when not done (no entry point,
    or libcuda's error: the driver layer then records, retrying in the right
    context or raising)."""
    if not cython.compiled or _cu_record == 0:
        return 1
    h = cython.declare(cython.size_t[2])
    if not _handles(event, stream, h):
        return 1
    fn = cython.cast(record_fn, _cu_record)  # type: ignore[name-defined]  # noqa: F821
    return fn(cython.cast(cython.p_void, h[0]), cython.cast(cython.p_void, h[1]))


@cython.ccall
@cython.exceptval(check=False)
def wait_event(stream: Any, event: Any) -> cython.int:
    """``cuStreamWaitEvent(stream, event, 0)``; nonzero when not done."""
    if not cython.compiled or _cu_wait == 0:
        return 1
    h = cython.declare(cython.size_t[2])
    if not _handles(event, stream, h):
        return 1
    fn = cython.cast(wait_fn, _cu_wait)  # type: ignore[name-defined]  # noqa: F821
    return fn(cython.cast(cython.p_void, h[1]), cython.cast(cython.p_void, h[0]), 0)


@cython.ccall
@cython.exceptval(check=False)
def launch_entry() -> cython.size_t:
    """The address of ``cuLaunchKernel`` (0 when not found), which the direct
    launch calls with the GIL released."""
    if _cu_launch == 0 and cython.compiled:
        entry_point("cuLaunchKernel")
    return _cu_launch
