"""Transparent mode: an unmodified Numba program, ordered and checked.

With the plugin selected (``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe``, or
``numba.cuda.set_memory_manager``), every device array Numba makes is a block
of the library. :func:`install` hooks the few places all of Numba's work on
those arrays goes through, so plain Numba code gets the launch protocol too:

* **launches**: ``dispatcher[grid, block, stream, shmem]`` of a ``cuda.jit``
  kernel (``CUDADispatcher.__getitem__``; ``forall``, CUDA ufuncs, gufuncs and
  ``cuda.reduce`` launch through it) gives a configured launch of the
  kernel's plain :class:`~numba_streamsafe.numba.launch.kernel.TrackedKernel`: accesses
  inferred from the kernel, fenced like a tracked launch, launched directly
  (and on the compiled path) where a tracked launch would be;
* **copies and fills**: numba-cuda's driver-level ``host_to_device``,
  ``device_to_host``, ``device_to_device``, ``device_memset`` and
  ``MemoryPointer.memset``, which ``copy_to_host``, ``copy_to_device``,
  ``cuda.to_device``, indexing and assignment all reach: fenced when they
  touch a block of the library (writes of the destination, reads of the
  source), passed through otherwise (:mod:`~numba_streamsafe.numba.copies`,
  in the compiled engine);
* **on Numba's CUDA simulator**: the simulator's kernels and array copies,
  and its streams' and events' synchronisation (``Stream.synchronize``,
  ``cuda.synchronize``, ``Event.record`` / ``wait`` / ``synchronize``, the
  default streams), which the simulated driver's checker then sees.
* **the program's own ordering**: Numba's ``Event.record`` / ``wait`` /
  ``synchronize``, ``Stream.synchronize`` and ``cuda.synchronize`` (on a GPU,
  and on the simulator) tell the tracking resource what the program already
  orders, so the library queues no wait the program's own synchronisation
  satisfies (``memory_stats()["waits_skipped"]``). An event recorded on a
  stream that has uses closes the stream's mark, which borrows the
  program's event in place of one of the library's
  (:mod:`~numba_streamsafe.numba.program_order`, in the compiled engine).
* **Python host callbacks**: Numba's ``Stream.add_callback`` (and so
  ``async_done``) makes every later compiled launch release the GIL
  (:func:`~numba_streamsafe.numba.launch.launcher.release_gil`).

Frees need no hook: a block's free waits for every use recorded on it, and
plain uses are recorded now.

What stays outside: raw pointers and kernels that receive them (a
``CPointer`` argument), foreign memory not imported
(:func:`~numba_streamsafe.from_dlpack`), and work queued by other libraries.
``NUMBA_STREAMSAFE_TRANSPARENT=0`` leaves plain Numba unordered (on a GPU no
hook is installed; on the simulator the checker still sees the work);
:func:`~numba_streamsafe.transparent` does the same for part of a program.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any

from numba_streamsafe.core.access import Access
from numba_streamsafe.core.errors import DriverError, InvalidArgument, InvalidLaunchConfig
from numba_streamsafe.core.settings import settings
from numba_streamsafe.numba import copies, program_order, target
from numba_streamsafe.numba.launch import launcher
from numba_streamsafe.numba.launch.kernel import TrackedKernel
from numba_streamsafe.numba.scope import FENCE, INSIDE, per_thread
from numba_streamsafe.runtime import installed_runtime

__all__ = ["install", "uninstall", "installed"]

_lock = threading.Lock()
#: (owner, name) -> the attribute replaced, for :func:`uninstall`.
_saved: dict[tuple[Any, str], Any] = {}
#: Whether the hooks fence (the setting), or only show work to a checking driver.
_fence = True


def installed() -> bool:
    """Whether Numba's operations are hooked in this process."""
    return bool(_saved)


def install() -> None:
    """Hook Numba's launches, copies and fills (and, on the simulator, its
    synchronisation) per ``NUMBA_STREAMSAFE_TRANSPARENT``; idempotent.

    On a GPU with the setting off nothing is hooked; on the simulator the
    hooks then show the work to the checker without ordering it.
    """
    global _fence
    with _lock:
        if _saved:
            return
        _fence = settings().transparent
        if target.SIMULATOR:
            _install_simulator()
        elif _fence:
            _install_gpu()


def uninstall() -> None:
    """Give Numba its own functions back."""
    with _lock:
        for (owner, name), value in _saved.items():
            setattr(owner, name, value)
        _saved.clear()


def _replace(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    _saved[(owner, name)] = original
    setattr(owner, name, make(original))


# ------------------------------------------------------------------ launches
def _plain_kernel(dispatcher: Any, configure: Callable[[Any, Any], Any]) -> Any:
    """The dispatcher's plain kernel (``TrackedKernel.plain``), made on first use; False for a
    device function or a kernel transparent mode leaves to Numba."""
    kernel = dispatcher.__dict__.get("_nss_plain")
    if kernel is None:
        try:
            kernel = TrackedKernel.plain(dispatcher, configure, _fence)
        except InvalidArgument:  # keyword-only or ** parameters: Numba launches them, unordered
            kernel = False
        kernel = dispatcher.__dict__.setdefault("_nss_plain", kernel)
    return kernel


def _launch_hook(original: Callable[[Any, Any], Any], is_device: Callable[[Any], bool]
                 ) -> Callable[[Any, Any], Any]:
    def __getitem__(self: Any, config: Any) -> Any:
        kernel = self.__dict__.get("_nss_plain")
        if kernel is None:
            kernel = False if is_device(self) else _plain_kernel(self, original)
        mode = per_thread.transparent
        # OBSERVE on a GPU: no checker to show the launch to, so Numba's own path
        # (the compiled launch path knows nothing of the thread's mode).
        if (kernel is False or mode == INSIDE or (mode != FENCE and not target.SIMULATOR)
                or type(config) is not tuple or not 2 <= len(config) <= 4):
            return original(self, config)
        return kernel[config]

    __getitem__.__doc__ = original.__doc__
    return __getitem__


def _configured(config: Any) -> Any:
    """The tracked-launch equivalent of one of Numba's configured launches, or
    False when transparent mode leaves the kernel to Numba."""
    dispatcher = config.dispatcher
    if dispatcher.targetoptions.get("device"):
        return False
    kernel = _plain_kernel(dispatcher, _numba_configure)
    if kernel is False:
        return False
    stream = config.__dict__.get("_nss_stream", config.stream)
    return kernel[config.griddim, config.blockdim, stream, config.sharedmem]


def _numba_configure(dispatcher: Any, config: tuple[Any, ...]) -> Any:
    """Numba's own configured launch, called by Numba's path (no hook on it)."""
    launch = dispatcher.configure(*config)
    return functools.partial(_saved[(type(launch), "__call__")], launch)


def _config_init_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self: Any, dispatcher: Any, griddim: Any, blockdim: Any, stream: Any,
                 sharedmem: Any) -> None:
        original(self, dispatcher, griddim, blockdim, stream, sharedmem)
        self._nss_stream = stream  # the user's stream object: kept alive by the launch's uses

    return __init__


def _config_call_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    def __call__(self: Any, *args: Any) -> Any:
        launch = self.__dict__.get("_nss_launch")
        if launch is None:
            launch = self._nss_launch = _configured(self)
        # Numba's pre-launch callbacks (numba-cuda 0.30 on) run on Numba's path.
        if (launch is False or per_thread.transparent != FENCE
                or self.__dict__.get("pre_launch_callbacks")):
            return original(self, *args)
        try:
            return launch(*args)
        except InvalidLaunchConfig:
            return original(self, *args)  # Numba's path raises Numba's error for it
        except DriverError as exc:
            if exc.call != "cuLaunchKernel":
                raise
            # The direct launch was refused and nothing ran: Numba's path raises
            # Numba's own error for it (as a plain launch does).
            return original(self, *args)

    __call__.__doc__ = original.__doc__
    return __call__


def _config_getstate_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    def __getstate__(self: Any) -> Any:
        state = original(self)
        state.pop("_nss_launch", None)
        state.pop("_nss_stream", None)
        return state

    return __getstate__


def _install_gpu() -> None:
    from numba.cuda.cudadrv import driver as numba_driver
    from numba.cuda.dispatcher import _LaunchConfiguration

    # Numba configures the launch (dimensions checked, its warnings, callbacks, the
    # thread's launch arguments); the call runs it as a tracked launch.
    _replace(_LaunchConfiguration, "__init__", _config_init_hook)
    _replace(_LaunchConfiguration, "__call__", _config_call_hook)
    _replace(_LaunchConfiguration, "__getstate__", _config_getstate_hook)
    for name, label, write_dst, read_src, host_waits in (
            ("host_to_device", "copy to device (Numba)", True, False, "before"),
            ("device_to_host", "copy to host (Numba)", False, True, "after"),
            ("device_to_device", "device copy (Numba)", True, True, None),
            ("device_memset", "memset (Numba)", True, False, None)):
        _replace(numba_driver, name, functools.partial(
            copies.copy_hook, fence=_fence, label=label, write_dst=write_dst,
            read_src=read_src, host_waits=host_waits))
    _replace(numba_driver.MemoryPointer, "memset",
             functools.partial(copies.pointer_memset_hook, fence=_fence))
    # The program's own ordering (its events, stream and device synchronises):
    # the waits it satisfies are skipped.
    _replace(numba_driver.Event, "record", program_order.record_hook)
    _replace(numba_driver.Event, "wait", program_order.wait_hook)
    _replace(numba_driver.Event, "synchronize", program_order.event_completed_hook)
    _replace(numba_driver.Event, "query", program_order.event_completed_hook)
    _replace(numba_driver.Stream, "synchronize", program_order.stream_synchronize_hook)
    # A Python host callback needs the GIL: no launch keeps it from then on.
    _replace(numba_driver.Stream, "add_callback", _gpu_stream_add_callback)
    _replace(numba_driver.Context, "synchronize", _gpu_context_synchronize)


def _gpu_stream_add_callback(original: Callable[..., Any]) -> Callable[..., Any]:
    def add_callback(self: Any, callback: Any, arg: Any = None) -> None:
        launcher.release_gil(True)
        original(self, callback, arg)
    add_callback.__doc__ = original.__doc__
    return add_callback


def _gpu_context_synchronize(original: Callable[..., Any]) -> Callable[..., Any]:
    def synchronize(self: Any) -> None:
        # cuCtxSynchronize waits for the calling thread's current context,
        # whichever context object it is called on.
        program_order.device_synchronised(installed_runtime(target.current_device()),
                                          lambda: original(self))
    synchronize.__doc__ = original.__doc__
    return synchronize


# ---------------------------------------------------------------- simulator
def _sim_op(label: str, stream: Any, pairs: tuple[tuple[Any, Access, str], ...], sync: bool,
            work: Callable[..., Any], *args: Any) -> Any:
    """One of the simulator's array operations, shown to the checker (and
    ordered, in transparent mode); ``sync``: the host waits for it, as for
    Numba's copies on the default stream."""
    if per_thread.transparent == INSIDE or isinstance(threading.current_thread(), _KernelThread):
        return work(*args)  # inside a fenced operation, or a kernel's own element access
    rt = target.launch_runtime()
    uses = copies.NumbaUses(rt)
    for obj, access, name in pairs:
        if isinstance(obj, _SimArray):
            _, block, _ = target.resolve(rt, obj)
            if block is not None:
                uses.add(block, access, name, *target.array_span(block, obj))
    if not uses.blocks:
        return work(*args)
    result = copies.fence_numba(_fence, label, stream, uses, work, *args)
    if sync:
        handle = program_order.stream_ref(rt, stream)[0]
        if rt.observing:  # the host waits for the copy: told to the resource
            program_order.synchronised(rt, handle, lambda: rt.driver.stream_synchronize(handle))
        else:
            rt.driver.stream_synchronize(handle)
    return result


_SimArray: Any = None
#: The simulator's thread type that runs a kernel's blocks.
_KernelThread: Any = None


def _value(value: Any) -> Any:
    return value


def _install_sim_arrays() -> None:
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
    from numba.cuda.simulator.kernel import BlockThread

    global _SimArray, _KernelThread
    _SimArray, _KernelThread = FakeCUDAArray, BlockThread

    def copy_to_host(original: Any) -> Any:
        def hook(self: Any, ary: Any = None, stream: Any = 0) -> Any:
            return _sim_op("copy to host (Numba)", stream, ((self, Access.READ, "array"),),
                           not stream, original, self, ary, stream)
        return hook

    def copy_to_device(original: Any) -> Any:
        def hook(self: Any, ary: Any, stream: Any = 0) -> Any:
            device = isinstance(ary, FakeCUDAArray)
            return _sim_op("device copy (Numba)" if device else "copy to device (Numba)",
                           stream, ((self, Access.WRITE, "dst"), (ary, Access.READ, "src")),
                           not stream and not device, original, self, ary, stream)
        return hook

    def getitem(original: Any) -> Any:
        def hook(self: Any, idx: Any) -> Any:
            value = original(self, idx)
            if isinstance(value, FakeCUDAArray) or isinstance(threading.current_thread(),
                                                             BlockThread):
                return value  # a view (no access), or a kernel's own element read
            # An element: Numba copies it to the host on the array's stream.
            return _sim_op("element read (Numba)", self.stream, ((self, Access.READ, "array"),),
                           not self.stream, _value, value)
        return hook

    def setitem(original: Any) -> Any:
        def hook(self: Any, idx: Any, value: Any) -> Any:
            return _sim_op("assignment (Numba)", self.stream,
                           ((self, Access.WRITE, "array"), (value, Access.READ, "value")),
                           not self.stream, original, self, idx, value)
        return hook

    for name, make in (("copy_to_host", copy_to_host), ("copy_to_device", copy_to_device),
                       ("__getitem__", getitem), ("__setitem__", setitem)):
        _replace(FakeCUDAArray, name, make)


def _sim_handle(stream: Any) -> tuple[Any, int]:
    rt = target.launch_runtime()
    return rt, program_order.stream_ref(rt, stream)[0]


def _sim_event(rt: Any, event: Any) -> int:
    """The simulated driver's event behind a simulator ``Event``, made on first use."""
    mine = event.__dict__.get("_nss_event")
    if mine is None or mine[0] is not rt.driver:
        driver = rt.driver
        handle = driver.event_create()
        weakref.finalize(event, _destroy_event, driver, handle)
        mine = event.__dict__["_nss_event"] = (driver, handle)
    return mine[1]  # type: ignore[no-any-return]


def _destroy_event(driver: Any, handle: int) -> None:
    try:
        driver.event_destroy(handle)
    except Exception:  # the driver was reset or replaced: nothing to give back
        pass


def _stream_synchronize(original: Any) -> Any:
    def synchronize(self: Any) -> None:
        rt, handle = _sim_handle(self)
        program_order.synchronised(rt, handle, lambda: rt.driver.stream_synchronize(handle))
    synchronize.__doc__ = original.__doc__
    return synchronize


def _device_synchronize(original: Any) -> Any:
    def synchronize() -> None:
        rt = target.launch_runtime()
        program_order.device_synchronised(rt, rt.driver.synchronize)
    synchronize.__doc__ = original.__doc__
    return synchronize


def _event_record(original: Any) -> Any:
    def record(self: Any, stream: Any = 0) -> None:
        rt, handle = _sim_handle(stream)
        event = _sim_event(rt, self)
        program_order.record(rt, self, handle, event, False, rt.driver.event_record,
                             (event, handle))
    return record


def _event_wait(original: Any) -> Any:
    def wait(self: Any, stream: Any = 0) -> None:
        rt = target.launch_runtime()
        handle, owner = program_order.stream_ref(rt, stream)
        event = _sim_event(rt, self)
        program_order.wait(rt, self, handle, owner, event, False, rt.driver.stream_wait_event,
                           (handle, event))
    return wait


def _event_synchronize(original: Any) -> Any:
    def synchronize(self: Any) -> None:
        rt = target.launch_runtime()
        program_order.completed(self, lambda: rt.driver.event_synchronize(  # type: ignore[attr-defined]
            _sim_event(rt, self)))
    return synchronize


def _install_sim_sync() -> None:
    from numba import cuda
    from numba.cuda.simulator import api

    from numba_streamsafe.numba import sim_plugin

    sim_plugin.install_default_streams()  # known by their handles, with or without the hooks
    _replace(api.stream, "synchronize", _stream_synchronize)
    for module in (api, cuda):
        _replace(module, "synchronize", _device_synchronize)
    for name, make in (("record", _event_record), ("wait", _event_wait),
                       ("synchronize", _event_synchronize)):
        _replace(api.Event, name, make)


def _install_simulator() -> None:
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    def is_device(kernel: Any) -> bool:
        return bool(kernel._device)

    _replace(FakeCUDAKernel, "__getitem__", lambda f: _launch_hook(f, is_device))
    _install_sim_arrays()
    _install_sim_sync()
