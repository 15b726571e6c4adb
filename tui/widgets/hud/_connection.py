"""The HUD's connection lines: provider and model, host and warm-up state, then what warm-up measured.

Warm-up measures two things, shown apart: what opening the connection cost (TCP connect and TLS) and the
ping, a round trip on the open connection (``core._warmup``). When warm-up failed, the reason, wrapped.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.content import Content

from llmchat.core.observe import ConnectionState
from llmchat.tui.numbers import duration
from llmchat.tui.widgets.hud._figures import MISS_STYLE, MUTED_STYLE, WARN_STYLE
from llmchat.tui.widgets.hud._lines import Lines, wrap

#: The colour of each warm-up state; an unknown state is shown plain.
STATE_STYLES = {"cold": MUTED_STYLE, "warming": WARN_STYLE, "warm": "$success", "failed": MISS_STYLE}


@dataclass(frozen=True, slots=True)
class Endpoint:
    """What the HUD says it talks to; any field may be empty until known."""

    provider: str = ""
    model: str = ""
    host: str = ""


def render_connection(endpoint: Endpoint, state: ConnectionState, width: int = 36) -> list[Content]:
    """``provider · model``, ``host · ● state``, then ``opened in 3.1 ms · ping 0.9 ms`` once warm-up
    measured them, or, after a failure, why (wrapped to ``width``). The warm-up state is shown only when it
    is about this provider (or the provider is not known yet), else ``cold``."""
    provider = endpoint.provider or state.provider
    if state.provider and provider and state.provider != provider:
        state = ConnectionState(provider)  # warm-up of another provider says nothing about this one
    lines = [
        Content.assemble(provider or ("no provider", MUTED_STYLE), (" · ", MUTED_STYLE),
                         endpoint.model or ("default model", MUTED_STYLE)),
        Content.assemble(endpoint.host or ("-", MUTED_STYLE), (" · ", MUTED_STYLE),
                         (f"● {state.state}", STATE_STYLES.get(state.state, ""))),
    ]
    if state.state == "failed":
        # Why, instead of the last good figures: they would read as the connection's now.
        return lines + (wrap(Content.styled(state.error, MISS_STYLE), width) if state.error else [])
    figures: list[str | tuple[str, str]] = []
    if state.setup_ms is not None:
        figures += [("opened in ", MUTED_STYLE), duration(state.setup_ms)]
    if state.rtt_ms is not None:
        figures += [(" · " if figures else "", MUTED_STYLE), ("ping ", MUTED_STYLE), duration(state.rtt_ms)]
    if figures:
        lines += wrap(Content.assemble(*figures), width)
    return lines


class ConnectionPanel(Lines):
    """Two to a few lines; ``show`` repaints them, re-laying out only when their count changes."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown = (Endpoint(), ConnectionState())

    def show(self, endpoint: Endpoint, state: ConnectionState) -> None:
        """Paint ``endpoint`` and the warm-up ``state``."""
        self._shown = (endpoint, state)
        self.paint_lines(render_connection(endpoint, state, self.width_for_text))

    def on_resize(self) -> None:
        if self.width_changed:
            self.show(*self._shown)
