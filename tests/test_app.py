"""The chat app end to end: Pilot drives it against the local server, with a real SQLite history."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from textual.pilot import Pilot

from llmchat.core import (
    CacheSettings,
    ChatClient,
    HttpSettings,
    ProviderSettings,
    RetryPlanned,
    RetrySettings,
    Settings,
)
from llmchat.core.history._store import HistoryStore
from llmchat.core.server import RunningServer
from llmchat.tui.app import ChatApp, Offline, make_app
from llmchat.tui.widgets.chat import ChatMessage, PromptInput
from llmchat.tui.widgets.hud import Hud

Factory = Callable[..., RunningServer]

MODEL = "llmchat-local"


def _settings(tmp_path: Path, **changes: Any) -> Settings:
    base = replace(Settings(), cache=CacheSettings(path=str(tmp_path / "cache"), policy="always"),
                   http=replace(HttpSettings(), warmup=False))
    return replace(base, **changes)


def _app(server: RunningServer, tmp_path: Path, *, settings: Settings | None = None, **kw: Any) -> ChatApp:
    settings = settings or _settings(tmp_path)
    client = ChatClient(settings, base_url=server.base_url, model=MODEL, http2="h2c")
    store = HistoryStore(tmp_path / "history.sqlite3")
    return make_app(settings=settings, client=client, store=store, **kw)


async def _until(pilot: Pilot[Any], cond: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await pilot.pause(0.02)


async def _send(pilot: Pilot[Any], app: ChatApp, text: str) -> ChatMessage:
    prompt = app.query_one(PromptInput)
    prompt.text = text
    before = len(app.query(ChatMessage))
    await pilot.press("enter")
    await _until(pilot, lambda: len(app.query(ChatMessage)) > before)
    return list(app.query(ChatMessage))[-1]


async def test_send_streams_a_reply_and_saves_it(server_factory: Factory, tmp_path: Path) -> None:
    server = server_factory(tokens_per_s=400)
    app = _app(server, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        reply = await _send(pilot, app, "hello there")
        await _until(pilot, lambda: reply.is_final)
        assert reply.status == "done" and "hello there" in reply.text
        assert "TTFT" in reply.note and "HTTP/2" in reply.note
        hud = app.query_one(Hud)
        await _until(pilot, lambda: hud.metrics.requests >= 1 and hud.metrics.in_flight == 0)
        conv_id = app.conversation_id
        assert conv_id is not None
        conv = await app.store.load(conv_id)
    assert [m.role for m in conv.messages] == ["user", "assistant"]
    assert conv.messages[1].content == reply.text and conv.messages[1].status == "done"
    assert conv.messages[1].record and conv.messages[1].record["http_version"] == "HTTP/2"


async def test_escape_cancels_and_keeps_the_partial_reply(server_factory: Factory, tmp_path: Path) -> None:
    server = server_factory(tokens_per_s=40)
    app = _app(server, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        reply = await _send(pilot, app, "a long one please")
        await _until(pilot, lambda: len(reply.text) > 10)
        await pilot.press("escape")
        await _until(pilot, lambda: reply.is_final)
        assert reply.status == "cancelled" and reply.text
        await _until(pilot, lambda: not app.replying)
        conv = await app.store.load(app.conversation_id)  # type: ignore[arg-type]
        saved = conv.messages[-1]
    assert saved.status == "cancelled" and saved.content == reply.text
    assert saved.record is not None and saved.record["cancelled"] is True


async def test_batch_mode_shows_a_cache_hit(local_server: RunningServer, tmp_path: Path) -> None:
    app = _app(local_server, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("ctrl+b")
        assert app.stream_mode is False and "batch" in app.query_one(Hud).mode
        first = await _send(pilot, app, "cache me")
        await _until(pilot, lambda: first.is_final)
        await pilot.press("ctrl+n")
        await _until(pilot, lambda: not app.query(ChatMessage))
        second = await _send(pilot, app, "cache me")
        await _until(pilot, lambda: second.is_final)
        assert first.status == "done" and second.status == "cached"
        assert second.text == first.text
        # The status line says "from cache" once, then the model and the lookup's time: no rate, no TTFT.
        assert re.fullmatch(r"from cache · llmchat-local · \d+ ms", second.rendered_text().splitlines()[-1])
        hud = app.query_one(Hud)
        await _until(pilot, lambda: hud.metrics.cache_hits == 1)


async def test_retry_is_visible_then_the_error_restores_the_prompt(
    server_factory: Factory, tmp_path: Path
) -> None:
    server = server_factory(error_rate=1.0)
    settings = _settings(tmp_path, retry=RetrySettings(max_attempts=2, base_delay_s=0.05, max_delay_s=0.05))
    app = _app(server, tmp_path, settings=settings)
    async with app.run_test(size=(140, 40)) as pilot:
        hud = app.query_one(Hud)
        shown: list[str | None] = []
        # The HUD's metrics subscribed first, so by the time this runs the HUD holds the live retry line.
        app.client.bus.subscribe(RetryPlanned, lambda e: shown.append(hud.metrics.pending_retry))
        reply = await _send(pilot, app, "will fail")
        await _until(pilot, lambda: reply.is_final)
        assert len(shown) == 1 and shown[0] is not None and shown[0].startswith("retry 2/2 in ")
        assert hud.metrics.pending_retry is None and hud.metrics.retries == 1
        assert reply.status == "error" and "after 2 attempts" in reply.note
        assert app.query_one(PromptInput).text == "will fail"
        assert any("after 2 attempts" in str(n.message) for n in app._notifications)


async def test_history_is_resumed_after_a_restart(local_server: RunningServer, tmp_path: Path) -> None:
    app = _app(local_server, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        reply = await _send(pilot, app, "remember me")
        await _until(pilot, lambda: reply.is_final)
        first_text = reply.text
    again = _app(local_server, tmp_path, continue_last=True)
    async with again.run_test(size=(140, 40)) as pilot:
        await _until(pilot, lambda: len(again.query(ChatMessage)) == 1)
        restored = again.query_one(ChatMessage)
        assert restored.text == first_text and restored.is_final
        assert again.history == [{"role": "user", "content": "remember me"},
                                 {"role": "assistant", "content": first_text}]
        # The next message continues the same conversation.
        reply = await _send(pilot, again, "and again")
        await _until(pilot, lambda: reply.is_final)
        conv = await again.store.load(again.conversation_id)  # type: ignore[arg-type]
    assert len(conv.messages) == 4


async def test_offline_badge_and_hud_toggle(local_server: RunningServer, tmp_path: Path) -> None:
    app = _app(local_server, tmp_path, offline=Offline(local_server.base_url))
    async with app.run_test(size=(140, 40)) as pilot:
        badge = app.query_one("#badge")
        assert "local server (offline demo)" in str(badge.render())
        hud = app.query_one(Hud)
        assert hud.display
        await pilot.press("f2")
        assert not hud.display
        await pilot.press("f2")
        assert hud.display
        await pilot.press("f5")  # the charts with axes, from anywhere in the app
        await _until(pilot, lambda: type(app.screen).__name__ == "HudDetail")
        await pilot.press("escape")
        await _until(pilot, lambda: app.screen is app.screen_stack[0])


async def test_hud_folds_away_on_narrow_terminals(local_server: RunningServer, tmp_path: Path) -> None:
    app = _app(local_server, tmp_path)
    async with app.run_test(size=(80, 30)) as pilot:
        await pilot.pause()
        assert not app.query_one(Hud).display


async def test_keymap_remaps_a_binding(local_server: RunningServer, tmp_path: Path) -> None:
    settings = _settings(tmp_path, keymap={"mode.toggle": "ctrl+t"})
    app = _app(local_server, tmp_path, settings=settings)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("ctrl+b")  # the old key no longer toggles
        assert app.stream_mode is True
        await pilot.press("ctrl+t")
        assert app.stream_mode is False


async def test_copy_last_reply(local_server: RunningServer, tmp_path: Path) -> None:
    app = _app(local_server, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        reply = await _send(pilot, app, "something with code")
        await _until(pilot, lambda: reply.is_final)
        await pilot.press("f3")
        assert app.clipboard == reply.text
        await pilot.press("f4")
        assert reply.code_blocks() and app.clipboard == reply.code_blocks()[-1]


async def test_request_log_and_metrics_port(local_server: RunningServer, tmp_path: Path) -> None:
    import json
    import urllib.request

    from llmchat.core.config._settings import LogSettings

    log = tmp_path / "requests.jsonl"
    settings = _settings(tmp_path, log=LogSettings(requests_path=str(log)))
    app = _app(local_server, tmp_path, settings=settings, metrics_port=0)
    async with app.run_test(size=(140, 40)) as pilot:
        reply = await _send(pilot, app, "log me")
        await _until(pilot, lambda: reply.is_final)
        exporter = next(o for o in app._observers if hasattr(o, "url"))
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(exporter.url, timeout=5).read().decode())
    assert "llmchat_request_duration_seconds" in body
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(lines) == 1 and lines[0]["http_version"] == "HTTP/2"


async def test_the_garbage_collector_is_frozen_only_when_the_program_asks(
    server_factory: Factory, tmp_path: Path
) -> None:
    import gc

    server = server_factory(tokens_per_s=0)
    before = gc.get_freeze_count()
    app = _app(server, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.pause()
        await pilot.pause()
        assert gc.get_freeze_count() == before  # a test run (or a library's process) is left as it was
    frozen = _app(server, tmp_path, freeze_gc=True)
    try:
        async with frozen.run_test(size=(140, 40)) as pilot:
            await _until(pilot, lambda: gc.get_freeze_count() > before)
    finally:
        gc.unfreeze()


async def test_the_app_scrapes_the_providers_metrics_and_keeps_cold_start_baselines(
    local_server: RunningServer, tmp_path: Path
) -> None:
    root = local_server.base_url.removesuffix("/v1")
    local = ProviderSettings(name="local", base_url=local_server.base_url, model=MODEL, http={"http2": "h2c"},
                             metrics_url=root + "/metrics", metrics_interval_s=0.05)
    settings = _settings(tmp_path, providers={"local": local})
    client = ChatClient(settings, provider="local")
    app = make_app(settings=settings, client=client, store=HistoryStore(tmp_path / "history.sqlite3"))
    async with app.run_test(size=(140, 40)) as pilot:
        hud = app.query_one(Hud)
        await _until(pilot, lambda: hud.server_line.display)  # scraped on its cadence, before any request
        assert "0 waiting · 0 running" in str(hud.server_line.content)
        reply = await _send(pilot, app, "am I saturating it")
        await _until(pilot, lambda: reply.is_final and hud.metrics.last is not None)
        last = hud.metrics.last
        assert last is not None and last.server_metrics is not None  # the record carries the snapshot
    # At exit the HUD's cold-start window went to the state folder, for the next run.
    state = Path(os.environ["XDG_STATE_HOME"]) / "llmchat" / "coldstart.json"
    [track] = json.loads(state.read_text())["tracks"]
    assert (track["provider"], track["model"]) == ("local", MODEL) and len(track["server"]) == 1


async def test_the_hud_shows_headroom_while_chatting_with_a_server_that_sends_it(  # type: ignore[no-untyped-def]
    server_factory, tmp_path: Path
) -> None:
    from llmchat.core.policy import RateLimits

    server = server_factory(profile="instant", rate_limit=30, rate_limit_tokens=9000)
    settings = _settings(tmp_path)
    client = ChatClient(settings, base_url=server.base_url, model=MODEL, http2="h2c", limits=RateLimits())
    app = make_app(settings=settings, client=client, store=HistoryStore(tmp_path / "history.sqlite3"))
    async with app.run_test(size=(140, 40)) as pilot:
        hud = app.query_one(Hud)
        assert not hud.headroom_lines.display
        reply = await _send(pilot, app, "how much is left")
        await _until(pilot, lambda: reply.is_final and hud.headroom_lines.display)
        shown = str(hud.headroom_lines.content)
        assert shown.startswith("requests 29 of 30 left · full in ")
        assert "tokens " in shown and " of 9,000 left" in shown
        assert client.limiter is not None and client.limiter.requests.capacity == 30  # learnt from the headers
