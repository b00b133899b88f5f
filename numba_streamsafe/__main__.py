"""``python -m numba_streamsafe``: what this installation runs on, in the manner
of ``numba -s`` and ``cupy.show_config()``.

Prints the versions of the library and of what it builds on, the CUDA driver
and devices (or Numba's CUDA simulator), whether the compiled hot path is
built and in use, the memory manager Numba is told to use, and the library's
settings in force.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from importlib import metadata


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _target() -> list[str]:
    from numba import config

    if config.ENABLE_CUDASIM:  # type: ignore[attr-defined]
        return ["target: Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1), over the library's "
                "simulated driver"]
    try:
        from cuda.bindings import driver

        err, version = driver.cuDriverGetVersion()
        if err:
            return [f"target: no CUDA driver usable (cuDriverGetVersion: error {int(err)})"]
        from numba import cuda

        lines = [f"CUDA driver: {version // 1000}.{version % 1000 // 10}"]
        for gpu in cuda.gpus:
            name = gpu.name.decode() if isinstance(gpu.name, bytes) else gpu.name
            lines.append(f"device {gpu.id}: {name}, compute capability "
                         f"{'.'.join(map(str, gpu.compute_capability))}")
        return lines
    except Exception as exc:  # no driver, no device: say so, and go on
        return [f"target: no CUDA GPU usable ({type(exc).__name__}: {exc})"]


def report() -> str:
    """The report's text."""
    from numba_streamsafe import __version__
    from numba_streamsafe.compiled import pure_python
    from numba_streamsafe.core.settings import reload_settings

    lines = [f"numba_streamsafe {__version__} (Python {sys.version.split()[0]})"]
    for dist in ("numba", "numba-cuda", "cuda-bindings", "cuda-core", "numpy"):
        lines.append(f"  {dist}: {_version(dist)}")
    lines += _target()
    import numba_streamsafe.numba.launcher as launcher
    from numba_streamsafe.compiled import engine_builds

    builds = engine_builds()
    for name, build in builds.items():
        lines.append(f"engine {name}: {build}")
    if pure_python:
        lines.append("compiled engine: not in use (NUMBA_STREAMSAFE_PURE_PYTHON=1)")
    elif not all(b.startswith("compiled") for b in builds.values()):
        lines.append("compiled engine: not built (no C compiler or no Cython at install time?): "
                     "the engine runs as Python; reinstall with a C compiler for the compiled one")
    elif launcher.available():
        lines.append("compiled launch path: in use (libcuda loaded)")
    else:
        lines.append("compiled launch path: unused here (no CUDA driver library loaded)")
    manager = os.environ.get("NUMBA_CUDA_MEMORY_MANAGER", "") or "default"
    lines.append(f"memory manager (NUMBA_CUDA_MEMORY_MANAGER): {manager}"
                 + (" (this library: transparent mode on its memory)"
                    if manager == "numba_streamsafe" else ""))
    settings = reload_settings()
    lines.append("settings in force:")
    for field in dataclasses.fields(settings):
        name = f"NUMBA_STREAMSAFE_{field.name.upper()}"
        given = " (set)" if name in os.environ else ""
        lines.append(f"  {name} = {getattr(settings, field.name)}{given}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
