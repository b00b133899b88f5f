"""The optional compiled hot path (numba_streamsafe/_hot.c, limited API).

Everything else is in pyproject.toml. The extension is optional: where it
cannot be built, the package installs and runs its pure-Python path.
"""

import os
import shutil

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

#: Loads the plugin under Numba's CUDA simulator, which never imports memory
#: managers itself, when the environment selects both (_numba_streamsafe_autoload.py).
PTH = "numba_streamsafe_sim.pth"


class BuildPyWithPth(build_py):
    """build_py that also puts the simulator's start-up hook at the top of the
    installed tree (a ``.pth`` file runs its import line at interpreter start)."""

    def run(self) -> None:
        super().run()
        shutil.copyfile(PTH, os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


class BuildExtOrSay(build_ext):
    """build_ext that says so, loudly, when the optional extension was not built."""

    def run(self) -> None:
        super().run()
        for ext in self.extensions:
            if not os.path.exists(self.get_ext_fullpath(ext.name)):
                print("WARNING: numba_streamsafe's compiled hot path (numba_streamsafe/_hot.c) "
                      "could not be built (is a C compiler installed?). The package works on "
                      "its pure-Python path, with slower launches; `python -m "
                      "numba_streamsafe` shows which path is in use. Install a C compiler "
                      "and reinstall to build it.", file=sys.stderr)


setup(
    cmdclass={"build_py": BuildPyWithPth, "build_ext": BuildExtOrSay},
    py_modules=["_numba_streamsafe_autoload"],
    ext_modules=[
        Extension(
            "numba_streamsafe._hot",
            ["numba_streamsafe/_hot.c"],
            py_limited_api=True,
            define_macros=[("Py_LIMITED_API", "0x030A0000")],
            extra_compile_args=["-O2"],
            libraries=["dl"],
            optional=True,
        )
    ],
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
