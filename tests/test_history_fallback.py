"""A history file llmchat cannot fully use: read-only, garbage, pages overwritten, from a newer llmchat,
failing mid-session. The store opens in the best mode it can, says so in one line, and never writes a file
it should not; `llmchat export` reads what it may read. Real files in tmp (see history_files.py)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from history_files import (
    damage_while_open,
    file_state,
    make_history,
    make_old_history,
    no_file_can_grow,
    overwrite_pages,
    read_only,
)

from llmchat.core.history import _file as _history_file
from llmchat.core.history._file import set_aside_command, shell_quote
from llmchat.core.history._store import (
    MIGRATIONS,
    Generation,
    HistoryError,
    HistoryStore,
    export_markdown,
    export_records_json,
)
from llmchat.tui.cli import main


def peek(path: Path, sql: str, *args: object) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)) as conn:
        return conn.execute(sql, args).fetchall()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "data" / "history.sqlite3"


async def _opened(db: Path | None) -> tuple[HistoryStore, list[str]]:
    """A store opened as the chat app opens it; ``None``: at llmchat's own path, whose folder it keeps
    private."""
    store = HistoryStore(db)
    changes: list[str] = []
    await store.open(fallback=True, on_change=lambda: changes.append(store.state))
    return store, changes


async def _still_works(store: HistoryStore) -> int:
    """A whole exchange through the store, as the app does it; returns the conversation."""
    conv = await store.new_conversation(title="new")
    await store.add_user_message(conv, "does it still work?")
    writer = store.reply_writer(await store.start_reply(conv, provider="p", model="m", mode="stream"))
    writer.append("it does")
    await writer.finish(status="done")
    assert [m.content for m in (await store.load(conv)).messages] == ["does it still work?", "it does"]
    return conv


# -- read-only -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("what", ["file", "folder", "llmchat's own folder"])
async def test_a_read_only_history_opens_as_a_copy_and_is_never_written(db: Path, what: str) -> None:
    own = what == "llmchat's own folder"  # which llmchat tightens to 0700, and must not loosen to writable
    db = HistoryStore().path if own else db
    await make_history(db, conversations=3)
    db.parent.chmod(0o700)
    before = file_state(db)
    with read_only(db if what == "file" else db.parent):
        folder_mode = db.parent.stat().st_mode
        store, changes = await _opened(None if own else db)
        try:
            assert store.state == "read-only"
            line = store.problem
            assert line.startswith("history is read-only: new messages are not saved (") and "\n" not in line
            assert str(db if what == "file" else db.parent) in line and "restart llmchat" in line
            assert [c.title for c in await store.list_conversations()] == [
                "conversation 2", "conversation 1", "conversation 0"]
            await _still_works(store)  # in memory
            assert len(await store.list_conversations()) == 4
        finally:
            await store.aclose()
        assert changes == []  # the state at open is read from the store, not announced
        assert db.parent.stat().st_mode == folder_mode
    assert file_state(db) == before
    assert peek(db, "SELECT COUNT(*) FROM conversations") == [(3,)]


async def test_a_read_only_file_is_reported_with_the_command_that_fixes_it(db: Path) -> None:
    await make_history(db)
    with read_only(db) as how:
        store, _ = await _opened(db)
        await store.aclose()
    fix = f"sudo chattr -i {shell_quote(db)}" if how == "chattr" else f"chmod u+w {shell_quote(db)}"
    assert fix in store.problem, store.problem


async def test_a_read_only_store_reads_without_writing_or_migrating(db: Path) -> None:
    make_old_history(db, version=len(MIGRATIONS) - 1)  # as the llmchat before this one left it
    before = file_state(db)
    async with HistoryStore(db, read_only=True) as store:
        assert store.state == "read-only" and store.problem == ""
        conv = await store.load(await store.last_conversation_id() or 0)
        assert conv.title == "old one" and conv.origin == "" and conv.generation == Generation()
    assert file_state(db) == before and peek(db, "PRAGMA user_version") == [(len(MIGRATIONS) - 1,)]


# -- damaged -------------------------------------------------------------------------------------------------
async def _pages_overwritten(db: Path) -> None:
    await make_history(db, conversations=12)
    overwrite_pages(db)


async def _garbage(db: Path) -> None:
    db.parent.mkdir(parents=True)
    db.write_bytes(b"not a database, just text\n" * 200)


async def _newer(db: Path) -> None:
    db.parent.mkdir(parents=True)
    with closing(sqlite3.connect(db)) as conn:
        conn.executescript("CREATE TABLE future (x); PRAGMA user_version = 99;")


@pytest.mark.parametrize(("make", "words"), [
    (_garbage, ("is damaged", "mv ")),
    (_pages_overwritten, ("is damaged", "integrity check", "mv ")),
    (_newer, ("newer llmchat", "upgrade llmchat")),
])
async def test_an_unusable_history_is_left_alone_for_one_in_memory(db: Path, make: Any,
                                                                     words: tuple[str, ...]) -> None:
    await make(db)
    before = file_state(db)
    store, _ = await _opened(db)
    try:
        assert store.state == "in-memory"
        line = store.problem
        assert "\n" not in line and str(db) in line
        assert line.endswith("this session's messages are kept in memory only")
        assert all(w in line for w in words), line
        assert await store.list_conversations() == []
        await _still_works(store)
    finally:
        await store.aclose()
    assert file_state(db) == before


async def test_a_partly_damaged_file_is_refused_at_open_not_at_the_first_prompt(db: Path) -> None:
    await _pages_overwritten(db)
    with pytest.raises(HistoryError) as err:
        await HistoryStore(db).open()
    assert "is damaged" in str(err.value)
    assert f"mv {shell_quote(db)} {shell_quote(f'{db}.damaged')}" in str(err.value)


def test_the_set_aside_command_works_in_a_shell_on_an_awkward_path(tmp_path: Path) -> None:
    folder = tmp_path / "it's  a $HOME `x`"
    folder.mkdir()
    db = folder / "history.sqlite3"
    db.write_bytes(b"damaged")
    Path(f"{db}-wal").write_bytes(b"its wal")
    Path(f"{db}.damaged").write_bytes(b"an earlier one")  # never overwritten
    command = set_aside_command(db)
    assert "\n" not in command and " ".join(command.split()) == command  # survives a one-line message
    subprocess.run(["bash", "-c", command], check=True)
    assert sorted(p.name for p in folder.iterdir()) == [
        "history.sqlite3.damaged", "history.sqlite3.damaged-2", "history.sqlite3.damaged-2-wal"]
    assert Path(f"{db}.damaged-2").read_bytes() == b"damaged"
    assert Path(f"{db}.damaged").read_bytes() == b"an earlier one"


# -- failing mid-session -------------------------------------------------------------------------------------
async def test_a_write_refused_mid_session_falls_back_to_a_copy_and_keeps_the_message(db: Path) -> None:
    await make_history(db, conversations=2)
    store, changes = await _opened(db)
    try:
        conv = await store.new_conversation(title="before")
        with no_file_can_grow():
            # Refused by the file, then retried in memory, all in this one call.
            msg = await store.add_user_message(conv, "kept in memory")
        assert store.state == "read-only"
        assert store.problem.startswith("history can no longer be written: new messages are not saved (")
        await asyncio.wait_for(_until(lambda: changes == ["read-only"]), 5)
        assert [(m.id, m.content) for m in (await store.load(conv)).messages] == [(msg, "kept in memory")]
        assert len(await store.list_conversations()) == 3  # the file's conversations came along
    finally:
        await store.aclose()
    assert peek(db, "SELECT COUNT(*) FROM messages WHERE content = 'kept in memory'") == [(0,)]


async def test_damage_found_mid_session_falls_back_to_an_empty_history(db: Path) -> None:
    await make_history(db, conversations=12)
    store, changes = await _opened(db)
    try:
        before = store.state  # read apart: mypy would keep ``store.state`` narrowed to "ok" past the damage
        assert before == "ok"
        damage_while_open(db)
        conv = await store.new_conversation(title="after the damage")
        assert store.state == "in-memory" and "is damaged" in store.problem and "mv " in store.problem
        await asyncio.wait_for(_until(lambda: changes == ["in-memory"]), 5)
        assert [c.title for c in await store.list_conversations()] == ["after the damage"]
        assert (await store.load(conv)).title == "after the damage"
    finally:
        await store.aclose()


async def test_a_locked_history_is_an_error_not_a_fallback(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    await make_history(db)
    monkeypatch.setattr(_history_file, "BUSY_TIMEOUT_S", 0.2)
    store, changes = await _opened(db)
    try:
        with closing(sqlite3.connect(db, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")
            with pytest.raises(HistoryError, match="locked by another program"):
                await store.new_conversation(title="blocked")
            other.execute("ROLLBACK")
        assert store.state == "ok" and changes == []
        await store.new_conversation(title="after")  # the file is used again at once
    finally:
        await store.aclose()
    assert peek(db, "SELECT title FROM conversations ORDER BY id DESC LIMIT 1") == [("after",)]


async def _until(check: Any) -> None:
    while not check():
        await asyncio.sleep(0.01)


# -- the schema: 'interrupted' -------------------------------------------------------------------------------
async def test_todays_schema_migrates_keeping_rows_ids_and_the_id_counter(db: Path) -> None:
    db.parent.mkdir(parents=True)
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:  # version 1, as llmchat made it so far
        for statement in MIGRATIONS[0]:
            conn.execute(statement)
        conn.execute("PRAGMA user_version = 1")
        conn.execute("INSERT INTO conversations (title, created_at, updated_at, touched)"
                     " VALUES ('old', 1, 1, 1)")
        for content, status in [("q", "done"), ("half", "cancelled"), ("gone", "done")]:
            conn.execute("INSERT INTO messages (conversation_id, role, content, status, created_at)"
                         " VALUES (1, 'assistant', ?, ?, 1)", (content, status))
        conn.execute("DELETE FROM messages WHERE content = 'gone'")  # id 3 was given once: never again
    async with HistoryStore(db) as store:
        conv = await store.load(1)
        assert [(m.id, m.content, m.status) for m in conv.messages] == [
            (1, "q", "done"), (2, "half", "cancelled")]
        writer = store.reply_writer(await store.start_reply(1, provider="p", model="m", mode="stream"))
        writer.append("cut")
        await writer.finish(status="interrupted")
        assert writer.msg_id == 4
    assert peek(db, "PRAGMA user_version") == [(len(MIGRATIONS),)]
    assert peek(db, "SELECT status FROM messages WHERE id = 4") == [("interrupted",)]
    assert peek(db, "PRAGMA foreign_key_check") == [] and peek(db, "PRAGMA integrity_check") == [("ok",)]


async def test_exports_mark_every_reply_that_did_not_finish(tmp_path: Path) -> None:
    async with HistoryStore(tmp_path / "h.sqlite3") as store:
        conv = await store.new_conversation(title="marks")
        for status in ("interrupted", "cancelled", "error", "done"):
            writer = store.reply_writer(await store.start_reply(conv, provider="p", model="m", mode="stream"))
            writer.append(f"{status} text")
            await writer.finish(status=status, error="cut" if status == "error" else None,
                                record={"model": "m", "total_ms": 5.0})
        await store.start_reply(conv, provider="p", model="m", mode="stream")  # a process killed right here
        loaded = await store.load(conv)
    md = export_markdown(loaded)
    assert "## Assistant (interrupted)\n\ninterrupted text\n\n_(interrupted: the reply was cut off)_" in md
    assert "cancelled text\n\n_(cancelled: the reply was stopped before it ended)_" in md
    assert "error text\n\n_(error: the reply did not finish)_" in md
    assert "done text\n\n*m via p · 5 ms*" in md  # a whole reply has no mark
    assert md.count("_(interrupted: the reply was cut off)_") == 2  # the killed one too
    records = json.loads(export_records_json(loaded))
    assert [r["message_status"] for r in records] == ["interrupted", "cancelled", "error", "done"]
    assert records[2]["message_error"] == "cut"


# -- llmchat export ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("what", ["file", "folder"])
def test_export_reads_a_read_only_history(what: str, capsys: pytest.CaptureFixture[str]) -> None:
    db = HistoryStore().path
    asyncio.run(make_history(db))
    before = file_state(db)
    with read_only(db if what == "file" else db.parent):
        assert main(["export", "last"]) == 0
        captured = capsys.readouterr()
        assert captured.out.startswith("# conversation 2\n") and "answer 2" in captured.out, captured.err
        assert main(["export", "1", "--format", "json"]) == 0
        records = json.loads(capsys.readouterr().out)
        assert [(r["conversation_id"], r["message_status"]) for r in records] == [(1, "done")]
    assert file_state(db) == before


def test_export_of_a_partly_damaged_history_is_the_line_the_app_shows(
        capsys: pytest.CaptureFixture[str]) -> None:
    db = HistoryStore().path
    asyncio.run(_pages_overwritten(db))

    async def app_line() -> str:
        store, _ = await _opened(db)
        await store.aclose()
        return store.problem

    shown = asyncio.run(app_line())
    assert main(["export", "last"]) == 1
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err and captured.out == ""
    memory = "; meanwhile this session's messages are kept in memory only"
    assert shown == lines[0].removeprefix("llmchat: ") + memory
