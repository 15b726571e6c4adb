"""The HUD's four sparklines over the last N requests: TTFB, TTFT, total latency and tokens/s."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.content import Content
from textual.widget import Widget
from textual.widgets import Sparkline, Static

from llmchat.core._metrics import REQUEST_SERIES, Metrics, Series
from llmchat.tui.widgets.hud._figures import MUTED_STYLE, TITLES, Sla, figure, number


def chart_label(name: Series, values: list[float], sla: Sla | None) -> Content:
    """``TTFT  45.0 ms  min 30.1 max 120``: the last value (SLA-coloured) then the window's range."""
    title = f"{TITLES[name]:<6}"
    if not values:
        return Content.assemble(title, ("no data yet", MUTED_STYLE))
    last = values[-1]
    style = sla.style(name, last) if sla is not None else ""
    return Content.assemble(
        title,
        (f"{figure(name, last):>11}", style),
        (f"  min {number(min(values))} max {number(max(values))}", MUTED_STYLE),
    )


class HudCharts(Widget):
    """A label and a Sparkline per series. Fixed height, so updates never re-lay out the screen."""

    DEFAULT_CSS = """
    HudCharts {
        height: 8;
    }
    HudCharts > .hud-chart-label {
        height: 1;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    HudCharts > Sparkline {
        height: 1;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        # Kept rather than queried: a repaint then costs no DOM walk.
        self._labels = {
            name: Static(chart_label(name, [], None), id=f"chart-{name}-label", classes="hud-chart-label")
            for name in REQUEST_SERIES
        }
        self._sparks = {name: Sparkline([], id=f"chart-{name}") for name in REQUEST_SERIES}

    def compose(self) -> ComposeResult:
        for name in REQUEST_SERIES:
            yield self._labels[name]
            yield self._sparks[name]

    def label(self, name: Series) -> Static:
        """The label line of one series (its last value, min and max)."""
        return self._labels[name]

    def sparkline(self, name: Series) -> Sparkline:
        """The Sparkline of one series."""
        return self._sparks[name]

    def show(self, metrics: Metrics, sla: Sla | None) -> None:
        """Paint the windows of ``metrics``; each Sparkline gets a new list (an equal one does not redraw)."""
        for name in REQUEST_SERIES:
            values = metrics.series(name)
            self._sparks[name].data = values
            self._labels[name].update(chart_label(name, values, sla), layout=False)
