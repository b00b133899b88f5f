"""What CUDA refuses, the simulator refuses, with the error a GPU gives; and the
rough edges a new user met (advice that works, the user's line, reversed views,
statistics after ``del``, the report of ``python -m numba_streamsafe``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
from numba import cuda

import numba_streamsafe as nss
from numba_streamsafe import (
    AccessWarning,
    InvalidArgument,
    Read,
    StreamMisuse,
    Write,
    tracked_kernel,
)
from numba_streamsafe.core.errors import InvalidLaunchConfig

HERE = os.path.abspath(__file__)


@tracked_kernel
def copy(src: Read, dst: Write):
    i = cuda.grid(1)
    if i < src.size:
        dst[i] = src[i]


def _arrays(stream):
    x = nss.to_device(np.arange(64, dtype=np.int64), stream=stream)
    return x, nss.device_array(64, np.int64, stream=stream)


# ------------------------------------------------------- launch configurations
@pytest.mark.parametrize("config, limit, value", [
    ((1, 4096), "1024 threads", "4096"),
    ((1, (32, 64)), "1024 threads", "2048"),
    ((1, (1, 1, 128)), "64", "128"),
    ((2, 0), "positive", "0"),
    ((-1, 32), "positive", "-1"),
    (((1, 1 << 17), 32), "65535", "131072"),
    ((1.5, 32), "int", "1.5"),
])
def test_a_launch_configuration_cuda_refuses_is_refused(rt, streams, config, limit, value):
    a, _ = streams
    x, y = _arrays(a)
    before = dict(rt.driver.calls)
    with pytest.raises(InvalidLaunchConfig) as info:
        copy[config[0], config[1], a](x, y)
    text = str(info.value)
    assert limit in text and value in text, text
    assert dict(rt.driver.calls) == before  # nothing queued


def test_dynamic_shared_memory_over_the_limit_is_refused(rt, streams):
    a, _ = streams
    x, y = _arrays(a)
    with pytest.raises(InvalidLaunchConfig, match="49152"):
        copy[1, 32, a, 1 << 20](x, y)
    copy[1, 64, a, 1024](x, y)  # within the limit
    assert (nss.copy_to_host(y, stream=a) == np.arange(64)).all()


def test_a_device_that_does_not_exist_is_refused(rt):
    with pytest.raises(InvalidArgument, match="device 5") as info:
        with nss.use_device(5):
            pass
    assert "1 device" in str(info.value)
    assert "SimDriver(device=d, system=system)" in str(info.value), "not mangled"


def test_an_integer_stream_never_created_is_refused_with_advice(rt, streams):
    a, _ = streams
    x, y = _arrays(a)
    rt.driver.synchronize()
    with pytest.raises(StreamMisuse) as info:
        copy[2, 32, 5](x, y)
    text = str(info.value)
    assert "0x5" in text and "cuda.stream()" in text and "SimDriver" not in text
    with pytest.raises(StreamMisuse, match=r"cuda\.stream\(\)"):
        nss.to_device(np.ones(4), stream=123)
    with pytest.raises(StreamMisuse, match="0x2a"):
        with nss.stream_scope(42):
            pass


def test_a_launch_on_a_destroyed_stream_says_what_to_do(rt, streams):
    a, b = streams
    x, y = _arrays(a)
    s = cuda.stream()
    handle = rt.stream_handle(s)
    rt.destroy_stream(s)
    with pytest.raises(StreamMisuse) as info:
        copy[1, 64, handle](x, y)
    assert "destroyed" in str(info.value) and "live stream" in str(info.value)


def test_an_unknown_access_name_says_how_to_fix_it():
    def k(src, dst):
        pass

    with pytest.raises(InvalidArgument) as info:
        tracked_kernel(access={"nope": "r"})(k)
    text = str(info.value)
    assert "'nope'" in text and "src, dst" in text and "access={'src':" in text


# ------------------------------------------------------------------ warnings
def test_the_access_warning_advice_works_in_strict_mode_and_names_the_users_line(rt, streams):
    a, _ = streams

    def body(src, dst):
        i = cuda.grid(1)
        if i < src.size:
            src[i] = src[i]

    x, y = _arrays(a)
    k = tracked_kernel(body, access={"src": "rw", "dst": "w"})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        k[1, 64, a](x, y)
    (warning,) = [w for w in seen if issubclass(w.category, AccessWarning)]
    assert os.path.abspath(warning.filename) == HERE
    text = str(warning.message)
    assert "nothing" not in text and "Read" in text
    fixed = tracked_kernel(body, access={"src": "rw", "dst": "r"})  # the advice, followed
    fixed[1, 64, a](x, y)  # strict mode accepts it


# --------------------------------------------------------------- copies, stats
def test_a_reversed_view_copies_to_the_host_as_numpy_would(rt, streams):
    a, _ = streams
    host = np.arange(24, dtype=np.float32).reshape(4, 6)
    x = nss.to_device(host, stream=a)
    for view, expect in ((x[::-1], host[::-1]), (x[:, ::-2], host[:, ::-2]),
                         (x[::-1, 1:5], host[::-1, 1:5])):
        got = nss.copy_to_host(view, stream=a)
        np.testing.assert_array_equal(got, expect)


def test_memory_stats_after_del_count_the_bytes_freed(rt, streams):
    a, _ = streams
    x = nss.device_array(1 << 12, np.uint8, stream=a)
    assert nss.memory_stats()["allocated_bytes.all.current"] == 1 << 12
    del x
    assert nss.memory_stats()["allocated_bytes.all.current"] == 0


# -------------------------------------------------------------------- report
def test_python_m_numba_streamsafe_reports_versions_path_and_settings(child_env, repo_root):
    proc = subprocess.run([sys.executable, "-m", "numba_streamsafe"], cwd=repo_root,
                          env=child_env(NUMBA_ENABLE_CUDASIM="1", NUMBA_STREAMSAFE_FENCES="eager"),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for key in ("numba_streamsafe", "numba-cuda", "cuda-bindings", "numpy", "engine",
                "memory manager", "NUMBA_STREAMSAFE_FENCES", "eager", "simulator"):
        assert key in out, (key, out)
    for key in ("libc", "llvmlite", "Cython", "nvvm path", "nvrtc version", "installed",
                "simulator start-up hook", "other NUMBA_ variables", "NUMBA_ENABLE_CUDASIM"):
        assert key in out, (key, out)


def test_the_report_lists_a_bad_setting_and_speaks_json(child_env, repo_root):
    import json

    proc = subprocess.run([sys.executable, "-m", "numba_streamsafe", "--json"], cwd=repo_root,
                          env=child_env(NUMBA_ENABLE_CUDASIM="1", NUMBA_STREAMSAFE_FENCES="lazzy"),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert "lazzy" in report["settings"]["error"] and "'lazy' or 'eager'" in \
        report["settings"]["error"]
    assert report["settings"]["as given"]["NUMBA_STREAMSAFE_FENCES"] == "lazzy"
    assert report["versions"]["numba-cuda"] != "not installed"
    assert ": supported (>=" in report["support"]["numba-cuda"], report["support"]
    assert report["other NUMBA_ variables"]["NUMBA_ENABLE_CUDASIM"] == "1"
    usage = subprocess.run([sys.executable, "-m", "numba_streamsafe", "--help"], cwd=repo_root,
                           env=child_env(), capture_output=True, text=True, timeout=120)
    assert usage.returncode == 0 and "--json" in usage.stdout


def test_the_report_says_whether_numba_cuda_and_numba_are_a_supported_pair(monkeypatch):
    from numba_streamsafe import __main__ as report

    assert report._release("0.30.4") == (0, 30, 4)
    assert report._release("0.31.0rc1") == (0, 31, 0)
    versions = {"numba-cuda": "0.29.0", "numba": "0.68.1"}
    monkeypatch.setattr(report, "_version", versions.__getitem__)
    monkeypatch.setattr(report, "_supported_numba_cuda", lambda: ("0.24", "0.31"))
    out = report._support()
    assert out["numba-cuda"] == "0.29.0: supported (>=0.24, <0.31)"
    assert "install numba<=0.65" in out["numba"]
    versions.update({"numba-cuda": "0.31.1", "numba": "0.68.1"})
    out = report._support()
    assert "NOT supported (>=0.24, <0.31)" in out["numba-cuda"] and "numba" not in out
    versions.update({"numba-cuda": "0.23.0", "numba": "0.62.1"})
    assert "NOT supported" in report._support()["numba-cuda"]


@pytest.mark.slow
def test_an_install_without_a_compiler_says_the_compiled_path_is_missing(repo_root, tmp_path):
    # A copy of the sources with nothing built: no extension left over to reuse.
    src = tmp_path / "src"
    shutil.copytree(repo_root, src, ignore=shutil.ignore_patterns(
        "build", ".venv*", ".git", "*.so", "__pycache__", ".whl*", ".before", ".nox",
        ".hypothesis", ".*_cache", "bench-results", "gpu-out", "*.egg-info"))
    env = {**os.environ, "CC": "/bin/false"}
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--isolated",
                           str(src), "-w", str(tmp_path / "wheels")], env=env,
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = proc.stdout + proc.stderr
    assert "compiled engine (numba_streamsafe.resources.tracking.marks) could not be built" in said


def test_a_configuration_checked_once_is_refused_or_accepted_alike_again():
    """check_launch remembers accepted plain configurations per device limits;
    what it refuses stays refused, a bool is never taken for 1, and another
    device's (smaller) limits decide for themselves."""
    from numba_streamsafe._driver.limits import SIMULATED, LaunchLimits, check_launch

    for _ in range(2):
        assert check_launch((4, 2), 256, 0, SIMULATED) == ((4, 2, 1), (256, 1, 1), 0)
        with pytest.raises(InvalidLaunchConfig):
            check_launch(4, 2048, 0, SIMULATED)
        with pytest.raises(InvalidLaunchConfig):
            check_launch(True, 256, 0, SIMULATED)
    small = LaunchLimits(max_threads_per_block=128)
    with pytest.raises(InvalidLaunchConfig, match="at most 128 threads"):
        check_launch((4, 2), 256, 0, small)
