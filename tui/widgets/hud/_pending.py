"""The HUD's pending line: a running timer while a reply is awaited, and a stall badge when tokens stop."""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Static

from llmchat.core.observe import Metrics
from llmchat.tui.widgets.hud._figures import MUTED_STYLE

_NS_PER_S = 1_000_000_000
STALL_STYLE = "bold $text on $warning"


def stalled_for(metrics: Metrics, now_ns: int, stall_s: float) -> float | None:
    """Seconds since a request in flight last showed life, when that is ``stall_s`` or more; else None."""
    activity = metrics.last_activity_ns()
    if activity is None:
        return None
    quiet_s = (now_ns - activity) / _NS_PER_S
    return quiet_s if quiet_s >= stall_s else None


def render_pending(metrics: Metrics, now_ns: int, stall_s: float) -> Content:
    """``waiting 1.2 s`` while requests are in flight (``· 3 in flight`` when several), with a ``stall 3.4 s``
    badge once nothing has come for ``stall_s``; ``idle`` otherwise. ``now_ns`` is perf_counter_ns."""
    since = metrics.pending_since_ns()
    if since is None:
        return Content.styled("idle", MUTED_STYLE)
    parts: list[str | tuple[str, str]] = [f"waiting {(now_ns - since) / _NS_PER_S:.1f} s"]
    if metrics.in_flight > 1:
        parts.append((f" · {metrics.in_flight} in flight", MUTED_STYLE))
    quiet_s = stalled_for(metrics, now_ns, stall_s)
    if quiet_s is not None:
        parts += ["  ", (f" stall {quiet_s:.1f} s ", STALL_STYLE)]
    return Content.assemble(*parts)


class PendingPanel(Static):
    """One fixed line, repainted by the HUD's ticker while a request is pending (never a re-layout)."""

    DEFAULT_CSS = """
    PendingPanel {
        height: 1;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(Content.styled("idle", MUTED_STYLE), id=id)
        self.stalled = False
        """Whether the stall badge is showing: for the shell and for tests."""

    def show(self, metrics: Metrics, now_ns: int, stall_s: float) -> None:
        """Paint the timer and the stall badge as of ``now_ns``."""
        self.stalled = stalled_for(metrics, now_ns, stall_s) is not None
        self.update(render_pending(metrics, now_ns, stall_s), layout=False)
