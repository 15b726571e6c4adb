"""A reply the model refused, after it arrived: kept in the history (status "refused", the words apart from the
answer, its migration from the schema before it), in the exports, on screen (Pilot against `llmchat serve
--refuse`, live and resumed) and never in the reply cache. Real SQLite files, real sockets."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from history_files import make_old_history
from test_app import MODEL, _send, _settings, _until

from llmchat.core import CacheSettings, ChatClient
from llmchat.core.history import HistoryStore, export_markdown, export_records_json
from llmchat.core.history._db import MIGRATIONS
from llmchat.core.server import RunningServer
from llmchat.core.server._thinking import REFUSAL
from llmchat.tui.app import ChatApp, make_app
from llmchat.tui.widgets.chat import ChatMessage
from llmchat.tui.widgets.chat._lines import text_of

Factory = Callable[..., RunningServer]

#: This feature's migration, wherever the list has it (later ones may be appended after it).
MINE = next(i for i, m in enumerate(MIGRATIONS) if any("refusal" in s for s in m))
MARK = f'_(refused: the model declined: "{REFUSAL}")_'


def _end_of(reply: ChatMessage) -> str:
    """The reply's last rows as text: its state line, wrapped."""
    return " ".join(text_of(line) for line in reply.lines_for(reply.inner_width)[-3:])


async def test_the_schema_before_it_migrates_keeps_ids_search_and_takes_a_refusal(tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite3"
    make_old_history(db, version=MINE)
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        # A deleted message's id is never given again: the rebuilt table keeps the counter.
        conn.execute("INSERT INTO messages (conversation_id, role, content, status, created_at, parent_id)"
                     " VALUES (1, 'user', 'gone soon', 'done', 3, 2)")
        conn.execute("DELETE FROM messages WHERE id = 3")
    async with HistoryStore(db) as store:
        old = await store.load(1)
        assert [(m.content, m.status, m.refusal) for m in old.messages] == [
            ("how slow?", "done", ""), ("very", "done", "")]
        assert [h.message_id for h in await store.search("slow")] == [1]  # the index survived the rebuild
        asked = await store.add_user_message(1, "tell me a secret")
        writer = store.reply_writer(await store.start_reply(1, provider="p", model="m", mode="stream"))
        await writer.finish(status="refused", refusal="I can't share that.", record={"model": "m"})
        again = await store.load(1)
        # The triggers were made again: a message added after the migration is found.
        assert [h.message_id for h in await store.search("secret")] == [asked]
    assert asked == 4
    refused = again.messages[-1]
    assert (refused.status, refused.content, refused.refusal, refused.partial) == (
        "refused", "", "I can't share that.", False)
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (len(MIGRATIONS),)
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("INSERT INTO messages_fts (messages_fts) VALUES ('integrity-check')").fetchall() == []
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("UPDATE messages SET status = 'maybe' WHERE id = 1")


async def _refused_chat(server: RunningServer, store: HistoryStore) -> int:
    """One streamed reply from a refusing server, saved as the app saves it."""
    conv = await store.new_conversation(title="secrets")
    await store.add_user_message(conv, "tell me a secret")
    writer = store.reply_writer(await store.start_reply(conv, provider="local", model="m", mode="stream"))
    async with ChatClient(base_url=server.base_url, model=MODEL, use_cache=False) as client:
        stream = client.stream([{"role": "user", "content": "tell me a secret"}])
        async for piece in stream:
            writer.append(piece)
    assert stream.refusal == REFUSAL
    await writer.finish(status="refused", record=stream.record.summary(), refusal=stream.refusal)
    return conv


async def test_a_refusal_is_exported_as_one_and_sent_back_as_what_the_model_said(
    server_factory: Factory, tmp_path: Path
) -> None:
    server = server_factory(ttft_ms=0, tokens_per_s=0, refuse=True)
    async with HistoryStore(tmp_path / "h.sqlite3") as store:
        conv = await store.load(await _refused_chat(server, store))
    reply = conv.messages[1]
    assert (reply.status, reply.content, reply.refusal) == ("refused", "", REFUSAL)
    markdown = export_markdown(conv)
    assert "## Assistant (refused)" in markdown and MARK in markdown, markdown
    [obj] = json.loads(export_records_json(conv))
    assert (obj["message_status"], obj["refusal"], obj["finish_reason"]) == ("refused", REFUSAL, "refusal")
    assert conv.messages_for_api()[-1] == {"role": "assistant", "content": REFUSAL}


async def test_a_refused_reply_is_never_cached_so_asking_again_asks_the_model(
    server_factory: Factory, tmp_path: Path
) -> None:
    server = server_factory(ttft_ms=0, tokens_per_s=0, refuse=True)
    settings = replace(_settings(tmp_path), cache=CacheSettings(path=str(tmp_path / "cache"), policy="always",
                                                                replay_streams=True))
    messages = [{"role": "user", "content": "tell me a secret"}]
    async with ChatClient(settings, base_url=server.base_url, model=MODEL) as client:
        first = await client.complete(messages, temperature=0)
        second = await client.complete(messages, temperature=0)
        stream = client.stream(messages, temperature=0)
        assert "".join([piece async for piece in stream]) == ""
    for refusal, record in ((first.refusal, first.record), (second.refusal, second.record),
                            (stream.refusal, stream.record)):
        # A hit would be an empty success: no words, finish_reason "stop".
        assert refusal == REFUSAL and record.finish_reason == "refusal"
        assert record.cache_lookup and not record.cache_hit


def _app(server: RunningServer, tmp_path: Path, **kw: Any) -> ChatApp:
    settings = _settings(tmp_path)
    client = ChatClient(settings, base_url=server.base_url, model=MODEL, http2="h2c")
    return make_app(settings=settings, client=client, store=HistoryStore(tmp_path / "history.sqlite3"), **kw)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "batch"])
async def test_the_app_shows_a_refusal_under_the_reply_live_and_resumed(
    server_factory: Factory, tmp_path: Path, stream: bool
) -> None:
    server = server_factory(ttft_ms=0, tokens_per_s=200, refuse=True)
    app = _app(server, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        app.stream_mode = stream
        reply = await _send(pilot, app, "tell me a secret")
        await _until(pilot, lambda: reply.is_final)
        await pilot.pause()
        assert (reply.status, reply.text) == ("refused", "")
        assert reply.note.startswith(f'the model declined: "{REFUSAL}"'), reply.note
        end = _end_of(reply)
        assert 'refused: the model declined: "I\'m sorry' in end, end
        # The next request carries what the model said.
        assert app.history[-1] == {"role": "assistant", "content": REFUSAL}
    async with HistoryStore(tmp_path / "history.sqlite3") as store:
        conv = await store.load(await store.last_conversation_id() or 0)
    saved = conv.messages[-1]
    assert (saved.status, saved.content, saved.refusal) == ("refused", "", REFUSAL)
    assert saved.record is not None and saved.record["finish_reason"] == "refusal"

    again = _app(server, tmp_path, continue_last=True)  # what `llmchat --continue` opens
    async with again.run_test(size=(140, 40)) as pilot:
        await _until(pilot, lambda: len(again.query(ChatMessage)) == 1)
        restored = again.query_one(ChatMessage)
        await pilot.pause()
        assert restored.status == "refused" and restored.note.startswith(f'the model declined: "{REFUSAL}"')
        assert "refused: the model declined:" in _end_of(restored)
        assert again.history[-1] == {"role": "assistant", "content": REFUSAL}
