"""What a user sees when a program starts: with the plugin selected on a machine
without a CUDA driver, the program runs on Numba's CUDA simulator and one line
says so; a bad ``NUMBA_STREAMSAFE_*`` setting is refused in one line, also when
Numba loads the plugin. Programs run in child interpreters started as a user
starts them (the variables are read before Numba loads), with this tree's
start-up hook ahead of an installed copy."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

import _numba_streamsafe_autoload as hook

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = {"NUMBA_CUDA_MEMORY_MANAGER": "numba_streamsafe"}

#: Whether an install (a wheel, or pip install -e) put the start-up hook beside the packages.
HOOK_INSTALLED = os.path.exists(os.path.join(sysconfig.get_paths()["purelib"],
                                             "numba_streamsafe_sim.pth"))
needs_hook = pytest.mark.skipif(not HOOK_INSTALLED, reason="the package is not installed in "
                                "this interpreter (pip install -e . or a wheel puts the "
                                "start-up hook there)")
no_driver = pytest.mark.skipif(hook.driver_library_exists(), reason="this machine has a CUDA "
                               "driver library: the plugin never picks the simulator here")

#: A plain Numba program on two streams: it imports nothing of the library.
TWO_STREAMS = ROOT / "tests" / "programs" / "two_streams.py"


def _user(script: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python script *args`` as a user runs it: none of the test run's
    variables of Numba or the library, only ``env``; this tree importable first."""
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("NUMBA_ENABLE_CUDASIM", "NUMBA_CUDA_MEMORY_MANAGER",
                                 "NUMBA_STREAMSAFE_"))}
    full.update(env)
    full["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, str(script), *args], cwd=script.parent, env=full,
                          capture_output=True, text=True, timeout=300)


def _readme_usage() -> str:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```python\n(.*?)```\n", readme[readme.index("\n## Usage\n"):], re.DOTALL)
    assert block is not None
    return block.group(1)


# --------------------------------------------- no CUDA driver: the simulator, said once
def test_a_driver_library_is_found_as_numba_finds_it(tmp_path):
    """Numba's candidates, loadable or only present: a file that is there but
    does not load is a broken GPU setup (Numba reports it), not a CPU machine."""
    assert not hook.driver_library_exists([str(tmp_path / "libcuda.so.1"), "libnocuda.so.9"])
    broken = tmp_path / "libcuda.so.1"
    broken.write_bytes(b"not a library")
    assert hook.driver_library_exists([str(broken)])
    assert hook.driver_library_exists(["libnocuda.so.9", "libc.so.6"])  # one that loads
    names = hook.driver_candidates()
    if sys.platform.startswith("linux"):
        assert names[:2] == ["libcuda.so", "libcuda.so.1"] and "/usr/lib64/libcuda.so.1" in names


@pytest.mark.parametrize("env, candidates, picked", [
    ({**PLUGIN}, [], True),                                       # no driver at all
    ({**PLUGIN}, ["libc.so.6"], False),                           # a driver library loads
    ({**PLUGIN, "NUMBA_ENABLE_CUDASIM": "0"}, [], False),         # the GPU asked for
    ({**PLUGIN, "NUMBA_ENABLE_CUDASIM": "1"}, [], False),         # the simulator asked for
    ({"NUMBA_CUDA_MEMORY_MANAGER": "rmm.allocators.numba"}, [], False),  # not this plugin
    ({}, [], False),                                              # no plugin
])
def test_the_simulator_is_picked_only_where_no_driver_exists(monkeypatch, capsys, env,
                                                              candidates, picked):
    for name in ("NUMBA_ENABLE_CUDASIM", "NUMBA_CUDA_MEMORY_MANAGER"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert hook.simulator_if_no_driver(candidates) is picked
    assert os.environ.get("NUMBA_ENABLE_CUDASIM") == ("1" if picked else
                                                      env.get("NUMBA_ENABLE_CUDASIM"))
    said = capsys.readouterr().err
    assert said == (hook.ANNOUNCEMENT + "\n" if picked else "")


@needs_hook
@no_driver
def test_setting_one_variable_runs_a_plain_two_stream_program_on_a_cpu(tmp_path):
    """The README's command, ``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe python
    my_program.py``, on a plain Numba program: before, ``cuda.stream()`` raised
    CudaSupportError (no CUDA driver library); now it runs on the simulator,
    ordered, and stderr holds the one line that says so."""
    script = tmp_path / "my_program.py"
    script.write_text(TWO_STREAMS.read_text())
    proc = _user(script, **PLUGIN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == "right on Numba's CUDA simulator\n"
    assert proc.stderr.splitlines() == [hook.ANNOUNCEMENT]
    assert "Numba's CUDA simulator" in hook.ANNOUNCEMENT and "NUMBA_ENABLE_CUDASIM" in \
        hook.ANNOUNCEMENT
    unset = _user(script)  # plain Numba, no plugin: Numba's own error, no word of ours
    assert unset.returncode != 0 and "CUDA driver library cannot be found" in unset.stderr
    assert hook.ANNOUNCEMENT not in unset.stderr
    refused = _user(script, NUMBA_ENABLE_CUDASIM="0", **PLUGIN)  # the GPU asked for
    assert refused.returncode != 0 and "CUDA driver library cannot be found" in refused.stderr
    assert hook.ANNOUNCEMENT not in refused.stderr


@needs_hook
@no_driver
def test_the_readme_usage_snippet_as_a_file_runs_with_the_variable(tmp_path):
    script = tmp_path / "usage.py"
    script.write_text(_readme_usage() + 'print("done", (out == 2 * host).all())\n')
    proc = _user(script, **PLUGIN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == "done True\n"
    assert proc.stderr.splitlines() == [hook.ANNOUNCEMENT]


@needs_hook
@no_driver
def test_the_plain_numba_example_runs_with_the_variable_alone(tmp_path):
    """examples/plain_numba_pipeline.py sets no variable when the plugin is
    selected: the library picks the simulator, and the checker finds no race."""
    proc = _user(ROOT / "examples" / "plain_numba_pipeline.py", **PLUGIN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.splitlines() == [hook.ANNOUNCEMENT]
    assert "on Numba's CUDA simulator; plugin loaded" in proc.stdout
    assert "hazards: 0" in proc.stdout


@pytest.mark.slow
def test_the_plain_numba_example_as_it_is_counts_its_races_on_the_simulator(tmp_path):
    """Run as it is on the simulator (one stream's work at a time), no round
    can go wrong: the example shows its races instead, as the library's
    checker counts them with the plugin selected and transparent mode off."""
    proc = _user(ROOT / "examples" / "plain_numba_pipeline.py", NUMBA_ENABLE_CUDASIM="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "plugin not loaded" in proc.stdout
    line = next(x for x in proc.stdout.splitlines() if x.startswith("hazards:"))
    if HOOK_INSTALLED:
        assert int(line.split()[1]) > 0, line
        assert "NUMBA_STREAMSAFE_TRANSPARENT=0" in line
    else:
        assert "not counted" in line


@pytest.mark.parametrize("args", [("--n", "0"), ("--repeat", "0"), ("--n", "-5")],
                         ids=["n-0", "repeat-0", "n-negative"])
def test_the_plain_numba_example_refuses_a_non_positive_size_or_round_count(args):
    """As the other examples do: argparse's usage error, exit status 2, before
    any work (a zero-sized grid used to fail in the race-counting child)."""
    proc = _user(ROOT / "examples" / "plain_numba_pipeline.py", *args, NUMBA_ENABLE_CUDASIM="1")
    assert proc.returncode == 2, proc.stdout + proc.stderr[-3000:]
    assert f"{args[0]} must be at least 1, got {args[1]}" in proc.stderr
    assert proc.stdout == ""


@needs_hook
def test_the_plain_numba_example_shows_why_its_race_count_failed():
    """Run as it is on the simulator, the example counts its races in a child
    process; when that child fails, its error is shown, not a guess about the
    installation."""
    proc = _user(ROOT / "examples" / "plain_numba_pipeline.py", "--n", "32", "--repeat", "1",
                 NUMBA_ENABLE_CUDASIM="1", NUMBA_STREAMSAFE_FENCES="eagr")
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = proc.stdout.index("hazards: not counted: the child process")
    shown = proc.stdout[line:]
    assert "InvalidSetting" in shown and "NUMBA_STREAMSAFE_FENCES='eagr'" in shown, shown
    assert "not installed" not in proc.stdout


# ------------------------------------------------- a bad setting: one line, named
BAD = [("NUMBA_STREAMSAFE_MODE", "chek", "'order' or 'check'"),
       ("NUMBA_STREAMSAFE_TRANSPARENT", "nope", "'on' or 'off'"),
       ("NUMBA_STREAMSAFE_PURE_PYTHON", "maybe", "'0', 'true'"),
       ("NUMBA_STREAMSAFE_MOD", "check", "did you mean NUMBA_STREAMSAFE_MODE?")]


def _one_line(proc: subprocess.CompletedProcess[str], name: str, value: str,
              allowed: str) -> None:
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("numba_streamsafe.InvalidSetting: ")
    assert name in lines[0] and value in lines[0] and allowed in lines[0], lines[0]
    assert "cannot be imported" not in lines[0] and "memory manager" not in lines[0]


@pytest.mark.parametrize("name, value, allowed", BAD)
def test_a_bad_setting_is_refused_in_one_line_at_import(tmp_path, name, value, allowed):
    """Before: ``import numba_streamsafe`` with NUMBA_STREAMSAFE_MODE=chek exited
    0 (the value was refused only when a runtime was built)."""
    script = tmp_path / "imports.py"
    script.write_text("import numba_streamsafe\nprint('imported')\n")
    _one_line(_user(script, **{name: value}), name, value, allowed)


@needs_hook
@pytest.mark.parametrize("name, value, allowed", BAD[:1])
def test_a_bad_setting_is_refused_in_one_line_when_the_plugin_loads_on_the_simulator(
        tmp_path, name, value, allowed):
    """Before: a 48-line traceback through the plugin's loading, ending in
    "NUMBA_CUDA_MEMORY_MANAGER names a module that cannot be imported"."""
    script = tmp_path / "my_program.py"
    script.write_text(TWO_STREAMS.read_text())
    proc = _user(script, NUMBA_ENABLE_CUDASIM="1", **PLUGIN, **{name: value})
    _one_line(proc, name, value, allowed)


def test_a_bad_setting_is_refused_in_one_line_through_numbas_plugin_loader(tmp_path):
    """Numba's own loader (``_ensure_memory_manager``, which a GPU context
    calls) wraps any error of the plugin's import in a RuntimeError that
    names the module; the user still sees only the setting's line."""
    script = tmp_path / "loads.py"
    script.write_text(textwrap.dedent("""
        from numba.cuda.cudadrv import driver
        driver._ensure_memory_manager()
        print("loaded")
    """))
    ok = _user(script, NUMBA_ENABLE_CUDASIM="0", **PLUGIN)
    assert ok.returncode == 0 and ok.stdout == "loaded\n", ok.stderr[-3000:]
    proc = _user(script, NUMBA_ENABLE_CUDASIM="0", NUMBA_STREAMSAFE_MODE="chek", **PLUGIN)
    _one_line(proc, "NUMBA_STREAMSAFE_MODE", "chek", "'order' or 'check'")


def test_a_caught_bad_setting_is_an_invalid_setting_with_its_parts(tmp_path):
    """The error is catchable (an InvalidArgument, a ValueError); where it is
    caught, nothing is printed; other uncaught errors keep their traceback."""
    script = tmp_path / "catches.py"
    script.write_text(textwrap.dedent("""
        try:
            import numba_streamsafe
        except ValueError as exc:
            from numba_streamsafe.core.errors import InvalidArgument, InvalidSetting
            assert isinstance(exc, InvalidSetting) and isinstance(exc, InvalidArgument)
            print(exc.name, exc.value, exc.allowed)
        raise KeyError("other")
    """))
    proc = _user(script, NUMBA_STREAMSAFE_FENCES="lazzy")
    assert proc.stdout == "NUMBA_STREAMSAFE_FENCES lazzy ('lazy', 'eager')\n"
    assert "Traceback" in proc.stderr and "KeyError: 'other'" in proc.stderr
