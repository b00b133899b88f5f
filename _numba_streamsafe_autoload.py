"""Run at interpreter start (``numba_streamsafe_sim.pth``): under Numba's CUDA
simulator with the plugin selected, load the plugin right after ``numba.cuda``.

On a GPU Numba imports the plugin named by ``NUMBA_CUDA_MEMORY_MANAGER``
itself; its CUDA simulator never does, so a program that does not import
``numba_streamsafe`` would run unordered and unchecked there. Without both
variables set this module only reads them.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def _wanted() -> bool:
    return (os.environ.get("NUMBA_ENABLE_CUDASIM", "0").strip() not in ("", "0")
            and os.environ.get("NUMBA_CUDA_MEMORY_MANAGER", "").strip() == "numba_streamsafe")


class _ThenPlugin:
    """The loader of ``numba.cuda``, followed by the import of the plugin."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        import numba_streamsafe  # noqa: F401 - routes the simulator, transparent mode

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Finder:
    """Finds ``numba.cuda`` with the other finders and wraps its loader, once."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "numba.cuda":
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ThenPlugin(spec.loader)
                return spec
        return None


if _wanted() and "numba.cuda" not in sys.modules:
    sys.meta_path.insert(0, _Finder())
