"""The app with a reasoning model: Pilot against `llmchat serve --reasoning-tokens / --tool-call`, a real
SQLite history. Thinking streams above the answer, folds once the answer begins, Ctrl+T toggles it; the HUD's
waterfall shows think then answer; a tool call is a card under the reply; resuming shows both again."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from llmchat.core import CacheSettings, ChatClient, HttpSettings, Settings, UISettings
from llmchat.core.history import HistoryStore
from llmchat.core.server import RunningServer
from llmchat.tui.app import ChatApp, make_app
from llmchat.tui.widgets.chat import ChatMessage, Conversation, PromptInput, ThinkingBlock, ToolCallCard
from llmchat.tui.widgets.hud._waterfall import THINK_STYLE, Waterfall, render_waterfall

MODEL = "llmchat-local"


def _app(server: RunningServer, tmp_path: Path, **ui: Any) -> ChatApp:
    settings = replace(Settings(), cache=CacheSettings(path=str(tmp_path / "cache"), policy="off"),
                       http=replace(HttpSettings(), warmup=False), ui=replace(UISettings(), **ui))
    client = ChatClient(settings, base_url=server.base_url, model=MODEL, http2="h2c")
    return make_app(settings=settings, client=client, store=HistoryStore(tmp_path / "history.sqlite3"))


async def _until(pilot: Any, cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await pilot.pause(0.01)


async def _send(pilot: Any, app: ChatApp, text: str) -> ChatMessage:
    app.query_one(PromptInput).text = text
    before = len(app.query_one(Conversation).messages())
    await pilot.press("enter")
    await _until(pilot, lambda: len(app.query_one(Conversation).messages()) >= before + 2)
    reply = app.query_one(Conversation).last_reply()
    assert reply is not None and not reply.ASIDE
    return reply


async def test_thinking_streams_above_the_answer_folds_and_toggles(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    # ~3 s of thinking at 40 tokens/s: long enough to see it stream before the answer, even on a loaded machine.
    server = server_factory(ttft_ms=50, tokens_per_s=40, reasoning_tokens=120, default_max_tokens=12)
    app = _app(server, tmp_path)
    async with app.run_test(size=(150, 45)) as pilot:
        reply = await _send(pilot, app, "why is the sky blue")
        await _until(pilot, lambda: bool(app.query(ThinkingBlock)))
        block = app.query_one(ThinkingBlock)
        view = app.query_one(Conversation)
        assert view.children.index(block) == view.children.index(reply) - 1  # right above the answer
        # While it thinks: open, streaming, and the answer still empty.
        await _until(pilot, lambda: len(block.text) > 40)
        assert block.status is None and block.expanded and reply.text == ""
        assert block.rendered_text().startswith("▾ thinking…")
        # The answer began: the thinking folded to its header, which says how long it took.
        await _until(pilot, lambda: bool(reply.text))
        assert block.status == "done" and not block.expanded
        header = block.rendered_text()
        assert header.startswith("▸ thought for ") and "Ctrl+T shows it" in header
        assert len(header.splitlines()) == 1
        await _until(pilot, lambda: reply.is_final and app.query_one(Waterfall)._shown is not None)
        record = app.query_one(Waterfall)._shown
        assert record is not None and record.thinking_ms is not None and record.thinking_ms > 1000
        assert "thought " in reply.note and "TTFT" in reply.note
        # The waterfall: think, then answer, in the TTFT row's two colours; the header says how long.
        drawn = render_waterfall(record, 60)
        assert f"thought {record.thinking_ms:.0f} ms" in drawn.plain.splitlines()[0]
        [ttft] = [line for line in drawn.split() if line.plain.startswith("ttft")]
        accent = "".join(ttft.plain[s.start:s.end] for s in ttft.spans if s.style == THINK_STYLE)
        assert "█" in accent and len(accent.strip()) >= len(ttft.plain.strip().split()[-1]) // 2
        await pilot.press("ctrl+t")
        assert block.expanded and block.rendered_text().startswith("▾ thought for ")
        assert block.text.strip().split()[0] in block.rendered_text()
        await pilot.press("ctrl+t")
        assert not block.expanded
        # Copying the reply copies the answer, never the thinking.
        assert app.query_one(Conversation).last_reply() is reply
        assert app.conversation_id is not None
        conv = await app.store.load(app.conversation_id)
    saved = conv.messages[1]
    assert saved.content == reply.text and saved.reasoning == block.text
    assert saved.record is not None and saved.record["thinking_ms"] == record.summary()["thinking_ms"]


async def test_a_tool_call_reply_shows_a_card_and_comes_back_on_resume(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    server = server_factory(ttft_ms=5, tokens_per_s=0, reasoning_tokens=8, reasoning_inline=True,
                            tool_call=True)
    app = _app(server, tmp_path, show_thinking=True)
    async with app.run_test(size=(150, 45)) as pilot:
        reply = await _send(pilot, app, "weather in Lisbon")
        await _until(pilot, lambda: reply.is_final and bool(app.query(ToolCallCard)))
        card = app.query_one(ToolCallCard)
        view = app.query_one(Conversation)
        assert view.children.index(card) == view.children.index(reply) + 1
        text = card.rendered_text()
        assert text.startswith("⚙ tool call get_weather (call_") and "not run" in text
        assert '  "location": "weather in Lisbon",' in text
        assert app.query_one(ThinkingBlock).expanded  # show_thinking keeps it open
        conv_id = app.conversation_id
    resumed = _app(server, tmp_path, show_thinking=False)
    resumed.conversation_id = None
    async with resumed.run_test(size=(150, 45)) as pilot:
        await resumed._load_conversation(conv_id)  # type: ignore[arg-type]
        await _until(pilot, lambda: bool(resumed.query(ToolCallCard)) and bool(resumed.query(ThinkingBlock)))
        block = resumed.query_one(ThinkingBlock)
        await _until(pilot, lambda: block.rendered_text().startswith("▸ thought"))  # rendered once laid out
        assert not block.expanded and len(block.rendered_text().splitlines()) == 1
        assert resumed.query_one(ToolCallCard).function_name == "get_weather"
        assert resumed.query_one(Conversation).last_reply() is resumed._last_reply


async def test_ctrl_t_with_no_thinking_says_so(server_factory: Callable[..., RunningServer],
                                               tmp_path: Path) -> None:
    server = server_factory(ttft_ms=5, tokens_per_s=0, default_max_tokens=8)
    app = _app(server, tmp_path)
    async with app.run_test(size=(150, 45)) as pilot:
        reply = await _send(pilot, app, "hi")
        await _until(pilot, lambda: reply.is_final)
        await pilot.press("ctrl+t")
        await _until(pilot, lambda: any("no reply here has thinking" in str(n.message)
                                        for n in app._notifications))
        assert not app.query(ThinkingBlock)


async def test_thinking_shown_as_the_answer_moves_to_the_block_when_its_bare_close_tag_comes(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    # The template opened <think> in the prompt: the stream starts with the thinking as plain content.
    server = server_factory(ttft_ms=20, tokens_per_s=60, reasoning_tokens=40, reasoning_open_in_prompt=True,
                            default_max_tokens=10)
    app = _app(server, tmp_path, show_thinking=True)
    async with app.run_test(size=(150, 45)) as pilot:
        reply = await _send(pilot, app, "why is the sky blue")
        await _until(pilot, lambda: reply.is_final)
        block = app.query_one(ThinkingBlock)
        view = app.query_one(Conversation)
        assert view.children.index(block) == view.children.index(reply) - 1
        assert "think>" not in reply.text and reply.text.startswith("## ")
        assert block.text.strip() and block.text.strip().split()[0] not in reply.text
        assert app.conversation_id is not None
        conv = await app.store.load(app.conversation_id)
    saved = conv.messages[1]
    assert saved.content == reply.text and saved.reasoning == block.text
