"""`llmchat bench --report out.html`: the run as one self-contained HTML page.

Inline CSS and inline SVG only: no script, no font, no image, nothing fetched (a Content-Security-Policy of
``default-src 'none'`` says so to the browser too), so the file opens anywhere, offline, and can be mailed.
The tables are the terminal's own cells (``_bench_report`` and ``_bench_sweep``'s ``*_cells``), the bar chart
and the sweep curve the ``--plot`` SVGs; new here are the attribution shares as stacked bars and the time
series (``Timeline``). Every text from the run is escaped. Pure: figures in, a page out.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llmchat.core.load import ConfigStats, SweepResult, Timeline
from llmchat.core.observe import GROUPS
from llmchat.tui.commands import _bench_report as report
from llmchat.tui.commands import _bench_sweep as sweep_report
from llmchat.tui.commands._bench_report import axis

#: A colour per configuration (or sweep level) in the time series, in the order they first ran.
SERIES_COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7",
                  "#bab0ac", "#e15759")
FAILED_COLOUR = "#e15759"
#: Attribution groups as the HUD names them, and a colour each ("unexplained" grey: it is not a place).
GROUP_LOOK: dict[str, tuple[str, str]] = {
    "client": ("client", "#59a14f"),
    "limit": ("client rate limit", "#edc948"),
    "network": ("network", "#4e79a7"),
    "network+server": ("network + server (not reported)", "#a0cbe8"),
    "server": ("server", "#b07aa1"),
    "retry": ("retries", "#e15759"),
    "unexplained": ("unexplained", "#bab0ac"),
}

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;padding:0 1em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0;font-variant-numeric:tabular-nums;font-size:.9em}
th,td{padding:.15em .7em;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
th{background:#f6f6f6}.l{text-align:left}.note{color:#555;font-size:.88em;margin:.2em 0}
.warn{color:#a33;font-weight:600}svg{max-width:100%;height:auto;display:block;margin:.5em 0}
"""
_CSP = "default-src 'none'; style-src 'unsafe-inline'"


@dataclass(frozen=True, kw_only=True)
class Page:
    """What the report shows (made by ``_bench_files`` from the run)."""

    title: str
    settings: Sequence[tuple[str, str]]
    """The configuration as (name, value) rows: target (masked), scenario, client settings. Never a key."""
    stats: Sequence[ConfigStats]
    mode: str
    timeline: Timeline
    sweep: SweepResult | None = None
    server: tuple[Mapping[str, Sequence[Mapping[str, float] | None]], str, float] | None = None
    """The provider's /metrics per configuration, its masked URL and the scrape interval; None without."""
    warnings: Sequence[str] = field(default_factory=tuple)
    made: str = ""
    interrupted: bool = False


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def table(rows: Sequence[Sequence[str]], *, left: int = 1, head: int = 1, cls: str = "") -> str:
    """Cells as an HTML table: the first ``head`` rows as headers, the first ``left`` columns left-aligned."""
    out = [f'<table class="{_e(cls)}">' if cls else "<table>"]
    for n, row in enumerate(rows):
        tag = "th" if n < head else "td"
        cells = "".join(f'<{tag} class="l">{_e(c)}</{tag}>' if i < left else f"<{tag}>{_e(c)}</{tag}>"
                        for i, c in enumerate(row))
        out.append(f"<tr>{cells}</tr>")
    out.append("</table>")
    return "\n".join(out)


def _notes(lines: Sequence[str]) -> str:
    return "\n".join(f'<p class="note">{_e(line)}</p>' for line in lines)


def _inline(svg: str) -> str:
    # The --plot SVGs are whole documents; inside HTML the element alone is wanted.
    return svg.strip()


def render(page: Page) -> str:
    """The whole HTML document."""
    stats = page.stats
    body = [f"<h1>{_e(page.title)}</h1>"]
    meta = page.made + ("  (interrupted: partial figures)" if page.interrupted else "")
    if meta:
        body.append(f'<p class="note">{_e(meta)}</p>')
    for warning in page.warnings:
        body.append(f'<p class="warn">{_e(warning)}</p>')
    body.append('<h2 id="configuration">Configuration</h2>')
    body.append(table([["setting", "value"], *([k, v] for k, v in page.settings)], left=2, cls="settings"))
    if page.sweep is not None and page.sweep.levels:
        result = page.sweep
        body.append('<h2 id="sweep">Sweep: latency against throughput</h2>')
        body.append(_inline(sweep_report.svg_curve(result, title="latency against throughput, one point per "
                                                                 "level")))
        body.append(table(sweep_report.sweep_cells(result), cls="sweep"))
        body.append(_notes(sweep_report.sweep_summary(result)))
    if stats:
        body.append('<h2 id="figures">Percentiles, throughput, errors</h2>')
        body.append(table(report.figures_cells(stats, mode=page.mode), left=2, cls="figures"))
        body.append(_notes(report.figures_notes(stats)))
        if page.sweep is None:
            body.append(_inline(report.svg_chart(stats, mode=page.mode, title="p50 / p90 / p99")))
        scheduled = report.schedule_cells(stats)
        if scheduled:
            body.append('<h2 id="schedule">From the scheduled start (open loop)</h2>')
            body.append(table(scheduled, left=2, cls="schedule"))
            body.append(_notes([report.SCHEDULE_NOTE]))
        if len(stats) > 1 and page.sweep is None:
            body.append('<h2 id="compare">Before / after</h2>')
            body.append(table(report.compare_cells(stats), left=2, cls="compare"))
        attribution = report.attribution_cells(stats)
        if attribution:
            body.append('<h2 id="attribution">Where the time went</h2>')
            body.append(shares_svg(stats))
            body.append(table(attribution, head=2, cls="attribution"))
            body.append(_notes(report.attribution_notes(stats)))
    if page.server is not None:
        snapshots, url, interval = page.server
        body.append('<h2 id="server">Server metrics</h2>')
        body.append(table(report.server_cells(snapshots, interval), left=2, cls="server"))
        body.append(_notes([report.server_note(url)]))
    body.append('<h2 id="timeline">Over the run</h2>')
    body.append(timeline_svg(page.timeline, mode=page.mode))
    tl = page.timeline
    shown = (f"{len(tl.points):,} of {tl.seen:,} requests shown, a uniform sample" if tl.sampled
             else f"every request shown ({tl.seen:,})")
    body.append(_notes([f"{shown}; x: seconds since the clients were ready; in flight counted at each "
                        f"{tl.width_s:g} s step"]))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{_e(page.title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        + "\n".join(body) + "\n</body>\n</html>\n"
    )


def shares_svg(stats: Sequence[ConfigStats]) -> str:
    """Each configuration's time split by attribution group as one stacked bar (negative shares, an overlap
    counted as negative unexplained time, draw nothing but keep their label)."""
    left, width, bar_h, gap, top = 130, 600, 22, 12, 34
    height = top + len(stats) * (bar_h + gap) + 10
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 20}" height="{height}" '
             'font-family="sans-serif" font-size="12" class="shares">']
    present = [g for g in GROUPS if any(g in s.attribution_shares for s in stats)]
    x = left
    for g in present:
        name, colour = GROUP_LOOK.get(g, (g, "#888"))
        parts.append(f'<rect x="{x}" y="8" width="12" height="12" fill="{colour}"/>'
                     f'<text x="{x + 16}" y="19">{_e(name)}</text>')
        x += 24 + 7 * len(name)
    for n, s in enumerate(stats):
        y = top + n * (bar_h + gap)
        parts.append(f'<text x="{left - 8}" y="{y + bar_h * 0.7:.1f}" text-anchor="end">{_e(s.name)}</text>')
        positive = sum(v for v in s.attribution_shares.values() if v > 0) or 1.0
        x0 = float(left)
        for g in GROUPS:
            v = s.attribution_shares.get(g)
            if v is None or v <= 0:
                continue
            w = width * v / positive
            name, colour = GROUP_LOOK.get(g, (g, "#888"))
            parts.append(f'<rect class="share" x="{x0:.1f}" y="{y}" width="{w:.1f}" height="{bar_h}" '
                         f'fill="{colour}"><title>{_e(s.name)}: {_e(name)} {v * 100:.0f}%</title></rect>')
            if w > 34:
                parts.append(f'<text x="{x0 + w / 2:.1f}" y="{y + bar_h * 0.7:.1f}" text-anchor="middle">'
                             f"{v * 100:.0f}%</text>")
            x0 += w
    parts.append("</svg>")
    return "\n".join(parts)


def timeline_svg(timeline: Timeline, *, mode: str) -> str:
    """Three panels against seconds since the start: TTFT per request (batch: TTFB is not kept, so end-to-end
    only), end-to-end per request (failed ones in red), and requests in flight as a step line."""
    w, left, panel_h, gap = 720, 70, 150, 46
    top = 60 if len(timeline.configs) > 1 else 36  # room for the configurations' key
    points = timeline.points
    flight = timeline.in_flight()
    x_max = max([p.start_s for p in points] + [t for t, _ in flight] + [0.0]) or 1.0
    x_scale, x_ticks = axis(x_max)
    panels: list[tuple[str, str]] = [("e2e", "end-to-end per request (ms)"), ("flight", "requests in flight")]
    if mode == "stream":
        panels.insert(0, ("ttft", "TTFT per request (ms)"))
    height = top + len(panels) * (panel_h + gap)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w + left + 20}" height="{height}" '
             'font-family="sans-serif" font-size="12" class="timeline">']
    if len(timeline.configs) > 1:
        x = left
        for i, name in enumerate(timeline.configs):
            parts.append(f'<rect x="{x}" y="8" width="12" height="12" fill="{_colour(i)}"/>'
                         f'<text x="{x + 16}" y="19">{_e(name)}</text>')
            x += 30 + 7 * len(name)

    def px(t: float) -> float:
        return left + w * t / x_scale

    for n, (kind, label) in enumerate(panels):
        y0 = top + n * (panel_h + gap)
        if kind == "flight":
            values = [float(c) for _, c in flight]
        else:
            values = [v for p in points if (v := (p.ttft_ms if kind == "ttft" else p.e2e_ms)) is not None]
        y_scale, y_ticks = axis(max(values, default=0.0))
        if kind == "flight":  # whole requests at every gridline
            y_ticks = [(t, label) for t, label in y_ticks if t == int(t)]

        def py(v: float, y0: int = y0, y_scale: float = y_scale) -> float:
            return y0 + panel_h - panel_h * v / y_scale

        parts.append(f'<text x="{left}" y="{y0 - 8}" font-weight="bold">{_e(label)}</text>')
        for tick, tick_label in y_ticks:
            y = py(tick)
            parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + w}" y2="{y:.1f}" stroke="#ddd"/>'
                         f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{tick_label}</text>')
        for tick, tick_label in x_ticks:
            parts.append(f'<text x="{px(tick):.1f}" y="{y0 + panel_h + 15}" text-anchor="middle">'
                         f"{tick_label}</text>")
        if kind == "flight":
            steps = []
            prev = 0
            for t, c in flight:
                steps.append(f"{px(t):.1f},{py(prev):.1f} {px(t):.1f},{py(c):.1f}")
                prev = c
            parts.append(f'<polyline class="inflight" points="{" ".join(steps)}" fill="none" '
                         'stroke="#4e79a7" stroke-width="1.5"/>')
        else:
            by_series: dict[tuple[int, bool], list[str]] = {}
            for p in points:
                v = p.ttft_ms if kind == "ttft" else p.e2e_ms
                if v is None:
                    continue
                by_series.setdefault((p.config, p.ok), []).append(f"M{px(p.start_s):.1f} {py(v):.1f}h0")
            for (config, ok), marks in sorted(by_series.items()):
                colour = _colour(config) if ok else FAILED_COLOUR
                what = timeline.configs[config] + ("" if ok else ", failed")
                parts.append(f'<path class="series" d="{"".join(marks)}" stroke="{colour}" stroke-width="3.5" '
                             f'stroke-linecap="round" fill="none"><title>{_e(what)}</title></path>')
        parts.append(f'<line x1="{left}" y1="{y0 + panel_h}" x2="{left + w}" y2="{y0 + panel_h}" '
                     'stroke="#333"/>')
    parts.append(f'<text x="{left + w / 2}" y="{height - 6}" text-anchor="middle">seconds since the start</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def _colour(i: int) -> str:
    return SERIES_COLOURS[i % len(SERIES_COLOURS)]
