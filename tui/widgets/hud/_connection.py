"""The HUD's connection lines: provider, model, host, warm-up state and the last ping's round trip."""

from __future__ import annotations

from dataclasses import dataclass

from textual.content import Content
from textual.widgets import Static

from llmchat.core._metrics import ConnectionState
from llmchat.tui.widgets.hud._figures import MISS_STYLE, MUTED_STYLE, WARN_STYLE, ms

#: The colour of each warm-up state; an unknown state is shown plain.
STATE_STYLES = {"cold": MUTED_STYLE, "warming": WARN_STYLE, "warm": "$success", "failed": MISS_STYLE}


@dataclass(frozen=True, slots=True)
class Endpoint:
    """What the HUD says it talks to; any field may be empty until known."""

    provider: str = ""
    model: str = ""
    host: str = ""


def render_connection(endpoint: Endpoint, state: ConnectionState) -> Content:
    """Two lines: ``provider · model``, then ``host · ● state · ping 1.20 ms``. The warm-up state is shown
    only when it is about this provider (or the provider is not known yet), else ``cold``."""
    provider = endpoint.provider or state.provider
    if state.provider and provider and state.provider != provider:
        state = ConnectionState(provider)  # warm-up of another provider says nothing about this one
    first = Content.assemble(provider or ("no provider", MUTED_STYLE), (" · ", MUTED_STYLE),
                             endpoint.model or ("no model", MUTED_STYLE))
    style = STATE_STYLES.get(state.state, "")
    second: list[str | tuple[str, str]] = [endpoint.host or ("-", MUTED_STYLE), (" · ", MUTED_STYLE),
                                           (f"● {state.state}", style)]
    if state.rtt_ms is not None:
        second += [(" · ping ", MUTED_STYLE), ms(state.rtt_ms)]
    return Content("\n").join([first, Content.assemble(*second)])


class ConnectionPanel(Static):
    """Two fixed lines; ``show`` repaints them without a re-layout."""

    DEFAULT_CSS = """
    ConnectionPanel {
        height: 2;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    def show(self, endpoint: Endpoint, state: ConnectionState) -> None:
        """Paint ``endpoint`` and the warm-up ``state``."""
        self.update(render_connection(endpoint, state), layout=False)
