"""The state line under a pending reply, in the app: Pilot drives it against the local server and scripted
peers on real sockets, with a real SQLite history. What it says at each stage of a request (waiting, thinking,
streaming, stalled, a rate limit counting down, from cache), that it goes when the reply ends, and that it is
there at any width, with or without the HUD."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import peers as P
from test_app import MODEL, _settings, _until

from llmchat.core import CacheSettings, ChatClient, RetrySettings, Settings, UISettings
from llmchat.core.history._store import HistoryStore
from llmchat.core.policy import RateLimits
from llmchat.core.server import RunningServer
from llmchat.tui.app import ChatApp, make_app
from llmchat.tui.widgets.chat import ChatMessage, PromptInput
from llmchat.tui.widgets.hud import Hud

Factory = Callable[..., RunningServer]


def _answer(*pieces: str, gap_s: float = 0.0, stall_s: float = 0.0) -> list[P.Step]:
    """A streamed reply of ``pieces``, ``gap_s`` apart, with a silence of ``stall_s`` after the first."""
    steps: list[P.Step] = [P.SSE_HEAD]
    for index, piece in enumerate(pieces):
        if index == 1 and stall_s:
            steps.append(P.Pause(stall_s))
        elif index and gap_s:
            steps.append(P.Pause(gap_s))
        last = index == len(pieces) - 1
        steps.append(P.event(P.delta(piece, finish_reason="stop" if last else None)))
    return [*steps, P.DONE, P.END]


def _app_at(base_url: str, tmp_path: Path, settings: Settings) -> ChatApp:
    """The app on llmchat's own server (h2c)."""
    client = ChatClient(settings, base_url=base_url, model=MODEL, http2="h2c")
    return make_app(settings=settings, client=client, store=HistoryStore(tmp_path / "history.sqlite3"))


def _peer_app(p: P.Peer, tmp_path: Path, **changes: Any) -> ChatApp:
    """The app on a scripted peer (HTTP/1.1), with ``changes`` to the test settings."""
    settings = _settings(tmp_path, **changes)
    client = ChatClient(settings, base_url=p.base_url, model=MODEL, http2=False)
    return make_app(settings=settings, client=client, store=HistoryStore(tmp_path / "history.sqlite3"))


async def _send(pilot: Any, app: ChatApp, text: str) -> ChatMessage:
    app.query_one(PromptInput).text = text
    await pilot.press("enter")
    # The reply itself, not the thinking block a reasoning model's reply mounts above it (an aside).
    await _until(pilot, lambda: len([m for m in app.query(ChatMessage) if not m.ASIDE]) == 1)
    return next(m for m in app.query(ChatMessage) if not m.ASIDE)


def _seen(reply: ChatMessage, log: list[str]) -> Callable[[], bool]:
    """A condition that also keeps every state line painted so far in ``log``."""
    def check() -> bool:
        if reply.live_text and (not log or log[-1] != reply.live_text):
            log.append(reply.live_text)
        return False
    return check


async def _watch_until(pilot: Any, reply: ChatMessage, log: list[str], cond: Callable[[], bool],
                       timeout: float = 15.0) -> None:
    keep = _seen(reply, log)
    await _until(pilot, lambda: keep() or cond(), timeout)


async def _states(app: ChatApp, prompt: str, *, width: int = 120) -> tuple[ChatMessage, list[str]]:
    """Send ``prompt`` and keep every state line its reply showed until it ended: the reply, and the lines."""
    log: list[str] = []
    async with app.run_test(size=(width, 40)) as pilot:
        reply = await _send(pilot, app, prompt)
        await _watch_until(pilot, reply, log, lambda: reply.is_final)
    return reply, log


async def test_waiting_then_streaming_then_gone_when_the_reply_ends(server_factory: Factory,
                                                                    tmp_path: Path) -> None:
    server = server_factory(ttft_ms=700, tokens_per_s=30)
    app = _app_at(server.base_url, tmp_path, _settings(tmp_path, ui=UISettings(stall_s=30.0)))
    log: list[str] = []
    async with app.run_test(size=(120, 40)) as pilot:
        reply = await _send(pilot, app, "tell me about latency")
        assert reply.label == MODEL  # labelled with the model from the start
        await _watch_until(pilot, reply, log, lambda: reply.live_text.startswith("streaming"))
        waiting = [line for line in log if line.startswith("waiting for the first token")]
        assert waiting, log
        # Counting up, from the request's start.
        counted = [float(line.rsplit("·", 1)[1].removesuffix(" s")) for line in waiting]
        assert counted == sorted(counted) and counted[-1] > counted[0], waiting
        # Past the first token (a loaded machine can show "1 token" first: the singular is right then).
        await _watch_until(pilot, reply, log, lambda: " tokens · TTFT " in reply.live_text)
        line = reply.live_text
        assert line.startswith("streaming · ") and line.endswith(" s"), line
        assert all(" 1 tokens" not in seen for seen in log), log
        # The row right after the text is the state line, inside the rows the reply holds (once laid out: a
        # loaded machine may paint the line a frame before the layout catches up).
        await _until(pilot, lambda: reply.region.height > len(reply.lines_for(reply.inner_width)), 15.0)
        await pilot.press("escape")
        await _until(pilot, lambda: reply.is_final)
        assert reply.live_text == "" and reply.status == "cancelled"
        assert "streaming ·" not in reply.rendered_text()
        assert reply.rendered_text().splitlines()[0] == MODEL


async def test_batch_mode_waits_for_the_whole_reply_and_says_so(server_factory: Factory,
                                                                tmp_path: Path) -> None:
    server = server_factory(ttft_ms=900, tokens_per_s=0)
    settings = replace(_settings(tmp_path, ui=UISettings(stall_s=30.0)), cache=CacheSettings(policy="off"))
    app = _app_at(server.base_url, tmp_path, settings)
    log: list[str] = []
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("ctrl+b")
        reply = await _send(pilot, app, "all at once")
        await _watch_until(pilot, reply, log, lambda: reply.is_final)
        assert reply.status == "done" and reply.live_text == ""
    # The request the client opened inside complete() is the one followed: its clock, counting up.
    waited = [float(line.rsplit(" · ", 1)[1].removesuffix(" s")) for line in log
              if line.startswith("waiting for the reply · ")]
    assert len(waited) >= 3 and waited == sorted(waited) and waited[-1] >= 0.5, log


async def test_a_429_counts_down_in_words_then_the_reply_comes(peer: Callable[..., P.Peer],
                                                               tmp_path: Path) -> None:
    limited = P.json_response(429, {"error": {"message": "Rate limit reached"}}, headers={"retry-after": "2"})
    p = peer([limited], then="keep", later=_answer("All ", "good."), chat_only=True)
    app = _peer_app(p, tmp_path, retry=RetrySettings(max_attempts=4, max_delay_s=10.0))
    reply, log = await _states(app, "hello", width=160)
    assert reply.status == "done" and reply.text == "All good."
    countdown = [line for line in log if "retry 2 of 4 in" in line]
    assert countdown, log
    assert all(line.startswith("server asked to wait 2 s (rate limited, HTTP 429) · retry 2 of 4 in ")
               for line in countdown), countdown
    assert countdown[0].endswith("Esc cancels · " + countdown[0].rsplit(" · ", 1)[1])
    lefts = [float(line.split(" in ", 1)[1].split(" s", 1)[0]) for line in countdown]
    assert lefts == sorted(lefts, reverse=True) and lefts[0] - lefts[-1] >= 0.5, lefts  # it counts down
    assert not any("retry-after" in line.lower() for line in log), log
    assert p.requests == 2


async def test_after_a_429_the_next_prompt_is_held_by_the_client_and_counts_down_to_its_send(
        peer: Callable[..., P.Peer], tmp_path: Path) -> None:
    # No retries: the 429 ends the first reply; the prompt sent again at once is held by the app's own
    # limiter, which learnt the server's Retry-After, and goes out when it has passed.
    limited = P.json_response(429, {"error": {"message": "Rate limit reached"}}, headers={"retry-after": "2"})
    p = peer([limited], then="keep", later=_answer("All ", "good."), chat_only=True)
    settings = _settings(tmp_path, retry=RetrySettings(max_attempts=1))
    client = ChatClient(settings, base_url=p.base_url, model=MODEL, http2=False, limits=RateLimits())
    app = make_app(settings=settings, client=client, store=HistoryStore(tmp_path / "history.sqlite3"))
    log: list[str] = []
    async with app.run_test(size=(160, 40)) as pilot:
        first = await _send(pilot, app, "hello")
        await _until(pilot, lambda: first.is_final)
        assert first.status == "error"
        app.query_one(PromptInput).text = "hello again"
        await pilot.press("enter")
        await _until(pilot, lambda: len([m for m in app.query(ChatMessage) if not m.ASIDE]) == 2)
        second = [m for m in app.query(ChatMessage) if not m.ASIDE][-1]
        await _watch_until(pilot, second, log, lambda: second.is_final)
    assert second.status == "done" and second.text == "All good.", (second.status, second.text)
    held = [line for line in log if line.startswith("held: the server asked to wait (HTTP 429) · sends in ")]
    assert held, log
    lefts = [float(line.split("sends in ", 1)[1].split(" s", 1)[0]) for line in held]
    assert lefts == sorted(lefts, reverse=True) and lefts[0] - lefts[-1] >= 0.5, lefts  # it counts down
    assert all(" · Esc cancels · " in line for line in held), held
    assert p.requests == 2


async def test_a_stall_says_so_then_streaming_resumes(peer: Callable[..., P.Peer], tmp_path: Path) -> None:
    # A second of streaming before the stall shows: a loaded machine may not read the line in the first half.
    p = peer(_answer("Kept ", "and the rest.", stall_s=2.2), then="keep", chat_only=True)
    app = _peer_app(p, tmp_path, ui=UISettings(stall_s=1.0))
    reply, log = await _states(app, "hello")
    assert reply.text == "Kept and the rest."
    stalled = [line for line in log if line.startswith("stalled: no token for")]
    assert stalled and all("1 token so far · Esc cancels" in line for line in stalled), log
    assert log.index(stalled[0]) > 0 and log[0].startswith(("sending", "waiting", "streaming")), log


async def test_reasoning_before_the_answer_shows_as_thinking(peer: Callable[..., P.Peer],
                                                             tmp_path: Path) -> None:
    steps: list[P.Step] = [P.SSE_HEAD, P.event(P.delta(reasoning_content="Let me see.")), P.Pause(1.2),
                           P.event(P.delta(reasoning_content=" Yes.")), P.Pause(1.0),
                           P.event(P.delta("Answer.", finish_reason="stop")), P.DONE, P.END]
    p = peer(steps, then="keep", chat_only=True)
    app = _peer_app(p, tmp_path, ui=UISettings(stall_s=30.0))
    reply, log = await _states(app, "think first")
    assert reply.text == "Answer."
    thinking = [line for line in log if line.startswith("thinking")]
    assert "thinking · 11 characters of reasoning" in [line.rsplit(" · ", 1)[0] for line in thinking], log
    assert "thinking · 16 characters of reasoning" in [line.rsplit(" · ", 1)[0] for line in thinking], log


async def test_a_cached_reply_says_from_cache(local_server: RunningServer, tmp_path: Path) -> None:
    settings = replace(_settings(tmp_path), cache=CacheSettings(path=str(tmp_path / "cache"), policy="always",
                                                               replay_streams=True))
    app = _app_at(local_server.base_url, tmp_path, settings)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("ctrl+b")  # batch mode fills the cache
        first = await _send(pilot, app, "cache me")
        await _until(pilot, lambda: first.is_final)
        await pilot.press("ctrl+n", "ctrl+b")
        await _until(pilot, lambda: not app.query(ChatMessage))
        second = await _send(pilot, app, "cache me")  # stream mode, replayed from the cache
        await _until(pilot, lambda: second.is_final)
        assert second.text == first.text
        assert "from cache" in second.rendered_text().splitlines()[-1]


async def test_the_state_line_is_there_without_the_hud_at_60_columns(server_factory: Factory,
                                                                       tmp_path: Path) -> None:
    server = server_factory(ttft_ms=1500, tokens_per_s=30)
    settings = _settings(tmp_path, ui=UISettings(stall_s=30.0),
                         keymap={"reply.cancel": "ctrl+x"})
    app = _app_at(server.base_url, tmp_path, settings)
    async with app.run_test(size=(60, 20)) as pilot:
        assert not app.query_one(Hud).display
        reply = await _send(pilot, app, "narrow")
        await _until(pilot, lambda: reply.live_text.startswith("waiting"))
        assert len(reply.live_text) <= reply.inner_width
        # The row under the label is the state line, fitted to the width, as the screen shows it.
        row = reply.row_after_lines(0, reply.inner_width)
        assert row is not None and "".join(s.text for s in row).strip() == reply.live_text
        await pilot.press("ctrl+x")  # the remapped cancel key
        await _until(pilot, lambda: reply.is_final and not app.replying)


async def test_the_state_line_ticks_are_repaints_not_layouts(server_factory: Factory,
                                                                         tmp_path: Path) -> None:
    """Over a second of waiting, the state line repaints about 10 times and lays nothing out."""
    server = server_factory(ttft_ms=1500, tokens_per_s=30)
    app = _app_at(server.base_url, tmp_path, _settings(tmp_path, ui=UISettings(stall_s=30.0)))
    async with app.run_test(size=(120, 40)) as pilot:
        reply = await _send(pilot, app, "slow start")
        await _until(pilot, lambda: reply.live_text.startswith("waiting"))
        layouts: list[float] = []
        original = reply.refresh

        def counting(*args: Any, **kw: Any) -> Any:
            if kw.get("layout"):
                layouts.append(time.monotonic())
            return original(*args, **kw)

        reply.refresh = counting  # type: ignore[method-assign]
        before = reply.live_repaints
        started = time.monotonic()
        await pilot.pause(0.6)
        elapsed = time.monotonic() - started
        repaints = reply.live_repaints - before
        assert reply.live_text.startswith("waiting")
        assert 1 <= repaints <= elapsed * 10 + 1, (repaints, elapsed)
        assert layouts == []
        await pilot.press("escape")
        await _until(pilot, lambda: reply.is_final)
