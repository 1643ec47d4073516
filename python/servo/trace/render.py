"""A `Timeline` as a text table and as a PNG plot (matplotlib, the ``monitor`` extra)."""

from __future__ import annotations

import itertools
import statistics
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from servo.trace.timeline import Request, Timeline, TraceError, coverage

STATE_COLORS = {
    "connecting": "#3182ce",
    "streaming": "#1f9d55",
    "degraded": "#d69e2e",
    "stalled": "#dd6b20",
    "reconnecting": "#805ad5",
    "dead": "#c53030",
}


def clock(ns: int) -> str:
    """Local time of day with milliseconds."""
    return datetime.fromtimestamp(ns / 1e9).strftime("%H:%M:%S.%f")[:-3]


def _ms(value: Any) -> str:
    return "-" if value is None else f"{float(value):.1f} ms"


def edge_rtt_ms(request: Request) -> float | None:
    """Observation taken to the first action of its chunk executed, on the edge's clock."""
    if request.sent_ns is None or request.first_ns is None:
        return None
    return (request.first_ns - request.sent_ns) / 1e6


def summary(timeline: Timeline) -> list[str]:
    """The lines above the table: the window, and what the numbers say about where time went."""
    runs = timeline.fallback_runs()
    joined = [r for r in timeline.requests if r.audit is not None and not r.server_clock]
    lines = [
        f"robot {timeline.robot}: {clock(timeline.start_ns)} to {clock(timeline.end_ns)} (edge clock), "
        f"{len(timeline.ticks)} ticks at {timeline.fps:g} Hz, {sum(n for *_, n in runs)} without a fresh action "
        f"in {len(runs)} stretch(es); {len(timeline.requests)} requests, {len(joined)} joined with the audit"
    ]
    if not any(first <= timeline.start_ns and timeline.end_ns <= last for first, last, _ in timeline.covers):
        lines.append(f"the window is not recorded whole: {coverage(timeline.covers, timeline.robot)}")
    rtts = [v for r in joined if (v := edge_rtt_ms(r)) is not None]
    audited = [r for r in timeline.requests if r.audit is not None and "staleness_ms" in r.audit]
    if rtts or audited:
        stale = [float(r.audit["staleness_ms"]) for r in audited if r.audit is not None]
        lines.append(
            f"edge round trip p50 {_p50(rtts)}, max {_max(rtts)}; staleness at the replica p50 {_p50(stale)}, "
            f"max {_max(stale)} (every audited request, run or not)"
        )
    lines.append(_verdict(timeline, runs, audited))
    return lines


def _verdict(timeline: Timeline, runs: list[tuple[int, int, int]], audited: list[Request]) -> str:
    """Where the longest stretch without a fresh action came from: the replica, or not (docs/design/audit.md §2)."""
    if not runs:
        return "no tick went without a fresh action"
    start, end, count = max(runs, key=lambda run: run[2])
    held_ms = (end - start) / 1e6 + 1e3 / timeline.fps
    slowest = max(audited, key=lambda r: float(r.audit["staleness_ms"]) if r.audit else 0.0, default=None)
    took = 0.0 if slowest is None or slowest.audit is None else float(slowest.audit["staleness_ms"])
    cut = []
    if timeline.held_before and start == timeline.ticks[0][0]:
        cut.append("it began before the window: start --at earlier")
    if timeline.held_after and end == timeline.ticks[-1][0]:
        cut.append("it goes on past the window's end: a longer --window sees all of it")
    past = f", at least: {'; '.join(cut)}" if cut else ""
    head = f"the longest stretch without a fresh action: {count} tick(s) from {clock(start)} ({held_ms:.0f} ms{past}); "
    if slowest is not None and took >= held_ms / 2:
        return head + (
            f"the replica took {took:.0f} ms over seq {slowest.seq_id}: look at the replica (queue wait, inference)"
        )
    return head + f"the replica answered every request within {took:.0f} ms: look at the link or the edge"


def _p50(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ms" if values else "-"


def _max(values: list[float]) -> str:
    return f"{max(values):.1f} ms" if values else "-"


def table(timeline: Timeline) -> str:
    """Transitions, requests and fallback runs in time order, one line each."""
    rows: list[tuple[int, str, str]] = []
    for at, state, reason in timeline.transitions:
        rows.append((at, "transition", f"{state}: {reason}"))
    for start, end, count in timeline.fallback_runs():
        rows.append((start, "fallback", f"{count} tick(s) without a fresh action, {(end - start) / 1e9:.2f} s"))
    for r in timeline.requests:
        rows.append((r.at_ns, "request", _request_text(r)))
    rows.sort(key=lambda row: row[0])
    lines = [*summary(timeline), "", f"{'time':<14}{'what':<12}detail"]
    lines += [
        f"{clock(at) + ('~' if text.startswith('(no frame') else ''):<14}{what:<12}{text}" for at, what, text in rows
    ]
    return "\n".join(lines) + "\n"


def _request_text(r: Request) -> str:
    head = f"seq {r.seq_id} session {r.session_id[:8]}"
    if r.server_clock:
        head = f"(no frame ran it: at its arrival, server clock) {head}"
    parts = [head]
    if r.sent_ns is not None:
        parts.append(f"edge: chunk in use {_ms(edge_rtt_ms(r))} after its observation, {r.actions} action(s) run")
    a = r.audit
    if a is None:
        parts.append("no audit line (which replica served it? pass its --audit)")
    else:
        parts.append(
            f"{a.get('replica', '?')}: {a.get('outcome')}, queue {_ms(a.get('queue_wait_ms'))}, "
            f"inference {_ms(a.get('inference_ms'))}, staleness {_ms(a.get('staleness_ms'))}, "
            f"superseded {a.get('superseded', 0)}"
        )
    return " | ".join(parts)


def plot(timeline: Timeline, path: str | Path) -> None:
    """Write the timeline as a PNG: states and fallback, per-request latencies, executed commands.

    Raises:
        TraceError: matplotlib is missing (``pip install 'servo-robotics[monitor]'``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TraceError("--plot needs matplotlib: pip install 'servo-robotics[monitor]'") from None
    t0 = timeline.start_ns

    def x(ns: int) -> float:
        return (ns - t0) / 1e9

    fig, (states, latency, commands) = plt.subplots(
        3, 1, figsize=(12, 7), sharex=True, gridspec_kw={"height_ratios": [1, 2, 3]}
    )
    fig.suptitle(f"robot {timeline.robot} from {clock(t0)} (edge clock)")
    changes = [*timeline.transitions, (timeline.end_ns, "", "")]
    for (at, state, _), (until, _, _) in itertools.pairwise(changes):
        if state:
            states.axvspan(x(max(at, t0)), x(until), color=STATE_COLORS.get(state, "#999"), label=state)
    fallback = [x(at) for at, source, _ in timeline.ticks if source in ("fallback", "none")]
    states.plot(fallback, [0.5] * len(fallback), "|", color="#c53030", label="no fresh action")
    handles, labels = states.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    states.legend(unique.values(), unique.keys(), loc="upper left", ncols=6, fontsize=8)
    states.set_yticks([])
    joined = [r for r in timeline.requests if r.sent_ns is not None]
    latency.plot(
        [x(r.at_ns) for r in joined],
        [edge_rtt_ms(r) for r in joined],
        "o-",
        ms=3,
        label="edge: observation → chunk in use",
    )
    audited = [r for r in timeline.requests if r.audit is not None]
    latency.plot(
        [x(r.at_ns) for r in audited],
        [float(r.audit["staleness_ms"]) if r.audit else np.nan for r in audited],
        "s",
        ms=3,
        label="replica: staleness when the chunk left",
    )
    latency.set_ylabel("ms")
    latency.legend(loc="upper left", fontsize=8)
    if timeline.ticks:
        times = [x(at) for at, _, action in timeline.ticks if action is not None]
        actions = np.array([action for _, _, action in timeline.ticks if action is not None])
        if len(actions):
            for j, name in enumerate(timeline.joint_names):
                commands.plot(times, actions[:, j], lw=1, label=name)
            commands.legend(loc="upper left", ncols=3, fontsize=8)
    commands.set_ylabel("command")
    commands.set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
