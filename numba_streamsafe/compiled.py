"""Which build of the engine runs: the compiled modules, or their Python source.

The engine (the modules of :data:`ENGINE`: the lock, the trace log, the
tracking state and rules and the table of live blocks in
:mod:`numba_streamsafe.resources`; the parameter
packer, the launch switches, the direct launch, the hooks of the program's
own ordering and of Numba's copies in
:mod:`numba_streamsafe.numba`) is written once, in Cython's
pure-Python mode. Where the package was built with a compiler, each module
is an extension compiled from that source and Python imports it in place of
the ``.py`` file; where it was not, the ``.py`` file runs as it is.

``NUMBA_STREAMSAFE_PURE_PYTHON=1`` (read when the package is imported) runs
the source even where the compiled modules are built: the reference the
compiled build is tested against, and a way to rule it out.

The pure-Python wheel (``py3-none-any``, built with
``NUMBA_STREAMSAFE_BUILD=python``) has no compiled module by choice: its
build writes :data:`PYTHON_BUILD_MARK` beside this module, and
:data:`python_build` reads it, so that the package does not warn of a
compiled engine it was never meant to have.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

# Neither imports an engine module (the finder below must come first).
from numba_streamsafe.core.errors import InvalidSetting
from numba_streamsafe.core.settings import flag, reporting

__all__ = ["ENGINE", "PYTHON_BUILD_MARK", "pure_python", "python_build", "engine_builds"]

#: The modules compiled from their own source where a compiler is present.
ENGINE = ("numba_streamsafe._driver.libcuda", "numba_streamsafe._driver.observer",
          "numba_streamsafe.resources.tracking.lock",
          "numba_streamsafe.core.tracehook", "numba_streamsafe.core.sites",
          "numba_streamsafe.resources.tracking.marks",
          "numba_streamsafe.resources.tracking.rules",
          "numba_streamsafe.resources.tracking.block_table",
          "numba_streamsafe.resources.tracking.freed",
          "numba_streamsafe.numba.launch.packing", "numba_streamsafe.numba.launch.policy",
          "numba_streamsafe.numba.launch.launcher", "numba_streamsafe.numba.program_order",
          "numba_streamsafe.numba.copies")


def _asked() -> bool:
    """``NUMBA_STREAMSAFE_PURE_PYTHON``, a switch (a bad value is refused, as
    every setting's is, except while ``python -m numba_streamsafe`` reports it)."""
    try:
        return flag("NUMBA_STREAMSAFE_PURE_PYTHON", False)
    except InvalidSetting:
        if not reporting():
            raise
        return False


#: The file that a build without the compiled engine (``NUMBA_STREAMSAFE_BUILD=python``:
#: the pure-Python wheel) writes into the package, beside this module.
PYTHON_BUILD_MARK = "PYTHON_BUILD"

#: Whether the Python source was asked for (``NUMBA_STREAMSAFE_PURE_PYTHON``).
pure_python = _asked()

#: Whether this installation was built without the compiled engine by choice
#: (the pure-Python wheel): its engine runs as Python, and that is no fault.
python_build = os.path.isfile(os.path.join(os.path.dirname(__file__), PYTHON_BUILD_MARK))


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Finds the engine's ``.py`` files ahead of their compiled modules."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in ENGINE or not path:
            return None
        leaf = fullname.rpartition(".")[2] + ".py"
        for entry in path:
            candidate = os.path.join(entry, leaf)
            if os.path.isfile(candidate):
                return importlib.util.spec_from_file_location(fullname, candidate)
        return None


if pure_python and not any(isinstance(f, _SourceFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _SourceFinder())


def engine_builds(load: bool = False) -> dict[str, str]:
    """Each engine module's build as imported in this process: ``"compiled"``
    (its file), ``"Python source"``, or ``"not imported"``; with ``load``,
    every engine module is imported first."""
    if load:
        import importlib

        for name in ENGINE:
            importlib.import_module(name)
    out = {}
    for name in ENGINE:
        module = sys.modules.get(name)
        if module is None:
            out[name] = "not imported"
        elif getattr(module, "COMPILED", False):
            out[name] = f"compiled ({os.path.basename(module.__file__ or '')})"
        else:
            out[name] = "Python source"
    return out
