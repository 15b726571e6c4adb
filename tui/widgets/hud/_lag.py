"""The HUD's render-lag line: chunk received to painted (the terminal's share), apart from the network's."""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Static

from llmchat.core._metrics import Metrics
from llmchat.tui.widgets.hud._figures import MUTED_STYLE, ms, number


def render_lag(metrics: Metrics) -> Content:
    """``render lag p50 3.10 · p99 12.0 ms``, or a dim note before the first painted chunk. The figures
    carry no unit but the last, so that the line fits a 38-column HUD."""
    p50, _, p99 = metrics.percentiles("render_lag")
    if p50 is None:
        return Content.styled("render lag: nothing painted yet", MUTED_STYLE)
    return Content.assemble(("render lag ", MUTED_STYLE), f"p50 {number(p50)} · p99 {ms(p99)}")


class RenderLagLine(Static):
    """One fixed line, repainted only when a new render-lag sample came (never a re-layout)."""

    DEFAULT_CSS = """
    RenderLagLine {
        height: 1;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    def show(self, metrics: Metrics) -> None:
        """Paint the render-lag percentiles of ``metrics``."""
        self.update(render_lag(metrics), layout=False)
