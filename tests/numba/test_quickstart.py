"""examples/quickstart.py: the README's usage snippet, run as a user runs it, on the simulator."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.py"
START = "# ---- the README's \"Usage\" snippet, from here ----\n"
END = "# ---- to here ----\n"


def test_quickstart_is_correct_with_no_hazard():
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, str(QUICKSTART)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CUDA simulator with the simulated driver" in proc.stdout, "says where it ran"
    assert "n=1024 " in proc.stdout, "sized for the simulator"
    assert "out equals 2 * host: ok" in proc.stdout
    assert "hazards seen by the simulated driver: 0" in proc.stdout
    assert "result: correct" in proc.stdout


def test_readme_usage_snippet_is_the_quickstart_code():
    code = QUICKSTART.read_text()
    assert code.count(START) == 1 and code.count(END) == 1
    snippet = code[code.index(START) + len(START):code.index(END)]
    readme = (ROOT / "README.md").read_text()
    usage = readme[readme.index("\n## Usage\n"):]
    block = re.search(r"```python\n(.*?)```\n", usage, re.DOTALL)
    assert block is not None, "the Usage section opens with a python block"
    assert block.group(1) == snippet
