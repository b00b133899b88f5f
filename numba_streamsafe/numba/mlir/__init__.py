"""numba-cuda-mlir: what the library supports under it, and what it refuses.

numba-cuda-mlir (``from numba_cuda_mlir import cuda``) compiles kernels with
MLIR and launches them through a launcher of its own, but vendors
numba-cuda's driver, with its External Memory Management hook
(``NUMBA_CUDA_MEMORY_MANAGER``, ``set_memory_manager``). That hook is all
the library can reach:

* **supported**: the memory-manager plugin. Given a numba-cuda-mlir context,
  :class:`~numba_streamsafe.StreamSafeMemoryManager` makes the plugin on
  numba-cuda-mlir's own classes (:mod:`numba_streamsafe.numba.mlir.emm`):
  device allocations come from the device's runtime, stream-ordered on the
  innermost :func:`~numba_streamsafe.stream_scope`'s stream (else the default
  stream), and each is freed in stream order on its stream when dropped.
* **refused** (:func:`check_settings`, :func:`check_kernel`): transparent
  mode and check mode, whose hooks are numba-cuda's launch path (numba-cuda-mlir
  launches without it, so no launch would be ordered or seen); the simulated
  driver (numba-cuda-mlir has no CUDA simulator); and tracked kernels written
  for numba-cuda-mlir (:func:`~numba_streamsafe.tracked_kernel` compiles with
  numba-cuda's ``cuda.jit``).

Nothing here imports numba-cuda-mlir: the plugin's module does, when a
numba-cuda-mlir context asks for it.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from numba_streamsafe.core.errors import InvalidArgument, StreamSafeError
from numba_streamsafe.core.settings import settings

__all__ = ["PACKAGE", "is_mlir_context", "check_settings", "check_kernel", "memory_manager"]

#: The import name of numba-cuda-mlir.
PACKAGE = "numba_cuda_mlir"

_GUIDE = "(see the guide's numba-cuda-mlir page)"


def _is_mlir(obj: Any) -> bool:
    """Whether ``obj`` is a module of numba-cuda-mlir or something one defines."""
    name = obj.__name__ if isinstance(obj, types.ModuleType) else \
        getattr(obj, "__module__", None)
    return isinstance(name, str) and (name == PACKAGE or name.startswith(PACKAGE + "."))


def is_mlir_context(context: Any) -> bool:
    """Whether ``context`` (what a driver hands its memory manager) is a
    numba-cuda-mlir context."""
    return context is not None and _is_mlir(type(context))


def check_settings() -> None:
    """Refuse the settings numba-cuda-mlir cannot work with: check mode,
    transparent mode (on unless ``NUMBA_STREAMSAFE_TRANSPARENT=0``) and the
    simulated driver.

    Raises
    ------
    StreamSafeError
        One of them is set; the message says which and what to do.
    """
    config = settings()
    if config.mode == "check":
        raise StreamSafeError(
            "NUMBA_STREAMSAFE_MODE=check is not supported under numba-cuda-mlir: "
            "numba_streamsafe cannot see its kernel launches, so races would go unreported. "
            "Unset NUMBA_STREAMSAFE_MODE, or check the program on numba-cuda "
            f"(from numba import cuda) {_GUIDE}")
    if config.transparent:
        raise StreamSafeError(
            "transparent mode is not supported under numba-cuda-mlir: numba_streamsafe "
            "cannot order its kernel launches and copies. Set NUMBA_STREAMSAFE_TRANSPARENT=0 "
            "to use the plugin as a stream-ordered allocator only (the program orders its "
            "streams itself, frees included), or use numba-cuda (from numba import cuda) "
            f"for transparent mode {_GUIDE}")
    if config.driver == "sim":
        raise StreamSafeError(
            "numba-cuda-mlir has no CUDA simulator: numba_streamsafe's simulated driver "
            "(NUMBA_STREAMSAFE_DRIVER=sim, the default under NUMBA_ENABLE_CUDASIM=1) cannot "
            "serve its GPU contexts. Unset NUMBA_STREAMSAFE_DRIVER and NUMBA_ENABLE_CUDASIM "
            f"{_GUIDE}")


def check_kernel(func: Callable[..., Any]) -> None:
    """Refuse a kernel written for numba-cuda-mlir as a tracked kernel: one
    whose code reads a global that is numba-cuda-mlir's (its ``cuda`` module,
    or a name imported from it).

    Raises
    ------
    InvalidArgument
        The kernel is written for numba-cuda-mlir.
    """
    code = getattr(func, "__code__", None)
    namespace = getattr(func, "__globals__", None)
    if code is None or namespace is None:
        return
    for name in code.co_names:
        value = namespace.get(name)
        if value is not None and _is_mlir(value):
            kernel = getattr(func, "__name__", "kernel")
            raise InvalidArgument(
                f"tracked_kernel {kernel}: the kernel is written for numba-cuda-mlir (its "
                f"{name!r} is numba-cuda-mlir's), but tracked kernels compile with numba-cuda's "
                "cuda.jit: they are not supported under numba-cuda-mlir. Write the kernel with "
                "numba-cuda (from numba import cuda), or launch it with numba-cuda-mlir's own "
                f"cuda.jit and order its streams yourself {_GUIDE}")


def memory_manager(*args: Any, **kwargs: Any) -> Any:
    """The plugin for a numba-cuda-mlir context, on numba-cuda-mlir's own
    classes, made with the arguments its driver gives (``context=``), once
    the settings are checked (:func:`check_settings`).

    Raises
    ------
    StreamSafeError
        A setting numba-cuda-mlir cannot work with.
    """
    check_settings()
    from numba_streamsafe.numba.mlir.emm import MlirMemoryManager

    return MlirMemoryManager(*args, **kwargs)
