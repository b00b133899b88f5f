"""A :class:`~numba_streamsafe.diagnostics.tracing.Trace` as Chrome trace JSON and as a picture.

Chrome trace / Perfetto JSON (the "Trace Event Format"): one process per
device, one thread (lane) per stream, a complete event (``ph: "X"``) per
launch, copy and memset, an instant event (``ph: "i"``) per allocation and
free, a flow (``ph: "s"`` then ``"f"``) from the earlier operation to the
waiting one for every wait queued, and counters (``ph: "C"``) of live and
pending bytes. Timestamps are microseconds from the start of the trace: the
device times when the trace measured them, else the host times of the calls.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from numba_streamsafe.diagnostics.tracing import Op, Trace

__all__ = ["chrome_events", "save_chrome", "plot"]


def _span(op: Op) -> tuple[float, float]:
    """Start and length (µs) of ``op``: device times when measured."""
    if op.device_t0 is not None and op.device_t1 is not None:
        return op.device_t0 / 1e3, max(op.device_t1 - op.device_t0, 1) / 1e3
    return op.t0 / 1e3, max(op.t1 - op.t0, 1) / 1e3


def _lanes(t: Trace) -> dict[tuple[int, int], int]:
    return {lane: i + 1 for i, lane in enumerate(t.streams())}


def chrome_events(t: Trace) -> list[dict[str, Any]]:
    """The trace as a list of Trace Event Format events."""
    lanes = _lanes(t)
    out: list[dict[str, Any]] = []
    for device in sorted({d for d, _ in lanes}):
        out.append({"ph": "M", "name": "process_name", "pid": device, "tid": 0, "ts": 0,
                    "args": {"name": f"device {device}"}})
    for (device, stream), tid in lanes.items():
        out.append({"ph": "M", "name": "thread_name", "pid": device, "tid": tid, "ts": 0,
                    "args": {"name": f"stream {stream:#x}" if stream >= 0 else "retired stream"}})
    ops = {op.id: op for op in t.ops}
    for op in t.ops:
        ts, dur = _span(op)
        out.append({"ph": "X", "name": op.label, "cat": op.kind, "pid": op.device,
                    "tid": lanes[(op.device, op.stream)], "ts": ts, "dur": dur,
                    "args": {"id": op.id, "tracked": op.tracked,
                             "uses": {n: f"{a} {p:#x}+{size}" for n, a, p, size in op.uses}}})
    flow = 0
    for w in t.waits:
        if not w.inserted:
            continue
        waiter = ops.get(w.op)
        if waiter is None:
            continue
        wts, _ = _span(waiter)
        tid = lanes[(w.device, w.stream)]
        args = {"argument": w.param, "access": w.access, "hazard": w.hazard,
                "after": f"{w.after_label}#{w.after} ({w.after_param})",
                "on_stream": f"{w.on_stream:#x}"}
        out.append({"ph": "i", "s": "t", "name": f"wait: {w.param}", "cat": "wait",
                    "pid": w.device, "tid": tid, "ts": wts, "args": args})
        earlier = ops.get(w.after)
        if earlier is None or (earlier.device, earlier.stream) not in lanes:
            continue
        flow += 1
        ets, edur = _span(earlier)
        out.append({"ph": "s", "name": "wait", "cat": "wait", "id": flow, "pid": earlier.device,
                    "tid": lanes[(earlier.device, earlier.stream)], "ts": ets + edur})
        out.append({"ph": "f", "bp": "e", "name": "wait", "cat": "wait", "id": flow,
                    "pid": w.device, "tid": tid, "ts": wts})
    for m in t.memory:
        ts = m.t / 1e3
        out.append({"ph": "i", "s": "t", "name": f"{m.what} {m.nbytes} B", "cat": "memory",
                    "pid": m.device, "tid": lanes[(m.device, m.stream)], "ts": ts,
                    "args": {"ptr": f"{m.ptr:#x}", "tag": m.tag}})
        out.append({"ph": "C", "name": "memory", "pid": m.device, "ts": ts,
                    "args": {"live_bytes": m.live_bytes, "pending_bytes": m.pending_bytes}})
    return out


def save_chrome(t: Trace, path: str) -> None:
    """Write :func:`chrome_events` to ``path`` (``{"traceEvents": [...]}``)."""
    doc = {"traceEvents": chrome_events(t), "displayTimeUnit": "ms",
           "otherData": {"producer": "numba_streamsafe", "summary": t.summary(),
                         "device_times": t.device_times_measured}}
    with open(path, "w") as f:
        json.dump(doc, f)


_COLORS = {"launch": "tab:blue", "copy": "tab:orange", "memset": "tab:gray"}


def plot(t: Trace, path: str | None = None) -> Any:
    """Draw ``t``: a lane per stream with its operations, an arrow per wait
    from the earlier operation to the waiting one, and live / pending bytes
    below. Saved to ``path`` when given; returns the matplotlib figure."""
    try:
        import matplotlib

        if path is not None:
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("Trace.plot needs matplotlib: pip install 'numba-streamsafe[plot]' "
                          "(or pip install matplotlib)") from exc
    lanes = _lanes(t)
    fig, (ax, mem) = plt.subplots(2, 1, figsize=(12, 1.2 + 0.6 * max(len(lanes), 1) + 2),
                                  sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    _draw_ops(ax, t, lanes)
    _draw_waits(ax, t, lanes)
    ax.set_yticks(list(lanes.values()))
    ax.set_yticklabels([f"dev {d} stream {s:#x}" for d, s in lanes])
    ax.set_ylim(0.3, len(lanes) + 0.9)
    ax.set_title("numba_streamsafe trace: operations per stream, waits (red arrows)"
                 + (", device times" if t.device_times_measured else ", host times"))
    if t.memory:
        xs = [m.t / 1e6 for m in t.memory]
        mem.step(xs, [m.live_bytes for m in t.memory], where="post", label="live bytes")
        mem.step(xs, [m.pending_bytes for m in t.memory], where="post", label="pending bytes")
        mem.legend(fontsize=7, loc="upper left")
    mem.set_xlabel("ms since the trace began")
    mem.set_ylabel("bytes")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=130)
    return fig


def _draw_ops(ax: Any, t: Trace, lanes: dict[tuple[int, int], int]) -> None:
    """A bar per operation in its stream's lane, labelled where there is room."""
    spans = [_span(op) for op in t.ops]
    total = max((a + b for a, b in spans), default=1.0) - min((a for a, _ in spans), default=0.0)
    last_label: dict[int, tuple[str, float]] = {}
    for op, (ts, dur) in zip(t.ops, spans, strict=True):
        y = lanes[(op.device, op.stream)]
        ax.broken_barh([(ts / 1e3, dur / 1e3)], (y - 0.35, 0.7),
                       facecolors=_COLORS.get(op.kind, "tab:blue"), edgecolors="white",
                       linewidth=0.3, alpha=0.85)
        # A label where there is room: not the same name again right after itself.
        prev = last_label.get(y)
        if prev is None or (prev[0] != op.label and ts - prev[1] > 0.04 * total):
            ax.text(ts / 1e3, y + 0.38, op.label[:20], fontsize=6, va="bottom")
            last_label[y] = (op.label, ts)


def _draw_waits(ax: Any, t: Trace, lanes: dict[tuple[int, int], int]) -> None:
    """An arrow per inserted wait, from the earlier operation to the waiting one."""
    ops = {op.id: op for op in t.ops}
    for w in t.waits:
        earlier, waiter = ops.get(w.after), ops.get(w.op)
        if not w.inserted or earlier is None or waiter is None:
            continue
        ets, edur = _span(earlier)
        wts, _ = _span(waiter)
        ax.annotate("", xy=(wts / 1e3, lanes[(w.device, w.stream)]),
                    xytext=((ets + edur) / 1e3, lanes[(earlier.device, earlier.stream)]),
                    arrowprops={"arrowstyle": "->", "color": "tab:red", "lw": 0.8})
