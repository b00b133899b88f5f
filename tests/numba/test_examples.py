"""The examples and the benchmarks, run as users run them, on the simulator.

Each example runs in a child process (it chooses its target before Numba's
CUDA module loads): with tracking it must be correct with no hazard; with
tracking off the simulated driver must see the race. The examples' modules
(``examples/kernels_sort.py``, ``kernels_join.py``, ``data.py``) are tested in
children too. ``test_examples_match_benchmarks.py`` checks that the examples
queue the GPU work the benchmarks time; ``test_quickstart.py`` runs the README's
snippet.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

#: The examples run end to end on the simulator: in CI (pytest -m slow), out of the
#: default run, which stays under a minute.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ("multistream_sort", "hash_join", "sort_join_pipeline")


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "NSS_BENCH_DIR": os.environ.get(
        "NSS_TEST_BENCH_DIR", str(ROOT / "bench-results" / "ci"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _run_code(code: str, done: str) -> None:
    """Run ``code`` in a child on the simulator; it must exit 0 after printing ``done``."""
    proc = _run("-c", code)
    assert proc.returncode == 0 and done in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_is_correct_with_tracking(example):
    proc = _run(f"examples/{example}.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CUDA simulator with the simulated driver" in proc.stdout, "says where it ran"
    assert "hazards seen by the simulated driver: 0" in proc.stdout
    assert "result: correct" in proc.stdout and "WRONG" not in proc.stdout


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_shows_the_race_without_tracking(example):
    proc = _run(f"examples/{example}.py", "--no-tracking")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tracking: OFF" in proc.stdout
    assert "result: RACE SHOWN" in proc.stdout, proc.stdout
    assert "hazards seen by the simulated driver: 0" not in proc.stdout


def test_the_pipeline_with_its_probe_stage_as_a_graph():
    """``--graph``: stages 3 and 4 captured once on the collector stream and
    replayed, ordered after the uploads and the build; right, with no hazard.
    Without tracking the replay (and the rest) runs unordered: the race shows."""
    proc = _run("examples/sort_join_pipeline.py", "--graph")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "probe stage as a CUDA graph" in proc.stdout
    assert "hazards seen by the simulated driver: 0" in proc.stdout
    assert "result: correct" in proc.stdout and "WRONG" not in proc.stdout
    proc = _run("examples/sort_join_pipeline.py", "--graph", "--no-tracking")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "result: RACE SHOWN" in proc.stdout, proc.stdout


@pytest.mark.slow  # 8192 keys at the GPU's launch shapes: a minute on the simulator
@pytest.mark.parametrize(("n", "strides"), [(2048, 1), (8192, 1), (8192, 2)])
def test_shared_memory_sort_path_is_correct(n, strides):
    """The GPU's sort path: shared-memory passes, and from 2 * TILE on the
    global passes between them (at 8192: strides 4096 and 2048, one per pass,
    or both in one pass of bitonic_step2)."""
    code = (
        "import sys; sys.path.insert(0, 'examples')\n"
        "import target\n"
        "target.SIMULATOR = False  # the GPU's launch shapes and shared-memory passes\n"
        "import numpy as np, kernels_sort, numba_streamsafe as nss\n"
        "from numba import cuda\n"
        f"keys = np.random.default_rng(0).integers(0, 1 << 32, {n}, dtype=np.int64)\n"
        "s = cuda.stream(); d = nss.to_device(keys, stream=s)\n"
        f"kernels_sort.bitonic_sort(d, s, {strides})\n"
        "assert np.array_equal(nss.copy_to_host(d, stream=s), np.sort(keys))\n"
        "assert target.hazards_now() == 0\n"
        "print('sorted')\n"
    )
    _run_code(code, "sorted")


def test_two_strides_per_pass_sorts_like_one():
    """bitonic_step2 on the simulator's path (every stride global), at every
    size from 1 to 256 keys, and a clear error for an unknown pass width."""
    code = (
        "import sys; sys.path.insert(0, 'examples')\n"
        "import numpy as np, kernels_sort, target, numba_streamsafe as nss\n"
        "from numba import cuda\n"
        "rng = np.random.default_rng(1); s = cuda.stream()\n"
        "for n in (1, 2, 4, 8, 16, 64, 256):\n"
        "    keys = rng.integers(0, 1 << 32, n, dtype=np.int64)\n"
        "    d = nss.to_device(keys, stream=s)\n"
        "    kernels_sort.bitonic_sort(d, s, 2)\n"
        "    assert np.array_equal(nss.copy_to_host(d, stream=s), np.sort(keys)), n\n"
        "assert target.hazards_now() == 0\n"
        "try:\n"
        "    kernels_sort.bitonic_sort(d, s, 3)\n"
        "except ValueError as exc:\n"
        "    assert 'strides_per_pass must be 1 or 2' in str(exc)\n"
        "else:\n"
        "    raise AssertionError('no error')\n"
        "print('sorted')\n"
    )
    _run_code(code, "sorted")


@pytest.mark.slow
def test_benchmarks_run_at_a_tiny_size():
    proc = _run("benchmarks/run_all.py", "--quick", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for figure in ("tracked / untracked launch, cross stream", "pipeline: tracked / device sync",
                   "alloc+free 64MiB: ours / Numba default", "build keys in pageable memory",
                   "chunks of one array / separate, K=8, tracked"):
        assert figure in proc.stdout
    assert "K=8: views / separate" in proc.stdout and "correct: True" in proc.stdout
    assert "pipeline correct: {'tracked': True, 'tracked-eager': True, 'sync': True, " \
           "'events': True}" in proc.stdout
    assert "graph replay racing a slow writer: wrong 0/2 ordered" in proc.stdout
    assert "hazards 0 / 2)" in proc.stdout


def test_graph_replay_negative_control():
    """``graph_replay.py --race``: the ordered replay is clean, and with the
    ordering off the checker sees the race in every trial."""
    proc = _run("benchmarks/graph_replay.py", "--race", "--trials", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ordered       wrong 0/2  trials with a hazard 0/2" in proc.stdout
    assert "ordering off  wrong 0/2  trials with a hazard 2/2" in proc.stdout


def test_hooks_benchmark_times_each_hook_against_the_bare_call():
    proc = _run("benchmarks/hooks_host.py", "--calls", "200", "--rounds", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    figures = {name: float(us) for name, us in
               re.findall(r"((?:copy|record\+wait|synchronize) (?:hooked|unhooked)) ([\d.]+) us",
                          proc.stdout)}
    assert len(figures) == 6, proc.stdout
    for hook in ("copy", "record+wait", "synchronize"):
        assert figures[f"{hook} hooked"] > figures[f"{hook} unhooked"] > 0, proc.stdout


def test_launch_entry_benchmark_times_the_compiled_entry_alone():
    from numba_streamsafe.numba.launch import launcher

    if not launcher.COMPILED or shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("launch_host.py measures the compiled entry, with a stub driver built by cc")
    proc = _run("benchmarks/launch_host.py", "--launches", "2000", "--rounds", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = re.search(r"same (\d+) ns, cross (\d+) ns, new (\d+) ns a launch", proc.stdout)
    assert found, proc.stdout
    assert all(int(g) > 0 for g in found.groups()), proc.stdout
    # What each variant asks of the entry, counted by the stub driver and the entry (times
    # are printed for people; a loaded host can reorder them, so they are not asserted).
    per = {}
    for v in ("same", "cross", "new"):
        counted = re.search(rf"{v} ([\d.]+) records ([\d.]+) waits ([\d.]+) recalled",
                            proc.stdout)
        assert counted, proc.stdout
        per[v] = tuple(float(x) for x in counted.groups())
    assert per["same"] == (0.0, 0.0, 1.0), proc.stdout  # one stream: nothing to order
    assert per["cross"] == (1.0, 1.0, 1.0), proc.stdout  # a wait and an event per launch
    assert per["new"] == (0.0, 0.0, 0.0), proc.stdout  # arguments worked out afresh


@pytest.mark.slow
@pytest.mark.parametrize("script", ["pipeline_phases.py", "pipeline_kernels.py"])
def test_diagnostics_run_at_a_tiny_size(script):
    proc = _run(f"benchmarks/{script}", "--n", "256", "--rounds", "1", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " ms" in proc.stdout and "CUDA simulator" in proc.stdout


@pytest.mark.slow
def test_pipeline_benchmark_sets_the_pool_reuse_attribute():
    """``--pool-internal-deps off`` reaches the driver, and the run stays correct."""
    code = (
        "import runpy, sys\n"
        "sys.path.insert(0, 'benchmarks')\n"
        "sys.argv = ['pipeline.py', '--n', '64', '--rounds', '1', '--pool-internal-deps', 'off',\n"
        "            '--name', 'pipeline-pool-attr']\n"
        "mod = runpy.run_path('benchmarks/pipeline.py')\n"
        "result = mod['main']()\n"
        "import numba_streamsafe as nss\n"
        "attrs = nss.get_runtime().driver.pool_attributes\n"
        "assert attrs.get('REUSE_ALLOW_INTERNAL_DEPENDENCIES') == 0, attrs\n"
        "assert all(result['correct'].values()), result['correct']\n"
        "assert result['pool_internal_deps'] == 'off'\n"
        "assert all(len(v) == 1 and v[0]['cpu_s'] > 0 and len(v[0]['collections']) == 3\n"
        "           for v in result['host'].values()), result['host']\n"
        "print('attribute set')\n"
    )
    _run_code(code, "attribute set")


@pytest.mark.slow
def test_alloc_parts_diagnostic_runs_on_the_simulator():
    """The per-manager breakdown runs every manager's worker and prints its table."""
    proc = _run("benchmarks/alloc_parts.py", "--passes", "1", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines()[2:]}
    assert set(rows) == {"device_array"}, proc.stdout
    assert len(rows["device_array"]) >= 2 and all(float(v) > 0 for v in rows["device_array"])


def test_stream_churn_benchmark_prints_each_figure_and_its_ratio():
    """``stream_churn.py`` at a tiny size: a row per point with the cost of a
    synchronise and of the launches and each one's ratio to the start, and
    the simulated driver's live streams at the end (a handful)."""
    proc = _run("benchmarks/stream_churn.py", "--checkpoints", "20,40", "--repeats", "2",
                "--sync-every", "10")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()[2:5]]
    assert [row[0] for row in rows] == ["0", "20", "40"], proc.stdout
    assert all(row.count("ms") == 3 and row[-1].endswith("x)") for row in rows), proc.stdout
    live = int(proc.stdout.split("at the end: ")[1].split()[0])
    assert live <= 10, proc.stdout


def test_stream_per_step_benchmark_compares_and_runs_long(tmp_path, monkeypatch):
    """``stream_per_step.py`` at a tiny size: one round of processes with and
    without the plugin (each right, the ratio printed), and its long run over
    short windows (0 wrong, no event held)."""
    monkeypatch.setenv("NSS_TEST_BENCH_DIR", str(tmp_path))
    proc = _run("benchmarks/stream_per_step.py", "--rounds", "1", "--steps", "4",
                "--warmup", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ratio median" in proc.stdout and "wrong 0" in proc.stdout, proc.stdout
    proc = _run("benchmarks/stream_per_step.py", "--minutes", "0.02", "--window", "0.4",
                "--warmup", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ", wrong 0" in proc.stdout, proc.stdout
    held = next(line for line in proc.stdout.splitlines() if line.startswith("events_held"))
    assert held.split()[1:3] == ["0.00", "0.00"], proc.stdout


def test_first_launch_benchmark_prints_the_librarys_share(tmp_path, monkeypatch):
    """``first_launch.py``, one round on the simulator: a row per kernel with
    the library's inference timed, the share against the target, and the
    plugin's import."""
    monkeypatch.setenv("NSS_TEST_BENCH_DIR", str(tmp_path))
    proc = _run("benchmarks/first_launch.py", "--rounds", "1", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if "inference" in line
            and "share" in line and not line.startswith("first")]
    assert [row[0] for row in rows] == ["axpy", "block_sum", "stencil", "histogram", "matmul",
                                        "clip"], proc.stdout
    assert "(target <= 0.10)" in proc.stdout and "right: True" in proc.stdout, proc.stdout


def test_relations_refuse_sizes_whose_rows_do_not_fit_the_row_type():
    code = (
        "import sys\n"
        "sys.path.insert(0, 'examples')\n"
        "import numpy as np, data, kernels_join\n"
        "assert np.iinfo(kernels_join.ROW).max == 2**31 - 1 == data.MAX_JOIN_N\n"
        "for n in (0, 2**31):\n"
        "    try:\n"
        "        data.make_relations(n, 1)\n"
        "    except ValueError as exc:\n"
        "        assert 'row numbers are int32' in str(exc), exc\n"
        "    else:\n"
        "        raise AssertionError(n)\n"
        "build, probe = data.make_relations(64, 1)\n"
        "assert build.size == probe.size == 64\n"
        "print('refused')\n"
    )
    _run_code(code, "refused")


@pytest.mark.slow
def test_pipeline_benchmark_runs_with_uploads_on_the_using_streams():
    """``--uploads per-stream`` (the placement before the upload stream) stays correct."""
    proc = _run("benchmarks/pipeline.py", "--n", "64", "--rounds", "1", "--uploads", "per-stream",
                "--name", "pipeline-per-stream", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "uploads per-stream" in proc.stdout
    assert proc.stdout.count(" correct ") == 4, proc.stdout


def test_upload_stream_waits_only_for_the_allocations_it_fills():
    """In the tracked sort -> join (the example's), until its last copy is queued the
    upload stream waits for nothing but the stream-ordered allocation of each build
    chunk on its worker: no free, merge or probe holds up a copy. (The probe keys'
    frees wait for their probes after that.)"""
    code = (
        "import sys\n"
        "sys.path.insert(0, 'examples')\n"
        "import numpy as np\n"
        "from numba import cuda\n"
        "import numba_streamsafe as nss\n"
        "import data, target\n"
        "import sort_join_pipeline as example\n"
        "build, probe = data.make_relations(256, 3)\n"
        "batches = data.HostBatches.of(probe, 8)\n"
        "collect, build_stream, upload = cuda.stream(), cuda.stream(), cuda.stream()\n"
        "workers = [cuda.stream() for _ in range(4)]\n"
        "probes = [cuda.stream() for _ in range(4)]\n"
        "rt = nss.get_runtime()\n"
        "drv = rt.driver\n"
        "recorded, log = {}, []\n"
        "record, wait = drv.event_record, drv.stream_wait_event\n"
        "def on_record(event, stream):\n"
        "    recorded[event] = stream\n"
        "    return record(event, stream)\n"
        "def on_wait(stream, event):\n"
        "    log.append((stream, recorded.get(event)))\n"
        "    return wait(stream, event)\n"
        "drv.event_record, drv.stream_wait_event = on_record, on_wait\n"
        "to_device = nss.to_device\n"
        "def on_upload(host, stream=0, **kwargs):\n"
        "    log.append((rt.stream_handle(stream), 'copy'))\n"
        "    return to_device(host, stream=stream, **kwargs)\n"
        "nss.to_device = on_upload\n"
        "count = example.sort_join(data.pinned_copy(build), batches, collect, workers,\n"
        "                          build_stream, probes, upload)\n"
        "got = np.concatenate(batches.results)\n"
        "assert np.array_equal(got, data.expected_rank(build, probe))\n"
        "assert target.hazards_now() == 0\n"
        "up = rt.stream_handle(upload)\n"
        "assert {s for s, src in log if src == 'copy'} == {up}, 'every copy on the upload stream'\n"
        "on_upload = [src for s, src in log if s == up]\n"
        "last = len(on_upload) - 1 - on_upload[::-1].index('copy')\n"
        "assert on_upload.count('copy') == 4 + 8, on_upload\n"
        "# Before the last copy: only the wait of a chunk's copy (logged as it is asked\n"
        "# for) for the chunk's allocation on its worker.\n"
        "copies = 0\n"
        "for i, src in enumerate(on_upload[:last]):\n"
        "    if src == 'copy':\n"
        "        copies += 1\n"
        "    else:\n"
        "        assert 1 <= copies <= 4 and on_upload[i - 1] == 'copy', on_upload\n"
        "        assert src == rt.stream_handle(workers[copies - 1]), (i, on_upload)\n"
        "assert any(s != up and src == up for s, src in log), 'the consumers wait for the copies'\n"
        "print('upload stream free')\n"
    )
    _run_code(code, "upload stream free")


def test_quickstart_help_prints_usage_and_runs_nothing():
    proc = _run("examples/quickstart.py", "--help", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout and "result" not in proc.stdout


def test_plot_without_matplotlib_is_refused_before_the_run(tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None; sys.argv = ['sort_join_pipeline.py', "
            f"'--plot', r'{tmp_path / 'x.png'}']; import runpy; "
            "sys.path.insert(0, 'examples'); "
            "runpy.run_path('examples/sort_join_pipeline.py', run_name='__main__')")
    proc = _run("-c", code, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "matplotlib" in proc.stderr and "result" not in proc.stdout


def test_no_tracking_prints_the_first_race():
    proc = _run("examples/hash_join.py", "--no-tracking", timeout=300)
    assert "first race:" in proc.stdout, proc.stdout
    assert "is not ordered before" in proc.stdout


def test_a_large_n_on_the_simulator_is_announced_and_shows_progress():
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import cli
    finally:
        sys.path.pop(0)
    assert cli.simulator_warning(1_000_000) is not None
    assert "1000000" in cli.simulator_warning(1_000_000)
    assert cli.simulator_warning(512) is None


def test_run_all_survives_a_benchmark_that_dies(tmp_path, monkeypatch):
    """A benchmark that crashes is named with how it ended; the rows it would have
    filled are marked as not run, and the other benchmarks' figures still print."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import run_all
    finally:
        sys.path.pop(0)
    dies = tmp_path / "dies.py"
    dies.write_text("import os\nos.abort()\n")
    monkeypatch.setattr(run_all, "FAILED", [])
    run_all.run(str(dies))
    assert run_all.FAILED == [(str(dies), "killed by signal 6")]
    monkeypatch.setenv("NSS_BENCH_DIR", str(tmp_path))
    assert run_all.load("launch_overhead") == {}
    assert run_all.at({}, "same stream", "ratio") is None
    assert run_all.at({"a": {"b": 1.5}}, "a", "b") == 1.5
