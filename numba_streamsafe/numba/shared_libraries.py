"""Unloading a kernel's library once when several GPUs share it.

numba-cuda (0.24 to 0.30, the supported releases) links a kernel once per
compute capability and loads the resulting ``cuda.core`` ``ObjectCode`` into
every context that launches it. Its handle is a context-independent
``CUlibrary``, so two GPUs of one kind hold *the same* handle, each in its own
context's module table.
Each context's module finalizer queues ``cuLibraryUnload`` of that handle:
the second call unloads a library already gone, and the driver crashes
(SIGSEGV, or glibc's "double free"). It shows at interpreter exit, when the
finalizers of both contexts run and each queue of pending deallocations is
long enough to be flushed there; a program that unloads a kernel from one
context and then the other (``cuda.close()``, a context reset) meets it too.

:func:`install` puts :class:`SharedLibraryUnload` in front of Numba's
``cuLibraryUnload``: a library still held by another live context is left to
that context's own unload, so each library is unloaded once, by the last
context holding it (at interpreter exit, a library held by several contexts is
left to the process's end).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["SharedLibraryUnload", "install"]


class SharedLibraryUnload:
    """Numba's ``cuLibraryUnload``, skipped while another context holds the library.

    Parameters
    ----------
    unload : callable
        Numba's checked ``cuLibraryUnload`` (raises on a driver error).
    contexts : callable
        Returns Numba's live contexts (objects with a ``modules`` mapping keyed
        by library handle).
    shutting_down : callable
        True once the interpreter is exiting: a context's own module is then
        still in its table when its unload runs.
    """

    def __init__(self, unload: Callable[[Any], Any], contexts: Callable[[], list[Any]],
                 shutting_down: Callable[[], bool]) -> None:
        self.unload = unload
        self.contexts = contexts
        self.shutting_down = shutting_down
        #: Unloads left to another context (for the tests and diagnostics).
        self.skipped = 0

    def holders(self, handle: Any) -> int:
        """How many live contexts have a module loaded from ``handle``."""
        value = int(handle)
        return sum(any(int(key) == value for key in list(ctx.modules))
                   for ctx in self.contexts())

    def __call__(self, handle: Any) -> Any:
        # Outside shutdown the unloading context has already dropped its module
        # (Context.unload_module, Context.reset); at shutdown it still holds it.
        others = self.holders(handle) - (1 if self.shutting_down() else 0)
        if others > 0:
            self.skipped += 1
            return None
        return self.unload(handle)


def _numba_contexts(driver: Any) -> Callable[[], list[Any]]:
    def contexts() -> list[Any]:
        found = []
        for device in list(driver.devices.values()):
            ctx = getattr(device, "primary_context", None)
            if ctx is not None:
                found.append(ctx)
        return found

    return contexts


def install() -> SharedLibraryUnload | None:
    """Put :class:`SharedLibraryUnload` in front of Numba's ``cuLibraryUnload``
    (once per process); returns it, or None where Numba unloads no libraries
    (an older numba-cuda, or its CUDA simulator)."""
    from numba import config

    if config.ENABLE_CUDASIM:  # type: ignore[attr-defined]
        return None
    from numba.cuda.cudadrv import driver as numba_driver

    drv = numba_driver.driver
    current = drv.__dict__.get("cuLibraryUnload")
    if isinstance(current, SharedLibraryUnload):
        return current
    wrap = getattr(drv, "_cuda_python_wrap_fn", None)
    if wrap is None or not hasattr(numba_driver, "_module_finalizer"):
        return None
    try:
        from numba.cuda import utils  # type: ignore[attr-defined]

        shutting_down = utils.shutting_down
        real = current if current is not None else wrap("cuLibraryUnload")
    except (AttributeError, ImportError):  # a numba-cuda without libraries
        return None
    guard = SharedLibraryUnload(real, _numba_contexts(drv), shutting_down)
    drv.cuLibraryUnload = guard  # type: ignore[attr-defined]
    return guard
