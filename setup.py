"""The optional compiled engine, and the simulator's start-up hook.

The engine's modules (ENGINE below) are Cython pure-Python sources: where
Cython and a C compiler are present the build compiles them, and where not
the package installs and runs them as Python. ``NUMBA_STREAMSAFE_BUILD=python``
builds the pure-Python wheel (``py3-none-any``): no extension, and a mark in
the package that says the Python build was chosen (numba_streamsafe/compiled.py).
Everything else is in pyproject.toml.
"""

import ast
import os
import shutil
import sys
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

#: Loads the plugin under Numba's CUDA simulator, which never imports memory
#: managers itself, when the environment selects both (_numba_streamsafe_autoload.py).
PTH = "numba_streamsafe_sim.pth"


#: The module the hook imports (installed at the top of the tree with it).
AUTOLOAD = "_numba_streamsafe_autoload.py"


class _WithHook:
    """An editable install's strategy that also writes the simulator's hook
    (the ``.pth`` file and its module) into the editable wheel, so that an
    editable install loads the plugin under the simulator as a wheel does.
    The module is a copy: reinstall after changing it."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __call__(self, wheel, files, mapping):  # type: ignore[no-untyped-def]
        self._inner(wheel, files, mapping)  # type: ignore[operator]
        for name in (PTH, AUTOLOAD):
            with open(name, "rb") as f:
                wheel.writestr(name, f.read())

    def __enter__(self):  # type: ignore[no-untyped-def]
        self._inner.__enter__()  # type: ignore[attr-defined]
        return self

    def __exit__(self, *exc):  # type: ignore[no-untyped-def]
        return self._inner.__exit__(*exc)  # type: ignore[attr-defined]


def _editable_command() -> dict:
    """``editable_wheel`` with the hook, where setuptools' editable strategies
    are the ones this wraps; otherwise setuptools' own, with a warning."""
    try:
        from setuptools.command.editable_wheel import editable_wheel
    except ImportError:
        return {}
    if not hasattr(editable_wheel, "_select_strategy"):
        print("WARNING: this setuptools' editable install cannot carry numba_streamsafe's "
              "simulator hook: under NUMBA_ENABLE_CUDASIM=1 import numba_streamsafe in the "
              "program, or install the package without -e.", file=sys.stderr)
        return {}

    class EditableWithHook(editable_wheel):
        def _select_strategy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            return _WithHook(super()._select_strategy(*args, **kwargs))

    return {"editable_wheel": EditableWithHook}


def _compiled_constant(name: str) -> Any:
    """A constant of numba_streamsafe/compiled.py (read, not imported: the
    package's dependencies need not be installed yet)."""
    with open(os.path.join("numba_streamsafe", "compiled.py")) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return ast.literal_eval(node.value)
    raise RuntimeError(f"numba_streamsafe/compiled.py defines no {name}")


#: The engine: modules compiled from their own (pure-Python mode) source.
ENGINE = [m.replace(".", "/") + ".py" for m in _compiled_constant("ENGINE")]

#: The builds ``NUMBA_STREAMSAFE_BUILD`` names: the engine compiled where a compiler is
#: present (the default), or the pure-Python wheel.
BUILDS = ("compiled", "python")


def _build() -> str:
    """The build asked for by ``NUMBA_STREAMSAFE_BUILD``; a value it does not take
    stops the build with one line that says which it takes."""
    value = os.environ.get("NUMBA_STREAMSAFE_BUILD", "").strip().lower() or "compiled"
    if value not in BUILDS:
        sys.exit(f"error: NUMBA_STREAMSAFE_BUILD={value!r} is not a build of numba_streamsafe: "
                 "set it to 'python' for the pure-Python wheel (py3-none-any), or to "
                 "'compiled' or nothing for the compiled engine")
    return value


#: Whether this is the pure-Python build (``NUMBA_STREAMSAFE_BUILD=python``).
PYTHON_BUILD = _build() == "python"


class BuildPyWithPth(build_py):
    """build_py that also puts the simulator's start-up hook at the top of the
    installed tree (a ``.pth`` file runs its import line at interpreter start)
    and, in the pure-Python build, the mark that says so into the package."""

    def run(self) -> None:
        super().run()
        shutil.copyfile(PTH, os.path.join(self.build_lib, PTH))
        mark = self._mark()
        if mark is not None:
            with open(mark, "w") as f:
                f.write("Built with NUMBA_STREAMSAFE_BUILD=python: the engine runs as Python "
                        "(numba_streamsafe/compiled.py).\n")

    def _mark(self) -> str | None:
        """The pure-Python build's mark in the built tree; None in the other build,
        and in an editable install (which runs the source tree)."""
        if not PYTHON_BUILD or getattr(self, "editable_mode", False):
            return None
        return os.path.join(self.build_lib, "numba_streamsafe",
                            _compiled_constant("PYTHON_BUILD_MARK"))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        mark = self._mark()
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH),
                *([mark] if mark is not None else [])]


def engine_extensions() -> list[Extension]:
    """The engine's extensions, or none in the pure-Python build or where Cython
    is not installed."""
    if PYTHON_BUILD:
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("WARNING: Cython is not installed: numba_streamsafe's engine is not compiled "
              "and runs as Python (slower launches).", file=sys.stderr)
        return []
    # Stripped on Linux (-s): symbols and debug sections are most of an unstripped module.
    link = ["-s"] if sys.platform.startswith("linux") else []
    exts = [Extension(path[:-3].replace("/", "."), [path], extra_compile_args=["-O2"],
                      extra_link_args=link)
            for path in ENGINE]
    built = list(cythonize(exts, language_level=3, quiet=True,
                           compiler_directives={"binding": False, "embedsignature": True}))
    for ext in built:  # cythonize's copies do not keep it: without a compiler, install anyway
        ext.optional = True
    return built


class BuildExtOrSay(build_ext):
    """build_ext that says so, loudly, when an engine module was not built."""

    def run(self) -> None:
        super().run()
        for ext in self.extensions:
            if not os.path.exists(self.get_ext_fullpath(ext.name)):
                print(f"WARNING: numba_streamsafe's compiled engine ({ext.name}) could not be "
                      "built (is a C compiler installed?). The package works with the engine "
                      "run as Python, with slower launches; `python -m numba_streamsafe` "
                      "shows which build is in use. Install a C compiler and reinstall to "
                      "build it.", file=sys.stderr)


setup(
    cmdclass={"build_py": BuildPyWithPth, "build_ext": BuildExtOrSay, **_editable_command()},
    py_modules=["_numba_streamsafe_autoload", "_numba_streamsafe_pytest"],
    ext_modules=engine_extensions(),
)
