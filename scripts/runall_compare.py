"""Compare the figure tables of ``benchmarks/run_all.py`` runs of two trees.

    python scripts/runall_compare.py COMPARE_LOG [--limit 0.03]

``COMPARE_LOG`` is what ``scripts/bench_compare.sh BEFORE run_all.py`` wrote: sections
``=== before round K`` and ``=== after round K``, each ending in run_all's table. For
each figure: the before and after values (the median over rounds when several),
after / before, and whether the figure moved the wrong way by more than ``--limit``
(a "<=" target: up is worse; ">=": down is worse; a peer figure has no direction).
Exits 1 when one did.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys

ROW = re.compile(r"^(?P<name>.+?)\s+(?P<value>-|\d+\.\d+)\s+(?:(?P<op><=|>=)\s+[\d.]+\s+\S.*"
                 r"|\(peer\))\s*$")


def tables(text: str) -> dict[str, list[dict[str, tuple[float | None, str | None]]]]:
    """side -> one table per round: figure -> (value, direction)."""
    out: dict[str, list[dict[str, tuple[float | None, str | None]]]] = {}
    side = None
    table: dict[str, tuple[float | None, str | None]] | None = None
    for line in text.splitlines():
        head = re.match(r"^=== (before|after) round", line)
        if head:
            side = head.group(1)
            table = {}
            out.setdefault(side, []).append(table)
            continue
        if table is None or line.startswith("figure"):
            continue
        m = ROW.match(line)
        if m:
            value = None if m.group("value") == "-" else float(m.group("value"))
            table[m.group("name").strip()] = (value, m.group("op"))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log")
    parser.add_argument("--limit", type=float, default=0.03)
    args = parser.parse_args()
    with open(args.log) as f:
        sides = tables(f.read())
    if not sides.get("before") or not sides.get("after"):
        print("no before and after tables in", args.log)
        return 2
    names = list(dict.fromkeys(n for t in sides["after"] for n in t))
    worse = 0
    print(f"{'figure':52s} {'before':>8s} {'after':>8s} {'after/before':>12s}")
    for name in names:
        values = {}
        op = None
        for side in ("before", "after"):
            got = [t[name][0] for t in sides[side] if name in t and t[name][0] is not None]
            op = op or next((t[name][1] for t in sides[side] if name in t), None)
            values[side] = statistics.median(got) if got else None
        b, a = values["before"], values["after"]
        if b is None or a is None or b == 0:
            print(f"{name:52s} {b if b is not None else '-':>8} {a if a is not None else '-':>8}")
            continue
        ratio = a / b
        bad = (op == "<=" and ratio > 1 + args.limit) or (op == ">=" and ratio < 1 - args.limit)
        worse += bad
        flag = "  WORSE" if bad else ("" if op else "  (peer)")
        print(f"{name:52s} {b:8.3f} {a:8.3f} {ratio:12.3f}{flag}")
    print(f"figures worse by more than {args.limit:.0%}: {worse}")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
