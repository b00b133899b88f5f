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

With this library's plugin selected and ``NUMBA_ENABLE_CUDASIM`` unset, the
first import of ``numba`` looks for the CUDA driver library where Numba looks
for it. Where there is none at all (a machine without an NVIDIA driver), the
program runs on Numba's CUDA simulator, as if ``NUMBA_ENABLE_CUDASIM=1`` had
been given, and one line on standard error says so. Where the library is
there, loadable or not, nothing changes: a GPU whose setup is broken gets
Numba's own error, never the simulator in its place.

PYTEST_DONT_REWRITE: the package declares a pytest plugin, so pytest marks
its modules for assertion rewriting; this one is imported before pytest
starts, and the marker keeps pytest from warning that it cannot rewrite it.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import os
import sys
from typing import Any

PLUGIN = "numba_streamsafe"

#: What announces the simulator where no CUDA driver library exists.
ANNOUNCEMENT = ("numba_streamsafe: no CUDA driver library on this machine, so this program runs "
                "on Numba's CUDA simulator, on the CPU (NUMBA_ENABLE_CUDASIM=1; set "
                "NUMBA_ENABLE_CUDASIM yourself, to 1 or 0, and this line goes)")


def driver_candidates() -> list[str]:
    """Where Numba looks for the CUDA driver library, in its order
    (``numba.cuda.cudadrv.driver.locate_driver_and_loader``): the names the
    system's loader finds, then the usual directories."""
    if sys.platform == "win32":
        dirs, names = ["\\windows\\system32"], ["nvcuda.dll"]
    elif sys.platform == "darwin":
        dirs, names = ["/usr/local/cuda/lib"], ["libcuda.dylib"]
    else:
        dirs, names = ["/usr/lib", "/usr/lib64"], ["libcuda.so", "libcuda.so.1"]
    return names + [os.path.join(d, n) for d in dirs for n in names]


def driver_library_exists(candidates: list[str] | None = None) -> bool:
    """Whether a CUDA driver library is there, as Numba decides it: one of
    the candidates loads, or exists as a file (and fails to load: a broken
    setup, for which Numba reports the load error)."""
    for path in driver_candidates() if candidates is None else candidates:
        try:
            (ctypes.WinDLL if sys.platform == "win32" else ctypes.CDLL)(path)  # type: ignore[attr-defined]
        except OSError:
            if os.path.isfile(path):
                return True
        else:
            return True
    return False


def simulator_if_no_driver(candidates: list[str] | None = None) -> bool:
    """Before Numba reads its configuration: with this library's plugin
    selected, ``NUMBA_ENABLE_CUDASIM`` unset and no CUDA driver library at
    all, select Numba's CUDA simulator and say so in one line on standard
    error. True when it did. Set in the environment, the choice is also
    that of the program's child processes (which say nothing more)."""
    if _selected() != PLUGIN or "NUMBA_ENABLE_CUDASIM" in os.environ:
        return False
    if driver_library_exists(candidates):
        return False
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    print(ANNOUNCEMENT, file=sys.stderr)
    return True


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
    Exception
        Whatever importing this library raised for another cause than its
        name (a bad ``NUMBA_STREAMSAFE_*`` setting: ``InvalidSetting``),
        as it is: the name is not blamed for it.
    """
    try:
        if name == PLUGIN:
            importlib.import_module(name)
        elif importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r}")
    except Exception as exc:
        if name == PLUGIN and not (isinstance(exc, ModuleNotFoundError) and exc.name == name):
            raise  # this library is there: the error is its own, not its name's
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
    """Picks the simulator where no driver exists when ``numba`` is first
    looked for; finds ``numba.cuda`` with the other finders and wraps its
    loader, once."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._decided = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name == "numba" and not self._decided:
            self._decided = True
            simulator_if_no_driver()
            return None
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
