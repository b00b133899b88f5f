"""Check mode's reports on a GPU, for CI: an unmodified plain Numba program
with one race (its producer called through a helper, its consumer on a
``cuda.external_stream`` of another Numba stream's handle) run with
``NUMBA_STREAMSAFE_CHECK_REPORT=exit`` and ``NUMBA_STREAMSAFE_REPORT_FILE``:
it exits with 1, the summary on standard error is the full report (printed,
for the docs), and the JSON line holds both stacks, the allocation, each
stream's creator and the fix. The same program ordered by a Numba event
exits with 0 and reports nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

PROGRAM = textwrap.dedent('''
    import sys

    import numpy as np
    from numba import cuda

    N = 1 << 20


    @cuda.jit
    def fill(out, v):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = v


    @cuda.jit
    def scale(src, dst):
        i = cuda.grid(1)
        if i < src.size:
            dst[i] = 2 * src[i]


    def produce(stream, x):
        fill[N // 256, 256, stream](x, 1.0)


    def main(ordered):
        upload = cuda.stream()
        work = cuda.stream()
        same = cuda.external_stream(int(work.handle))  # another object, one stream
        x = cuda.device_array(N, np.float32, stream=upload)
        y = cuda.device_array(N, np.float32, stream=work)
        produce(upload, x)
        if ordered:
            done = cuda.event()
            done.record(upload)
            done.wait(same)
        scale[N // 256, 256, same](x, y)
        work.synchronize()
        print("done")


    main(sys.argv[1] == "ordered")
''')


@pytest.mark.parametrize("how", ["racy", "ordered"])
def test_a_report_fit_for_ci(gpu, tmp_path, child_env, race_report, how):
    (tmp_path / "pipeline.py").write_text(PROGRAM)
    report = tmp_path / "races.jsonl"
    env = child_env(NUMBA_CUDA_MEMORY_MANAGER="numba_streamsafe", NUMBA_STREAMSAFE_MODE="check",
                    NUMBA_STREAMSAFE_CHECK_REPORT="exit", NUMBA_STREAMSAFE_REPORT_FILE=str(report))
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "pipeline.py", how],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert "done" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
    if how == "ordered":
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "no race found" in proc.stderr and not report.exists(), proc.stderr[-3000:]
        return
    assert proc.returncode == 1, proc.stderr[-3000:]
    print(proc.stderr)  # the report printed in full (docs/guide/races_on_gpu.md shows it)
    race_report(proc.stderr.strip().splitlines()[0])
    lines = [json.loads(text) for text in report.read_text().splitlines()]
    assert len(lines) == 1, lines
    race = lines[0]
    assert race["kind"] == "read-after-write"
    first, second = race["first"], race["second"]
    assert [f[1] for f in first["stack"][:2]] and first["stack"][0][0].endswith("pipeline.py")
    assert len(first["stack"]) >= 3, first  # produce's launch, main's call, the module's
    assert second["stack"][0][0].endswith("pipeline.py") and len(second["stack"]) >= 2
    assert race["allocated"] and race["allocated"][0][0].endswith("pipeline.py")
    # Both streams were made by Numba at their lines; the external stream is the work
    # stream's handle, so it is known by its creation.
    for side in (first, second):
        origin = side["stream_origin"]
        assert origin["library"] == "numba" and origin["how"] == "made", origin
        assert origin["stack"][0][0].endswith("pipeline.py"), origin
    assert "ev = cuda.event(); ev.record(" in race["fix"] and "ev.wait(" in race["fix"]
    assert "first (write)" in proc.stderr and "memory allocated at:" in proc.stderr
