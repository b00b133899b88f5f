"""Numba's CUDA simulator, with the plugin selected, allocates through the library.

Numba's simulator has no memory managers: ``cuda.device_array`` and friends
make NumPy-backed arrays that no resource tracks. When the plugin is selected
(``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe`` before ``numba_streamsafe`` is
imported, or ``numba.cuda.set_memory_manager(numba_streamsafe.StreamSafeMemoryManager)``,
which the simulator is given here), :func:`install` routes the simulator's
``cuda.device_array``, ``device_array_like`` and ``to_device`` to
:func:`numba_streamsafe.device_array` / :func:`~numba_streamsafe.to_device`,
so a program written against plain Numba runs unchanged on the CPU, tracked
and checked by the simulated driver. Host arrays passed to tracked kernels
are uploaded by the kernel itself (see ``TrackedKernel``).

Allocations without a stream are ordered on the innermost
:func:`~numba_streamsafe.stream_scope`, else on the default stream, as the
plugin orders them on a GPU. ``pinned_array`` and ``mapped_array`` (host
memory) are left to the simulator.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

__all__ = ["selected", "install", "uninstall", "installed", "install_default_streams",
           "shim_set_memory_manager", "setup"]

_NAMES = ("device_array", "device_array_like", "to_device", "close", "stream")
_original: dict[str, Any] = {}
_lock = threading.Lock()


def selected() -> bool:
    """Whether the environment selects the plugin (``NUMBA_CUDA_MEMORY_MANAGER``)."""
    return os.environ.get("NUMBA_CUDA_MEMORY_MANAGER", "").strip() == "numba_streamsafe"


def installed() -> bool:
    """Whether the simulator's allocation calls go through the library."""
    return bool(_original)


def _stream(stream: Any) -> Any:
    # Numba's stream=0 is "no stream given": the plugin's scope rules apply.
    return None if stream is None or (isinstance(stream, int) and stream == 0) else stream


#: The library's array calls, given by :func:`setup` (numba_streamsafe.numba.arrays).
_library: dict[str, Any] = {}


def _device_array(shape: Any, dtype: Any = np.float64, strides: Any = None, order: str = "C",
                  stream: Any = 0) -> Any:
    if strides is not None:
        # Numba's strides argument: only the C and F layouts are made here.
        return _original["device_array"](shape, dtype, strides, order, stream)
    return _library["device_array"](shape, dtype, stream=_stream(stream), order=order,
                                    tag="cuda.device_array")


def _device_array_like(ary: Any, stream: Any = 0) -> Any:
    host = np.asarray(ary) if not hasattr(ary, "shape") else ary
    flags = getattr(host, "flags", None)
    order = "F" if flags is not None and flags.f_contiguous and not flags.c_contiguous else "C"
    return _library["device_array"](tuple(host.shape), host.dtype, stream=_stream(stream),
                                    order=order, tag="cuda.device_array_like")


def _to_device(obj: Any, stream: Any = 0, copy: bool = True, to: Any = None) -> Any:
    if not copy and to is None:
        return _device_array_like(np.asarray(obj), stream)
    return _library["to_device"](obj, stream=_stream(stream), to=to, tag="cuda.to_device")


def _close() -> None:
    """``numba.cuda.close()``: the simulator's contexts go, and with them every
    block of the installed runtimes, as the plugin's ``reset`` does on a GPU
    (arrays from before are refused with ``StaleContext``)."""
    from numba_streamsafe.runtime import installed_devices, installed_runtime

    _original["close"]()
    for device in installed_devices():
        rt = installed_runtime(device)
        if rt is not None:
            rt.reset()


def _new_stream() -> Any:
    """``numba.cuda.stream()``: the simulator's stream, marked with the device it
    was made on (:func:`~numba_streamsafe.use_device`), which alone may use it,
    as a GPU's stream belongs to its context."""
    from numba_streamsafe.numba.scope import current_device

    stream = _original["stream"]()
    stream._nss_device = current_device()
    return stream


_PATCHES = {"device_array": _device_array, "device_array_like": _device_array_like,
            "to_device": _to_device, "close": _close, "stream": _new_stream}


#: ``(install, uninstall)`` of what comes with the routing (transparent mode),
#: given by the plugin's module (:func:`add_companion`).
_companions: list[tuple[Any, Any]] = []


def add_companion(install_it: Any, uninstall_it: Any) -> None:
    """Install ``install_it()`` with the routing (now, if it is installed) and
    ``uninstall_it()`` with its removal."""
    _companions.append((install_it, uninstall_it))
    if _original:
        install_it()


def install() -> None:
    """Route the simulator's allocation calls through the library, with its
    companions (idempotent)."""
    from numba import cuda

    with _lock:
        if not _original:
            for name in _NAMES:
                _original[name] = getattr(cuda, name)
                setattr(cuda, name, _PATCHES[name])
    for install_it, _ in _companions:
        install_it()


def uninstall() -> None:
    """Give the simulator its own allocation calls back."""
    from numba import cuda

    with _lock:
        for name, fn in _original.items():
            setattr(cuda, name, fn)
        _original.clear()
    for _, uninstall_it in _companions:
        uninstall_it()


#: The simulator's default streams, once :func:`install_default_streams` made them.
_defaults: list[Any] = []


def install_default_streams() -> None:
    """Give the simulator's ``default_stream()``, ``legacy_default_stream()``
    and ``per_thread_default_stream()`` one object each, carrying CUDA's
    handle of that stream (0, the legacy one, or 2, the per-thread one;
    ``default_stream()`` gives the one the settings make the default), as a
    GPU's do. The simulator's own make a new stream object each call, which
    the library would take for a new blocking stream (a race between a
    default stream and itself, a graph captured on it). Idempotent."""
    from numba import cuda
    from numba.cuda.simulator import api

    from numba_streamsafe.core.streams import default_stream_handle

    with _lock:
        if _defaults:
            return

        class _DefaultStream(api.stream):  # type: ignore[misc, name-defined]
            """A default stream of the simulator, known by its CUDA handle."""

            def __init__(self, handle: int) -> None:
                self.handle = handle

        legacy, per_thread = _DefaultStream(0), _DefaultStream(2)

        def default_stream() -> Any:
            return per_thread if default_stream_handle() else legacy

        calls = {"default_stream": default_stream, "legacy_default_stream": lambda: legacy,
                 "per_thread_default_stream": lambda: per_thread}
        for module in (api, cuda):
            for name, call in calls.items():
                setattr(module, name, call)
        _defaults.extend((legacy, per_thread))


def shim_set_memory_manager() -> None:
    """Give the simulator a ``numba.cuda.set_memory_manager`` (it has none):
    selecting :class:`~numba_streamsafe.StreamSafeMemoryManager` installs the
    routing, any other class takes it away."""
    from numba import cuda

    if hasattr(cuda, "set_memory_manager"):
        return

    def set_memory_manager(mm_plugin: Any) -> None:
        if isinstance(mm_plugin, type) and getattr(mm_plugin, "_nss_plugin", False):
            install()
        else:
            uninstall()

    cuda.set_memory_manager = set_memory_manager


def setup(device_array: Any, to_device: Any) -> None:
    """Under the simulator: route to the library's ``device_array`` and
    ``to_device`` (given by the array module, which calls this on import), the
    default streams (:func:`install_default_streams`), the
    ``set_memory_manager`` shim, and the routing now when the environment
    selects the plugin."""
    from numba import config

    if not config.ENABLE_CUDASIM:  # type: ignore[attr-defined]
        return
    _library.update(device_array=device_array, to_device=to_device)
    install_default_streams()
    shim_set_memory_manager()
    if selected():
        install()
