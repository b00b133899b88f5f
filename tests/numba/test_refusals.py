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
    # Before, the advice named SimDriver, an internal class; the advice works:
    assert "numba_streamsafe.get_runtime(5)" in str(info.value) and "Sim" not in str(info.value)
    nss.get_runtime(5)
    with nss.use_device(5):
        s = cuda.stream()
        x = nss.to_device(np.arange(4.0), stream=s)
        assert (nss.copy_to_host(x, stream=s) == np.arange(4.0)).all()
    assert nss.block_of(x).device == 5


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
    # The stream object itself: before, a DriverError of cuStreamWaitEvent
    # ("stream 0x... does not exist"), with no advice.
    for use in (lambda s: copy[1, 64, s](x, y), lambda s: nss.to_device(np.ones(4), stream=s)):
        with pytest.raises(StreamMisuse) as info:
            use(s)
        assert "was destroyed" in str(info.value) and "numba.cuda.stream()" in str(info.value)
    t = cuda.stream()  # the next stream may get the handle: the old object stays refused
    copy[1, 64, t](x, y)
    with pytest.raises(StreamMisuse, match="was destroyed"):
        copy[1, 64, s](x, y)
    destroyed = rt.driver.streams_destroyed
    del s
    import gc

    gc.collect()
    cuda.stream()  # the dead object's stream is not destroyed a second time (it may be t's)
    copy[1, 64, t](x, y)
    assert rt.driver.streams_destroyed == destroyed


def test_cuda_stream_legacy_as_a_number_is_refused_with_advice_on_the_simulator(rt, streams):
    """``stream=1`` (CUDA's CU_STREAM_LEGACY, or a stream numbered by hand):
    before, a DriverError of cuMemAllocAsync ("stream 0x1 does not exist")."""
    a, _ = streams
    x, y = _arrays(a)
    for use in (lambda: rt.allocate(16, stream=1), lambda: nss.to_device(np.ones(4), stream=1),
                lambda: copy[1, 64, 1](x, y)):
        with pytest.raises(StreamMisuse) as info:
            use()
        text = str(info.value)
        assert "CU_STREAM_LEGACY" in text and "None or 0" in text and "numba.cuda.stream()" in text
    rt.resource.deallocate(rt.allocate(16, stream=0))  # the legacy default stream's own name


@pytest.mark.parametrize("bad", ["s", 1.0, True, None, -1])
def test_a_stream_that_is_no_handle_is_refused_at_the_resource_with_advice(rt, bad):
    """Before, ``rt.resource.allocate(16, "s")`` raised a bare TypeError
    ("'>' not supported between 'str' and 'int'")."""
    from numba_streamsafe.core.errors import InvalidArgumentType
    from numba_streamsafe.resources import DirectResource

    direct = DirectResource(rt.driver)
    for call in (lambda: rt.resource.allocate(16, bad), lambda: direct.allocate(16, bad),
                 lambda: rt.resource.borrow(1 << 20, 16, bad)):
        with pytest.raises(InvalidArgumentType) as info:
            call()
        text = str(info.value)
        assert repr(bad) in text and "get_runtime()." in text and "stream_handle(stream)" in text
    assert rt.resource.stats().allocations == 0 and direct.stats().allocations == 0


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
    for key in ("libc", "llvmlite", "Cython", "nvvm path", "versions: not loaded under", "  kind: ",
                "simulator start-up hook", "other NUMBA_ variables", "NUMBA_ENABLE_CUDASIM"):
        assert key in out, (key, out)
    assert out.endswith("problems: none\n"), out[-500:]
    # Before: "installed: installed" where the source tree's egg-info came first.
    assert "installed: installed" not in out
    _each_line_a_key(out)


def _each_line_a_key(text: str) -> None:
    """Every line of the report after its head is ``key: value`` or ``key:``
    (a value's own line break used to leave a line of its own)."""
    import re

    for line in text.splitlines()[1:]:
        assert re.match(r"^ *[^ :][^:]*:( .+)?$", line), repr(line)


def test_a_missing_compiler_is_one_line_with_the_extra_to_install(monkeypatch):
    """Before: NVRTC missing broke the whole compilers section into a value
    ending in a line break, and nothing said what to install."""
    from numba_streamsafe import __main__ as report

    def missing() -> None:
        raise RuntimeError('Failure finding "libnvrtc.so.13":\n  No such file\n')

    monkeypatch.setattr(report, "_cuda_paths", missing)
    monkeypatch.setattr(report, "_nvrtc_version", missing)
    monkeypatch.setattr(report, "_simulated", lambda: False)  # the compilers are loaded
    for major, extra in ((None, "cpu"), (12, "cu12"), (13, "cu13")):
        monkeypatch.setattr(report, "_driver_major", lambda major=major: major)
        data = report.collect()
        text = report.report(data)
        _each_line_a_key(text)
        compilers = data["compilers"]
        assert compilers["nvrtc version"] == ('unknown (RuntimeError: Failure finding '
                                              '"libnvrtc.so.13": No such file)')
        assert f".[{extra}]" in compilers["install"] or f"[{extra}]\"" in compilers["install"]
        assert f"the {extra} extra installs" in compilers["install"]
        # On a GPU a missing compiler keeps kernels from compiling: a problem.
        assert any("NVRTC" in p for p in data["problems"]) is (major is not None)


def test_under_the_simulator_the_compilers_are_not_called_missing(monkeypatch):
    """The simulator's numba.cuda loads no compiler: the report says so, and
    advises no extra (before: two errors and the cpu extra, installed already)."""
    from numba_streamsafe import __main__ as report

    monkeypatch.setattr(report, "_simulated", lambda: True)
    data = report.collect()
    compilers = data["compilers"]
    assert "nvvm version" not in compilers and "install" not in compilers, compilers
    assert compilers["versions"].startswith("not loaded under Numba's CUDA simulator"), compilers
    assert not any("NVVM" in p or "NVRTC" in p for p in data["problems"]), data["problems"]
    _each_line_a_key(report.report(data))


def test_the_report_exits_1_when_numba_cuda_and_numba_cannot_work_together(child_env,
                                                                            repo_root, tmp_path):
    """numba-cuda 0.24 with numba 0.68 (a fake numba-cuda 0.24 ahead on the path,
    whose version is all the rule reads): before, the report said so and exited 0."""
    meta = tmp_path / "numba_cuda-0.24.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: numba-cuda\nVersion: 0.24.0\n")
    env = child_env(NUMBA_ENABLE_CUDASIM="1")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "numba_streamsafe"], cwd=repo_root, env=env,
                          capture_output=True, text=True, timeout=120)
    from importlib import metadata

    if metadata.version("numba").startswith("0.6") and int(metadata.version("numba")
                                                           .split(".")[1]) >= 66:
        assert proc.returncode == 1, proc.stdout[-2000:]
        tail = proc.stdout[proc.stdout.index("problems (this installation cannot work"):]
        assert "numba-cuda 0.24.0" in tail and "install numba<=0.65" in tail
    else:  # an older numba: the pair works
        assert proc.returncode == 0 and "problems: none" in proc.stdout


def test_the_report_lists_a_bad_setting_and_speaks_json(child_env, repo_root):
    import json

    proc = subprocess.run([sys.executable, "-m", "numba_streamsafe", "--json"], cwd=repo_root,
                          env=child_env(NUMBA_ENABLE_CUDASIM="1", NUMBA_STREAMSAFE_FENCES="lazzy"),
                          capture_output=True, text=True, timeout=120)
    # Listed, not refused at the package's import (as any other program's import
    # is); a refused setting keeps the installation from working: exit 1.
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert "lazzy" in report["settings"]["error"] and "'lazy' or 'eager'" in \
        report["settings"]["error"]
    assert report["problems"] == [f"a setting is refused: {report['settings']['error']}"]
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
