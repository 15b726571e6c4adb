"""Conversations as trees, and full-text search, on a real SQLite file: regenerate and edit keep every
alternative, the current branch is what loads (resume, export, --continue), switching moves it, and search
finds any message of any branch. Migrations run on a database made with the schema before this one."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from history_files import make_old_history

from llmchat.core.history import _search
from llmchat.core.history._store import MIGRATIONS, HistoryStore, export_markdown, export_records_json
from llmchat.core.history._tree import branch_ids, children_of, newest_leaf_under
from llmchat.tui.cli import main


def peek(path: Path, sql: str, *args: object) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(path)) as conn:
        return conn.execute(sql, args).fetchall()


async def _reply(store: HistoryStore, conv: int, text: str, *, alternative_to: int | None = None,
                 ttft: float = 100.0) -> int:
    msg = await store.start_reply(conv, provider="local", model="m", mode="stream", alternative_to=alternative_to)
    writer = store.reply_writer(msg)
    writer.append(text)
    await writer.finish(status="done", record={"model": "m", "ttft_ms": ttft, "total_ms": ttft * 2})
    return msg


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "history.sqlite3"


async def test_regenerate_keeps_both_replies_with_their_own_records(db: Path) -> None:
    async with HistoryStore(db) as store:
        conv = await store.new_conversation()
        q = await store.add_user_message(conv, "why is the sky blue")
        first = await _reply(store, conv, "Rayleigh scattering", ttft=120.0)
        second = await _reply(store, conv, "Because of scattering", alternative_to=first, ttft=480.0)
        loaded = await store.load(conv)
        assert [m.id for m in loaded.messages] == [q, second]
        assert loaded.messages[1].alternatives == (first, second)
        assert loaded.messages[1].alternative_marker == "2/2"
        assert loaded.messages[0].alternative_marker == ""
        assert loaded.messages[1].record is not None and loaded.messages[1].record["ttft_ms"] == 480.0
        # Switching back shows the first reply and its own record; the second is kept.
        back = await store.select(conv, first)
        assert [m.id for m in back.messages] == [q, first]
        assert back.messages[1].record is not None and back.messages[1].record["ttft_ms"] == 120.0
        assert back.messages[1].alternative_marker == "1/2"
        # The next message follows the branch on screen.
        follow = await store.add_user_message(conv, "and at sunset?")
        assert [m.id for m in (await store.load(conv)).messages] == [q, first, follow]
    assert peek(db, "SELECT parent_id FROM messages WHERE id = ?", follow) == [(first,)]


async def test_an_edit_starts_a_branch_and_switching_follows_each_branch_to_its_end(db: Path) -> None:
    async with HistoryStore(db) as store:
        conv = await store.new_conversation()
        q1 = await store.add_user_message(conv, "first question")
        a1 = await _reply(store, conv, "first answer")
        q2 = await store.add_user_message(conv, "second question, badly put")
        a2 = await _reply(store, conv, "a confused answer")
        q2b = await store.add_user_message(conv, "second question, well put", alternative_to=q2)
        a2b = await _reply(store, conv, "a clear answer")
        now = await store.load(conv)
        assert [m.id for m in now.messages] == [q1, a1, q2b, a2b]
        assert now.messages[2].alternatives == (q2, q2b) and now.messages[2].alternative_marker == "2/2"
        # Resume and export follow the current branch: the old wording is in neither.
        api = now.messages_for_api()
        assert [m["content"] for m in api] == ["first question", "first answer", "second question, well put",
                                               "a clear answer"]
        markdown = export_markdown(now)
        assert "well put" in markdown and "badly put" not in markdown and "confused" not in markdown
        assert [r["message_id"] for r in json.loads(export_records_json(now))] == [a1, a2b]
        # Switching to the old wording brings its own reply back.
        old = await store.select(conv, q2)
        assert [m.id for m in old.messages] == [q1, a1, q2, a2]
        # Selecting a message already on the branch changes nothing.
        same = await store.select(conv, a1)
        assert [m.id for m in same.messages] == [q1, a1, q2, a2]
        # An edit of the very first message is a second root.
        root = await store.add_user_message(conv, "another start", alternative_to=q1)
        assert [m.id for m in (await store.load(conv)).messages] == [root]
        assert (await store.load(conv)).messages[0].alternatives == (q1, root)
        with pytest.raises(ValueError, match="not in conversation"):
            await store.select(conv, 10_000)
        other = await store.new_conversation()
        with pytest.raises(ValueError, match="not in conversation"):
            await store.add_user_message(other, "x", alternative_to=q1)
    # --continue and export read the current branch from the file, as another process would.
    async with HistoryStore(db, read_only=True) as again:
        assert [m.id for m in (await again.load(conv)).messages] == [root]


def test_the_tree_walks_survive_hand_edited_rows() -> None:
    parents = {1: None, 2: 1, 3: 2, 4: 3}
    assert branch_ids(parents, 4) == [1, 2, 3, 4]
    assert branch_ids(parents, 99) == [1, 2, 3, 4]  # a leaf removed by hand: the newest message
    assert branch_ids({1: 2, 2: 1}, 1) == [2, 1]  # a cycle ends the walk instead of hanging
    assert branch_ids({}, None) == []
    children = children_of([(1, None), (2, 1), (5, 1), (3, 2)])
    assert children == {None: [1], 1: [2, 5], 2: [3]}
    assert newest_leaf_under(children, 1) == 5 and newest_leaf_under(children, 2) == 3


async def test_migration_makes_an_older_history_a_tree_and_indexes_it(db: Path) -> None:
    # The schema before the tree's migration, wherever the list has it (later ones may follow it).
    version = next(i for i, m in enumerate(MIGRATIONS) if any("parent_id" in s for s in m))
    make_old_history(db, version=version)  # as the llmchat before this one left it: one question, one answer
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute("INSERT INTO messages (conversation_id, role, content, status, created_at)"
                     " VALUES (1, 'user', 'and the kettle?', 'done', 3)")
    async with HistoryStore(db) as store:
        conv = await store.load(1)
        assert [m.content for m in conv.messages] == ["how slow?", "very", "and the kettle?"]
        assert [m.parent_id for m in conv.messages] == [None, conv.messages[0].id, conv.messages[1].id]
        hits = await store.search("kettle")
        assert [(h.conversation_id, h.message_id) for h in hits] == [(1, conv.messages[2].id)]
        # Messages added after the migration follow the old ones and are indexed by the triggers.
        added = await store.add_user_message(1, "boiling point of water")
        assert (await store.load(1)).messages[-1].parent_id == conv.messages[2].id
        assert [h.message_id for h in await store.search("boiling")] == [added]
    assert peek(db, "PRAGMA user_version") == [(len(MIGRATIONS),)]
    assert peek(db, "SELECT leaf_id FROM conversations") == [(added,)]


async def test_search_ranks_highlights_and_keeps_the_index_in_step(db: Path) -> None:
    async with HistoryStore(db) as store:
        one = await store.new_conversation(title="networking")
        await store.add_user_message(one, "How does TCP keep-alive work?")
        reply = await _reply(store, one, "TCP keep-alive sends probes; keep-alive probes keep NAT mappings warm.")
        two = await store.new_conversation(title="cooking")
        await store.add_user_message(two, "A recipe for bread, please")
        hits = await store.search("keep alive")
        assert [h.message_id for h in hits][0] == reply  # the one that says it most ranks first
        assert {h.conversation_id for h in hits} == {one}
        top = hits[0]
        assert top.title == "networking" and top.role == "assistant"
        assert [top.snippet[s:e].lower() for s, e in top.highlights][:2] == ["keep", "alive"]
        assert "[keep]-[alive]" in top.marked().lower()
        # The last word is a prefix (as it is typed); every word must appear.
        assert [h.conversation_id for h in await store.search("rec")] == [two]
        assert await store.search("bread tcp") == []
        # What a person types is never FTS5 syntax: quotes, operators and column names are words.
        for text in ['"', 'AND', 'content:', 'NEAR(', '*', "tcp OR", "-"]:
            await store.search(text)
        assert await store.search("  ...  ") == []
        assert _search.fts_query('a "b" OR c') == '"a" "b" "OR" "c"*'
        # A streaming reply is found by what it says so far; deleting a conversation takes its hits.
        msg = await store.start_reply(two, provider="local", model="m", mode="stream")
        writer = store.reply_writer(msg)
        writer.append("sourdough starter")
        await writer.flush()
        assert [h.message_id for h in await store.search("sourdough")] == [msg]
        await writer.finish(status="done", text="rye loaf")
        assert await store.search("sourdough") == []
        assert [h.message_id for h in await store.search("rye")] == [msg]
        await store.delete(two)
        assert await store.search("rye") == [] and await store.search("bread") == []
    assert peek(db, "INSERT INTO messages_fts (messages_fts) VALUES ('integrity-check')") == []


def test_search_command_prints_hits_and_json(db: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(db.parent))
    path = db.parent / "llmchat" / "history.sqlite3"
    assert main(["search", "port"]) == 2
    assert "search: no history yet at" in capsys.readouterr().err
    path.parent.mkdir()

    async def fill() -> tuple[int, int]:
        async with HistoryStore(path) as store:
            conv = await store.new_conversation(title="ports")
            await store.add_user_message(conv, "which port does the local server use?")
            return conv, await _reply(store, conv, "It picks a free port each run.")

    conv, answer = asyncio.run(fill())
    assert main(["search", "free", "port"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{conv}:{answer}\tports\tassistant\tIt picks a [free] [port] each run."]
    assert main(["search", "port", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {line["message_id"] for line in lines} == {answer, answer - 1}
    assert all(line["conversation_id"] == conv and line["snippet"] for line in lines)
    assert main(["search", "nothing-like-this"]) == 1
    assert capsys.readouterr().err.strip() == 'search: no message holds "nothing-like-this"'
    assert main(["search", "..."]) == 2
    assert "search: give a word to search for" in capsys.readouterr().err
