"""What `llmchat bench` prints and draws: the side-by-side figures, the before/after table and the charts.

Pure text in, text out (the command writes it): tables as aligned columns, the terminal chart through plotext,
and the SVG chart written by hand (grouped bars, no library), so every picture holds the same numbers as the
table above it. Each table's cells come from a ``*_cells`` function and its lines under it from ``*_notes``,
so ``--report`` (``_bench_html``) shows what the terminal shows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from xml.sax.saxutils import escape

from llmchat.core.client import summarize_snapshots
from llmchat.core.load import (
    EXACT_LIMIT,
    METRIC_NAMES,
    METRICS,
    QUANTILES,
    RELATIVE_ERROR,
    ConfigStats,
    ScheduleFigures,
    compare_rows,
)
from llmchat.core.observe import PARTS
from llmchat.tui.numbers import nice_ticks, tick_labels

BAR_COLOURS = ("#4e79a7", "#f28e2b", "#e15759")  # p50, p90, p99


def fmt_ms(v: float | None) -> str:
    """A latency in ms to a precision that suits its size; "-" for none."""
    if v is None:
        return "-"
    if v < 10:
        return f"{v:.2f}"
    if v < 1000:
        return f"{v:.1f}"
    return f"{v:.0f}"


def _pct(v: float | None, *, signed: bool = False) -> str:
    if v is None:
        return "-"
    return f"{v:+.1f}%" if signed else f"{v:.1f}%"


def grid(rows: Sequence[Sequence[str]], *, left: int = 1) -> str:
    """Rows of cells as aligned columns: the first ``left`` columns left-aligned, the rest right-aligned."""
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(max(len(r) for r in rows))]
    lines = []
    for row in rows:
        cells = [c.ljust(widths[i]) if i < left else c.rjust(widths[i]) for i, c in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def figures_table(stats: Sequence[ConfigStats], *, mode: str) -> str:
    """Every figure, one column per configuration: latency percentiles, errors by class (the server's and the
    network's apart from the client's own), throughput."""
    return "\n".join([grid(figures_cells(stats, mode=mode), left=2), *figures_notes(stats)])


def figures_cells(stats: Sequence[ConfigStats], *, mode: str) -> list[list[str]]:
    """``figures_table``'s cells, row by row (the header row first; two label columns): ``--report`` shows
    the same cells as the terminal."""
    rows: list[list[str]] = [["", "", *(s.name for s in stats)]]
    for metric in ("pool_wait", "ttfb", "ttft", "itl", "tpot", "e2e"):
        if metric in ("ttft", "itl", "tpot") and mode != "stream":
            continue
        for i, q in enumerate(QUANTILES):
            label = f"{METRIC_NAMES[metric]} ms" if i == 0 else ""
            rows.append([label, f"p{q}", *(fmt_ms(s.latency[metric][f"p{q}"]) for s in stats)])
    rows.append(["requests", "", *(str(s.requests) for s in stats)])
    # The server's and the network's failures, then the client's own (a pool timeout never left the client).
    rows.append(["server/net errors", "", *(f"{s.server_failed} ({_pct(s.server_error_rate * 100)})"
                                            for s in stats)])
    for kind in sorted({k for s in stats for k in s.server_errors}):
        rows.append(["", kind, *(_kind_cell(s, kind) for s in stats)])
    rows.append(["client errors", "", *(f"{s.client_failed} ({_pct(s.client_error_rate * 100)})"
                                        for s in stats)])
    client_kinds = sorted({k for s in stats for k in s.client_errors})
    for kind in client_kinds:
        rows.append(["", kind, *(_kind_cell(s, kind) for s in stats)])
    rows.append(["requests/s", "", *(f"{s.rps:.2f}" for s in stats)])
    rows.append(["output tokens/s", "", *(f"{s.output_tokens_per_s:.1f}" for s in stats)])
    if stats and stats[0].slo.given:
        rows.append(["goodput req/s", "", *(f"{s.goodput_rps or 0.0:.2f}" for s in stats)])
    rows.append(["HTTP", "", *(s.http_version for s in stats)])
    rows.append(["conn. reused", "", *(_pct(None if s.reused_ratio is None else s.reused_ratio * 100)
                                       for s in stats)])
    rows.append(["conn. opened", "", *(str(s.on_wire - s.reused) for s in stats)])
    rows.append(["conn. setup ms", "", *(fmt_ms(s.setup_ms) for s in stats)])
    rows.append(["retries", "", *(str(s.retries) for s in stats)])
    rows.append(["cache hits", "", *(str(s.cache_hits) for s in stats)])
    rows.append(["wall s", "", *(f"{s.wall_s:.2f}" for s in stats)])
    return rows


def figures_notes(stats: Sequence[ConfigStats]) -> list[str]:
    """The lines under ``figures_table``: what goodput counted, what client errors are, which percentiles are
    approximate."""
    notes = []
    if stats and stats[0].slo.given:
        notes.append(f"goodput: successful requests/s with {stats[0].slo.describe()}")
    if any(s.client_errors for s in stats):
        notes.append("client errors are the bench's own and never reached the server (timeout_pool: no free "
                     "connection in its pool within http.pool_timeout_s; they are not retried): they lower "
                     "requests/s and goodput, not the server's error rate. Leave --max-connections out to size "
                     "the pool for the load")
    approximate = [METRIC_NAMES[m] for m in METRICS if any(m in s.approximate for s in stats)]
    if approximate:
        notes.append(_approximate_note(approximate))
    return notes


def schedule_table(stats: Sequence[ConfigStats]) -> str:
    """An open loop's figures from the schedule: schedule lag, and TTFT and end-to-end counted from each
    request's scheduled start beside the same from its actual start; empty in a closed loop."""
    rows = schedule_cells(stats)
    if not rows:
        return ""
    return grid(rows, left=2) + "\n" + SCHEDULE_NOTE


SCHEDULE_NOTE = ("schedule lag: how late each request started after its scheduled arrival; latencies counted "
                 "from the scheduled start include it (coordinated omission)")


def schedule_cells(stats: Sequence[ConfigStats]) -> list[list[str]]:
    """``schedule_table``'s cells (two label columns); [] in a closed loop."""
    timed = [s for s in stats if s.schedule is not None]
    if not timed:
        return []
    rows: list[list[str]] = [["from the scheduled start", "", *(s.name for s in timed)]]
    series: list[tuple[str, Callable[[ConfigStats, str], float | None]]] = [
        ("schedule lag ms", lambda s, q: _sched(s).lag[q]),
        ("TTFT ms, scheduled", lambda s, q: _sched(s).ttft[q]),
        ("TTFT ms, actual", lambda s, q: s.latency["ttft"][q]),
        ("end-to-end ms, scheduled", lambda s, q: _sched(s).e2e[q]),
        ("end-to-end ms, actual", lambda s, q: s.latency["e2e"][q]),
    ]
    for label, value in series:
        for i, q in enumerate(f"p{q}" for q in QUANTILES):
            rows.append([label if i == 0 else "", q, *(fmt_ms(value(s, q)) for s in timed)])
    rows.append(["lag growth ms/s", "", *(f"{_sched(s).slope_ms_per_s:+.1f}" for s in timed)])
    return rows


def _sched(s: ConfigStats) -> ScheduleFigures:
    assert s.schedule is not None  # schedule_table keeps the open loop's configurations only
    return s.schedule


def schedule_warning(stats: Sequence[ConfigStats], *, cap: int, cap_hits: int) -> str | None:
    """The line said when an open loop's schedule lag grew over the run: the client, not the server, was the
    limit (its in-flight cap when that filled, else its own CPU); None when it kept up."""
    grown = [s for s in stats if s.schedule is not None and s.schedule.growing]
    if not grown:
        return None
    names = ", ".join(f"{s.name} +{s.schedule.rise_ms:.0f} ms" for s in grown if s.schedule is not None)
    why = (f"its cap of {cap} requests in flight filled {cap_hits} times (raise --max-in-flight)" if cap_hits
           else "it could not send as fast as the arrivals came (its CPU: try --workers or a lower --rate)")
    return (f"llmchat: schedule lag grew over the run ({names}): the client, not the server, was the limit; "
            f"{why}. Latencies from the scheduled start count that wait")


def _approximate_note(names: Sequence[str]) -> str:
    return (f"percentiles of {', '.join(names)} from a log-bucketed histogram, each within "
            f"{RELATIVE_ERROR * 100:g}% of the exact value (more than {EXACT_LIMIT:,} values)")


def attribution_table(stats: Sequence[ConfigStats]) -> str:
    """Where the time went: one row per attribution part any configuration has, p50/p90/p99 in ms per
    configuration ("-" where it has none), then each configuration's split by group. Empty when no
    configuration has a successful request."""
    rows = attribution_cells(stats)
    if not rows:
        return ""
    return "\n".join([grid(rows), *attribution_notes(stats)])


def _present_parts(stats: Sequence[ConfigStats]) -> list[str]:
    present = [k for k in PARTS if any(k in s.attribution for s in stats)]
    return present + sorted({k for s in stats for k in s.attribution} - set(present))


def attribution_cells(stats: Sequence[ConfigStats]) -> list[list[str]]:
    """``attribution_table``'s cells (two header rows: the names, then the quantiles); [] with no part."""
    present = _present_parts(stats)
    if not present:
        return []
    header: list[str] = ["where the time went, ms"]
    quantiles: list[str] = [""]
    for s in stats:
        header += ["", s.name, ""]  # the name over the middle (p90) column of its three
        quantiles += [f"p{q}" for q in QUANTILES]
    rows = [header, quantiles]
    for key in present:
        row = [key]
        for s in stats:
            part = s.attribution.get(key)
            row += [fmt_ms(None if part is None else part[f"p{q}"]) for q in QUANTILES]
        rows.append(row)
    return rows


def attribution_notes(stats: Sequence[ConfigStats]) -> list[str]:
    """The lines under ``attribution_table``: each configuration's split by group, where the parts come from,
    which percentiles are approximate."""
    present = _present_parts(stats)
    if not present:
        return []
    lines = []
    width = max(len(s.name) for s in stats)
    for s in stats:
        split = " · ".join(f"{g} {v * 100:.0f}%" for g, v in sorted(s.attribution_shares.items(),
                                                                      key=lambda kv: -abs(kv[1])))
        lines.append(f"{s.name:<{width}}  {split or '-'}")
    lines.append("parts: " + _part_sources(present))
    approximate = [k for k in present if any(k in s.approximate_parts for s in stats)]
    if approximate:
        lines.append(_approximate_note(approximate))
    return lines


def _part_sources(keys: Sequence[str]) -> str:
    # Reported and derived parts lean on what the server said about itself: the table says which are.
    known = [k for k in keys if k in PARTS]
    reported = [k for k in known if PARTS[k][2] == "reported"]
    derived = [k for k in known if PARTS[k][2] == "derived"]
    text = "measured by the client"
    if reported:
        text += f", except {', '.join(reported)} (reported by the server)"
        if derived:
            text += f" and {', '.join(derived)} (measured less reported)"
    elif derived:
        text += f", except {', '.join(derived)} (measured less reported)"
    return text


def server_table(snapshots: Mapping[str, Sequence[Mapping[str, float] | None]], url: str,
                 interval_s: float) -> str:
    """The provider's own /metrics over each configuration's slices: requests waiting (the saturation sign)
    and running, p50 and max, the fullest KV cache, and how many scrapes answered."""
    return grid(server_cells(snapshots, interval_s), left=2) + "\n" + server_note(url)


def server_note(url: str) -> str:
    """The line under ``server_table``: where the figures came from."""
    return f"scraped from {url}; requests waiting above 0 flag saturation"


def server_cells(snapshots: Mapping[str, Sequence[Mapping[str, float] | None]],
                 interval_s: float) -> list[list[str]]:
    """``server_table``'s cells (two label columns)."""
    names = list(snapshots)
    figures = [summarize_snapshots(snapshots[n]) for n in names]
    return [
        [f"server metrics, every {interval_s:g} s", "", *names],
        ["requests waiting", "p50", *(_count(f.waiting_p50) for f in figures)],
        ["", "max", *(_count(f.waiting_max) for f in figures)],
        ["requests running", "p50", *(_count(f.running_p50) for f in figures)],
        ["", "max", *(_count(f.running_max) for f in figures)],
        ["KV cache use", "max", *(_pct(None if f.kv_cache_usage_max is None else f.kv_cache_usage_max * 100)
                                  for f in figures)],
        ["scrapes", "", *(f"{f.snapshots} ({f.failed} failed)" for f in figures)],
    ]


def _count(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"


def _kind_cell(s: ConfigStats, kind: str) -> str:
    n = s.errors.get(kind, 0)
    return f"{n} ({_pct(n * 100 / s.requests if s.requests else 0.0)})"


def compare_table(stats: Sequence[ConfigStats]) -> str:
    """The before/after table: p99 end-to-end, the server's and the network's error rate and requests/s, each
    with its change against the first configuration, the client's own error rate, and the HTTP version each
    actually used."""
    return grid(compare_cells(stats), left=2)


def compare_cells(stats: Sequence[ConfigStats]) -> list[list[str]]:
    """``compare_table``'s cells, the header row first."""
    rows = [["config", "HTTP", "reused", "p99 e2e ms", "change", "errors", "change", "client err", "req/s",
             "change"]]
    for i, row in enumerate(compare_rows(stats)):
        first = i == 0
        reused = row["reused_ratio"]
        rows.append([
            row["config"],
            row["http_version"],
            _pct(None if reused is None else reused * 100),
            fmt_ms(row["p99_e2e_ms"]),
            "(base)" if first else _pct(row["p99_e2e_change_pct"], signed=True),
            _pct(row["server_error_rate"] * 100),
            "(base)" if first else f"{row['server_error_rate_change_pp']:+.1f} pp",
            _pct(row["client_error_rate"] * 100),
            f"{row['requests_per_s']:.2f}",
            "(base)" if first else _pct(row["requests_per_s_change_pct"], signed=True),
        ])
    return rows


def chart_metrics(mode: str) -> tuple[str, ...]:
    """The latencies the charts show: TTFT and end-to-end when streaming, TTFB and end-to-end in batch."""
    return ("ttft", "e2e") if mode == "stream" else ("ttfb", "e2e")


def terminal_chart(stats: Sequence[ConfigStats], *, mode: str, width: int, colour: bool) -> str:
    """Grouped bars of p50/p90/p99 per configuration, one chart per metric, drawn by plotext."""
    import plotext as plt  # only for --plot: it is not needed to run a benchmark

    out = []
    names = [s.name for s in stats]
    for metric in chart_metrics(mode):
        plt.clear_figure()
        series = [[s.latency[metric][f"p{q}"] or 0.0 for s in stats] for q in QUANTILES]
        plt.multiple_bar(names, series, labels=[f"p{q}" for q in QUANTILES])
        plt.title(f"{METRIC_NAMES[metric]} latency (ms)")
        plt.plotsize(max(40, min(width, 100)), 16)
        text = plt.build()
        out.append(text if colour else plt.uncolorize(text))
    plt.clear_figure()
    return "\n".join(out)


def svg_chart(stats: Sequence[ConfigStats], *, mode: str, title: str = "llmchat bench") -> str:
    """The same chart as an SVG document: one panel per metric, a group of p50/p90/p99 bars per
    configuration, a labelled y axis in ms. Pure; never fails (missing values draw no bar)."""
    metrics = chart_metrics(mode)
    panel_w, panel_h, top, left, bottom = 720, 280, 56, 70, 50
    height = top + len(metrics) * (panel_h + bottom)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{panel_w + left + 20}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f'<title>{escape(title)}</title>',
        f'<text x="{left}" y="20" font-size="15" font-weight="bold">{escape(title)}</text>',
    ]
    for i, q in enumerate(QUANTILES):
        x = left + i * 60
        parts.append(f'<rect x="{x}" y="30" width="12" height="12" fill="{BAR_COLOURS[i]}"/>'
                     f'<text x="{x + 16}" y="41">p{q}</text>')
    for n, metric in enumerate(metrics):
        y0 = top + n * (panel_h + bottom)
        parts.extend(_panel(stats, metric, left, y0, panel_w, panel_h))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _panel(stats: Sequence[ConfigStats], metric: str, left: int, y0: int, w: int, h: int) -> list[str]:
    values = [[s.latency[metric][f"p{q}"] for q in QUANTILES] for s in stats]
    peak = max((v for row in values for v in row if v is not None), default=0.0) or 1.0
    scale, ticks = axis(peak)
    inner_top = y0 + 20
    inner_h = h - 20
    name = escape(METRIC_NAMES[metric])
    out = [f'<text x="{left}" y="{y0 + 12}" font-weight="bold">{name} latency (ms)</text>']
    for tick, label in ticks:
        y = inner_top + inner_h - inner_h * tick / scale
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + w}" y2="{y:.1f}" stroke="#ddd"/>'
                   f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    group_w = w / max(len(stats), 1)
    bar_w = min(40.0, group_w * 0.8 / len(QUANTILES))
    for g, (s, row) in enumerate(zip(stats, values, strict=True)):
        gx = left + g * group_w + (group_w - bar_w * len(QUANTILES)) / 2
        for i, v in enumerate(row):
            if v is None:
                continue
            bh = inner_h * v / scale
            out.append(f'<rect x="{gx + i * bar_w:.1f}" y="{inner_top + inner_h - bh:.1f}" '
                       f'width="{bar_w - 2:.1f}" height="{bh:.1f}" fill="{BAR_COLOURS[i]}">'
                       f'<title>{escape(s.name)} p{QUANTILES[i]} {fmt_ms(v)} ms</title></rect>')
        out.append(f'<text x="{left + (g + 0.5) * group_w:.1f}" y="{inner_top + inner_h + 18:.1f}" '
                   f'text-anchor="middle">{escape(s.name)}</text>')
    out.append(f'<line x1="{left}" y1="{inner_top + inner_h}" x2="{left + w}" y2="{inner_top + inner_h}" '
               'stroke="#333"/>')
    return out


def axis(peak: float) -> tuple[float, list[tuple[float, str]]]:
    """An axis from 0 to at least ``peak``: its top, and its round gridlines (steps of 1, 2 or 5 times a power
    of ten) with their labels at the step's precision."""
    ticks = nice_ticks(0.0, peak if peak > 0 else 1.0, 6)
    return ticks[-1], list(zip(ticks, tick_labels(ticks, ""), strict=True))
