"""The HUD's figures: the spread of TTFT and total over the window, how many met their target, the counters,
the retry line and the cost.

The table shows the sample count and the three figures that many samples support (``numbers.spread_stats``):
min, median and max below 20 replies, p95 from 20, p99 from 100, never a percentile nobody measured. Under
each row that is coloured, the target and how many replies missed it.
"""

from __future__ import annotations

from textual.content import Content

from llmchat.core.observe import Metrics, Series, Spread
from llmchat.tui.numbers import Stat, duration, money, plural, share, spread_stats
from llmchat.tui.widgets.hud._figures import MISS_STYLE, MUTED_STYLE, OK_STYLE, TITLES, WARN_STYLE, Targets
from llmchat.tui.widgets.hud._lines import Lines

_LABEL = 6
_N = 4
_COL = 9
_FIELDS: dict[Stat, str] = {"min": "min", "median": "p50", "p95": "p95", "p99": "p99", "max": "max"}


def _row(name: Series, spread: Spread, stats: tuple[Stat, ...], style_of: str | None, targets: Targets,
         ) -> Content:
    cells: list[str | tuple[str, str]] = [f"{TITLES[name]:<{_LABEL}}", f"{spread.n:>{_N}}"]
    for stat in stats:
        value: float | None = getattr(spread, _FIELDS[stat])
        style = "" if style_of is None else targets.style(name, value, style_of)
        cells.append((f"{duration(value):>{_COL}}", style))
    return Content.assemble(*cells)


def _target_line(label: str, target_ms: float, over: int, n: int) -> Content:
    """``  TTFT target 200 ms: 2 of 8 over``, the count red when some were over, green when none was."""
    return Content.assemble((f"  {label} {duration(target_ms)}: ", MUTED_STYLE),
                            (f"{over} of {n} over", MISS_STYLE if over else OK_STYLE))


def _table(metrics: Metrics, targets: Targets) -> list[Content]:
    ttft, total = metrics.spread("ttft"), metrics.spread("total")
    counts = [s.n for s in (ttft, total) if s.n]
    stats = spread_stats(min(counts) if counts else 0)
    header = f"{'':<{_LABEL}}{'n':>{_N}}" + "".join(f"{stat:>{_COL}}" for stat in stats)
    lines = [Content.styled(header, MUTED_STYLE), _row("ttft", ttft, stats, "stream", targets)]
    ttfts = metrics.series("ttft")
    if ttfts:
        over = sum(1 for v in ttfts if v > targets.ttft_ms)
        lines.append(_target_line("TTFT target", targets.ttft_ms, over, len(ttfts)))
    replies = metrics.replies
    batch = [r.total_ms for r in replies if r.mode == "batch" and r.total_ms is not None]
    # The total row mixes modes unless every reply was batch; only a batch total has a target.
    pure = bool(batch) and len(batch) == len(replies)
    lines.append(_row("total", total, stats, "batch" if pure else None, targets))
    if batch:
        over = sum(1 for v in batch if v > targets.total_ms)
        label = "target" if pure else "batch target"
        lines.append(_target_line(label, targets.total_ms, over, len(batch)))
    return lines


def _errors(metrics: Metrics) -> Content:
    count = metrics.error_count
    parts: list[str | tuple[str, str]] = [
        (plural(count, "error"), MISS_STYLE if count else ""), f" · {metrics.cancelled} cancelled"
    ]
    if count:
        # Last on the line: the kinds are what an ellipsis may cut on a narrow HUD.
        kinds = ", ".join(f"{kind} {n}" for kind, n in metrics.errors.most_common(3))
        parts.append((f" · {kinds}", MISS_STYLE))
    return Content.assemble(*parts)


def _cache(metrics: Metrics) -> Content:
    ratio = metrics.hit_ratio
    if ratio is None:
        return Content.styled("cache: no lookups yet", MUTED_STYLE)
    return Content.assemble(
        f"cache {plural(metrics.cache_hits, 'hit')} · {plural(metrics.cache_misses, 'miss')}",
        (f" · {share(ratio)} hits", MUTED_STYLE),
    )


def _cost(metrics: Metrics) -> Content:
    if metrics.cost_total is None and not metrics.cost_unknown:
        return Content.styled("cost: no priced request yet", MUTED_STYLE)
    # "≥" when some priced requests came without usage: the total is then a lower bound.
    sign = "≥" if metrics.cost_unknown else "≈"
    last = "?" if metrics.cost_last is None else money(metrics.cost_last)
    total = money(metrics.cost_total or 0.0)
    parts: list[str | tuple[str, str]] = [f"cost {sign} {total}"]
    if len(metrics.cost_by_mode) > 1 or "batch" in metrics.cost_by_mode:
        # The session's cost per mode, so streaming's price beside batch's is seen as it adds up.
        parts += [(f" · {mode} {money(cost)}", MUTED_STYLE) for mode, cost in sorted(metrics.cost_by_mode.items())]
    parts.append((f" · last {last}", MUTED_STYLE))
    return Content.assemble(*parts)


def render_stats(metrics: Metrics, targets: Targets, *, with_cost: bool) -> list[Content]:
    """The stats block, one figure per line: the table (with a target line under each coloured row), the
    counters, the live retry line (blank when no retry is pending) and, ``with_cost``, the cost."""
    retry = metrics.pending_retry or metrics.pending_hold
    lines = [
        *_table(metrics, targets),
        Content(f"{plural(metrics.requests, 'request')} · {metrics.in_flight} in flight · "
                f"{plural(metrics.retries, 'retry')}"),
        _errors(metrics),
        _cache(metrics),
        Content.styled(retry, WARN_STYLE) if retry else Content(""),
    ]
    if with_cost:
        lines.append(_cost(metrics))
    return lines


class HudStats(Lines):
    """The spread, the targets and the counters. Its height changes only when a target line comes or goes (a
    reply of a new mode), never while a reply streams; the retry line keeps its row, blank, when no retry is
    pending."""

    def __init__(self, *, with_cost: bool = False, id: str | None = None) -> None:
        super().__init__(id=id, classes="-with-cost" if with_cost else None)
        self.with_cost = with_cost

    def show(self, metrics: Metrics, targets: Targets) -> None:
        """Paint the figures of ``metrics``, the target series coloured against ``targets``."""
        self.paint_lines(render_stats(metrics, targets, with_cost=self.with_cost))
