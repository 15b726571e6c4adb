"""The HUD's render-lag line: chunk received to painted (the terminal's share), apart from the network's."""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Static

from llmchat.core.observe import Metrics
from llmchat.tui.numbers import MIN_SAMPLES, duration
from llmchat.tui.widgets.hud._figures import MUTED_STYLE


def render_lag(metrics: Metrics) -> Content:
    """``render lag median 3.1 ms · max 9.7 ms``, the second figure p95 from 20 painted frames and p99 from
    100 (``numbers.MIN_SAMPLES``); a dim note before the first painted chunk."""
    spread = metrics.spread("render_lag")
    if not spread.n:
        return Content.styled("render lag: nothing painted yet", MUTED_STYLE)
    if spread.n >= MIN_SAMPLES["p99"]:
        tail, value = "p99", spread.p99
    elif spread.n >= MIN_SAMPLES["p95"]:
        tail, value = "p95", spread.p95
    else:
        tail, value = "max", spread.max
    figures = f"median {duration(spread.p50)} · {tail} {duration(value)}"
    return Content.assemble(("render lag ", MUTED_STYLE), figures)


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
        """Paint the render-lag figures of ``metrics``."""
        self.update(render_lag(metrics), layout=False)
