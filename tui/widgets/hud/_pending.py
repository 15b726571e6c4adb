"""The HUD's pending line: the running request's elapsed time and what it is doing, and a stall badge when
tokens stop."""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Static

from llmchat.core.observe import Metrics
from llmchat.tui.request_state import Held, Retry, describe, seconds
from llmchat.tui.widgets.hud._figures import MUTED_STYLE, OK_STYLE, WARN_STYLE

_NS_PER_S = 1_000_000_000
STALL_STYLE = "bold $text on $warning"
#: The state line's style names (tui/request_state.py) as the HUD colours them.
_STYLES = {"status.warning": WARN_STYLE, "status.cached": OK_STYLE, "status.muted": MUTED_STYLE}
_WIDTH = 40
"""The line's width when the panel has not been laid out yet (the HUD's content width)."""


def stalled_for(metrics: Metrics, now_ns: int, stall_s: float) -> float | None:
    """Seconds since a request in flight last showed life, when that is ``stall_s`` or more; else None."""
    activity = metrics.last_activity_ns()
    if activity is None:
        return None
    quiet_s = (now_ns - activity) / _NS_PER_S
    return quiet_s if quiet_s >= stall_s else None


def render_pending(metrics: Metrics, now_ns: int, stall_s: float, width: int = _WIDTH) -> Content:
    """``elapsed 1.2 s · streaming · 42 tokens`` while requests are in flight: the time since the oldest
    started and what the one started last is doing (``· 3 in flight`` when several), with a ``stall 3.4 s``
    badge once nothing has come for ``stall_s``; ``idle`` otherwise. ``now_ns`` is perf_counter_ns; the
    words are shortened to fit ``width`` cells."""
    since = metrics.pending_since_ns()
    if since is None:
        return Content.styled("idle", MUTED_STYLE)
    parts: list[str | tuple[str, str]] = [f"elapsed {seconds((now_ns - since) / _NS_PER_S)}"]
    crowd = f" · {metrics.in_flight} in flight" if metrics.in_flight > 1 else ""
    quiet_s = stalled_for(metrics, now_ns, stall_s)
    badge = f" stall {quiet_s:.1f} s " if quiet_s is not None else ""
    record = metrics.running
    if record is not None:
        planned, hold = metrics.planned_retry(record), metrics.planned_hold(record)
        state = describe(record, now_ns, stall_s=stall_s, retry=Retry(*planned) if planned else None,
                         held=Held(*hold) if hold else None)
        if state.kind != "stalled":  # the badge says so
            room = width - len(parts[0]) - len(crowd) - (len(badge) + 2 if badge else 0) - 3
            for text, style in state.pieces(room, elapsed=False, hints=False) if room > 0 else []:
                parts += [(" · ", MUTED_STYLE), (text, _STYLES.get(style, ""))]
    if crowd:
        parts.append((crowd, MUTED_STYLE))
    if badge:
        parts += ["  ", (badge, STALL_STYLE)]
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
        """Paint the elapsed time, the running request's state and the stall badge as of ``now_ns``."""
        self.stalled = stalled_for(metrics, now_ns, stall_s) is not None
        width = self.content_size.width or _WIDTH
        self.update(render_pending(metrics, now_ns, stall_s, width), layout=False)
