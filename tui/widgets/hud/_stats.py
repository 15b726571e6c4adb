"""The HUD's figures: p50/p95/p99 of TTFT and total over the window, counters, the retry line, the cost."""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Static

from llmchat.core._metrics import Metrics, Series
from llmchat.tui.widgets.hud._figures import MISS_STYLE, MUTED_STYLE, TITLES, WARN_STYLE, Sla, money, number

_PERCENTILE_SERIES: tuple[Series, ...] = ("ttft", "total")
_COL = 7


def _percentile_row(metrics: Metrics, name: Series, sla: Sla | None) -> Content:
    cells: list[str | tuple[str, str]] = [f"{TITLES[name]:<6}"]
    for value in metrics.percentiles(name):
        cells.append((f"{number(value):>{_COL}}", sla.style(name, value) if sla else ""))
    return Content.assemble(*cells)


def _errors(metrics: Metrics) -> Content:
    count = metrics.error_count
    parts: list[str | tuple[str, str]] = ["errors ", (str(count), MISS_STYLE if count else "")]
    parts.append(f" · cancelled {metrics.cancelled}")
    if count:
        # Last on the line: the kinds are what an ellipsis may cut on a narrow HUD.
        kinds = ", ".join(f"{kind} {n}" for kind, n in metrics.errors.most_common(3))
        parts.append((f" · {kinds}", MISS_STYLE))
    return Content.assemble(*parts)


def _cache(metrics: Metrics) -> Content:
    ratio = metrics.hit_ratio
    return Content.assemble(
        f"cache {metrics.cache_hits} hit · {metrics.cache_misses} miss",
        ("" if ratio is None else f" · {ratio:.0%} hits", MUTED_STYLE),
    )


def _cost(metrics: Metrics) -> Content:
    if metrics.cost_total is None and not metrics.cost_unknown:
        return Content.styled("cost: no priced request yet", MUTED_STYLE)
    # "≥" when some priced requests came without usage: the total is then a lower bound.
    sign = "≥" if metrics.cost_unknown else "≈"
    last = "?" if metrics.cost_last is None else money(metrics.cost_last)
    total = money(metrics.cost_total or 0.0)
    return Content.assemble(f"cost {sign} {total}", (f" · last {last}", MUTED_STYLE))


def render_stats(metrics: Metrics, sla: Sla | None, *, with_cost: bool) -> Content:
    """The stats block, one figure per line, always the same number of lines (see ``HudStats``)."""
    retry = metrics.pending_retry
    lines = [
        Content.styled(f"{'ms':<6}{'p50':>{_COL}}{'p95':>{_COL}}{'p99':>{_COL}}", MUTED_STYLE),
        *(_percentile_row(metrics, name, sla) for name in _PERCENTILE_SERIES),
        Content(f"requests {metrics.requests} · in flight {metrics.in_flight} · retries {metrics.retries}"),
        _errors(metrics),
        _cache(metrics),
        Content.styled(retry, WARN_STYLE) if retry else Content(""),
    ]
    if with_cost:
        lines.append(_cost(metrics))
    return Content("\n").join(lines)


class HudStats(Static):
    """Percentiles and counters. Its height is fixed (7 lines, 8 with the cost line) so that updating it never
    re-lays out the screen; the retry line keeps its row, blank, when no retry is pending."""

    DEFAULT_CSS = """
    HudStats {
        height: 7;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    HudStats.-with-cost {
        height: 8;
    }
    """

    def __init__(self, *, with_cost: bool = False, id: str | None = None) -> None:
        super().__init__(id=id, classes="-with-cost" if with_cost else None)
        self.with_cost = with_cost

    def show(self, metrics: Metrics, sla: Sla | None) -> None:
        """Paint the figures of ``metrics``, the SLA series coloured against ``sla``."""
        self.update(render_stats(metrics, sla, with_cost=self.with_cost), layout=False)
