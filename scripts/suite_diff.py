"""numba-cuda's own test suite with and without the numba_streamsafe plugin,
and the difference.

    python3 scripts/suite_diff.py run [--out DIR] [--jobs N] [TEST ...]
    python3 scripts/suite_diff.py diff WITHOUT.log WITH.log

``run`` starts ``python -m numba.runtests -v -m JOBS TEST...`` (default test:
``numba.cuda.tests``) twice at once, in two processes: one with Numba's own
memory manager, one with ``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe``
(its environment also gets ``NSS_SUITE_ENV``, for example
``NUMBA_STREAMSAFE_IPC=1``). Each writes its log under DIR. Then it prints
the outcome counts of both and every test that passes without the plugin
but fails, errors or is missing with it; the exit status is 1 when there is
any. ``diff`` does the second half on two saved logs.

The logs are unittest's verbose output (``name (id) ... outcome``, where a
first docstring line may sit between the id and the outcome).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

#: ``test_x (pkg.mod.Class.test_x)``, optionally followed on the same line by
#: `` ... outcome``.
_ID = re.compile(r"^(?P<name>\w+) \((?P<id>[\w.]+)\)(?P<rest>.*)$")
_OUTCOME = re.compile(r" \.\.\. (?P<outcome>ok|FAIL|ERROR|skipped\b.*|expected failure"
                      r"|unexpected success)\s*$")

PASS = {"ok", "expected failure", "skipped"}


def _normal(outcome: str) -> str:
    return "skipped" if outcome.startswith("skipped") else outcome


def parse(text: str) -> dict[str, str]:
    """Outcome per test id of one verbose unittest log ("ok", "FAIL", "ERROR",
    "skipped", "expected failure", "unexpected success")."""
    outcomes: dict[str, str] = {}
    pending: str | None = None  # an id whose outcome comes on a later line
    for line in text.splitlines():
        m = _ID.match(line)
        if m:
            test = m.group("id")
            if not test.endswith(m.group("name")):
                test = f"{test}.{m.group('name')}"
            o = _OUTCOME.search(m.group("rest"))
            if o:
                outcomes[test] = _normal(o.group("outcome"))
                pending = None
            else:
                pending = test
            continue
        if pending is not None:
            o = _OUTCOME.search(line)
            if o:
                outcomes[pending] = _normal(o.group("outcome"))
                pending = None
    return outcomes


def regressions(without: dict[str, str], with_plugin: dict[str, str]) -> list[tuple[str, str]]:
    """Tests that pass without the plugin and do not pass with it: (id, outcome
    with the plugin, "missing" when it did not run)."""
    out = []
    for test, outcome in sorted(without.items()):
        if outcome not in PASS:
            continue
        other = with_plugin.get(test, "missing")
        if other not in PASS:
            out.append((test, other))
    return out


def report(without: dict[str, str], with_plugin: dict[str, str]) -> int:
    for label, outcomes in (("without the plugin", without), ("with the plugin", with_plugin)):
        counts = Counter(outcomes.values())
        print(f"{label:20s} {len(outcomes):5d} tests: "
              + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    worse = regressions(without, with_plugin)
    better = [t for t, o in with_plugin.items() if o in PASS and without.get(t, "x") not in PASS]
    print(f"pass without the plugin, not with it: {len(worse)}")
    for test, outcome in worse:
        print(f"  {outcome:8s} {test}")
    print(f"pass with the plugin, not without it: {len(better)}")
    for test in sorted(better):
        print(f"  {without.get(test, 'missing'):8s} {test}")
    return 1 if worse else 0


def run(out: Path, jobs: int, tests: list[str]) -> int:
    out.mkdir(parents=True, exist_ok=True)
    procs = []
    extra = dict(item.split("=", 1) for item in os.environ.get("NSS_SUITE_ENV", "").split()
                 if "=" in item)
    for label, env in (("without", {"NUMBA_CUDA_MEMORY_MANAGER": "default"}),
                       ("with", {"NUMBA_CUDA_MEMORY_MANAGER": "numba_streamsafe", **extra})):
        log = (out / f"suite-{label}.log").open("w")
        cmd = [sys.executable, "-m", "numba.runtests", "-v", "-m", str(jobs), *tests]
        procs.append((label, log, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                                   env={**os.environ, **env})))
    for label, log, proc in procs:
        rc = proc.wait()
        log.close()
        print(f"{label} the plugin: exit {rc}")
    texts = {label: (out / f"suite-{label}.log").read_text(errors="replace")
             for label in ("without", "with")}
    return report(parse(texts["without"]), parse(texts["with"]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-out")))
    r.add_argument("--jobs", type=int, default=8)
    r.add_argument("tests", nargs="*", default=["numba.cuda.tests"])
    d = sub.add_parser("diff")
    d.add_argument("without", type=Path)
    d.add_argument("with_plugin", type=Path)
    args = parser.parse_args()
    if args.cmd == "run":
        return run(args.out, args.jobs, args.tests)
    return report(parse(args.without.read_text(errors="replace")),
                  parse(args.with_plugin.read_text(errors="replace")))


if __name__ == "__main__":
    raise SystemExit(main())
