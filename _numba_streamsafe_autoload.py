"""Run at interpreter start (``numba_streamsafe_sim.pth``): under Numba's CUDA
simulator with a memory manager selected, load it right after ``numba.cuda``.

On a GPU Numba imports the plugin named by ``NUMBA_CUDA_MEMORY_MANAGER``
itself, and refuses a name it cannot import; its CUDA simulator never
does, so a program that does not import ``numba_streamsafe`` would run
unordered and unchecked there, and a misspelled name would go unnoticed.
Here ``numba_streamsafe`` is imported (routing the simulator, transparent
mode), and a name that no module has raises the error Numba raises on a
GPU. Without a manager selected this module only reads the variable; with
one, whether the simulator is on is read when ``numba.cuda`` loads. The
package's wheel and its editable install both put the ``.pth`` file beside
it (``setup.py``).

PYTEST_DONT_REWRITE: the package declares a pytest plugin, so pytest marks
its modules for assertion rewriting; this one is imported before pytest
starts, and the marker keeps pytest from warning that it cannot rewrite it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

PLUGIN = "numba_streamsafe"


def _selected() -> str | None:
    """The memory manager the environment selects, or None."""
    name = os.environ.get("NUMBA_CUDA_MEMORY_MANAGER", "").strip()
    return None if name in ("", "default") else name


def _simulator() -> bool:
    """Whether Numba's CUDA simulator is selected (read when ``numba.cuda``
    loads: a program may select it after start-up, before that import)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0").strip() not in ("", "0")


def load(name: str) -> None:
    """Import this library's plugin; for another memory manager, check that
    ``name`` names a module (the simulator cannot use another library's
    manager, so it is not imported).

    Raises
    ------
    RuntimeError
        ``name`` names no importable module (Numba's error on a GPU), with
        the name this library is imported by when ``name`` looks like a
        misspelling of it.
    """
    try:
        if name == PLUGIN:
            importlib.import_module(name)
        elif importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r}")
    except Exception as exc:
        hint = ""
        if name != PLUGIN and name.replace("-", "_").lower().startswith("numba_stream"):
            hint = f" (this library's plugin is named {PLUGIN!r})"
        raise RuntimeError(
            f"Failed to use memory manager from {name}: NUMBA_CUDA_MEMORY_MANAGER names a "
            f"module that cannot be imported ({type(exc).__name__}: {exc}){hint}. Numba "
            "refuses it on a GPU; set the variable to an importable module, or unset it"
        ) from exc


class _ThenPlugin:
    """The loader of ``numba.cuda``, followed by the import of the plugin."""

    def __init__(self, inner: Any, name: str) -> None:
        self._inner = inner
        self._name = name

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        load(self._name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Finder:
    """Finds ``numba.cuda`` with the other finders and wraps its loader, once."""

    def __init__(self, name: str) -> None:
        self._name = name

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "numba.cuda":
            return None
        sys.meta_path.remove(self)
        if not _simulator():
            return None  # on a GPU Numba loads the manager itself
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ThenPlugin(spec.loader, self._name)
                return spec
        return None


_name = _selected()
if _name is not None and "numba.cuda" not in sys.modules:
    sys.meta_path.insert(0, _Finder(_name))
