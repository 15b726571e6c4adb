"""The HUD's server line: the provider's own /metrics as last scraped (requests waiting, running, KV cache).

Shown only for a provider with a ``metrics_url`` (hidden until the first scrape came back, so a HUD without
one keeps its layout). Requests waiting are the saturation sign, so they are in warning colour when above 0.
"""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Static

from llmchat.core.observe import ServerState
from llmchat.tui.widgets.hud._figures import MISS_STYLE, MUTED_STYLE, WARN_STYLE


def _count(value: float) -> str:
    return f"{value:.0f}" if value == int(value) else f"{value:.1f}"


def render_server(state: ServerState | None) -> Content:
    """``server 2 waiting · 1 running · KV 43%``; after a failed scrape, why (and the last figures dimmed)."""
    if state is None:
        return Content("")
    shown = state.metrics if state.metrics is not None else state.last_good
    parts: list[str | tuple[str, str]] = [("server ", MUTED_STYLE)]
    if state.metrics is None:
        parts.append((f"metrics failed: {state.error or 'no answer'}", MISS_STYLE))
        if shown:
            parts.append(("; before: ", MUTED_STYLE))
    figures: list[str | tuple[str, str]] = []
    if shown:
        style = MUTED_STYLE if state.metrics is None else ""
        waiting = shown.get("requests_waiting")
        running = shown.get("requests_running")
        usage = shown.get("kv_cache_usage")
        if waiting is not None:
            figures.append((f"{_count(waiting)} waiting", WARN_STYLE if waiting > 0 and not style else style))
        if running is not None:
            figures.append((f"{_count(running)} running", style))
        if usage is not None:
            figures.append((f"KV {usage * 100:.0f}%", style))
    elif state.metrics is not None:
        figures.append(("no queue gauges in its /metrics", MUTED_STYLE))
    for i, figure in enumerate(figures):
        if i:
            parts.append((" · ", MUTED_STYLE))
        parts.append(figure)
    return Content.assemble(*parts)


class ServerLine(Static):
    """One fixed line, hidden until the first scrape; ``show`` repaints it without a re-layout after that."""

    DEFAULT_CSS = """
    ServerLine {
        height: 1;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.display = False

    def show(self, state: ServerState | None) -> None:
        """Paint ``state`` (the provider's last scrape); None hides the line (a provider with no scrape)."""
        if state is None:
            if self.display:
                self.display = False
            return
        self.update(render_server(state), layout=False)
        if not self.display:
            self.display = True  # the line takes its row when the provider's first scrape came back
