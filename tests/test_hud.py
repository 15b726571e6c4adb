"""The HUD in a tiny app driven by a real Bus: what its labels say, its colours, its live lines, its detail
view, and its refresh policy. Records are real TimingRecords, stamps set by hand; every wait is bounded."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from textual.app import App, ComposeResult
from textual.containers import Horizontal
from textual.content import Content
from textual.pilot import Pilot
from textual.widgets import Static
from timing_records import T0, record

from llmchat.core.config._settings import UISettings
from llmchat.core.observe._attribution import (
    GROUPS,
    MUTE_MS,
    attribute,
    format_shares,
    shares_over,
    shown_groups,
)
from llmchat.core.observe._bus import (
    Bus,
    Chunk,
    FirstToken,
    RequestDone,
    RequestStarted,
    RetryPlanned,
    ServerMetricsSampled,
    WarmupState,
)
from llmchat.core.observe._coldstart import ColdStartDetector
from llmchat.core.observe._timing import TimingRecord
from llmchat.core.observe._window import Metrics, ServerState
from llmchat.core.policy._retry import RetryEvent
from llmchat.tui.numbers import duration
from llmchat.tui.widgets.hud import AttributionPanel, Hud, HudDetail, PlotChart
from llmchat.tui.widgets.hud._attribution import (
    BADGES,
    GROUP_LOOK,
    MIN_SHARE,
    OVERLAP_NOTE,
    render_attribution,
    segments,
)
from llmchat.tui.widgets.hud._server import render_server

WAIT_S = 5.0


class HudApp(App[None]):
    CSS = "#chat { width: 1fr; }"

    def __init__(self, ui: UISettings | None = None) -> None:
        super().__init__()
        self.bus = Bus()
        self.ui = ui or UISettings()

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield Static("chat", id="chat")
            yield Hud(bus=self.bus, ui=self.ui, id="hud")


async def until(
    pilot: Pilot[None], condition: Callable[[], bool], what: str, timeout: float = WAIT_S
) -> float:
    """Wait for ``condition`` (polling the app between frames); fail after ``timeout``. Returns the wait."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        await pilot.pause(0.02)
    return time.monotonic() - start


def text(widget: Static) -> str:
    return str(widget.content)


def styles_of(widget: Static, needle: str) -> set[str]:
    """The styles of the spans that cover ``needle`` in a widget's content."""
    content = widget.content
    assert isinstance(content, Content)
    start = content.plain.index(needle)
    end = start + len(needle)
    return {str(span.style) for span in content.spans if span.start < end and span.end > start}


def finish(bus: Bus, *records: TimingRecord) -> None:
    for r in records:
        bus.publish(RequestStarted(r))
        if r.first_token_ns is not None:
            bus.publish(FirstToken(r))
        bus.publish(RequestDone(r))


def retry_event() -> RetryEvent:
    return RetryEvent(attempt=2, max_attempts=4, reason="429", status=429, wait_s=1.3,
                      wait_source="Retry-After", error="rate limited")


async def test_the_labels_show_the_figures() -> None:
    app = HudApp()
    async with app.run_test(size=(90, 50)) as pilot:
        hud = app.query_one(Hud)
        app.bus.publish(WarmupState("local", "warm", 1.5))
        finish(app.bus, record(ttft_ms=40.0, total_ms=300.0), record(ttft_ms=60.0, total_ms=500.0),
               record(ttft_ms=50.0, total_ms=400.0, reused=True, error="boom", error_kind="timeout"))
        await until(pilot, lambda: "3 requests" in text(hud.stats), "the stats to count 3 requests")
        stats = text(hud.stats)
        assert "1 error · 0 cancelled · timeout 1" in stats
        assert "cache: no lookups yet" in stats  # nothing looked in the cache: neither hits nor misses
        assert "3 requests · 0 in flight · 0 retries" in stats
        # Two replies (the error is not charted): too few for a percentile, so min, median and max.
        header, ttft_row = stats.splitlines()[:2]
        assert header.split() == ["n", "min", "median", "max"]
        assert ttft_row.split() == ["TTFT", "2", "40.0", "ms", "50.0", "ms", "60.0", "ms"]
        ttft, total = text(hud.charts.label("ttft")), text(hud.charts.label("total"))
        assert ttft == "TTFT   60.0 ms ≤ 200 ms target"
        assert total == "total  500 ms  range 300–500 ms"
        assert hud.charts.chart("total").values == [300.0, 500.0]
        connection = text(hud.connection_panel).splitlines()
        assert connection == ["local · llmchat-local", "127.0.0.1:8000 · ● warm", "ping 1.5 ms"]
        waterfall = text(hud.waterfall)
        assert waterfall.splitlines()[0] == "HTTP/2 · reused · timeout"  # not the 200 the stream began with
        assert styles_of(hud.waterfall, "timeout") == {"$error"}
        assert text(hud.pending_panel) == "idle"


async def test_a_target_colour_comes_with_its_target_and_each_request_keeps_its_own_modes() -> None:
    app = HudApp(UISettings(sla_ttft_ms=100.0, sla_total_ms=1000.0))
    async with app.run_test(size=(90, 50)) as pilot:
        hud = app.query_one(Hud)
        label, total_label = hud.charts.label("ttft"), hud.charts.label("total")
        finish(app.bus, record(ttft_ms=80.0, total_ms=2000.0))
        await until(pilot, lambda: "80.0 ms" in text(label), "the first TTFT")
        assert text(label) == "TTFT   80.0 ms ≤ 100 ms target"
        assert styles_of(label, "80.0 ms ≤ 100 ms target") == {"$success"}
        # A streamed reply's total has no target: plain, with its range instead of a verdict.
        assert text(total_label) == "total  2000 ms  1 reply" and styles_of(total_label, "2000 ms") == set()
        finish(app.bus, record(ttft_ms=150.0, total_ms=400.0))
        await until(pilot, lambda: "150 ms" in text(label), "the second TTFT")
        assert text(label) == "TTFT   150 ms > 100 ms target"
        assert styles_of(label, "150 ms > 100 ms target") == {"$error"}
        ttft_cells = hud.charts.chart("ttft").cell_styles
        assert ttft_cells == ["$success", "$error"]
        stats = text(hud.stats)
        assert "  TTFT target 100 ms: 1 of 2 over" in stats.splitlines()
        assert styles_of(hud.stats, "1 of 2 over") == {"$error"}
        painted = (hud.charts.label("ttft").content, hud.stats.content, ttft_cells)

        # The mode toggles: nothing already made is recoloured, so nothing is repainted.
        hud.mode = "batch"
        await pilot.pause(0.2)
        assert (hud.charts.label("ttft").content, hud.stats.content) == painted[:2]
        assert hud.charts.chart("ttft").cell_styles == ttft_cells
        assert hud.charts.chart("total").cell_styles == ["", ""]  # streamed totals: no target, in any mode

        # A batch reply is held to the total target; the streamed ones before it keep theirs.
        finish(app.bus, record(mode="batch", total_ms=1500.0))
        await until(pilot, lambda: "1500 ms" in text(total_label), "the batch total")
        assert text(total_label) == "total  1500 ms > 1000 ms target"
        assert styles_of(total_label, "1500 ms > 1000 ms target") == {"$error"}
        assert hud.charts.chart("total").cell_styles == ["", "", "$error"]
        assert hud.charts.chart("ttft").cell_styles == ["$success", "$error"]
        assert "  batch target 1000 ms: 1 of 1 over" in text(hud.stats).splitlines()
        # The total row mixes modes, so its cells carry no colour (only a batch total has a target).
        total_row = next(line for line in text(hud.stats).splitlines() if line.startswith("total"))
        assert styles_of(hud.stats, total_row) == set()
        finish(app.bus, record(mode="batch", total_ms=900.0))
        await until(pilot, lambda: "900 ms" in text(total_label), "the second batch total")
        assert styles_of(total_label, "900 ms ≤ 1000 ms target") == {"$success"}
        hud.mode = "stream"
        await pilot.pause(0.2)
        assert hud.charts.chart("total").cell_styles == ["", "", "$error", "$success"]


async def test_the_retry_line_shows_while_a_retry_is_pending() -> None:
    app = HudApp()
    async with app.run_test(size=(90, 50)) as pilot:
        hud = app.query_one(Hud)
        r = record(t0_ns=time.perf_counter_ns())
        r.first_token_ns = r.last_token_ns = r.end_ns = None
        app.bus.publish(RequestStarted(r))
        app.bus.publish(RetryPlanned(r, retry_event()))
        line = "retry 2/4 in 1.3 s (429, Retry-After)"
        await until(pilot, lambda: line in text(hud.stats), "the retry line")
        assert "1 retry" in text(hud.stats)
        assert styles_of(hud.stats, line) == {"$warning"}
        r.first_token_ns = time.perf_counter_ns()
        app.bus.publish(FirstToken(r))
        await until(pilot, lambda: line not in text(hud.stats), "the retry line to go")
        r.end_ns = time.perf_counter_ns()
        app.bus.publish(RequestDone(r))
        await until(pilot, lambda: "1 request " in text(hud.stats), "the request to finish")


async def test_the_stall_badge_after_stall_s_without_a_token() -> None:
    stall_s = 0.2
    app = HudApp(UISettings(stall_s=stall_s))
    async with app.run_test(size=(90, 50)) as pilot:
        hud = app.query_one(Hud)
        panel = hud.pending_panel
        r = record(t0_ns=time.perf_counter_ns())
        r.first_token_ns = r.last_token_ns = r.end_ns = None
        started = time.perf_counter()
        app.bus.publish(RequestStarted(r))
        await until(pilot, lambda: "elapsed" in text(panel), "the running timer")
        await until(pilot, lambda: panel.stalled, "the stall badge")
        assert time.perf_counter() - started >= stall_s  # never before stall_s has passed
        assert "stall" in text(panel)
        # A token arrives: the badge goes, the timer keeps running.
        now = time.perf_counter_ns()
        r.first_token_ns = r.last_token_ns = now
        app.bus.publish(FirstToken(r))
        app.bus.publish(Chunk(r, "hi", now))
        await until(pilot, lambda: not panel.stalled, "the stall badge to go")
        assert "elapsed" in text(panel) and "stall" not in text(panel)
        r.end_ns = time.perf_counter_ns()
        app.bus.publish(RequestDone(r))
        await until(pilot, lambda: text(panel) == "idle", "the pending line to go idle")


async def test_the_timer_runs_while_pending() -> None:
    app = HudApp(UISettings(stall_s=60.0))
    async with app.run_test(size=(90, 50)) as pilot:
        hud = app.query_one(Hud)
        r = record(t0_ns=time.perf_counter_ns() - 2_000_000_000)  # started 2 s ago
        r.first_token_ns = r.last_token_ns = r.end_ns = None
        app.bus.publish(RequestStarted(r))

        def shown_s() -> float:
            words = text(hud.pending_panel).split()
            return float(words[1]) if words[0] == "elapsed" else -1.0

        await until(pilot, lambda: shown_s() >= 2.0, "the timer to count from the request's start")
        first = shown_s()
        assert first < 2.0 + WAIT_S
        await until(pilot, lambda: shown_s() >= first + 0.3, "the timer to move on")
        r.end_ns = time.perf_counter_ns()
        app.bus.publish(RequestDone(r))
        await until(pilot, lambda: text(hud.pending_panel) == "idle", "idle")


async def test_the_pending_line_says_what_the_running_request_is_doing() -> None:
    """Elapsed is called elapsed; then the running request's own figures: waiting, a retry counting down
    with its reason in words, then tokens and TTFT once they come."""
    app = HudApp(UISettings(stall_s=60.0))
    async with app.run_test(size=(90, 50)) as pilot:
        hud = app.query_one(Hud)
        panel = hud.pending_panel
        r = record(t0_ns=time.perf_counter_ns())
        r.first_token_ns = r.last_token_ns = r.end_ns = r.phases.headers_ns = None
        r.content_chunks = 0
        app.bus.publish(RequestStarted(r))
        await until(pilot, lambda: text(panel).startswith("elapsed ") and "waiting" in text(panel), "waiting")
        app.bus.publish(RetryPlanned(r, RetryEvent(attempt=2, max_attempts=4, reason="429", status=429,
                                                   wait_s=45.0, wait_source="retry-after-ms", error="429")))
        await until(pilot, lambda: "retry 2 of 4 in 45 s" in text(panel), "the retry countdown")
        assert "retry-after" not in text(panel)  # the chat's state line, wider, gives the reason in words
        await until(pilot, lambda: "retry 2 of 4 in 44 s" in text(panel), "the countdown to count down")
        now = time.perf_counter_ns()
        r.phases.headers_ns = now
        r.first_token_ns = r.last_token_ns = now
        r.content_chunks = 12
        app.bus.publish(FirstToken(r))
        await until(pilot, lambda: "12 tokens" in text(panel), "the tokens so far")
        assert "retry" not in text(panel)
        r.end_ns = time.perf_counter_ns()
        app.bus.publish(RequestDone(r))
        await until(pilot, lambda: text(panel) == "idle", "idle")


async def test_the_waterfall_marks_new_and_reused_connections() -> None:
    app = HudApp()
    async with app.run_test(size=(90, 50)) as pilot:
        hud = app.query_one(Hud)
        finish(app.bus, record(reused=False))
        await until(pilot, lambda: "new conn" in text(hud.waterfall), "a new connection")
        rows = {line.split()[0]: line for line in text(hud.waterfall).splitlines()[1:]}
        assert rows["connect"].split()[1:3] == ["1.3", "ms"]
        assert rows["tls"].split()[1:3] == ["4.5", "ms"]
        assert "█" in rows["total"] or "▉" in rows["total"]
        finish(app.bus, record(reused=True))
        await until(pilot, lambda: "reused" in text(hud.waterfall), "a reused connection")
        rows = {line.split()[0]: line for line in text(hud.waterfall).splitlines()[1:]}
        assert rows["connect"].split()[1:] == ["-"]
        assert rows["tls"].split()[1:] == ["-"]
        assert rows["send"].split()[1:3] == ["0.3", "ms"]
        assert "proxy" not in text(hud.waterfall)
        # Through a forward proxy the header says so (the record's `proxy`, masked, says which).
        finish(app.bus, record(reused=True, proxy="http://127.0.0.1:3128"))
        await until(pilot, lambda: "via proxy" in text(hud.waterfall), "the proxy")
        assert text(hud.waterfall).splitlines()[0].startswith("HTTP/2 · reused · via proxy")


async def test_the_detail_view_opens_and_closes() -> None:
    app = HudApp()
    async with app.run_test(size=(120, 50)) as pilot:
        hud = app.query_one(Hud)
        finish(app.bus, record(ttft_ms=40.0, total_ms=300.0), record(ttft_ms=70.0, total_ms=350.0))
        await until(pilot, lambda: "2 requests" in text(hud.stats), "two requests")
        hud.focus()
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, HudDetail), "the detail view")
        chart = app.screen.query_one("#plot-ttft", PlotChart)
        await until(pilot, lambda: "last 70.0 ms" in str(chart.content), "the TTFT chart")
        drawn = str(chart.content)
        assert "reply, oldest to newest" in drawn  # the x axis label
        # Whole replies on the x axis, round durations with their unit on the y axis, from zero.
        assert "1.25" not in drawn and "1.00" not in drawn
        assert "0 ms" in drawn and "20 ms" in drawn and "80 ms" in drawn
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, HudDetail), "the detail view to close")


async def test_the_ticker_sleeps_when_idle_and_coalesces_bursts() -> None:
    app = HudApp()
    async with app.run_test(size=(90, 50)) as pilot:
        hud = app.query_one(Hud)
        await until(pilot, lambda: not hud.ticking, "the ticker to sleep")
        frames = hud.frames
        # Chunks alone never wake it: they are a counter and a timestamp.
        r = record()
        for i in range(200):
            app.bus.publish(Chunk(r, "x", i))
        await pilot.pause(0.3)
        assert hud.frames == frames and not hud.ticking
        # A burst of 100 finished requests is painted in a frame or two, not a hundred.
        finish(app.bus, *(record(total_ms=100.0 + i) for i in range(100)))
        await until(pilot, lambda: "100 requests" in text(hud.stats), "the burst")
        await until(pilot, lambda: not hud.ticking, "the ticker to sleep again")
        assert 1 <= hud.frames - frames <= 3


async def test_the_cost_line_shows_when_prices_are_configured() -> None:
    prices = {"llmchat-local": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}}
    app = HudApp(UISettings(prices=prices))
    async with app.run_test(size=(90, 50)) as pilot:
        hud = app.query_one(Hud)
        assert "cost: no priced request yet" in text(hud.stats)
        finish(app.bus, record(prompt_tokens=1000, output_tokens=500, usage_from_server=True))
        await until(pilot, lambda: "cost ≈" in text(hud.stats), "the cost")
        assert "cost ≈ $0.0020 · last $0.0020" in text(hud.stats)
        finish(app.bus, record(prompt_tokens=None, usage_from_server=False))  # a server that sends no usage
        await until(pilot, lambda: "cost ≥ $0.0020 · last ?" in text(hud.stats), "a lower bound")
    plain = HudApp()
    async with plain.run_test(size=(90, 50)):
        assert "cost" not in text(plain.query_one(Hud).stats)


async def test_render_lag_is_its_own_line() -> None:
    app = HudApp()
    async with app.run_test(size=(90, 50)) as pilot:
        hud = app.query_one(Hud)
        for ms in (2.0, 4.0, 6.0):
            hud.metrics.observe_render_lag(ms)
        await until(pilot, lambda: "median" in text(hud.lag_line), "the render lag")
        # Three frames: the median and the slowest, never a p99 nobody measured.
        assert text(hud.lag_line) == "render lag median 4.0 ms · max 6.0 ms"
        assert "render" not in text(hud.stats)
        for lag in range(17):
            hud.metrics.observe_render_lag(float(lag))
        await until(pilot, lambda: "p95" in text(hud.lag_line), "p95 from 20 frames")
        for _ in range(80):
            hud.metrics.observe_render_lag(1.0)
        await until(pilot, lambda: "p99" in text(hud.lag_line), "p99 from 100 frames")


async def test_the_hud_unsubscribes_when_it_goes() -> None:
    app = HudApp()
    async with app.run_test(size=(90, 50)) as pilot:
        assert app.bus.wants(RequestDone)
        await app.query_one(Hud).remove()
        await pilot.pause()
        assert not app.bus.wants(RequestDone) and not app.bus.wants(Chunk)


async def test_the_shell_names_the_endpoint() -> None:
    app = HudApp()
    async with app.run_test(size=(90, 50)) as pilot:
        hud = app.query_one(Hud)
        app.bus.publish(WarmupState("groq", "warming"))
        hud.provider, hud.model, hud.host = "openai", "gpt-4o-mini", "api.example:443"
        await until(pilot, lambda: "openai · gpt-4o-mini" in text(hud.connection_panel), "the endpoint")
        # Warm-up news about another provider says nothing about this one.
        assert "api.example:443 · ● cold" in text(hud.connection_panel)
        app.bus.publish(WarmupState("openai", "warming"))
        await until(pilot, lambda: "● warming" in text(hud.connection_panel), "warming")
        assert styles_of(hud.connection_panel, "● warming") == {"$warning"}


async def test_the_connection_lines_name_the_model_a_reply_used_and_what_warm_up_measured() -> None:
    app = HudApp()
    async with app.run_test(size=(90, 50)) as pilot:
        hud = app.query_one(Hud)
        panel = hud.connection_panel
        hud.provider, hud.host = "local", "127.0.0.1:8000"  # no model configured: the server picks
        app.bus.publish(WarmupState("local", "warm", 0.84, setup_ms=1.9))
        await until(pilot, lambda: "ping" in text(panel), "the warm-up figures")
        assert text(panel).splitlines() == ["local · default model", "127.0.0.1:8000 · ● warm",
                                            "opened in 1.9 ms · ping 0.8 ms"]
        # A later ping on the open connection keeps the setup it did not measure again.
        app.bus.publish(WarmupState("local", "warm", 0.61))
        await until(pilot, lambda: "ping 0.6 ms" in text(panel), "the next ping")
        assert "opened in 1.9 ms" in text(panel)
        finish(app.bus, record(model="llmchat-local"))
        await until(pilot, lambda: "local · llmchat-local" in text(panel), "the model the reply named")
        # The model a reply names wins over the configured one (a dated snapshot of an alias, say).
        hud.model = "gpt-4o"
        finish(app.bus, record(model="gpt-4o-2024-08-06"))
        await until(pilot, lambda: "gpt-4o-2024-08-06" in text(panel), "the dated model")
        error = "connection refused by 127.0.0.1:8000: nothing is listening there; start the server"
        app.bus.publish(WarmupState("local", "failed", None, error))
        await until(pilot, lambda: "failed" in text(panel), "the failure")
        width = panel.content_size.width
        assert error in " ".join(text(panel).splitlines()[2:]) and len(error) > width
        assert all(len(line) <= width for line in text(panel).splitlines())  # wrapped, not cut
        assert "ping" not in text(panel)  # the last good ping is not the connection's now


async def test_a_hidden_hud_paints_nothing_and_catches_up_when_shown() -> None:
    app = HudApp()
    async with app.run_test(size=(90, 50)) as pilot:
        hud = app.query_one(Hud)
        finish(app.bus, record())
        await until(pilot, lambda: "1 request " in text(hud.stats), "the first request")
        hud.display = False
        await pilot.pause()
        frames = hud.frames
        finish(app.bus, record(), record())
        await until(pilot, lambda: not hud.ticking, "the ticker to stop while hidden")
        assert hud.frames == frames and "1 request " in text(hud.stats)
        hud.display = True
        await until(pilot, lambda: "3 requests" in text(hud.stats), "the HUD to catch up once shown")


# --- where the time went: Metrics keeps the attributions, the panel draws them --------------------------


def served(
    r: TimingRecord, *, queue_ms: float = 0.5, early_ms: float = 8.0, late_ms: float = 10.0
) -> TimingRecord:
    """``r`` as llmchat serve reports it: queued ``queue_ms``, its first token sent ``early_ms`` before the
    client saw it and its last ``late_ms`` before the end (stamps on the server's own clock)."""
    assert r.first_token_ns is not None and r.end_ns is not None
    r.server_timing = {
        "received_ns": 0,
        "started_ns": round(queue_ms * 1e6),
        "first_token_ns": r.first_token_ns - r.t0_ns - round(early_ms * 1e6),
        "last_token_ns": r.end_ns - r.t0_ns - round(late_ms * 1e6),
    }
    return r


class CountingDetector(ColdStartDetector):
    """A real detector that also counts how often it was asked."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def observe(self, record: TimingRecord) -> bool:
        self.calls += 1
        return super().observe(record)


def bar_cells(panel: AttributionPanel) -> list[str]:
    """The group of each cell of the panel's bar line, read back from its glyphs and styles."""
    content = panel.content
    assert isinstance(content, Content)
    line = content.plain.split("\n")[0]
    looks = {(glyph, style): group for group, (_, glyph, style) in GROUP_LOOK.items()}
    cells = []
    for i, glyph in enumerate(line):
        styles = {str(s.style) for s in content.spans if s.start <= i < s.end}
        assert len(styles) == 1, (i, styles)
        cells.append(looks[(glyph, styles.pop())])
    return cells


def panel_lines(panel: AttributionPanel) -> list[str]:
    return str(panel.content).split("\n")


def panel_line(panel: AttributionPanel, n: int) -> str:
    lines = panel_lines(panel)
    return lines[n] if n < len(lines) else ""


def window_text(panel: AttributionPanel) -> str:
    """The "last N replies" lines joined back (they wrap between entries, at a " · ")."""
    lines = panel_lines(panel)
    first = next(i for i, line in enumerate(lines) if line.startswith(("last ", "no reply from the server")))
    return " · ".join(lines[first:])


def panel_text(panel: AttributionPanel) -> str:
    """The panel's lines as one text (a wrapped sentence joined back with spaces)."""
    return " ".join(panel_lines(panel))


def key_text(groups: dict[str, float], total_ms: float, *, glyphs: bool = True) -> str:
    """What the key says of ``groups``: each group in words with its share, largest first."""
    ranked = sorted((g for g in groups if g != "unexplained" and groups[g] >= MIN_SHARE * total_ms),
                    key=lambda g: -groups[g])
    words = []
    for g in ranked:
        name, glyph, _ = GROUP_LOOK[g]
        words.append(f"{glyph + ' ' if glyphs else ''}{name} {round(groups[g] / total_ms * 100)}%")
    return " · ".join(words)


def key_lines(panel: AttributionPanel, first: int, count: int) -> str:
    """Key lines ``first`` .. ``first + count`` joined back: a key wraps between its entries, at a " · "."""
    return " · ".join(panel_lines(panel)[first:first + count])


def test_metrics_attributes_each_finished_request_once_not_per_chunk() -> None:
    detector = CountingDetector()
    m = Metrics(window=3, detector=detector)
    bus = Bus()
    m.subscribe(bus, chunks=True)
    r = served(record(ttft_ms=50.0, total_ms=400.0))
    bus.publish(RequestStarted(r))
    for i in range(50):
        bus.publish(Chunk(r, "x", r.t0_ns + i))
    assert detector.calls == 0 and m.last_attribution is None
    bus.publish(RequestDone(r))
    assert detector.calls == 1
    a = m.last_attribution
    assert a is not None and a == attribute(r)  # the same parts as the core gives, nothing added
    assert a.reporter == "llmchat serve" and a.ms("server_generation") > 0
    # The window keeps the replies from the network; the last attribution follows every outcome.
    failed = record(error="boom", error_kind="timeout")
    hit = record(cache_hit=True, total_ms=3.0)
    m.observe_many([failed, hit])
    assert detector.calls == 3
    assert m.last_attribution is not None and m.last_attribution.flags == ["cache_hit"]
    assert m.attributions == [a]
    replies = [served(record(ttft_ms=40.0 + i, total_ms=300.0 + 50 * i)) for i in range(4)]
    m.observe_many(replies)
    assert len(m.attributions) == 3  # the window rolls
    # The core's shares, with each reply's unexplained part (under MUTE_MS: clock noise) left out.
    want = shares_over(attribute(x) for x in replies[-3:])
    assert all(abs(attribute(x).ms("unexplained")) < MUTE_MS for x in replies[-3:])
    del want["unexplained"]
    assert m.attribution_shares() == pytest.approx(want)
    assert m.attribution_shares() is m.attribution_shares()  # computed once per finished request


def test_metrics_carries_the_turns_slowest_frame_as_render_lag_after_the_total() -> None:
    m = Metrics()
    first = record(ttft_ms=50.0, total_ms=400.0)
    m.observe_render_lag(99.0)  # a frame before any request: not this turn's
    m.observe_started(first)
    m.observe_render_lag(4.0)
    m.observe_render_lag(9.0)
    m.observe_render_lag(3.0)
    m.observe_done(first)
    a = m.last_attribution
    assert a is not None and [(p.key, p.ms) for p in a.after] == [("render_lag", 9.0)]
    assert a.total_ms == pytest.approx(400.0, abs=1e-6)  # outside the total
    m.observe_render_lag(12.0)  # the reply's last frame, painted after RequestDone
    assert [p.ms for p in a.after] == [12.0]
    second = record(ttft_ms=50.0, total_ms=400.0)
    m.observe_started(second)
    m.observe_render_lag(2.0)
    assert [p.ms for p in a.after] == [12.0]  # the next turn's frames are not the last one's
    m.observe_done(second)
    assert m.last_attribution is not None and [p.ms for p in m.last_attribution.after] == [2.0]


@given(
    st.dictionaries(st.sampled_from(GROUPS), st.floats(min_value=-50, max_value=1e5, allow_nan=False),
                    min_size=1),
    st.integers(min_value=1, max_value=120),
)
def test_bar_segments_fill_the_width_in_proportion(groups: dict[str, float], width: int) -> None:
    cells = segments(groups, width)
    positive = {g: ms for g, ms in groups.items() if ms > 0}
    total = sum(positive.values())
    if not cells:
        assert total <= 0  # else the largest group is named, and drawn
        return
    assert sum(n for _, n in cells) == width
    assert [g for g, _ in cells] == [g for g in GROUPS if g in dict(cells)]  # bar order
    named = {g for g, ms in positive.items() if ms >= MIN_SHARE * total}
    assert {g for g, _ in cells} <= named
    if len(named) <= width:
        assert {g for g, _ in cells} == named  # every group the legend names has a cell
    shown = sum(positive[g] for g in named)
    for g, n in cells:
        # Largest remainder, plus at most the cells lent to groups under one cell each.
        assert abs(n - positive[g] * width / shown) <= len(named)


async def test_the_panel_draws_the_last_requests_split_and_the_windows_shares() -> None:
    app = HudApp()
    async with app.run_test(size=(90, 50)) as pilot:
        hud = app.query_one(Hud)
        panel = hud.attribution
        assert panel_lines(panel) == ["no request yet"]
        r = served(record(ttft_ms=60.0, total_ms=500.0), queue_ms=0.5, early_ms=20.0, late_ms=60.0)
        r.decode_ns, r.decode_before_first_ns = 25_000_000, 5_000_000  # the client's share: decoding
        finish(app.bus, r)
        await until(pilot, lambda: "█" in panel_line(panel, 0), "the bar")
        a = attribute(r)
        groups = hud.metrics.last_groups
        assert set(groups) == {"client", "network", "server"}  # a 0 ms unexplained is not a part to show
        cells = bar_cells(panel)
        assert len(cells) == panel.content_size.width  # the width of the panel
        shown = {g: ms for g, ms in groups.items() if ms >= MIN_SHARE * a.total_ms}
        for group, ms in shown.items():
            exact = ms * len(cells) / sum(shown.values())
            assert abs(cells.count(group) - exact) <= len(shown), (group, cells.count(group), exact)
        assert cells == sorted(cells, key=GROUPS.index)  # one segment per group, in bar order
        # The key: the groups in words, each with its bar glyph, largest first; wrapped between entries.
        want = key_text(groups, a.total_ms)
        assert want.startswith("█ server") and "█ client" in want and "█ network" in want
        lines = panel_lines(panel)
        key_count = next(i for i, line in enumerate(lines[1:]) if line.startswith("server times"))
        assert key_lines(panel, 1, key_count) == want
        assert all(len(line) <= panel.content_size.width for line in lines)  # wrapped, never cut
        assert styles_of(panel, "█ server") >= {"$accent"} and styles_of(panel, "█ network") >= {"$primary"}
        assert lines[1 + key_count] == "server times: llmchat serve"
        # One reply in the window, the one just split: the same shares, in the same words.
        assert window_text(panel) == "last 1 reply: " + key_text(groups, a.total_ms, glyphs=False)
        # A failure changes the bar, not the window's shares (it has no reply from the network).
        finish(app.bus, record(error="refused", error_kind="connect"))
        await until(pilot, lambda: "the request ended early (connect)" in panel_text(panel), "the failure")
        assert window_text(panel) == "last 1 reply: " + key_text(groups, a.total_ms, glyphs=False)


async def test_a_routine_clock_overlap_is_folded_into_the_server_and_a_large_one_is_an_overlap() -> None:
    app = HudApp()
    async with app.run_test(size=(90, 50)) as pilot:
        hud = app.query_one(Hud)
        panel = hud.attribution
        # OpenAI's header says 1 ms more than the 19.5 ms from the end of the send to the headers.
        small = record(ttft_ms=60.0, total_ms=400.0, ttfb_ms=20.0, reused=True, server_processing_ms=20.5)
        a = attribute(small)
        assert -MUTE_MS < a.ms("unexplained") < 0 and any(OVERLAP_NOTE in n for n in a.notes)
        finish(app.bus, small)
        await until(pilot, lambda: "server" in panel_line(panel, 1), "the first split")
        assert "unexplained" not in panel_text(panel) and "overlap" not in panel_text(panel)
        assert "░" not in panel_line(panel, 0)
        # llmchat serve on a busy machine: the first token met a one-way delay 32.5 ms longer than the last,
        # over a 4.9 s stream. 0.7 % of what the server reported: routine, folded into the server's figure.
        busy = served(record(ttft_ms=272.0, total_ms=5163.0, reused=True), early_ms=40.0, late_ms=7.5)
        b = attribute(busy)
        assert b.ms("unexplained") == pytest.approx(-32.5, abs=0.01)
        finish(app.bus, busy)
        await until(pilot, lambda: hud.metrics.last is busy and "server" in panel_line(panel, 1),
                    "the long stream")
        groups = hud.metrics.last_groups
        assert "unexplained" not in groups
        assert sum(groups.values()) == pytest.approx(b.total_ms)  # the parts still sum to the total
        assert groups["server"] == pytest.approx(b.group_ms()["server"] - 32.5, abs=0.01)
        assert "overlap" not in panel_text(panel) and "reported 32.5" not in panel_text(panel)
        assert " -" not in panel_text(panel)  # no negative share anywhere
        # 150 ms more than a 19.5 ms span: that is news, said as an overlap (warning colour) with its reason.
        large = record(ttft_ms=60.0, total_ms=400.0, ttfb_ms=20.0, reused=True, server_processing_ms=170.0)
        finish(app.bus, large)
        await until(pilot, lambda: "overlap" in panel_text(panel), "the overlap")
        overlap = -attribute(large).ms("unexplained")
        assert f"overlap {duration(overlap)}" in panel_text(panel)
        assert styles_of(panel, f"overlap {duration(overlap)}") == {"$warning"}
        assert f"the server reported {duration(overlap)} more than the client measured" in panel_text(panel)
        assert "negative unexplained" not in panel_text(panel) and "? -" not in panel_text(panel)
    # `ask --stats` prints the same shares as the HUD: the routine overlaps folded, the large one said.
    assert "unexplained" not in format_shares(attribute(small))
    assert "unexplained" not in format_shares(b) and " -" not in format_shares(b)
    assert "unexplained -" in format_shares(attribute(large))


async def test_the_panel_shows_flags_as_badges_and_says_a_cache_hit_in_words() -> None:
    app = HudApp()
    async with app.run_test(size=(120, 50)) as pilot:
        panel = app.query_one(Hud).attribution
        # Three ordinary first tokens, then one far slower after two minutes of silence: a cold start.
        finish(app.bus, *(served(record(ttft_ms=50.0, total_ms=300.0)) for _ in range(3)))
        cold = served(record(ttft_ms=900.0, total_ms=1200.0, t0_ns=T0 + 120 * 10**9))
        finish(app.bus, cold)
        await until(pilot, lambda: "cold start" in panel_text(panel), "the cold-start badge")
        assert styles_of(panel, " cold start ") == {BADGES["cold_start"][1]}
        # The server queued it for most of its first token: saturated.
        busy = served(record(ttft_ms=200.0, total_ms=500.0, t0_ns=T0 + 121 * 10**9), queue_ms=150.0)
        finish(app.bus, busy)
        await until(pilot, lambda: "saturated" in panel_text(panel), "the saturation badge")
        assert "cold start" not in panel_text(panel)
        window = window_text(panel)
        assert window.startswith("last 5 replies: ")
        finish(app.bus, record(cache_hit=True, total_ms=2.0))
        await until(pilot, lambda: "cache" in panel_text(panel), "the cache hit")
        lines = panel_lines(panel)
        assert lines[1] == "answered from the cache in 2.0 ms"
        assert "client 100%" not in panel_text(panel)  # said in words, not as a split
        assert window_text(panel) == window  # the replies from the server, untouched by a reply from the disk


async def test_a_cancel_says_where_its_time_went() -> None:
    app = HudApp()
    async with app.run_test(size=(90, 50)) as pilot:
        panel = app.query_one(Hud).attribution
        cancelled = record(ttft_ms=400.0, total_ms=1200.0, reused=True, cancelled=True,
                           error_kind="cancelled")
        finish(app.bus, cancelled)
        await until(pilot, lambda: "cancelled" in panel_text(panel), "the cancel")
        text_ = panel_text(panel)
        assert "cancelled after 1200 ms: 400 ms waiting for the first token, 800 ms streaming" in text_
        assert "ended early" not in text_ and "no reply yet" not in text_
        assert panel_text(panel).endswith(
            "no reply from the server yet (cancels, errors and cache hits are left out)")
    early = record(ttft_ms=None, total_ms=700.0, cancelled=True, error_kind="cancelled")
    early.first_token_ns = None
    batch = record(mode="batch", total_ms=700.0, cancelled=True, error_kind="cancelled")
    for r, said in ((early, "cancelled after 700 ms, waiting for the first token"),
                    (batch, "cancelled after 700 ms, waiting for the reply")):
        lines = render_attribution(attribute(r), shown_groups(attribute(r)), r, {}, 0, 80)
        assert said in " ".join(line.plain for line in lines)


async def test_notes_wrap_to_the_panel_instead_of_being_cut() -> None:
    app = HudApp()
    async with app.run_test(size=(90, 50)) as pilot:
        panel = app.query_one(Hud).attribution
        full = served(record(ttft_ms=60.0, total_ms=400.0))
        full.server_metrics = {"requests_waiting": 3.0, "requests_running": 8.0, "kv_cache_usage": 0.97}
        notes = attribute(full).notes
        assert notes and sum(map(len, notes)) > 2 * panel.content_size.width
        finish(app.bus, full)
        await until(pilot, lambda: "KV cache" in panel_text(panel), "the notes")
        width = panel.content_size.width
        assert all(len(line) <= width for line in panel_lines(panel))
        # Every line gets its row, at the layout after the paint.
        await until(pilot, lambda: panel.size.height == len(panel_lines(panel)), "the panel to take its rows")
        for note in notes:
            assert note in panel_text(panel)


async def test_the_panel_repaints_only_when_a_request_finished() -> None:
    app = HudApp()
    async with app.run_test(size=(90, 50)) as pilot:
        hud = app.query_one(Hud)
        finish(app.bus, served(record()))
        await until(pilot, lambda: "server" in panel_line(hud.attribution, 1), "the first split")
        painted = hud.attribution.content
        r = record(t0_ns=time.perf_counter_ns())
        r.first_token_ns = r.last_token_ns = r.end_ns = None
        app.bus.publish(RequestStarted(r))
        app.bus.publish(Chunk(r, "x", time.perf_counter_ns()))
        hud.metrics.observe_render_lag(5.0)
        await until(pilot, lambda: "median" in text(hud.lag_line) and "elapsed" in text(hud.pending_panel),
                    "the live lines")
        assert hud.attribution.content is painted  # other topics repainted, not this one
        r.first_token_ns = r.t0_ns + 40_000_000
        r.last_token_ns = r.end_ns = r.t0_ns + 90_000_000
        app.bus.publish(RequestDone(r))
        await until(pilot, lambda: hud.attribution.content is not painted, "the repaint on done")


async def test_a_reported_model_load_is_a_cold_start_badge_on_the_very_first_request() -> None:
    app = HudApp()
    async with app.run_test(size=(120, 50)) as pilot:
        panel = app.query_one(Hud).attribution
        # No history at all: the server said it loaded the model, and that is enough.
        cold = served(record(ttft_ms=1700.0, total_ms=1800.0))
        assert cold.server_timing is not None
        cold.server_timing["model_load_ns"] = 1_500 * 10**6
        finish(app.bus, cold)
        await until(pilot, lambda: "cold start" in panel_text(panel), "the cold-start badge")
        assert "server reported 1500 ms of model load" in panel_text(panel)
        assert panel_line(panel, 1).startswith("█ server ")


def test_the_server_line_says_what_the_metrics_show() -> None:
    busy = render_server(ServerState("local", {"requests_waiting": 2.0, "requests_running": 1.0,
                                               "kv_cache_usage": 0.43}))
    assert busy.plain == "server 2 waiting · 1 running · KV 43%"
    idle = render_server(ServerState("local", {"requests_waiting": 0.0, "requests_running": 0.0}))
    assert idle.plain == "server 0 waiting · 0 running"
    failed = render_server(ServerState("local", None, "HTTP 404", {"requests_waiting": 2.0}))
    assert failed.plain == "server metrics failed: HTTP 404; before: 2 waiting"
    assert render_server(ServerState("local", {})).plain == "server no queue gauges in its /metrics"


async def test_the_server_line_shows_once_scraped_and_only_for_the_provider_shown() -> None:
    app = HudApp()
    async with app.run_test(size=(90, 50)) as pilot:
        hud = app.query_one(Hud)
        hud.provider = "local"
        await pilot.pause()
        assert not hud.server_line.display  # no metrics_url, no scrape: the HUD keeps its layout
        app.bus.publish(ServerMetricsSampled("local", {"requests_waiting": 1.0, "requests_running": 1.0}))
        await until(pilot, lambda: hud.server_line.display, "the server line")
        assert text(hud.server_line) == "server 1 waiting · 1 running"
        assert styles_of(hud.server_line, "1 waiting") == {"$warning"}
        app.bus.publish(ServerMetricsSampled("local", None, "connection refused"))
        await until(pilot, lambda: "failed" in text(hud.server_line), "the failed scrape")
        hud.provider = "other"  # another provider's queue says nothing about this one
        await until(pilot, lambda: not hud.server_line.display, "the line hidden")


def test_the_headroom_lines_say_what_is_left_and_colour_it_with_the_threshold_beside() -> None:
    from llmchat.core.observe import Headroom
    from llmchat.tui.widgets.hud._headroom import render_headroom

    lines = render_headroom(Headroom(60, 48, 12.0, 150_000, 9_000, 0.006), 0.1)
    assert [line.plain for line in lines] == [
        "requests 48 of 60 left · full in 12.0 s",
        "tokens 9,000 of 150,000 left, under 10% · full in 6.0 ms",
    ]
    low = lines[1]
    start = low.plain.index("9,000")
    assert {str(s.style) for s in low.spans if s.start <= start < s.end} == {"$error"}
    assert render_headroom(Headroom(limit_requests=10, remaining_requests=1), 0.05)[0].plain == (
        "requests 1 of 10 left")  # 10 % left is not under 5 %
    assert render_headroom(None, 0.1) == []


async def test_the_hud_shows_headroom_holds_and_cost_per_mode() -> None:
    from llmchat.core.observe import Headroom, RateLimitHeld
    from llmchat.core.policy import ProviderLimiter

    ui = UISettings(prices={"llmchat-local": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}})
    app = HudApp(ui)
    async with app.run_test(size=(90, 50)) as pilot:
        hud = app.query_one(Hud)
        hud.provider = "local"
        await pilot.pause()
        assert not hud.headroom_lines.display  # no headers yet: the HUD keeps its layout
        held = record(usage_from_server=True, prompt_tokens=10)
        held.end_ns = None
        app.bus.publish(RequestStarted(held))
        limiter = ProviderLimiter("local", rpm=1)
        limiter.reserve()
        app.bus.publish(RateLimitHeld(held, limiter.reserve()))
        await until(pilot, lambda: "client rate limit" in text(hud.stats), "the hold line")
        assert "client rate limit 60.0 s (requests)" in text(hud.stats)
        done = record(usage_from_server=True, prompt_tokens=10, headroom=Headroom(60, 2, 58.0))
        app.bus.publish(RequestDone(done))
        batch = record(mode="batch", ttft_ms=None, usage_from_server=True, prompt_tokens=10)
        app.bus.publish(RequestDone(batch))
        await until(pilot, lambda: hud.headroom_lines.display, "the headroom lines")
        assert text(hud.headroom_lines) == "requests 2 of 60 left, under 10% · full in 58.0 s"
        assert "cost ≈ $0.00022 · batch $0.00011 · stream $0.00011" in text(hud.stats)
        held.end_ns = T0 + 400_000_000
        app.bus.publish(RequestDone(held))
        await until(pilot, lambda: "client rate limit" not in text(hud.stats), "the hold line cleared")
