"""The library as an installation runs it: its modules byte-compiled, as pip
byte-compiles a package it installs, and selected (or not) for a benchmark's
child process by the variable a user sets (:func:`memory_manager_env`).

A checkout run from its source where Python writes no bytecode
(``PYTHONDONTWRITEBYTECODE``, set on some machines) compiles every module of
the library at every import instead: 80 to 119 ms a process on the lent
H200, against 19 to 21 ms byte-compiled, which a benchmark of whole processes
would count against the library. Importing this module imports neither Numba
nor the library.
"""

from __future__ import annotations

import compileall
import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path

#: The plugin's name for ``NUMBA_CUDA_MEMORY_MANAGER``.
PLUGIN = "numba_streamsafe"


def memory_manager_env(manager: str | None,
                       env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A child process's environment: ``env`` (default: this process's) with
    ``NUMBA_CUDA_MEMORY_MANAGER`` set to ``manager``, or unset where
    ``manager`` is None (Numba's own memory manager)."""
    out = dict(os.environ if env is None else env)
    out.pop("NUMBA_CUDA_MEMORY_MANAGER", None)
    if manager is not None:
        out["NUMBA_CUDA_MEMORY_MANAGER"] = manager
    return out


def byte_compile_library() -> Path | None:
    """Byte-compile the modules of the ``numba_streamsafe`` that this Python
    imports (into its ``__pycache__`` folders, where pip would write them);
    its folder, or None where it is not found."""
    spec = importlib.util.find_spec("numba_streamsafe")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    compileall.compile_dir(str(root), quiet=1)
    return root
