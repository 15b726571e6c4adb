"""The HUD's four small charts over the last N replies: TTFB, TTFT, total latency and tokens/s.

Each is a label (the last value, then either its target verdict or the window's range) over a column chart
with one cell per reply, oldest at the left: one reply is one cell, never a full-width bar, and a chart only
reads as a trend once there are several. Bars rise from zero, so a bar twice as tall took twice as long; with
more replies than cells, each cell is the slowest (largest) of the replies it covers. A cell of a target
series is coloured against the target of its own request's mode.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from textual.app import ComposeResult
from textual.content import Content
from textual.widget import Widget
from textual.widgets import Static

from llmchat.core.observe import REQUEST_SERIES, Metrics, Series
from llmchat.tui.numbers import duration_range, figure, plural
from llmchat.tui.widgets.hud._figures import MISS_STYLE, MUTED_STYLE, OK_STYLE, TITLES, Targets, value_text

_LEVELS = "▁▂▃▄▅▆▇█"
BAR_STYLE = "$primary"


def column_chart(values: Sequence[float], styles: Sequence[str], width: int) -> Content:
    """One cell per value (a bar from zero to the largest value), left to right; more values than ``width``
    are bucketed, each cell the largest of its run, in the worst style of its run (error over success)."""
    if not values or width < 1:
        return Content("")
    top = max(values)
    n = len(values)
    cells: list[tuple[float, str]] = []
    if n <= width:
        cells = list(zip(values, styles, strict=True))
    else:
        for i in range(width):
            lo, hi = i * n // width, (i + 1) * n // width
            run = range(lo, max(hi, lo + 1))
            worst = {styles[k] for k in run}
            style = MISS_STYLE if MISS_STYLE in worst else OK_STYLE if OK_STYLE in worst else ""
            cells.append((max(values[k] for k in run), style))
    parts = []
    for value, style in cells:
        level = 1 if top <= 0 else max(1, math.ceil(value / top * len(_LEVELS)))
        parts.append((_LEVELS[min(level, len(_LEVELS)) - 1], style or BAR_STYLE))
    return Content.assemble(*parts)


def chart_label(name: Series, values: Sequence[float], last_mode: str, targets: Targets | None) -> Content:
    """``TTFT   263 ms > 200 ms target`` for the series the last reply's mode is held to; else the last value
    and the window's range, ``TTFB   44.1 ms  range 28.5–5049 ms`` (``1 reply`` while there is one)."""
    title = f"{TITLES[name]:<7}"
    if not values:
        return Content.assemble(title, ("no reply yet", MUTED_STYLE))
    last = values[-1]
    verdict = targets.verdict(name, last, last_mode) if targets is not None else None
    if verdict is not None:
        text, style = verdict
        return Content.assemble(title, (value_text(name, last), style), " ", (text, style))
    if len(values) == 1:
        return Content.assemble(title, value_text(name, last), ("  " + plural(1, "reply"), MUTED_STYLE))
    lo, hi = min(values), max(values)
    spread = f"{figure(lo)}–{figure(hi)}" if name == "tokens_per_s" else duration_range(lo, hi)
    return Content.assemble(title, value_text(name, last), (f"  range {spread}", MUTED_STYLE))


class ColumnChart(Static):
    """One row of ``column_chart``, redrawn to its width."""

    DEFAULT_CSS = """
    ColumnChart {
        height: 1;
        text-wrap: nowrap;
        text-overflow: clip;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.values: list[float] = []
        """What is charted, oldest first: for tests and the shell."""
        self.cell_styles: list[str] = []

    def show(self, values: list[float], styles: list[str]) -> None:
        """Chart ``values``, each cell in its own style ("" for the plain bar colour)."""
        self.values, self.cell_styles = values, styles
        self._paint()

    def _paint(self) -> None:
        self.update(column_chart(self.values, self.cell_styles, self.content_size.width or 36), layout=False)

    def on_resize(self) -> None:
        self._paint()


def _modes(metrics: Metrics, name: Series, count: int) -> list[str]:
    """The mode of the request behind each value of a window. TTFT is stream mode only; the total window holds
    every reply, in ``replies`` order. TTFB and tokens/s are never a target, so their modes do not matter."""
    if name == "total":
        return [r.mode for r in metrics.replies][-count:] if count else []
    return ["stream"] * count


class HudCharts(Widget):
    """A label and a column chart per series. Fixed height, so updates never re-lay out the screen."""

    DEFAULT_CSS = """
    HudCharts {
        height: 8;
    }
    HudCharts > .hud-chart-label {
        height: 1;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        # Kept rather than queried: a repaint then costs no DOM walk.
        self._labels = {
            name: Static(chart_label(name, [], "stream", None), id=f"chart-{name}-label",
                         classes="hud-chart-label")
            for name in REQUEST_SERIES
        }
        self._charts = {name: ColumnChart(id=f"chart-{name}") for name in REQUEST_SERIES}

    def compose(self) -> ComposeResult:
        for name in REQUEST_SERIES:
            yield self._labels[name]
            yield self._charts[name]

    def label(self, name: Series) -> Static:
        """The label line of one series (its last value, and its target verdict or range)."""
        return self._labels[name]

    def chart(self, name: Series) -> ColumnChart:
        """The column chart of one series."""
        return self._charts[name]

    def show(self, metrics: Metrics, targets: Targets) -> None:
        """Paint the windows of ``metrics``, each value judged by the target of its own request's mode."""
        for name in REQUEST_SERIES:
            values = metrics.series(name)
            modes = _modes(metrics, name, len(values))
            styles = [targets.style(name, v, m) for v, m in zip(values, modes, strict=True)]
            self._charts[name].show(values, styles)
            last_mode = modes[-1] if modes else "stream"
            self._labels[name].update(chart_label(name, values, last_mode, targets), layout=False)
