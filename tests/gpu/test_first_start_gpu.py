"""The first start on a GPU: selecting the plugin never swaps the simulator in
where a CUDA driver is there, and a bad setting is one line through Numba's
own plugin loader (which a GPU context runs). Children as a user starts them.
The CPU side is tests/numba/test_first_start.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import _numba_streamsafe_autoload as hook

pytestmark = pytest.mark.gpu

TWO_STREAMS = Path(__file__).resolve().parents[1] / "programs" / "two_streams.py"


def _run(tmp_path, child_env, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "my_program.py"
    script.write_text(TWO_STREAMS.read_text())
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=child_env(**env),
                          capture_output=True, text=True, timeout=300)


def test_the_plugin_runs_a_plain_program_on_the_gpu_not_the_simulator(gpu, tmp_path, child_env):
    proc = _run(tmp_path, child_env, NUMBA_CUDA_MEMORY_MANAGER="numba_streamsafe")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == "right on the GPU\n", proc.stdout
    assert hook.ANNOUNCEMENT not in proc.stderr


def test_a_bad_setting_is_one_line_through_numbas_plugin_loader_on_a_gpu(gpu, tmp_path,
                                                                         child_env):
    proc = _run(tmp_path, child_env, NUMBA_CUDA_MEMORY_MANAGER="numba_streamsafe",
                NUMBA_STREAMSAFE_MODE="chek")
    assert proc.returncode == 1, proc.stdout
    assert proc.stderr.splitlines() == [
        "numba_streamsafe.InvalidSetting: NUMBA_STREAMSAFE_MODE='chek' is not one of its "
        "values: use 'order' or 'check' (or unset it)"], proc.stderr
