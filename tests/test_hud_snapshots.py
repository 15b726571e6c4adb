"""What the HUD looks like, as SVG snapshots (pytest-textual-snapshot): fed fixed records, nothing in flight,
so no clock reaches the picture. Laid out as in the app (its stylesheet, the HUD right of the chat) at 160x45
and 100x30, in stream and batch mode. Update with ``pytest tests/test_hud_snapshots.py --snapshot-update`` and
look at the SVGs under tests/__snapshots__/ before committing them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.app import App, ComposeResult
from textual.containers import Horizontal
from textual.pilot import Pilot
from textual.widgets import Static
from timing_records import T0, record

import llmchat.tui
from llmchat.core.config._settings import UISettings
from llmchat.core.observe._bus import Bus, FirstToken, RequestDone, RequestStarted, WarmupState
from llmchat.core.observe._timing import TimingRecord
from llmchat.core.policy._retry import RetryEvent
from llmchat.tui.widgets.hud import Hud

PRICES = {"llmchat-local": {"input_per_mtok": 0.15, "output_per_mtok": 0.6}}
SIZES = [(160, 45), (100, 30)]


class SnapshotApp(App[None]):
    CSS_PATH = str(Path(llmchat.tui.__file__).parent / "app.tcss")

    def __init__(self, ui: UISettings) -> None:
        super().__init__()
        self.bus = Bus()
        self.ui = ui

    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            yield Static("the chat", id="chat")
            yield Hud(bus=self.bus, ui=self.ui, id="hud")


def feed(bus: Bus, records: list[TimingRecord]) -> None:
    for r in records:
        bus.publish(RequestStarted(r))
        if r.first_token_ns is not None:
            bus.publish(FirstToken(r))
        bus.publish(RequestDone(r))


def server_timing(queue_ms: float, ttft_ms: float, total_ms: float, early_ms: float = 8.0,
                  late_ms: float = 10.0) -> dict[str, int]:
    """What llmchat serve reports (its own monotonic stamps): queued ``queue_ms``, first token sent
    ``early_ms`` before the client saw it, last token ``late_ms`` before the end."""
    ms = 1_000_000
    return {"received_ns": 0, "started_ns": int(queue_ms * ms),
            "first_token_ns": int((ttft_ms - early_ms) * ms), "last_token_ns": int((total_ms - late_ms) * ms)}


def stream_records() -> list[TimingRecord]:
    usage: dict[str, Any] = {"prompt_tokens": 1200, "usage_from_server": True}
    shape = [(62, 410), (48, 380), (55, 520), (140, 900), (51, 395), (230, 1210), (49, 402), (58, 450)]
    out = []
    for i, (ttft, total) in enumerate(shape):
        last = i == len(shape) - 1
        # The last one as a loaded machine sees it: its first token met a longer one-way delay than its last,
        # so the server's generation overruns the client's streaming span by 3 ms (a routine overlap).
        timing = server_timing(30.0 if last else 0.5, ttft, total, early_ms=12.0 if last else 8.0,
                               late_ms=9.0 if last else 10.0)
        out.append(record(ttft_ms=ttft, total_ms=total, ttfb_ms=ttft - 15, reused=i > 0, server_timing=timing,
                          **usage))
    out.insert(5, record(reused=True, error="localhost:8000 timed out", error_kind="timeout"))
    out.insert(7, record(ttft_ms=3.0, total_ms=9.0, reused=True, cache_hit=True, cache_lookup=True))
    return out


def batch_records() -> list[TimingRecord]:
    retried = record(mode="batch", total_ms=2400.0, ttfb_ms=2300.0, tls=False, error="503 from the server",
                     error_kind="server_error", status=503)
    retried.http_version = "HTTP/1.1"
    retried.retries = [RetryEvent(attempt=2, max_attempts=4, reason="503", status=503, wait_s=0.8,
                                  wait_source="backoff", error="503")]
    return [
        record(mode="batch", total_ms=900.0, ttfb_ms=880.0, cache_lookup=True),
        record(mode="batch", total_ms=1800.0, ttfb_ms=1790.0, reused=True, cache_lookup=True),
        record(mode="batch", total_ms=4100.0, ttfb_ms=4050.0, reused=True, cache_lookup=True),
        record(mode="batch", total_ms=11.0, reused=True, cache_hit=True, cache_lookup=True),
        retried,
    ]


def stream_app() -> SnapshotApp:
    return SnapshotApp(UISettings(prices=PRICES))


async def fed_stream(pilot: Pilot[None]) -> None:
    app = pilot.app
    assert isinstance(app, SnapshotApp)
    app.bus.publish(WarmupState("local", "warm", 0.84, setup_ms=1.9))
    feed(app.bus, stream_records())
    for ms in (1.8, 2.5, 3.1, 9.7):
        app.query_one(Hud).metrics.observe_render_lag(ms)
    app.query_one(Hud).paint()
    await pilot.pause()


async def fed_batch(pilot: Pilot[None]) -> None:
    app = pilot.app
    assert isinstance(app, SnapshotApp)
    hud = app.query_one(Hud)
    hud.mode = "batch"
    hud.provider, hud.model, hud.host = "vllm", "Qwen2.5-7B-Instruct", "127.0.0.1:8001"
    app.bus.publish(WarmupState("vllm", "failed", None, "connection refused by 127.0.0.1:8001: nothing is "
                                "listening there; start the server or fix base_url"))
    feed(app.bus, batch_records_for("vllm"))
    hud.paint()
    await pilot.pause()


def batch_records_for(provider: str) -> list[TimingRecord]:
    out = batch_records()
    for r in out:
        r.provider, r.model, r.host = provider, "Qwen2.5-7B-Instruct", "127.0.0.1:8001"
    return out


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_hud_in_stream_mode(snap_compare: Any, size: tuple[int, int]) -> None:
    assert snap_compare(stream_app(), terminal_size=size, run_before=fed_stream)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_hud_in_batch_mode_after_a_failed_retry(snap_compare: Any, size: tuple[int, int]) -> None:
    assert snap_compare(SnapshotApp(UISettings()), terminal_size=size, run_before=fed_batch)


def test_hud_after_a_cancel_and_a_single_reply(snap_compare: Any) -> None:
    """One reply is a point (one cell, min = median = max), and a cancel is said in words."""

    async def run(pilot: Pilot[None]) -> None:
        app = pilot.app
        assert isinstance(app, SnapshotApp)
        one = record(ttft_ms=263.0, total_ms=1400.0, reused=False)
        cancelled = record(ttft_ms=400.0, total_ms=1200.0, reused=True, t0_ns=T0 + 5 * 10**9, cancelled=True,
                           error_kind="cancelled")
        feed(app.bus, [one, cancelled])
        hud = app.query_one(Hud)
        hud.paint()
        await pilot.pause()
        hud.scroll_end(animate=False)  # down to where the time went, and the figures
        await pilot.pause()

    assert snap_compare(SnapshotApp(UISettings()), terminal_size=(100, 30), run_before=run)


def test_hud_detail_view(snap_compare: Any) -> None:
    async def open_detail(pilot: Pilot[None]) -> None:
        await fed_stream(pilot)
        pilot.app.query_one(Hud).focus()
        await pilot.press("d")
        await pilot.pause()

    assert snap_compare(stream_app(), terminal_size=(100, 36), run_before=open_detail)
