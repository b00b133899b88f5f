"""Which stream Numba allocations are ordered on, which device the library's
work goes to, and whether launches are tracked."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from numba import config as _config

from numba_streamsafe.core.errors import InvalidArgument
from numba_streamsafe.core.settings import settings

__all__ = ["stream_scope", "current_stream", "tracking", "use_device", "device_scope",
           "current_device", "transparent", "numba_call", "FENCE", "OBSERVE", "INSIDE",
           "per_thread", "SIMULATOR"]

#: Values of the per-thread transparent-mode flag (:func:`transparent`):
#: Numba's own operations are fenced (FENCE), left unordered but still shown
#: to a checking driver (OBSERVE: ``transparent(False)``), or passed through
#: untouched because an operation the library fences already made them
#: (INSIDE: :func:`numba_call`).
FENCE, OBSERVE, INSIDE = 2, 1, 0

#: True when Numba's CUDA simulator is on (``NUMBA_ENABLE_CUDASIM=1``); the
#: Numba layer reads it here (``target.SIMULATOR`` is this one).
SIMULATOR: bool = bool(_config.ENABLE_CUDASIM)  # type: ignore[attr-defined]


class _Scopes(threading.local):
    """Per-thread stack of scope streams (an empty one on each new thread), and
    the device of the innermost :func:`use_device` (None outside one)."""

    def __init__(self) -> None:
        self.stack: list[Any] = []
        self.device: int | None = None
        #: How Numba's own launches, copies and fills on this thread are
        #: handled: FENCE, OBSERVE or INSIDE (see :func:`transparent`).
        self.transparent = FENCE


#: This thread's scopes (each thread finds its own, initially empty): read by the
#: plugin on each allocation and by transparent mode on each launch, as plain
#: attribute reads.
per_thread = _Scopes()


@contextlib.contextmanager
def stream_scope(stream: Any) -> Iterator[Any]:
    """Order the allocations made inside the block on ``stream``.

    Applies to every allocation that reaches the memory-manager plugin on
    this thread (``cuda.device_array``, ``cuda.to_device``, Numba's
    auto-transfers) and to :func:`numba_streamsafe.device_array` calls given no
    ``stream``. Scopes nest; the innermost wins.

    Parameters
    ----------
    stream : stream-like
        A stream of the current device (not a bare handle never created).

    Yields
    ------
    stream-like
        ``stream``.

    Raises
    ------
    StreamMisuse
        ``stream`` is an integer handle that names no stream.

    Examples
    --------
    >>> with stream_scope(s):            # doctest: +SKIP
    ...     tmp = cuda.device_array(n)   # allocated on s, freed on s
    """
    if stream.__class__ is int and stream > 2:
        # A bare handle is checked now: one never created is refused here.
        from numba_streamsafe.runtime import get_runtime, sole_runtime

        rt = sole_runtime()
        (rt if rt is not None else get_runtime(per_thread.device or 0)).stream_handle(stream)
    stack = per_thread.stack
    stack.append(stream)
    try:
        yield stream
    finally:
        stack.pop()


@contextlib.contextmanager
def transparent(enabled: bool) -> Iterator[None]:
    """Turn transparent mode on or off for Numba's own operations on this thread
    inside the block.

    With the plugin selected, transparent mode (on unless
    ``NUMBA_STREAMSAFE_TRANSPARENT=0``) fences every plain ``cuda.jit`` launch
    and every copy and fill Numba makes on the library's memory, as tracked
    kernels and copies are fenced. ``transparent(False)`` leaves the plain
    Numba work inside the block unordered, as it is without the library: the
    program then orders it itself (events, synchronisation). On Numba's CUDA
    simulator the checker still sees that work, so its races are reported.
    Tracked kernels and the library's copies are fenced either way (see
    :func:`tracking` to switch those off).

    The setting belongs to the thread and covers every device: Numba's work
    on any GPU from this thread inside the block is left unordered
    (:func:`tracking`, by contrast, switches one device's runtime for every
    thread).

    Parameters
    ----------
    enabled : bool
        Transparent mode inside the block, on this thread.

    Yields
    ------
    None

    Raises
    ------
    InvalidArgument
        ``enabled`` is not a bool; or it is True in a process started with
        ``NUMBA_STREAMSAFE_TRANSPARENT=0``: the mode is off for the whole
        process there (no hook orders Numba's work), and this block cannot
        turn it on.

    Examples
    --------
    >>> with transparent(False):                 # doctest: +SKIP
    ...     legacy_stage[grid, block, s](x)      # ordered by hand below
    ...     done.record(s)
    """
    if not isinstance(enabled, bool):
        raise InvalidArgument(f"transparent(): enabled must be True or False, got {enabled!r}")
    if enabled and not settings().transparent:
        raise InvalidArgument(
            "transparent(True) cannot turn transparent mode on: this process started with "
            "NUMBA_STREAMSAFE_TRANSPARENT=0, which leaves Numba's own launches and copies "
            "unordered in the whole process. Unset the variable (the mode is on by default), "
            "or order that work with tracked kernels and copies")
    local = per_thread
    old = local.transparent
    local.transparent = FENCE if enabled else OBSERVE
    try:
        yield
    finally:
        local.transparent = old


def numba_call(work: Any, *args: Any) -> Any:
    """``work(*args)`` with transparent mode off on this thread: a call into
    Numba made inside an operation the library fences already (a tracked copy's
    ``copy_to_device``, a launch through Numba's path), whose own copies and
    launches are that operation's and are not fenced a second time."""
    local = per_thread
    old = local.transparent
    local.transparent = INSIDE
    try:
        return work(*args)
    finally:
        local.transparent = old


def current_stream() -> Any:
    """The stream of the innermost :func:`stream_scope` on this thread, or None.

    Returns
    -------
    stream-like or None
        The stream given to that scope."""
    stack = per_thread.stack
    return stack[-1] if stack else None


def device_scope() -> int | None:
    """The device of the innermost :func:`use_device` on this thread, or None."""
    return per_thread.device


def current_device() -> int:
    """The device work from this thread goes to now.

    On a GPU, the device of the thread's current context (``cuCtxGetDevice``:
    :func:`use_device` and Numba's ``with cuda.gpus[d]:`` make it current),
    else 0 (Numba makes device 0's context current when none is). On Numba's
    CUDA simulator, the device of the innermost :func:`use_device`, else 0.
    """
    if SIMULATOR:
        device = per_thread.device
        return 0 if device is None else device
    from numba_streamsafe._driver.cuda import context_device

    return context_device()


def check_device(device: Any, caller: str) -> None:
    """Refuse ``device`` unless it is a device ordinal of this process.

    Raises
    ------
    InvalidArgument
        ``device`` is not an int naming a device of this machine (on Numba's
        CUDA simulator: device 0, or one with a runtime installed).
    """
    from numba.cuda import gpus

    from numba_streamsafe.runtime import installed_devices

    ordinal = isinstance(device, int) and not isinstance(device, bool)
    # Numba's simulator has one device; more exist once their runtimes are installed.
    known = sorted({0, *installed_devices()}) if SIMULATOR else list(range(len(gpus)))
    if SIMULATOR and ordinal and device > 0:
        where = ("On Numba's CUDA simulator a simulated device exists once its runtime is "
                 f"built: call numba_streamsafe.get_runtime({device!r}) first (the simulated "
                 "devices share one race checker), as the guide's page on several GPUs shows")
    else:
        where = "Use one of those ordinals"
    if not ordinal or device not in known:
        raise InvalidArgument(
            f"{caller}({device!r}): there is no device {device!r}; this process has "
            f"{len(known)} device{'s' if len(known) != 1 else ''} ({', '.join(map(str, known))}). "
            f"{where}")


@contextlib.contextmanager
def use_device(device: int) -> Iterator[int]:
    """Send the library's work on this thread to ``device`` inside the block.

    New arrays (:func:`numba_streamsafe.device_array`, ``to_device``) are
    allocated there, and tracked launches, copies and memsets run there (their
    streams must be streams of that device), ordered with uses of other
    devices' arrays (see ``enable_peer_access``). On a GPU this enters Numba's
    ``with cuda.gpus[device]:`` (so plain Numba calls go there too; entering
    that directly works as well); on Numba's CUDA simulator it is the only way
    to choose a device. The device's runtime is built on entry if needed.

    Parameters
    ----------
    device : int
        The device ordinal.

    Yields
    ------
    int
        ``device``.

    Raises
    ------
    InvalidArgument
        ``device`` is not a device of this machine (or of the simulator).

    Examples
    --------
    >>> with use_device(1):                            # doctest: +SKIP
    ...     y = nss.device_array(n, stream=s1)         # on device 1
    ...     consume[grid, block, s1](x0, y)            # x0 of device 0: peer access
    """
    from numba.cuda import gpus

    from numba_streamsafe.runtime import get_runtime

    check_device(device, "use_device")
    get_runtime(device)
    old = per_thread.device
    per_thread.device = device
    try:
        if SIMULATOR:
            yield device
        else:
            with gpus[device]:
                yield device
    finally:
        per_thread.device = old


@contextlib.contextmanager
def tracking(enabled: bool, device: int | None = None) -> Iterator[None]:
    """Turn launch tracking on or off for one device inside the block.

    With tracking off, tracked kernels and copies launch without waits or
    events, as plain Numba would: this is how the examples show the race.

    Parameters
    ----------
    enabled : bool
        The ``tracking`` setting inside the block.
    device : int, optional
        The device whose runtime to switch. By default the device of the
        current context on entry: the innermost :func:`use_device` (or Numba's
        ``with cuda.gpus[d]:``), else device 0. Nest one block per device to
        switch several.

    Yields
    ------
    None

    Raises
    ------
    InvalidArgument
        ``enabled`` is not a bool, or ``device`` is not a device of this
        machine (or of the simulator).

    Notes
    -----
    The switch is a setting of one runtime, not of the process: on entry the
    block takes the runtime that ``get_runtime(device)`` returns then, sets
    its ``tracking`` to ``enabled``, and on exit puts back that runtime's
    previous setting. Hence:

    - work on other devices keeps their own setting: inside
      ``with use_device(1), tracking(False):`` only device 1 is untracked;
    - a runtime installed inside the block with
      :func:`~numba_streamsafe.set_runtime` is not switched: launches on it
      keep its own setting (tracked, for a tracking stack);
    - the runtime switched on entry is restored on exit even when it was
      replaced inside the block, and the replacement is left as it is;
    - install a runtime *before* entering the block to run it untracked.

    The setting is shared by every thread using that runtime (not per
    thread); nested blocks restore in the order they exit. Transparent mode
    (:func:`transparent`) is the other way round: a setting of the thread,
    for every device.

    Examples
    --------
    >>> with use_device(1), tracking(False):     # doctest: +SKIP
    ...     kernel[grid, block, s1](x1)          # device 1 untracked; device 0 as it was
    """
    from numba_streamsafe.numba.launch.policy import launch_policy
    from numba_streamsafe.runtime import get_runtime

    if not isinstance(enabled, bool):
        raise InvalidArgument(f"tracking(): enabled must be True or False, got {enabled!r}")
    if device is None:
        device = current_device()
    else:
        check_device(device, "tracking")
    policy = launch_policy(get_runtime(device))
    old = policy.tracking
    policy.tracking = enabled
    try:
        yield
    finally:
        policy.tracking = old
