"""``python -m numba_streamsafe``: what this installation runs on, in the manner
of ``numba -s`` and ``cupy.show_config()``; what a bug report needs.

Lists the system (OS, glibc, Python), the versions of the library and of what
it builds on (and whether that numba-cuda and numba are a supported pair), how
it is installed (editable or not, the simulator's start-up hook), the CUDA
compiler libraries (NVVM, NVRTC), the CUDA driver, runtime and devices with
their memory-pool support (or Numba's CUDA simulator), whether the compiled
engine is built and in use, the memory manager Numba is told to use, the
library's settings in force (a bad value is listed, not raised) and the other
``NUMBA_*`` variables set. Where NVVM or NVRTC is missing it names the extra
to install (``cpu``, ``cu12`` or ``cu13``). Last come the problems that keep
this installation from working (a numba-cuda release or a numba and numba-cuda
pair that cannot work, ``numba.cuda`` failing to import, a bad setting, no
compiler where a GPU would need one): the command exits 1 when there is any,
0 otherwise. ``--json`` prints the same as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import sysconfig
from collections.abc import Callable
from importlib import metadata
from typing import Any

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

#: The distributions whose versions the report lists.
DISTRIBUTIONS = ("numba", "numba-cuda", "llvmlite", "cuda-bindings", "cuda-core", "numpy",
                 "Cython", "rmm-cu13", "rmm-cu12")


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _error(exc: Exception) -> str:
    """``Kind: message`` on one line (the messages of other libraries' errors
    span lines, and end in a line break)."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _guarded(section: Callable[[], Any]) -> Any:
    """A section's value, or what went wrong (on one line): the report never raises."""
    try:
        return section()
    except Exception as exc:
        return f"unknown ({_error(exc)})"


def _system() -> dict[str, str]:
    libc, libc_version = platform.libc_ver()
    return {"os": platform.platform(), "machine": platform.machine(),
            "libc": f"{libc} {libc_version}".strip() or "unknown",
            "python": f"{platform.python_implementation()} {sys.version.split()[0]}"}


def _release(version: str) -> tuple[int, ...]:
    """``"0.30.4"`` -> ``(0, 30, 4)`` (a pre-release suffix is dropped; ``()``
    for what is no version, "not installed" say)."""
    try:
        return Version(version).release
    except InvalidVersion:
        return ()


def _supported_numba_cuda() -> tuple[str, str]:
    """The numba-cuda bounds (``>=``, ``<``) this installation's metadata
    declares (pyproject.toml's dependency); empty when it is not installed."""
    try:
        requires = metadata.requires("numba-streamsafe") or []
    except metadata.PackageNotFoundError:
        requires = []
    for text in requires:
        req = Requirement(text)
        if req.name == "numba-cuda" and req.marker is None:
            bounds = {s.operator: s.version for s in req.specifier}
            return bounds.get(">=", ""), bounds.get("<", "")
    return "", ""


def _support() -> dict[str, str]:
    """Whether the numba-cuda and numba found are a supported pair."""
    found = _version("numba-cuda")
    lower, upper = _supported_numba_cuda()
    out: dict[str, str] = {}
    if not lower and not upper:
        out["numba-cuda"] = f"{found} (the supported releases are unknown: not installed)"
    else:
        release = _release(found)
        inside = ((not lower or release >= _release(lower))
                  and (not upper or release < _release(upper)))
        span = f">={lower}, <{upper}"
        out["numba-cuda"] = (f"{found}: supported ({span})" if inside else
                             f"{found}: NOT supported ({span}); install a release in that range")
    numba = _version("numba")
    if _release(found) < (0, 30) and _release(numba) >= (0, 66):
        out["numba"] = (f"{numba} with numba-cuda {found}: numba-cuda before 0.30 fails to "
                        "import with numba 0.66 or newer; install numba<=0.65")
    return out


def _editable() -> bool | None:
    """Whether this library is installed editable (``pip install -e``); None
    when it is not installed. Of the copies of its metadata found (a source
    tree's ``*.egg-info`` may come first on the path), the installed one's
    ``direct_url.json`` says."""
    found = None
    for dist in metadata.distributions(name="numba-streamsafe"):
        direct = dist.read_text("direct_url.json")
        if direct:
            return bool(json.loads(direct).get("dir_info", {}).get("editable"))
        found = False
    return found


def _install() -> dict[str, Any]:
    import numba_streamsafe

    out: dict[str, Any] = {"location": os.path.dirname(numba_streamsafe.__file__)}
    editable = _editable()
    out["kind"] = {True: "editable (pip install -e)", False: "from a wheel (pip install)",
                   None: "not installed (run from a source tree)"}[editable]
    hook = os.path.join(sysconfig.get_paths()["purelib"], "numba_streamsafe_sim.pth")
    out["simulator start-up hook"] = ("installed" if os.path.exists(hook)
                                      else "not installed: under the simulator import "
                                      "numba_streamsafe in the program")
    return out


def _compilers() -> dict[str, str]:
    """NVVM and NVRTC as numba-cuda finds them (kernels compile without a GPU),
    each on its own; where either is missing, the extra that installs it."""
    out: dict[str, str] = {}
    paths = _guarded(_cuda_paths)
    for lib in ("nvvm", "nvrtc"):
        found = paths.get(lib) if isinstance(paths, dict) else None
        out[f"{lib} path"] = (f"{found.info} (by {found.by})" if found and found.info
                              else "not found" if isinstance(paths, dict) else paths)
    if _simulated():
        # The simulator's numba.cuda has no compiler to load: the paths above are all
        # that can be told here, and no extra is missing for it.
        out["versions"] = ("not loaded under Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1: "
                           "kernels run as Python); run this without it to load NVVM and NVRTC")
        return out
    out["nvvm version"] = _guarded(lambda: ".".join(map(str, _nvvm_version())))
    out["nvrtc version"] = _guarded(lambda: ".".join(map(str, _nvrtc_version())))
    if _compilers_missing(out):
        out["install"] = _extra_advice()
    return out


def _simulated() -> bool:
    """Whether this process runs Numba's CUDA simulator."""
    from numba import config

    return bool(config.ENABLE_CUDASIM)  # type: ignore[attr-defined]


def _cuda_paths() -> dict[str, Any]:
    from numba.cuda.cuda_paths import get_cuda_paths

    return dict(get_cuda_paths())


def _compilers_missing(compilers: dict[str, str]) -> list[str]:
    """The compiler libraries the report could not load (by their versions)."""
    return [lib.upper() for lib in ("nvvm", "nvrtc")
            if compilers.get(f"{lib} version", "").startswith(("unknown", "not"))]


def _driver_major() -> int | None:
    """The CUDA driver's major version, None where there is no driver."""
    try:
        from numba_streamsafe._driver.cuda import driver_version

        version = driver_version()
    except Exception:
        return None
    return None if version is None else version // 1000


def _extra_advice() -> str:
    """The extra that brings NVVM and NVRTC: the one of this CUDA driver's
    major version, else ``cpu`` (compilers from PyPI, no GPU needed)."""
    major = _driver_major()
    extra = f"cu{major}" if major in (12, 13) else "cpu"
    what = {"cpu": "NVVM and NVRTC from PyPI, so kernels compile without a GPU",
            "cu12": "the CUDA 12 stack, compilers included, for this CUDA 12 driver",
            "cu13": "the CUDA 13 stack, compilers included, for this CUDA 13 driver"}[extra]
    command = (f'pip install -e ".[{extra}]" (in the source tree)' if _editable()
               else f'pip install "numba-streamsafe[{extra}]"')
    return f"{command}: the {extra} extra installs {what}"


def _nvvm_version() -> tuple[int, ...]:
    from numba.cuda.cudadrv import nvvm

    return tuple(nvvm.NVVM().get_version())


def _nvrtc_version() -> tuple[int, ...]:
    from numba.cuda.cudadrv import nvrtc

    return tuple(nvrtc._get_nvrtc_version())  # type: ignore[attr-defined]  # numba-cuda's own


def _target() -> dict[str, Any]:
    if _simulated():
        return {"target": "Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1), over the library's "
                          "simulated driver"}
    try:
        return _gpus()
    except Exception as exc:  # no driver, no device: say so, and go on
        return {"target": f"no CUDA GPU usable ({_error(exc)})"}


def _gpus() -> dict[str, Any]:
    from numba_streamsafe._driver import cuda as driver

    version = driver.driver_version()
    if version is None:
        return {"target": "no CUDA driver usable (cuDriverGetVersion failed)"}
    out: dict[str, Any] = {"cuda driver": f"{version // 1000}.{version % 1000 // 10}",
                           "cuda runtime": _guarded(_runtime_version)}
    from numba import cuda

    devices = []
    for gpu in cuda.gpus:
        name = gpu.name.decode() if isinstance(gpu.name, bytes) else gpu.name
        supported = driver.pools_supported(gpu.id)
        devices.append({"id": gpu.id, "name": name,
                        "compute capability": ".".join(map(str, gpu.compute_capability)),
                        "memory pools": "unknown" if supported is None else supported})
    out["devices"] = devices
    return out


def _runtime_version() -> str:
    from numba_streamsafe._driver.cuda import runtime_version

    version = runtime_version()
    return "not loadable" if version is None else f"{version // 1000}.{version % 1000 // 10}"


def _engine() -> dict[str, Any]:
    import numba_streamsafe.numba.launch.launcher as launcher
    from numba_streamsafe.compiled import engine_builds, pure_python, python_build

    builds = engine_builds(load=True)
    if pure_python:
        state = "not in use (NUMBA_STREAMSAFE_PURE_PYTHON=1)"
    elif python_build:
        state = ("not built: the pure-Python wheel (py3-none-any) runs the engine as Python, "
                 "with slower launches; a manylinux wheel has it compiled, and so does "
                 "pip install --no-binary numba-streamsafe with a C compiler")
    elif not all(b.startswith("compiled") for b in builds.values()):
        state = ("WARNING: not built (no C compiler or no Cython at install time?): the engine "
                 "runs as Python, with slower launches; reinstall with a C compiler")
    elif launcher.available():
        state = "compiled, launch path in use (libcuda loaded)"
    else:
        state = "compiled; its launch path unused here (no CUDA driver library loaded)"
    return {"state": state, "modules": builds}


def _settings() -> dict[str, Any]:
    """The settings in force, or, where a variable holds a value it does not
    take, the error and the variables as given."""
    from numba_streamsafe.core.errors import InvalidArgument
    from numba_streamsafe.core.settings import reload_settings

    given = {k: v for k, v in sorted(os.environ.items()) if k.startswith("NUMBA_STREAMSAFE_")}
    try:
        settings = reload_settings()
    except InvalidArgument as exc:
        return {"error": str(exc), "as given": given}
    out = {}
    for field in dataclasses.fields(settings):
        name = f"NUMBA_STREAMSAFE_{field.name.upper()}"
        out[name] = f"{getattr(settings, field.name)}{' (set)' if name in given else ''}"
    return out


def _problems(report: dict[str, Any]) -> list[str]:
    """What keeps this installation from working, read off the report and
    found by importing ``numba.cuda``; empty when nothing does."""
    out = []
    support = report["support"]
    if isinstance(support, dict):
        out += [f"numba-cuda {text}" for key, text in support.items()
                if key == "numba-cuda" and "NOT supported" in text]
        out += [f"numba {support['numba']}"] if "numba" in support else []
    else:
        out.append(f"the supported releases: {support}")
    imported = _guarded(_import_numba_cuda)
    if imported is not None:
        out.append(f"numba.cuda does not import: {imported}")
    settings = report["settings"]
    if isinstance(settings, dict) and "error" in settings:
        out.append(f"a setting is refused: {settings['error']}")
    compilers = report["compilers"]
    missing = _compilers_missing(compilers) if isinstance(compilers, dict) else []
    if missing and _driver_major() is not None:
        out.append(f"{' and '.join(missing)} missing: kernels cannot compile for the GPU; "
                   f"{compilers['install']}")
    return out


def _import_numba_cuda() -> None:
    """Import ``numba.cuda`` (a numba-cuda and numba pair that cannot work
    fails here, or at the first kernel)."""
    import numba.cuda  # noqa: F401


def collect() -> dict[str, Any]:
    """The report as a dict (what ``--json`` prints): the last key,
    ``problems``, lists what keeps the installation from working."""
    from numba_streamsafe import __version__

    manager = os.environ.get("NUMBA_CUDA_MEMORY_MANAGER", "") or "default"
    report = {
        "numba_streamsafe": __version__,
        "system": _guarded(_system),
        "versions": {dist: _version(dist) for dist in DISTRIBUTIONS},
        "support": _guarded(_support),
        "install": _guarded(_install),
        "compilers": _guarded(_compilers),
        "target": _guarded(_target),
        "engine": _guarded(_engine),
        "memory manager": manager + (" (this library: transparent mode on its memory)"
                                     if manager == "numba_streamsafe" else ""),
        "settings": _guarded(_settings),
        "other NUMBA_ variables": {k: v for k, v in sorted(os.environ.items())
                                   if k.startswith("NUMBA_")
                                   and not k.startswith("NUMBA_STREAMSAFE_")},
    }
    report["problems"] = _problems(report)
    return report


def _lines(value: Any, indent: str = "") -> list[str]:
    if isinstance(value, dict):
        out = []
        for key, item in value.items():
            if isinstance(item, dict | list):
                out.append(f"{indent}{key}:")
                out += _lines(item, indent + "  ")
            else:
                out.append(f"{indent}{key}: {item}")
        return out or [f"{indent}(none)"]
    if isinstance(value, list):
        out = []
        for item in value:
            out += _lines(item, indent + "  ") if isinstance(item, dict) else [f"{indent}{item}"]
        return out
    return [f"{indent}{value}"]


def report(data: dict[str, Any] | None = None) -> str:
    """The report's text (of ``data``, as :func:`collect` returns it)."""
    data = dict(collect() if data is None else data)
    head = f"numba_streamsafe {data.pop('numba_streamsafe')}"
    problems = data.pop("problems")
    tail = (["problems (this installation cannot work as it is):",
             *(f"  {p}" for p in problems)] if problems else ["problems: none"])
    return "\n".join([head, *_lines(data), *tail])


def main(argv: list[str] | None = None) -> int:
    """Print the report; 1 when it lists a problem, else 0."""
    parser = argparse.ArgumentParser(
        prog="python -m numba_streamsafe",
        description="What this installation of numba_streamsafe runs on (for bug reports). "
                    "Exits 1 when the installation cannot work as it is (the report's last "
                    "lines say why), else 0.")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    data = collect()
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    else:
        print(report(data))
    return 1 if data["problems"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
