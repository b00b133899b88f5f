"""The driver observer: the CUDA calls that order work or touch memory, whoever
makes them in the process (Numba, CuPy, PyTorch, cuda.core, a C extension),
as CUPTI's callback API reports them.

One subscriber for the process (CUPTI allows one: a profiler such as Nsight
Systems or the PyTorch profiler cannot subscribe while it runs, and it cannot
start while one of them holds CUPTI). Its callback is C (``observer_cupti.h``):
it notes each call into a buffer of the call's context, with no Python lock
taken unless its thread already holds the GIL, and the tracking resource of
that context drains the buffer (:class:`Slot`) under its own lock before each
decision, so what other code did is known in the order it was done.

The calls noted (each once it returned ``CUDA_SUCCESS``; a destroy as it
starts), with their ``_ptsz`` / ``_ptds`` forms:

* event records (``cuEventRecord``, ``cuEventRecordWithFlags``), stream waits
  (``cuStreamWaitEvent``), event destroys;
* synchronises: ``cuStreamSynchronize``, ``cuEventSynchronize``, a
  ``cuEventQuery`` that found the event complete, ``cuCtxSynchronize`` (which
  the runtime's ``cudaDeviceSynchronize`` calls);
* one-dimensional copies and fills, asynchronous and synchronous
  (``cuMemcpy*``, ``cuMemsetD8/16/32*``), with the caller's Python stack when
  its thread holds the GIL (Python 3.12 and newer);
* stream creation and destruction (CUPTI's resource callbacks), with the
  creator's stack likewise.

Part of the engine (:mod:`numba_streamsafe.compiled`), written in Cython's
pure-Python mode (C declarations in ``observer.pxd``). Run as Python, nothing
can be observed: :func:`start` says why, and check mode follows Numba's own
events and synchronises instead.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import glob
import os
import site
import sys
import threading
from collections.abc import Iterator

import cython

__all__ = ["COMPILED", "start", "stop", "running", "reason", "slot_for", "callback_name",
           "find_cupti", "quiet", "Slot", "KINDS",
           "EVENT_RECORD", "STREAM_WAIT", "STREAM_SYNC", "EVENT_SYNC", "EVENT_QUERY",
           "CTX_SYNC", "EVENT_DESTROY", "COPY", "MEMSET", "STREAM_CREATED", "STREAM_DESTROYED",
           "SYNC_BEFORE", "SYNC_AFTER"]

#: Whether this module runs compiled (else it runs as Python source).
COMPILED: bool = cython.compiled

# What a record is: ``(kind, cbid, stream, event, dst, src, bytes, flags,
# thread, stack)``, kind one of these (observer_cupti.h's NSS_K_*).
EVENT_RECORD = 1
STREAM_WAIT = 2
STREAM_SYNC = 3
EVENT_SYNC = 4
EVENT_QUERY = 5
CTX_SYNC = 6
EVENT_DESTROY = 7
COPY = 8
MEMSET = 9
STREAM_CREATED = 10
STREAM_DESTROYED = 11
#: A record's flags: the host waited for the default stream's work before a
#: synchronous copy (from the host), or for the copy itself (to the host).
SYNC_BEFORE = 1
SYNC_AFTER = 2

#: Each kind's name, for messages.
KINDS = {EVENT_RECORD: "event record", STREAM_WAIT: "stream wait", STREAM_SYNC: "stream "
         "synchronise", EVENT_SYNC: "event synchronise", EVENT_QUERY: "event query",
         CTX_SYNC: "device synchronise", EVENT_DESTROY: "event destroy", COPY: "copy",
         MEMSET: "fill", STREAM_CREATED: "stream created", STREAM_DESTROYED: "stream destroyed"}

_lock = threading.Lock()
_running = False
#: Why the observer is not running (None while it runs, or before the first try).
_reason: str | None = None
_slots: dict[int, Slot] = {}
#: The functions of CUPTI's callback API the observer calls (their addresses go to C).
_CUPTI = ("cuptiSubscribe", "cuptiEnableCallback", "cuptiGetCallbackName", "cuptiUnsubscribe",
          "cuptiGetResultString")
_libraries: list = []


def find_cupti() -> str | None:
    """The path of a CUPTI library to load: ``NUMBA_STREAMSAFE_CUPTI`` when
    set, else the one of the ``nvidia-cuda-cupti`` wheel, of CUDA's toolkit
    (``CUDA_HOME``, ``CUDA_PATH``, ``/usr/local/cuda``), or the loader's;
    None when none is found."""
    given = os.environ.get("NUMBA_STREAMSAFE_CUPTI", "").strip()
    if given:
        return given
    roots = [*site.getsitepackages(), site.getusersitepackages(), *sys.path]
    found: list[str] = []
    for root in dict.fromkeys(r for r in roots if r and os.path.isdir(r)):
        found += sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libcupti.so*")))
        if found:
            break
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if not found and home:
            for sub in ("extras/CUPTI/lib64", "lib64", "targets/x86_64-linux/lib",
                        "targets/sbsa-linux/lib"):
                found += sorted(glob.glob(os.path.join(home, sub, "libcupti.so*")))
    if found:
        return min(found, key=len)  # libcupti.so.13 before libcupti.so.2025.3.1
    return ctypes.util.find_library("cupti")


def start(frames: int = 16) -> str | None:
    """Subscribe to CUPTI, once for the process: from then on the calls above
    are noted for each context (:func:`slot_for`). ``frames`` is how many of
    the caller's Python frames a copy, fill or stream creation keeps.

    Returns
    -------
    str or None
        None when the observer runs; else why it cannot (the compiled engine
        is not built, no CUPTI library is found or loads, another subscriber
        such as a profiler holds CUPTI), as a sentence.
    """
    global _running, _reason
    with _lock:
        if _running:
            return None
        if not cython.compiled:
            _reason = ("the compiled engine is not built (the observer's callback is C); "
                       "reinstall with a C compiler present")
            return _reason
        path = find_cupti()
        if path is None:
            _reason = ("no CUPTI library was found; install the nvidia-cuda-cupti wheel for "
                       "your CUDA version or set NUMBA_STREAMSAFE_CUPTI to libcupti's path")
            return _reason
        try:
            library = ctypes.CDLL(path)
            entries = [ctypes.cast(getattr(library, name), ctypes.c_void_p).value or 0
                       for name in _CUPTI]
        except (OSError, AttributeError) as exc:
            _reason = f"{path} cannot be used ({exc})"
            return _reason
        _libraries.append(library)  # loaded for good: CUPTI calls back into it
        rc: cython.int = _start(entries, frames)
        if rc == 0:
            _running = True
            _reason = None
            return None
        text = _why()
        if rc == 39:  # CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
            _reason = ("another CUPTI subscriber (a profiler such as Nsight Systems or the "
                       "PyTorch profiler) holds CUPTI")
        elif rc < 0:
            _reason = f"{path} cannot be used ({text or 'not a CUPTI library'})"
        else:
            _reason = f"CUPTI refused the subscription (error {rc}: {text})"
        return _reason


@cython.cfunc
def _start(entries: list, frames: cython.int) -> cython.int:
    return nss_start(entries[0], entries[1], entries[2], entries[3],  # type: ignore[name-defined]  # noqa: F821,E501
                     entries[4], frames)


@cython.cfunc
def _why() -> str:
    """CUPTI's or the loader's reason for the last failed start (empty: none given)."""
    if nss_reason() == cython.NULL:  # type: ignore[name-defined]  # noqa: F821
        return ""
    text: bytes = nss_reason()  # type: ignore[name-defined]  # noqa: F821
    return text.decode(errors="replace")


def stop() -> None:
    """Unsubscribe, so that a profiler can subscribe (what was noted stays to
    be drained; nothing more is noted)."""
    global _running, _reason
    with _lock:
        if _running and cython.compiled:
            nss_stop()  # type: ignore[name-defined]  # noqa: F821
        if _running:
            _reason = "stopped (numba_streamsafe._driver.observer.stop)"
        _running = False


def running() -> bool:
    """Whether the observer notes calls now."""
    return _running


def reason() -> str | None:
    """Why the observer does not run (None while it runs, or before :func:`start`)."""
    return _reason


def slot_for(context: int) -> Slot:
    """The buffer of what was noted on CUDA context ``context`` (a
    ``CUcontext`` as an int): one per context, claimed on first use."""
    with _lock:
        slot = _slots.get(context)
        if slot is None:
            slot = _slots[context] = Slot(context)
        return slot


def callback_name(cbid: int) -> str:
    """The name of a driver call by its CUPTI callback id (as a record holds it)."""
    if cython.compiled and _running:
        if nss_callback_name(cbid) != cython.NULL:  # type: ignore[name-defined]  # noqa: F821
            name: bytes = nss_callback_name(cbid)  # type: ignore[name-defined]  # noqa: F821
            return name.decode()
    return f"driver call {cbid}"


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Calls this thread makes inside the block are not noted (the library's
    own copies, which it records itself)."""
    if not cython.compiled:
        yield
        return
    nss_quiet_enter()  # type: ignore[name-defined]  # noqa: F821
    try:
        yield
    finally:
        nss_quiet_exit()  # type: ignore[name-defined]  # noqa: F821


@cython.cclass
class Slot:
    """What was noted on one CUDA context, drained by its tracking resource.

    Parameters
    ----------
    context : int
        The ``CUcontext``, as an int.
    """

    def __init__(self, context: int) -> None:
        self.context = context
        self.lost = 0
        if cython.compiled:
            self.index = nss_slot_for(context)  # type: ignore[name-defined]  # noqa: F821
        else:
            self.index = -1

    @property
    def whole_process(self) -> bool:
        """The observer sees every call of the process, Numba's own included."""
        return True

    @cython.ccall
    def pending(self) -> cython.bint:
        """Whether records wait to be drained (a cheap look, no lock)."""
        if not cython.compiled:
            return False
        return nss_pending(self.index) != 0  # type: ignore[name-defined]  # noqa: F821

    @cython.ccall
    def drain(self) -> list:
        """The records noted since the last drain, oldest first, each
        ``(kind, cbid, stream, event, dst, src, bytes, flags, thread, stack)``
        (``stack``: ``[(code, line), ...]`` innermost first, or None); the
        buffer is emptied. Records dropped since (the buffer full) are added
        to :attr:`lost`."""
        if not cython.compiled:
            return []
        lost = cython.declare(cython.ulonglong, 0)
        out: list = nss_drain(self.index, cython.address(lost))  # type: ignore[name-defined]  # noqa: F821,E501
        self.lost += lost
        return out
