"""Thinking and tool calls in the history (a real SQLite file), its migration from the schema before it, the
exports (`llmchat export --thinking`) and `llmchat ask --json`, against `llmchat serve` over real sockets."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest
from history_files import make_old_history

from llmchat.core import ChatClient
from llmchat.core.history import HistoryStore, export_markdown, export_records_json
from llmchat.core.history._db import MIGRATIONS
from llmchat.core.server import RunningServer
from llmchat.tui.cli import main

#: This feature's migration, wherever the list has it (other migrations may be appended before it).
MINE = next(i for i, m in enumerate(MIGRATIONS) if any("reasoning" in s for s in m))
PROMPT = "is it raining in Lisbon"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


async def test_the_schema_before_it_migrates_and_keeps_its_replies(tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite3"
    make_old_history(db, version=MINE)
    async with HistoryStore(db) as store:
        old = await store.load(1)
        assert [(m.role, m.content, m.reasoning, m.tool_calls) for m in old.messages] == [
            ("user", "how slow?", "", []), ("assistant", "very", "", [])]
        assert old.messages[1].record == {"model": "llama3", "total_ms": 900.0}
        reply = await store.start_reply(1, provider="p", model="m", mode="stream")
        writer = store.reply_writer(reply)
        writer.append_reasoning("hmm")
        writer.append("yes")
        await writer.finish(status="done", tool_calls=[{"id": "c", "type": "function",
                                                        "function": {"name": "f", "arguments": "{}"}}])
        again = await store.load(1)
    assert (again.messages[2].reasoning, again.messages[2].content) == ("hmm", "yes")
    assert again.messages[2].tool_calls[0]["function"]["name"] == "f"
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (len(MIGRATIONS),)
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


async def _chat(server: RunningServer, store: HistoryStore) -> int:
    """One streamed reply saved as the app saves it: answer, thinking and tool calls apart."""
    conv = await store.new_conversation(title="weather")
    await store.add_user_message(conv, PROMPT)
    writer = store.reply_writer(await store.start_reply(conv, provider="local", model="m", mode="stream"))
    async with ChatClient(base_url=server.url + "/v1", model="llmchat-local") as client:
        stream = client.stream([{"role": "user", "content": PROMPT}], tools=TOOLS)
        stream.on_reasoning = lambda text, _ns: writer.append_reasoning(text)
        async for piece in stream:
            writer.append(piece)
    await writer.finish(status="done", record=stream.record.summary(),
                        tool_calls=[c.to_dict() for c in stream.tool_calls])
    return conv


async def test_thinking_and_tool_calls_are_kept_apart_and_exported(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    server = server_factory(ttft_ms=5, tokens_per_s=0, reasoning_tokens=16, tool_call=True)
    async with HistoryStore(tmp_path / "h.sqlite3") as store:
        conv = await store.load(await _chat(server, store))
    reply = conv.messages[1]
    assert reply.content == "" and len(reply.reasoning) > 20
    assert reply.tool_calls[0]["function"]["name"] == "get_weather"
    assert reply.record is not None and reply.record["tool_calls"] == 1
    assert reply.record["first_reasoning_ms"] is not None
    # Never sent back: the model gets neither its thinking nor an unanswered call.
    assert all(reply.reasoning not in m["content"] for m in conv.messages_for_api())
    plain, thinking = export_markdown(conv), export_markdown(conv, thinking=True)
    assert "**Tool call** `get_weather`" in plain and '"location": "is it raining in Lisbon"' in plain
    assert reply.reasoning.split()[0] not in plain.split("## Assistant")[1].split("**Tool call**")[0]
    assert "*Thinking:*" in thinking and f"> {reply.reasoning.strip().splitlines()[0]}" in thinking
    [record] = json.loads(export_records_json(conv))
    assert record["tool_call_list"] == reply.tool_calls and "reasoning" not in record
    assert json.loads(export_records_json(conv, thinking=True))[0]["reasoning"] == reply.reasoning


def test_llmchat_export_thinking_flag(
    server_factory: Callable[..., RunningServer], capsys: pytest.CaptureFixture[str]
) -> None:
    server = server_factory(ttft_ms=5, tokens_per_s=0, reasoning_tokens=16, tool_call=True)

    async def fill() -> str:
        async with HistoryStore() as store:
            await _chat(server, store)
            return (await store.load(1)).messages[1].reasoning

    reasoning = asyncio.run(fill())
    assert main(["export", "last"]) == 0
    out = capsys.readouterr().out
    assert "**Tool call** `get_weather`" in out and "*Thinking:*" not in out
    assert main(["export", "last", "--thinking"]) == 0
    assert f"> {reasoning.strip().splitlines()[0]}" in capsys.readouterr().out
    assert main(["export", "last", "--format", "json", "--thinking"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["reasoning"] == reasoning


@pytest.mark.parametrize("batch", [False, True], ids=["stream", "batch"])
def test_ask_json_carries_the_thinking_its_timing_and_the_tool_calls(
    server_factory: Callable[..., RunningServer], capsys: pytest.CaptureFixture[str], batch: bool
) -> None:
    server = server_factory(ttft_ms=5, tokens_per_s=400, reasoning_tokens=12, reasoning_inline=True)
    args = ["ask", PROMPT, "--base-url", server.url + "/v1", "--max-tokens", "8", "--json"]
    assert main(args + (["--batch"] if batch else [])) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["reasoning"].strip() and "<think>" not in obj["reply"] and obj["reply"].startswith("## ")
    assert obj["tool_call_list"] == [] and obj["tool_calls"] == 0
    if not batch:
        assert obj["ttft_ms"] == pytest.approx(obj["first_reasoning_ms"] + obj["thinking_ms"], abs=0.01)
        assert obj["reasoning_chunks"] >= 10
        assert any(p["key"] == "thinking" for p in obj["attribution"]["parts"])


def test_ask_prints_a_tool_call_it_never_runs(
    server_factory: Callable[..., RunningServer], capsys: pytest.CaptureFixture[str]
) -> None:
    server = server_factory(ttft_ms=5, tokens_per_s=0, tool_call=True)
    assert main(["ask", PROMPT, "--base-url", server.url + "/v1"]) == 0
    out = capsys.readouterr().out
    assert out == '[tool call get_weather: {"location": "is it raining in Lisbon", "unit": "celsius"}]\n'
