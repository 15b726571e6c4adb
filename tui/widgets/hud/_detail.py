"""The HUD's detail view: the four series of the last N replies as plotext charts with axes, in a modal.

plotext draws to a string (``build()``); the string's ANSI colours become Rich Text in a Static. plotext keeps
its figure in module state, so each chart is built whole, one at a time, on the event loop (a few ms each,
only when the view opens or resizes).

The axes speak the HUD's number style: the x axis counts replies in whole numbers, the y axis starts at zero
(a point twice as high took twice as long) with round ticks that carry their unit. One reply is a point, not a
trend: a series with a single value is said in words instead of drawn.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Static

from llmchat.core.observe import REQUEST_SERIES, Metrics, Series
from llmchat.tui.numbers import index_ticks, nice_ticks, plural, tick_labels
from llmchat.tui.widgets.hud._figures import MUTED_STYLE, TITLES, value_text

#: The unit of each series' values, for its axis labels.
UNITS: dict[Series, str] = {
    "ttfb": "ms", "ttft": "ms", "total": "ms", "tokens_per_s": "tok/s", "render_lag": "ms",
}


def plot(name: Series, values: list[float], width: int, height: int) -> str:
    """The chart of one series (at least two values) as plotext's ANSI text, ``width`` x ``height`` cells (at
    least 20 x 6)."""
    # Imported here: plotext takes tens of milliseconds to import, and the app should not wait for a view
    # that may never open. No stubs or py.typed.
    import plotext

    n = len(values)
    yticks = nice_ticks(0.0, max(values), max(2, min(6, height // 3)))
    xticks = index_ticks(n, max(2, min(8, width // 8)))
    plotext.clear_figure()
    plotext.theme("clear")
    plotext.plotsize(max(width, 20), max(height, 6))
    plotext.plot(list(range(1, n + 1)), values, marker="hd")
    plotext.xticks(xticks, [str(t) for t in xticks])
    plotext.xlim(1, n)
    plotext.yticks(yticks, tick_labels(yticks, UNITS[name]))
    plotext.ylim(yticks[0], yticks[-1])
    plotext.title(f"{TITLES[name]} · last {value_text(name, values[-1])}")
    plotext.xlabel("reply, oldest to newest")
    if UNITS[name] != "ms":
        plotext.ylabel(UNITS[name])  # durations carry their unit on every tick
    return str(plotext.build())


def single(name: Series, values: list[float]) -> Content:
    """What a chart says before it has two values to draw."""
    if not values:
        return Content.styled(f"{TITLES[name]}: no reply yet", MUTED_STYLE)
    return Content.assemble(f"{TITLES[name]}: {value_text(name, values[0])}",
                            (" (one reply: a point, not a trend; the chart starts at two)", MUTED_STYLE))


class PlotChart(Static):
    """One plotext chart, redrawn to its own size."""

    def __init__(self, name: Series, values: list[float], *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.series_name = name
        self.values = values

    def on_resize(self) -> None:
        size = self.content_size
        if len(self.values) < 2:
            self.update(single(self.series_name, self.values))
            return
        text = Text.from_ansi(plot(self.series_name, self.values, size.width, size.height), no_wrap=True)
        self.update(text, layout=False)


class HudDetail(ModalScreen[None]):
    """The four charts in a 2 x 2 grid over the app; Escape (or the key that opened it) closes it."""

    DEFAULT_CSS = """
    HudDetail {
        align: center middle;
    }
    HudDetail > Vertical {
        width: 90%;
        height: 90%;
        border: round $primary;
        background: $surface;
    }
    HudDetail #hud-detail-grid {
        grid-size: 2 2;
        height: 1fr;
    }
    HudDetail PlotChart {
        height: 1fr;
        width: 1fr;
    }
    HudDetail #hud-detail-help {
        height: 1;
        color: $text-muted;
    }
    """

    BINDINGS = [
        Binding("escape", "close", "Close", id="hud.detail.close"),
        Binding("d", "close", "Close", show=False, id="hud.detail.close"),
    ]

    def __init__(self, metrics: Metrics) -> None:
        super().__init__()
        # A snapshot: the view shows the window as it was when opened, so the axes hold still while reading.
        self.series = {name: metrics.series(name) for name in REQUEST_SERIES}

    def compose(self) -> ComposeResult:
        with Vertical():
            shown = max(map(len, self.series.values()))
            yield Static(f"last {plural(shown, 'reply', 'replies')} from the server · Esc closes",
                         id="hud-detail-help")
            with Grid(id="hud-detail-grid"):
                for name in REQUEST_SERIES:
                    yield PlotChart(name, self.series[name], id=f"plot-{name}")

    def action_close(self) -> None:
        self.dismiss(None)
