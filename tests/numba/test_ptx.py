"""Tracked kernels compile to PTX for Hopper (cc 9.0) with no GPU.

Compilation runs in a child interpreter without Numba's CUDA simulator
(the simulator has no compiler), using the CUDA compiler libraries from PyPI.
Each kernel to compile is a :class:`~numba_streamsafe.numba.launch.kernel.TrackedKernel`
carrying a ``ptx_signature`` string.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
GPU_KERNELS = HERE.parent / "gpu" / "kernels.py"

# argv: a path to import, or "sys.path:<dir>:<module>"; then optional JSON
# {kernel name: signature} for kernels that carry no ptx_signature.
SCRIPT = textwrap.dedent(r'''
    import importlib
    import importlib.util
    import json
    import sys

    target, extra = sys.argv[1], json.loads(sys.argv[2])
    if target.startswith("sys.path:"):
        _, folder, name = target.split(":")
        sys.path.insert(0, folder)
        module = importlib.import_module(name)
    else:
        spec = importlib.util.spec_from_file_location("nss_ptx_subject", target)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)

    import numba
    from numba import cuda
    from numba_streamsafe.numba.launch.kernel import TrackedKernel

    assert not numba.config.ENABLE_CUDASIM, "the simulator cannot compile PTX"
    results = {}
    for name, obj in sorted(vars(module).items()):
        if not isinstance(obj, TrackedKernel):
            continue
        signature = extra.get(name, getattr(obj, "ptx_signature", None))
        if signature is None:
            continue
        ptx, resty = cuda.compile_ptx(obj.py_func, signature, cc=(9, 0))
        results[name] = {"target_sm_90": ".target sm_90" in ptx,
                         "entry": ".entry" in ptx or ".visible .entry" in ptx,
                         "nanosleep": "nanosleep" in ptx,
                         "restype": str(resty), "bytes": len(ptx)}
    print("RESULT " + json.dumps(results))
''')


#: Compiles one trivial kernel to PTX; fails where NVVM cannot be found.
PROBE = ("from numba import cuda\n"
         "cuda.compile_ptx(lambda x: None, 'void(int32)', cc=(9, 0))\n")
_NO_NVVM = ("NVVM (CUDA's compiler library) cannot be found, so kernels cannot compile to PTX "
            "on this machine: install the package's 'cpu' extra (pip install -e '.[cpu]') or "
            "the CUDA toolkit")


def nvvm_missing(probe: subprocess.CompletedProcess[str]) -> str | None:
    """Why PTX tests must skip, from the probe's result (None: NVVM works)."""
    if probe.returncode == 0:
        return None
    text = probe.stderr
    if "NVVM" in text or "nvvm" in text or "libNVVM" in text:
        return _NO_NVVM
    return None  # another failure: let the test fail and show it


_probe_result: list[str | None] = []


def skip_without_nvvm(child_env, repo_root) -> None:
    """Skip the calling test where NVVM is not installed (probed once per session)."""
    if not _probe_result:
        probe = subprocess.run([sys.executable, "-c", PROBE], cwd=repo_root,
                               env=child_env(NUMBA_ENABLE_CUDASIM="0"), capture_output=True,
                               text=True, timeout=300)
        _probe_result.append(nvvm_missing(probe))
    if _probe_result[0] is not None:
        pytest.skip(_probe_result[0])


def compile_kernels(child_env, repo_root, target: str, extra: dict | None = None) -> dict:
    skip_without_nvvm(child_env, repo_root)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, target, json.dumps(extra or {})],
                          cwd=repo_root, env=child_env(NUMBA_ENABLE_CUDASIM="0"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(line[len("RESULT "):])


def assert_compiled(results: dict, names) -> None:
    assert sorted(results) == sorted(names)
    for name, r in results.items():
        assert r["target_sm_90"] and r["entry"], (name, r)
        assert r["restype"] == "none", (name, r)


@pytest.mark.slow
def test_gpu_suite_kernels_compile(child_env, repo_root):
    results = compile_kernels(child_env, repo_root, str(GPU_KERNELS))
    assert_compiled(results, ["copy", "fill", "nested_sum", "pair_sum", "slow_copy", "slow_fill",
                              "slow_pair_fill", "unannotated"])
    assert results["slow_fill"]["nanosleep"] and results["slow_copy"]["nanosleep"]
    assert results["slow_pair_fill"]["nanosleep"]
    assert not results["fill"]["nanosleep"]


@pytest.mark.slow  # end to end (CI runs it); the default run stays under a minute
def test_string_annotated_kernels_compile(child_env, repo_root):
    signatures = {
        "by_name": "void(int64[:], int64[:], int64[:], int64)",
        "by_attribute": "void(float32[:], float32[:], float32)",
        "unresolvable": "void(int32[:], int32[:], int32)",
        "quoted": "void(int64[:], int64[:], int64[:], int64[:], int64)",
    }
    results = compile_kernels(child_env, repo_root,
                              str(HERE.parent / "helpers" / "future_annotated.py"), signatures)
    assert_compiled(results, signatures)


def test_a_machine_without_nvvm_skips_the_ptx_tests_with_advice():
    """The probe's verdict: NVVM missing (as numba-cuda reports it) skips, with
    the install to make; success, or any other failure, does not skip."""
    missing = subprocess.CompletedProcess([], 1, "", "numba.cuda.cudadrv.error.NvvmSupportError: "
                                          "libNVVM cannot be found. Do `conda install cudatoolkit`")
    assert "'cpu' extra" in nvvm_missing(missing)
    assert nvvm_missing(subprocess.CompletedProcess([], 0, "", "")) is None
    assert nvvm_missing(subprocess.CompletedProcess([], 1, "", "SyntaxError: x")) is None
