"""The HUD: the live latency side panel, composed of its parts and repainted on its own clock.

Refresh policy (this runs while tokens stream): bus callbacks only feed ``Metrics``, whose listener wakes
the HUD's ticker if it sleeps. The ticker runs at most ``refresh_hz`` times a second, repaints only the parts
whose figures changed (per-topic versions in ``Metrics``), repaints the pending timer only while a request
is in flight, and pauses itself once there is nothing left to show: an idle HUD costs nothing. Every part has
a fixed height and is updated with ``layout=False``, so no repaint re-lays out the screen.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.reactive import reactive
from textual.timer import Timer
from textual.widgets import Static

from llmchat.core.client import ContextFit
from llmchat.core.config import UISettings
from llmchat.core.observe import Bus, Metrics, prices_from_settings
from llmchat.tui.numbers import plural
from llmchat.tui.widgets.hud._alternatives import TITLE as ALTERNATIVES_TITLE
from llmchat.tui.widgets.hud._alternatives import AlternativesLines
from llmchat.tui.widgets.hud._attribution import AttributionPanel
from llmchat.tui.widgets.hud._charts import HudCharts
from llmchat.tui.widgets.hud._connection import ConnectionPanel, Endpoint
from llmchat.tui.widgets.hud._context import ContextLine
from llmchat.tui.widgets.hud._detail import HudDetail
from llmchat.tui.widgets.hud._figures import Targets
from llmchat.tui.widgets.hud._headroom import HeadroomLines
from llmchat.tui.widgets.hud._lag import RenderLagLine
from llmchat.tui.widgets.hud._pending import PendingPanel
from llmchat.tui.widgets.hud._server import ServerLine
from llmchat.tui.widgets.hud._stats import HudStats
from llmchat.tui.widgets.hud._waterfall import Waterfall


class Hud(VerticalScroll, can_focus=True):
    """The side panel. Give it the client's ``bus`` (it feeds its own ``Metrics`` while mounted) or a
    ``metrics`` fed elsewhere (then it only reads). ``mode`` ("stream" | "batch") is the mode of the next
    request; each request already made is coloured against the target of its own mode, so a toggle repaints
    nothing. ``provider``, ``model`` and ``host`` name the endpoint in the connection lines (the model a reply
    names wins over the configured one)."""

    DEFAULT_CSS = """
    Hud {
        width: 40;
        height: 1fr;
        padding: 0 1;
        scrollbar-size-vertical: 1;
    }
    Hud > .hud-box {
        height: auto;
    }
    Hud .hud-title {
        height: 1;
        margin-top: 1;
        color: $text-muted;
        text-style: bold;
    }
    Hud .hud-title.-first {
        margin-top: 0;
    }
    """

    BINDINGS = [Binding("d", "detail", "Latency charts", id="hud.detail")]

    mode: reactive[str] = reactive("stream")
    provider: reactive[str] = reactive("")
    model: reactive[str] = reactive("")
    host: reactive[str] = reactive("")

    def __init__(
        self,
        *,
        bus: Bus | None = None,
        metrics: Metrics | None = None,
        ui: UISettings | None = None,
        refresh_hz: float = 10.0,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        """``refresh_hz`` caps repaints per second (ValueError unless positive)."""
        super().__init__(name=name, id=id, classes=classes)
        if refresh_hz <= 0:
            raise ValueError("refresh_hz must be positive")
        self.ui = ui or UISettings()
        self.metrics = metrics or Metrics(self.ui.hud_history, prices=prices_from_settings(self.ui.prices))
        self._bus = bus
        self._interval = 1.0 / refresh_hz
        self._ticker: Timer | None = None
        self._ticking = False
        self._offs: list[Callable[[], None]] = []
        # The versions each part last painted; -1 forces the first paint.
        self._seen = {"requests": -1, "done": -1, "connection": -1, "render": -1, "server": -1, "headroom": -1}
        self._was_pending = False
        self._retry_shown: str | None = None
        self.frames = 0
        """How many ticks repainted something: for benchmarks and tests of the refresh policy."""

        self.connection_panel = ConnectionPanel(id="hud-connection")
        self.server_line = ServerLine(id="hud-server")
        self.headroom_lines = HeadroomLines(id="hud-headroom")
        self.pending_panel = PendingPanel(id="hud-pending")
        self.charts_title = Static(self._charts_title(), classes="hud-title")
        self.charts = HudCharts(id="hud-charts")
        self.waterfall = Waterfall(id="hud-waterfall")
        self.alternatives_title = Static(ALTERNATIVES_TITLE, classes="hud-title")
        self.alternatives_title.display = False
        self.alternatives = AlternativesLines(id="hud-alternatives")
        self.attribution = AttributionPanel(id="hud-attribution")
        self.stats = HudStats(with_cost=bool(self.metrics.prices), id="hud-stats")
        self.lag_line = RenderLagLine(id="hud-lag")
        self.context_line = ContextLine(id="hud-context")
        self.fit: ContextFit | None = None
        """The last request's fit into the context window (set by the app before it sends)."""

    def compose(self) -> ComposeResult:
        # Two boxes, for the cost of a frame while a reply streams. Textual repaints the bounding box of all
        # that changed and re-renders every widget whose clip overlaps it; children of a box are clipped to
        # the box. So the lines that change 10 times a second (pending, render lag) sit together in one box,
        # and a frame that touches only them leaves the widgets of the other box alone.
        with Vertical(id="hud-live", classes="hud-box"):
            yield Static("connection", classes="hud-title -first")
            yield self.connection_panel
            yield self.server_line
            yield self.headroom_lines
            yield self.pending_panel
            yield self.lag_line
        with Vertical(id="hud-history", classes="hud-box"):
            yield self.charts_title
            yield self.charts
            yield Static("last request", classes="hud-title")
            yield self.waterfall
            yield self.alternatives_title
            yield self.alternatives
            yield Static("where the time went", classes="hud-title")
            yield self.attribution
            yield Static("figures", classes="hud-title")
            yield self.stats
            # Last: on a 45-row terminal the parts above already fill the panel (a cancel's attribution
            # wraps to several lines), and the counters there matter more at a glance.
            yield self.context_line

    def compare_alternatives(self, records: Sequence[Mapping[str, Any] | None], current: int) -> None:
        """Show a prompt's replies side by side (their stored records, oldest first; ``current`` on screen);
        fewer than two hides the comparison."""
        self.alternatives.show(records, current)
        self.alternatives_title.display = self.alternatives.display

    # -- lifecycle ------------------------------------------------------------------------------------------
    def on_mount(self) -> None:
        if self._bus is not None:
            self._offs.append(self.metrics.subscribe(self._bus))
        self._offs.append(self.metrics.add_listener(self.wake))
        self._ticker = self.set_interval(self._interval, self._tick, pause=True, name="hud-ticker")
        self.paint()

    def on_unmount(self) -> None:
        for off in self._offs:
            off()
        self._offs.clear()

    def _charts_title(self) -> str:
        n = len(self.metrics.replies)
        return f"last {plural(n, 'reply', 'replies')}" if n else f"replies (the last {self.metrics.window})"

    # -- reactives ---------------------------------------------------------------------------------------
    @property
    def targets(self) -> Targets:
        """The latency targets: TTFT against ``ui.sla_ttft_ms`` for streamed requests, the total against
        ``ui.sla_total_ms`` for batch ones."""
        return Targets.from_ui(self.ui)

    def watch_provider(self) -> None:
        self._seen["connection"] = self._seen["server"] = self._seen["headroom"] = -1
        self.wake()

    watch_model = watch_host = watch_provider

    # -- refresh policy ------------------------------------------------------------------------------------
    @property
    def ticking(self) -> bool:
        """Whether the repaint ticker runs; it sleeps whenever there is nothing new to show."""
        return self._ticking

    def wake(self) -> None:
        """Something changed: make sure the ticker runs (it repaints within one interval, then sleeps)."""
        if self._ticker is not None and not self._ticking:
            self._ticking = True
            self._ticker.resume()

    def on_show(self) -> None:
        self.wake()  # whatever changed while it was hidden

    def _tick(self) -> None:
        if not self.display:
            # Hidden (the key, or folded on a narrow terminal): paint nothing; on_show wakes the ticker and
            # the versions still say what changed meanwhile.
            self._ticking = False
            if self._ticker is not None:
                self._ticker.pause()
            return
        painted = self.paint()
        if not painted and not self._was_pending:
            self._ticking = False
            if self._ticker is not None:
                self._ticker.pause()

    def paint(self, now_ns: int | None = None) -> bool:
        """Repaint the parts whose figures changed, and the pending line while a request is in flight (and
        once more after, to clear it). Returns whether anything was repainted. ``now_ns`` (perf_counter_ns)
        is for tests that freeze the clock."""
        m, seen = self.metrics, self._seen
        painted = False
        targets = self.targets
        if seen["done"] != m.done_version:
            seen["done"] = m.done_version
            self.charts_title.update(self._charts_title(), layout=False)
            self.charts.show(m, targets)
            self.waterfall.show(m.last)
            self.attribution.show(m)
            self.context_line.show(self.fit, m.last_attribution, m.last)
            seen["connection"] = -1  # the last record may name what the shell did not (its model)
            painted = True
        if seen["connection"] != m.connection_version:
            seen["connection"] = m.connection_version
            self.connection_panel.show(self.endpoint(), m.connection)
            painted = True
        retry = m.pending_retry or m.pending_hold  # it ends when the next attempt's headers come, which is not an event
        if seen["requests"] != m.requests_version or retry != self._retry_shown:
            seen["requests"] = m.requests_version
            self._retry_shown = retry
            self.stats.show(m, targets)
            painted = True
        if seen["server"] != m.server_version:
            seen["server"] = m.server_version
            # The shown provider's scrape only: another provider's queue says nothing about this one.
            self.server_line.show(m.server_state(self.provider) if self.provider else m.server_state())
            painted = True
        if seen["headroom"] != m.headroom_version:
            seen["headroom"] = m.headroom_version
            self.headroom_lines.show(m.headroom(self.provider) if self.provider else m.headroom(),
                                     self.ui.headroom_warn)
            painted = True
        if seen["render"] != m.render_version:
            seen["render"] = m.render_version
            self.lag_line.show(m)
            painted = True
        pending = m.in_flight > 0
        if pending or self._was_pending:
            self.pending_panel.show(m, time.perf_counter_ns() if now_ns is None else now_ns, self.ui.stall_s)
            painted = True
        self._was_pending = pending
        if painted:
            self.frames += 1
        return painted

    def endpoint(self) -> Endpoint:
        """What the connection lines name: the shell's provider and host, else the last record's; the model
        the last request of this provider used (the one a discovery picked, or the reply named), else the
        shell's."""
        last = self.metrics.last
        provider = self.provider or (last.provider if last else "")
        mine = last is not None and (not self.provider or last.provider == self.provider)
        model = last.model if mine and last is not None and last.model else self.model
        return Endpoint(provider, model, self.host or (last.host if last else ""))

    def show_context(self, fit: ContextFit) -> None:
        """Show the next request's prompt tokens against the window (the prefill share follows its reply)."""
        self.fit = fit
        self.context_line.show(fit, None, None)

    # -- actions -------------------------------------------------------------------------------------------
    def action_detail(self) -> None:
        """Open the detail view: the four series as charts with axes."""
        self.app.push_screen(HudDetail(self.metrics))
