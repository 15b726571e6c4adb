"""What `llmchat bench --sweep` prints and draws: one row per level, the knee, the highest level meeting the SLO,
the saturation warning, and latency against throughput (plotext in the terminal, hand-written SVG in a file).

Pure text in, text out, as ``_bench_report``; the curves hold the same numbers as the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from xml.sax.saxutils import escape

from llmchat.core.load import METRIC_NAMES, SLO_SHARE, SweepResult
from llmchat.tui.commands._bench_report import BAR_COLOURS, axis, fmt_ms, grid


def sweep_table(result: SweepResult) -> str:
    """One row per level: requests, requests/s, goodput, TTFT/ITL/end-to-end p50 and p99, server errors, the
    server's queue p90, and the SLO share when one was given; the knee and the SLO's level marked."""
    return grid(sweep_cells(result))


def sweep_cells(result: SweepResult) -> list[list[str]]:
    """``sweep_table``'s cells, the header row first."""
    mode = result.mode
    slo = bool(result.levels) and result.levels[0].stats.slo.given
    head = ["level", "requests", "req/s", "goodput"] if slo else ["level", "requests", "req/s"]
    metrics = ("ttft", "itl", "e2e") if mode == "stream" else ("ttfb", "e2e")
    for m in metrics:
        head += [f"{METRIC_NAMES[m]} p50", "p99"]
    head += ["errors", "queue p90"]
    if slo:
        head.append("met SLO")
    rows = [head]
    knee, best = result.knee, result.best
    for i, lv in enumerate(result.levels):
        s = lv.stats
        mark = " knee" if i == knee else ""
        mark += " *" if i == best else ""
        row = [s.name + mark, str(s.requests), f"{s.rps:.2f}"]
        if slo:
            row.append(f"{s.goodput_rps or 0.0:.2f}")
        for m in metrics:
            row += [fmt_ms(s.latency[m]["p50"]), fmt_ms(s.latency[m]["p99"])]
        row += [f"{s.server_failed}", fmt_ms(lv.queue_p90_ms)]
        if slo:
            share = lv.slo_share
            row.append("-" if share is None else f"{share:.0%}")
        rows.append(row)
    return rows


def sweep_summary(result: SweepResult) -> list[str]:
    """The lines under the table: the knee, the highest level meeting the SLO, why an automatic sweep
    stopped."""
    lines = []
    levels = result.levels
    if result.knee is not None:
        k = levels[result.knee]
        lines.append(f"knee: {k.stats.name} ({k.stats.rps:.2f} requests/s): past it throughput stops growing "
                     "while latency climbs")
    elif levels:
        lines.append("knee: none found: throughput kept up with the load at every level")
    if levels and levels[0].stats.slo.given:
        what = f"{levels[0].stats.slo.describe()} for {SLO_SHARE:.0%} of requests"
        if result.best is None:
            lines.append(f"SLO ({what}): not met at any level, the first included")
        else:
            b = levels[result.best]
            lines.append(f"SLO ({what}): highest level meeting it {b.stats.name} "
                         f"({b.stats.rps:.2f} requests/s, goodput {b.stats.goodput_rps or 0.0:.2f}) (*)")
    if result.stopped:
        lines.append(f"sweep stopped: {result.stopped}")
    return lines


def saturation_warning(result: SweepResult) -> str | None:
    """The line said when the server queued requests at some level, naming the first and the evidence."""
    i = result.saturated_at
    if i is None:
        return None
    lv = result.levels[i]
    evidence = []
    if lv.queued:
        evidence.append(f"its reported queue time p90 {fmt_ms(lv.queue_p90_ms)} ms")
    if lv.waiting_max:
        evidence.append(f"up to {lv.waiting_max:g} requests waiting in its /metrics")
    return (f"llmchat: the server saturated from {lv.stats.name}: {' and '.join(evidence)}; latency past that "
            "level is its queue, not its speed")


def _metric(result: SweepResult) -> str:
    return "ttft" if result.mode == "stream" else "e2e"


def _curves(result: SweepResult) -> list[tuple[str, list[tuple[float, float]]]]:
    metric = _metric(result)
    out = []
    for q in ("p50", "p99"):
        pts = [(lv.stats.rps, v) for lv in result.levels
               if (v := lv.stats.latency[metric][q]) is not None]
        out.append((f"{METRIC_NAMES[metric]} {q}", pts))
    return out


def terminal_curve(result: SweepResult, *, width: int, colour: bool) -> str:
    """Latency p50 and p99 against requests/s, one point per level, drawn by plotext."""
    import plotext as plt  # only for --plot

    plt.clear_figure()
    for name, pts in _curves(result):
        if pts:
            plt.plot([x for x, _ in pts], [y for _, y in pts], label=name, marker="dot")
    plt.title("latency (ms) against throughput (requests/s), one point per level")
    plt.xlabel("requests/s")
    plt.plotsize(max(40, min(width, 100)), 18)
    text = str(plt.build())
    plt.clear_figure()
    return text if colour else str(plt.uncolorize(text))


def svg_curve(result: SweepResult, *, title: str = "llmchat bench --sweep") -> str:
    """The same curve as an SVG document: a polyline per percentile, a labelled point per level, axes in
    requests/s and ms. Pure; never fails (no levels draws empty axes)."""
    w, h, left, top, bottom = 720, 360, 70, 56, 50
    curves = _curves(result)
    xs = [x for _, pts in curves for x, _ in pts]
    ys = [y for _, pts in curves for _, y in pts]
    x_scale, x_ticks = axis(max(xs, default=0.0))
    y_scale, y_ticks = axis(max(ys, default=0.0))

    def px(x: float) -> float:
        return left + w * x / x_scale

    def py(y: float) -> float:
        return top + h - h * y / y_scale

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w + left + 30}" height="{top + h + bottom}" '
             'font-family="sans-serif" font-size="12">',
             f'<title>{escape(title)}</title>',
             f'<text x="{left}" y="20" font-size="15" font-weight="bold">{escape(title)}</text>']
    for tick, label in y_ticks:
        y = py(tick)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + w}" y2="{y:.1f}" stroke="#ddd"/>'
                     f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    for tick, label in x_ticks:
        parts.append(f'<text x="{px(tick):.1f}" y="{top + h + 18}" text-anchor="middle">{label}</text>')
    parts.append(f'<text x="{left + w / 2}" y="{top + h + 40}" text-anchor="middle">requests/s</text>'
                 f'<text x="14" y="{top + h / 2}" transform="rotate(-90 14 {top + h / 2})" '
                 'text-anchor="middle">ms</text>')
    for n, (name, pts) in enumerate(curves):
        colour = BAR_COLOURS[0 if n == 0 else 2]
        parts.append(f'<rect x="{left + n * 110}" y="30" width="12" height="12" fill="{colour}"/>'
                     f'<text x="{left + n * 110 + 16}" y="41">{escape(name)}</text>')
        if pts:
            line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
            parts.append(f'<polyline class="curve" points="{line}" fill="none" stroke="{colour}" '
                         'stroke-width="2"/>')
        for (x, y), lv in zip(pts, _with_values(result, n), strict=False):
            parts.append(f'<circle class="level" cx="{px(x):.1f}" cy="{py(y):.1f}" r="4" fill="{colour}">'
                         f'<title>{escape(lv)} {x:.2f} req/s {fmt_ms(y)} ms</title></circle>')
    if result.knee is not None:
        knee = result.levels[result.knee].stats
        kx = px(knee.rps)
        parts.append(f'<line x1="{kx:.1f}" y1="{top}" x2="{kx:.1f}" y2="{top + h}" stroke="#888" '
                     f'stroke-dasharray="4 3"/><text x="{kx + 4:.1f}" y="{top + 12}">knee {escape(knee.name)}</text>')
    if result.best is not None:  # the highest level meeting the SLO, ringed on its p50 point
        best = result.levels[result.best].stats
        v = best.latency[_metric(result)]["p50"]
        if v is not None:
            bx, by = px(best.rps), py(v)
            parts.append(f'<circle class="slo" cx="{bx:.1f}" cy="{by:.1f}" r="9" fill="none" stroke="#59a14f" '
                         f'stroke-width="2.5"><title>highest level meeting the SLO: {escape(best.name)}</title>'
                         f'</circle><text x="{bx + 12:.1f}" y="{by + 16:.1f}" fill="#3b7a34">SLO met up to '
                         f'{escape(best.name)}</text>')
    parts.append(f'<line x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}" stroke="#333"/>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _with_values(result: SweepResult, curve: int) -> Sequence[str]:
    metric = "ttft" if result.mode == "stream" else "e2e"
    q = ("p50", "p99")[curve]
    return [lv.stats.name for lv in result.levels if lv.stats.latency[metric][q] is not None]
