"""The chat history on a real SQLite file in a temp folder, read back through separate sqlite3 connections,
a process killed mid-reply, a real stream from the local server, and `llmchat export` through the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import stat
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import closing
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest

from llmchat.core import CacheSettings, ChatClient, ProviderSettings, Settings
from llmchat.core.history import _db as _history_db
from llmchat.core.history._store import (
    MIGRATIONS,
    ConversationNotFoundError,
    HistoryError,
    HistoryStore,
    default_history_path,
    export_markdown,
    export_records_json,
)
from llmchat.core.server import RunningServer
from llmchat.tui.cli import main

T = TypeVar("T")
KEY_ENV = "LLMCHAT_HISTORY_TEST_KEY"
KEY = "sk-history-test-0123456789abcdef"
RECORD = {"request_id": "abc123", "provider": "local", "model": "llmchat-local", "http_version": "HTTP/2",
          "ttft_ms": 212.4, "tokens_per_s": 70.3, "total_ms": 1420.0, "retries": 1, "cache_hit": False}


def peek(path: Path, sql: str, *args: object) -> list[tuple[Any, ...]]:
    """A query on a connection of its own, as another process would see the file."""
    with closing(sqlite3.connect(path)) as conn:
        return conn.execute(sql, args).fetchall()


async def eventually(check: Callable[[], T], *, timeout: float, what: str) -> T:
    """Polls ``check`` until it returns something truthy; fails after ``timeout`` seconds."""
    deadline = time.perf_counter_ns() + int(timeout * 1e9)
    while True:
        value = check()
        if value:
            return value
        if time.perf_counter_ns() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)


def one_line_naming(exc: BaseException, path: Path, *words: str) -> str:
    text = str(exc)
    assert "\n" not in text and str(path) in text, text
    for word in words:
        assert word in text, (word, text)
    return text


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "data" / "history.sqlite3"


@pytest.fixture
async def store(db: Path) -> Any:
    async with HistoryStore(db) as s:
        yield s


# -- the file ------------------------------------------------------------------------------------------------
async def test_default_path_follows_xdg_and_is_private(tmp_path: Path) -> None:
    env = {"XDG_DATA_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path / "home")}
    assert default_history_path(env) == tmp_path / "xdg" / "llmchat" / "history.sqlite3"
    # A relative XDG_DATA_HOME is ignored, as the spec says.
    rel = {"XDG_DATA_HOME": "relative", "HOME": str(tmp_path / "home")}
    assert default_history_path(rel) == tmp_path / "home" / ".local" / "share" / "llmchat" / "history.sqlite3"
    assert HistoryStore().path == Path(os.environ["XDG_DATA_HOME"]) / "llmchat" / "history.sqlite3"

    folder = tmp_path / "xdg" / "llmchat"
    folder.mkdir(parents=True, mode=0o755)
    folder.chmod(0o755)  # a loose folder left by someone: llmchat's own data folder is tightened
    async with HistoryStore(env=env) as store:
        conv = await store.new_conversation()
        await store.add_user_message(conv, "hello")
        files = sorted(p.name for p in folder.iterdir())
        assert files == ["history.sqlite3", "history.sqlite3-shm", "history.sqlite3-wal"]
        for p in folder.iterdir():
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


async def test_schema_version_wal_and_pragmas(store: HistoryStore, db: Path) -> None:
    assert peek(db, "PRAGMA user_version") == [(len(MIGRATIONS),)]
    assert peek(db, "PRAGMA journal_mode") == [("wal",)]
    tables = {r[0] for r in peek(db, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"conversations", "messages"} <= tables


async def test_reopen_keeps_everything(db: Path) -> None:
    async with HistoryStore(db) as store:
        conv = await store.new_conversation(title="kept", system_prompt="be brief", provider="p", model="m")
        await store.add_user_message(conv, "question")
        writer = store.reply_writer(await store.start_reply(conv, provider="p", model="m", mode="stream"))
        writer.append("answer")
        await writer.finish(status="done", record=RECORD)
    async with HistoryStore(db) as store:
        loaded = await store.load(conv)
    assert loaded.title == "kept" and loaded.system_prompt == "be brief"
    assert [(m.role, m.content, m.status) for m in loaded.messages] == [
        ("user", "question", "done"), ("assistant", "answer", "done")]
    assert loaded.messages[1].record == RECORD


async def test_migrations_run_once_and_upgrade_an_older_file(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with HistoryStore(db) as store:
        conv = await store.new_conversation(title="from v1")
    second = ("CREATE TABLE extra (n INTEGER)", "INSERT INTO extra VALUES (1)")
    monkeypatch.setattr(_history_db, "MIGRATIONS", [*MIGRATIONS, second])
    for _ in range(3):
        async with HistoryStore(db) as store:
            assert (await store.load(conv)).title == "from v1"
    assert peek(db, "PRAGMA user_version") == [(len(MIGRATIONS) + 1,)]
    assert peek(db, "SELECT COUNT(*) FROM extra") == [(1,)]


async def test_two_windows_open_a_new_file_at_once_and_share_it(db: Path) -> None:
    first, second = HistoryStore(db), HistoryStore(db)
    await asyncio.wait_for(asyncio.gather(first.open(), second.open()), 10)  # each migrates on its own thread
    try:
        conv = await first.new_conversation(title="shared")
        await second.add_user_message(conv, "from the other window")
        assert [m.content for m in (await first.load(conv)).messages] == ["from the other window"]
        assert await second.last_conversation_id() == conv
    finally:
        await first.aclose()
        await second.aclose()
    assert peek(db, "PRAGMA user_version") == [(len(MIGRATIONS),)]


async def test_a_failed_migration_leaves_the_file_at_its_version(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with HistoryStore(db) as store:
        await store.new_conversation(title="safe")
    broken = ("CREATE TABLE half (n INTEGER)", "INSERT INTO no_such_table VALUES (1)")
    monkeypatch.setattr(_history_db, "MIGRATIONS", [*MIGRATIONS, broken])
    with pytest.raises(HistoryError) as err:
        await HistoryStore(db).open()
    one_line_naming(err.value, db, "no_such_table")
    assert peek(db, "PRAGMA user_version") == [(len(MIGRATIONS),)]
    assert peek(db, "SELECT name FROM sqlite_master WHERE name = 'half'") == []


async def test_a_file_from_a_newer_llmchat_is_refused_and_left_alone(db: Path) -> None:
    db.parent.mkdir(parents=True)
    with closing(sqlite3.connect(db)) as conn:
        conn.executescript("CREATE TABLE future (x); PRAGMA user_version = 7;")
    before = (db.read_bytes(), db.stat().st_mtime_ns)
    store = HistoryStore(db)
    with pytest.raises(HistoryError) as err:
        await store.open()
    one_line_naming(err.value, db, "newer llmchat", "schema version 7", "upgrade llmchat")
    assert (db.read_bytes(), db.stat().st_mtime_ns) == before
    assert sorted(p.name for p in db.parent.iterdir()) == ["history.sqlite3"]  # no -wal: nothing was written
    with pytest.raises(RuntimeError):
        await store.list_conversations()  # a failed open leaves the store closed
    with pytest.raises(RuntimeError):
        store.reply_writer(1)


@pytest.mark.parametrize("garbage", [b"not a database, just text\n" * 200, b"\x00junk"])
async def test_a_corrupt_file_is_one_line_naming_the_file_and_the_fix(db: Path, garbage: bytes) -> None:
    db.parent.mkdir(parents=True)
    db.write_bytes(garbage)
    with pytest.raises(HistoryError) as err:
        await HistoryStore(db).open()
    one_line_naming(err.value, db, "damaged", f"mv '{db}' '{db}.damaged'")
    assert err.value.__cause__ is None and err.value.exit_code == 1
    assert db.read_bytes() == garbage


async def test_a_folder_where_the_file_should_be_is_one_line(db: Path) -> None:
    db.mkdir(parents=True)
    with pytest.raises(HistoryError) as err:
        await HistoryStore(db).open()
    one_line_naming(err.value, db, "cannot open history")


# -- conversations and messages ------------------------------------------------------------------------------
async def test_messages_keep_their_order_roles_and_per_message_models(store: HistoryStore, db: Path) -> None:
    conv = await store.new_conversation(provider="local", model="small")
    plan = [("local", "small", "stream"), ("groq", "big", "batch"), ("local", "small", "stream")]
    ids = []
    for i, (provider, model, mode) in enumerate(plan):
        ids.append(await store.add_user_message(conv, f"q{i}"))
        msg = await store.start_reply(conv, provider=provider, model=model, mode=mode)
        ids.append(msg)
        writer = store.reply_writer(msg)
        writer.append(f"a{i}")
        await writer.finish(status="done", record={**RECORD, "model": model, "mode": mode})
    loaded = await store.load(conv)
    assert [m.id for m in loaded.messages] == ids == sorted(ids)
    assert [m.content for m in loaded.messages] == ["q0", "a0", "q1", "a1", "q2", "a2"]
    assert [m.role for m in loaded.messages] == ["user", "assistant"] * 3
    replies = [m for m in loaded.messages if m.role == "assistant"]
    assert [(m.provider, m.model, m.mode) for m in replies] == plan
    assert all(m.record is None and m.provider == "" for m in loaded.messages if m.role == "user")
    assert replies[1].record is not None and replies[1].record["model"] == "big"
    [info] = await store.list_conversations()
    assert (info.id, info.message_count, info.provider, info.model) == (conv, 6, "local", "small")


async def test_the_user_message_is_saved_before_any_reply(store: HistoryStore, db: Path) -> None:
    conv = await store.new_conversation()
    msg = await store.add_user_message(conv, "is this kept?")
    # Nothing about the reply exists yet, and another connection already sees the question.
    rows = peek(db, "SELECT id, role, content, status FROM messages")
    assert rows == [(msg, "user", "is this kept?", "done")]


async def test_a_streaming_reply_is_flushed_within_a_second_and_seen_by_another_connection(
    store: HistoryStore, db: Path
) -> None:
    conv = await store.new_conversation()
    msg = await store.start_reply(conv, provider="local", model="m", mode="stream")
    writer = store.reply_writer(msg)  # the default: at least every second

    def saved() -> str:
        return str(peek(db, "SELECT content FROM messages WHERE id = ?", msg)[0][0])

    assert not writer.flush_pending
    for piece in ("Hel", "lo, ", "world"):
        writer.append(piece)
    # append only buffers: nothing can have reached the file before the loop runs again.
    assert writer.flush_pending and saved() == ""
    await eventually(lambda: saved() == "Hello, world", timeout=2.5, what="the first timed flush")
    # Nothing new, nothing armed: the timer runs only while text waits.
    await eventually(lambda: not writer.flush_pending, timeout=1.0, what="the timer to disarm")
    assert writer.flushes == 1
    writer.append("!")
    assert writer.flush_pending
    await eventually(lambda: saved() == "Hello, world!", timeout=2.5, what="the second timed flush")
    assert peek(db, "SELECT status FROM messages WHERE id = ?", msg) == [("streaming",)]
    await writer.finish(status="done")
    assert not writer.flush_pending and writer.flushes == 2


CHILD = """
import asyncio, sys
from pathlib import Path
from llmchat.core.history._store import HistoryStore

async def main():
    store = HistoryStore(Path(sys.argv[1]))
    await store.open()
    conv = await store.new_conversation(title="killed")
    await store.add_user_message(conv, "tell me")
    writer = store.reply_writer(await store.start_reply(conv, provider="p", model="m", mode="stream"),
                                flush_s=0.2)
    for i in range(50):
        writer.append(f"t{i} ")
    await asyncio.Event().wait()  # streaming forever, until killed

asyncio.run(main())
"""


async def test_a_killed_process_keeps_what_was_flushed(db: Path) -> None:
    expected = "".join(f"t{i} " for i in range(50))
    db.parent.mkdir(parents=True)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", CHILD, str(db))
    try:
        def reply() -> list[tuple[Any, ...]]:
            if not db.exists():
                return []
            try:
                return peek(db, "SELECT content, status FROM messages WHERE role = 'assistant'")
            except sqlite3.OperationalError:  # the child is still creating the schema
                return []

        await eventually(lambda: reply() == [(expected, "streaming")], timeout=20.0, what="the child's flush")
    finally:
        proc.kill()
        await asyncio.wait_for(proc.wait(), 10)
    async with HistoryStore(db) as store:
        conv = await store.load(await store.last_conversation_id() or 0)
    assert conv.title == "killed"
    assert [(m.role, m.content, m.status) for m in conv.messages] == [
        ("user", "tell me", "done"), ("assistant", expected, "streaming")]
    assert conv.messages_for_api()[-1]["content"] == expected + "\n\n[reply cut short: interrupted]"
    assert "## Assistant (interrupted)" in export_markdown(conv)


@pytest.mark.parametrize(("status", "error"), [
    ("cancelled", None), ("error", "the stream was cut\nat byte 10")])
async def test_finish_cancelled_or_error_keeps_the_partial_text(
    store: HistoryStore, db: Path, status: Any, error: str | None
) -> None:
    conv = await store.new_conversation()
    msg = await store.start_reply(conv, provider="p", model="m", mode="stream")
    writer = store.reply_writer(msg)
    writer.append("half an ")
    writer.append("answer")
    await writer.finish(status=status, error=error, record={**RECORD, "cancelled": status == "cancelled"})
    writer.append(" that came too late")  # dropped: the row is final
    await writer.finish(status="done")  # a second finish changes nothing
    row = peek(db, "SELECT content, status, error FROM messages WHERE id = ?", msg)
    assert row == [("half an answer", status, None if error is None else "the stream was cut at byte 10")]
    assert writer.text == "half an answer"


async def test_finish_with_text_replaces_what_was_appended(store: HistoryStore, db: Path) -> None:
    conv = await store.new_conversation()
    writer = store.reply_writer(await store.start_reply(conv, provider="p", model="m", mode="batch"))
    await writer.finish(status="done", text="the whole reply")
    assert peek(db, "SELECT content FROM messages WHERE id = ?", writer.msg_id) == [("the whole reply",)]
    with pytest.raises(ValueError):
        await store.reply_writer(writer.msg_id).finish(status="finished")  # type: ignore[arg-type]


async def test_closing_the_store_finishes_an_unfinished_reply_as_interrupted(db: Path) -> None:
    async with HistoryStore(db) as store:
        conv = await store.new_conversation()
        writer = store.reply_writer(await store.start_reply(conv, provider="p", model="m", mode="stream"),
                                    flush_s=60.0)
        writer.append("saved on close")
    assert not writer.flush_pending  # no timer left on the loop
    # Its reply can never end now: "streaming" would say it still might.
    assert peek(db, "SELECT content, status FROM messages WHERE role = 'assistant'") == [
        ("saved on close", "interrupted")]


async def test_delete_cascades_to_messages_and_unknown_ids_say_which_exist(
    store: HistoryStore, db: Path
) -> None:
    keep = await store.new_conversation(title="keep")
    await store.add_user_message(keep, "stay")
    gone = await store.new_conversation(title="gone")
    await store.add_user_message(gone, "bye")
    await store.start_reply(gone, provider="p", model="m", mode="stream")
    await store.delete(gone)
    assert peek(db, "SELECT conversation_id, content FROM messages") == [(keep, "stay")]
    assert [c.id for c in await store.list_conversations()] == [keep]
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: store.load(gone), lambda: store.delete(gone), lambda: store.rename(gone, "x"),
        lambda: store.add_user_message(gone, "x"), lambda: store.set_system_prompt(gone, ""),
        lambda: store.start_reply(gone, provider="p", model="m", mode="stream")]
    for call in calls:
        with pytest.raises(ConversationNotFoundError) as err:
            await call()
        assert str(err.value) == (
            f"no conversation {gone} in the history; recent ones are {keep} (or use `last`)")
        assert err.value.exit_code == 2


async def test_a_reply_whose_conversation_was_deleted_finishes_quietly(store: HistoryStore) -> None:
    conv = await store.new_conversation()
    writer = store.reply_writer(await store.start_reply(conv, provider="p", model="m", mode="stream"))
    writer.append("orphan")
    await store.delete(conv)
    await writer.flush()
    await writer.finish(status="done")
    assert await store.list_conversations() == []


async def test_last_conversation_follows_activity_not_the_wall_clock(
    store: HistoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert await store.last_conversation_id() is None
    # The wall clock steps back by an hour at every read; the order must not care.
    clock = iter(range(10**9, 0, -3600))
    monkeypatch.setattr(_history_db, "time", SimpleNamespace(time=lambda: float(next(clock))))
    a = await store.new_conversation(title="a")
    b = await store.new_conversation(title="b")
    assert await store.last_conversation_id() == b
    await store.add_user_message(a, "back to a")
    assert await store.last_conversation_id() == a
    assert [c.id for c in await store.list_conversations()] == [a, b]
    assert [c.id for c in await store.list_conversations(limit=1)] == [a]
    await store.rename(b, "renaming is not activity")
    assert await store.last_conversation_id() == a


async def test_titles_come_from_the_first_user_message(store: HistoryStore) -> None:
    conv = await store.new_conversation()
    first = "How do I\n  keep an HTTP/2 connection warm between requests when the provider closes idle ones?"
    await store.add_user_message(conv, first)
    await store.add_user_message(conv, "and a second question")
    title = (await store.load(conv)).title
    assert "\n" not in title and len(title) <= 60 and title.endswith("…")
    assert title.startswith("How do I keep an HTTP/2 connection warm")
    named = await store.new_conversation(title="mine")
    await store.add_user_message(named, "does not rename it")
    await store.rename(conv, "  a new\nname  ")
    assert {c.id: c.title for c in await store.list_conversations()} == {conv: "a new name", named: "mine"}


async def test_system_prompt_and_the_messages_to_resume_with(store: HistoryStore) -> None:
    conv = await store.new_conversation(system_prompt="old")
    await store.set_system_prompt(conv, "Answer in French.")
    await store.add_user_message(conv, "hello")
    ok = store.reply_writer(await store.start_reply(conv, provider="p", model="m", mode="stream"))
    ok.append("bonjour")
    await ok.finish(status="done")
    await store.add_user_message(conv, "more")
    failed = store.reply_writer(await store.start_reply(conv, provider="p", model="m", mode="stream"))
    await failed.finish(status="error", error="connection refused")  # nothing arrived
    await store.add_user_message(conv, "again")
    cut = store.reply_writer(await store.start_reply(conv, provider="p", model="m", mode="stream"))
    cut.append("je vais")
    await cut.finish(status="cancelled")
    assert (await store.load(conv)).messages_for_api() == [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "bonjour"},
        {"role": "user", "content": "more"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "je vais\n\n[reply cut short: cancelled]"},
    ]


# -- export --------------------------------------------------------------------------------------------------
async def _sample(store: HistoryStore) -> int:
    conv = await store.new_conversation(title="Pools", system_prompt="Be brief.")
    await store.add_user_message(conv, "what is a pool?")
    local = {"provider": "local", "model": "llmchat-local", "mode": "stream"}
    done = store.reply_writer(await store.start_reply(conv, **local))
    done.append("A set of open connections.")
    await done.finish(status="done", record=RECORD)
    await store.add_user_message(conv, "and h2?")
    cut = store.reply_writer(await store.start_reply(conv, **local))
    cut.append("One connection, many")
    await cut.finish(status="cancelled", record={**RECORD, "request_id": "def456", "cancelled": True})
    await store.add_user_message(conv, "go on")
    err = store.reply_writer(await store.start_reply(conv, provider="groq", model="big", mode="stream"))
    err.append("Stre")
    await err.finish(status="error", error="the connection dropped mid-reply; try again",
                     record={**RECORD, "request_id": "ghi789", "model": "big", "error": "dropped"})
    return conv


async def test_markdown_export_has_headings_marks_and_timing_lines(store: HistoryStore) -> None:
    conv = await store.load(await _sample(store))
    md = export_markdown(conv)
    assert md.startswith("# Pools\n")
    assert "## System prompt\n\nBe brief.\n" in md
    assert md.count("## You\n") == 3
    assert "## Assistant\n\nA set of open connections.\n" in md
    assert "## Assistant (cancelled)\n\nOne connection, many\n" in md
    assert "## Assistant (error: the connection dropped mid-reply; try again)\n\nStre\n" in md
    assert "*llmchat-local via local · HTTP/2 · TTFT 212 ms · 70 tok/s · 1.42 s · 1 retry*" in md
    assert "*big via groq · HTTP/2 · TTFT 212 ms" in md
    order = [md.index(text) for text in ("what is a pool?", "A set of", "and h2?", "One connection")]
    assert order == sorted(order)


async def test_json_export_is_one_record_per_reply_with_message_ids(store: HistoryStore) -> None:
    conv = await store.load(await _sample(store))
    records = json.loads(export_records_json(conv))
    replies = [m for m in conv.messages if m.role == "assistant"]
    assert [r["message_id"] for r in records] == [m.id for m in replies]
    assert [r["request_id"] for r in records] == ["abc123", "def456", "ghi789"]
    assert [r["message_status"] for r in records] == ["done", "cancelled", "error"]
    assert {r["conversation_id"] for r in records} == {conv.id}
    assert records[2]["message_error"] == "the connection dropped mid-reply; try again"
    assert records[0]["ttft_ms"] == 212.4


async def test_a_real_stream_is_saved_and_its_key_is_nowhere(
    server_factory: Callable[..., RunningServer], db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = server_factory(profile="instant", api_key=KEY)  # the server refuses requests without the key
    monkeypatch.setenv(KEY_ENV, KEY)
    provider = ProviderSettings(name="peer", base_url=server.base_url, api_key_env=KEY_ENV,
                                model="llmchat-local")
    settings = Settings(providers={"peer": provider}, cache=CacheSettings(path=str(tmp_path / "cache")))
    async with HistoryStore(db) as store, ChatClient(settings, provider="peer") as client:
        conv = await store.new_conversation()
        await store.add_user_message(conv, "tell me about pools")
        history = (await store.load(conv)).messages_for_api()
        msg = await store.start_reply(conv, provider="peer", model=client.model, mode="stream")
        writer = store.reply_writer(msg, flush_s=0.05)
        stream = client.stream(history, max_tokens=60)
        async for delta in stream:
            writer.append(delta)
        await writer.finish(status="done", record=stream.record.summary())
        conv_loaded = await store.load(conv)
    reply = conv_loaded.messages[-1]
    assert reply.content == stream.text and len(reply.content) > 20
    assert reply.record is not None and reply.record["output_tokens"] == 60 and reply.record["status"] == 200
    md, records = export_markdown(conv_loaded), export_records_json(conv_loaded)
    assert f"llmchat-local via peer · {reply.record['http_version']} · TTFT" in md
    assert json.loads(records)[0]["message_id"] == reply.id
    files = list(db.parent.iterdir())
    assert files
    for blob in [md, records, repr(conv_loaded)] + [p.read_bytes().decode("latin-1") for p in files]:
        assert KEY not in blob


# -- llmchat export ------------------------------------------------------------------------------------------
def _default_store_with_sample() -> tuple[Path, int]:
    async def fill() -> tuple[Path, int]:
        async with HistoryStore() as store:
            await store.new_conversation(title="older")
            return store.path, await _sample(store)
    return asyncio.run(fill())


def _stderr_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert "Traceback" not in captured.err
    assert len(lines) == 1 and lines[0].startswith("llmchat: "), captured.err
    return lines[0]


def test_export_prints_markdown_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    _, conv = _default_store_with_sample()
    assert main(["export", "last"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("# Pools\n") and "## Assistant (cancelled)" in md
    assert main(["export", str(conv), "--format", "json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert len(records) == 3 and {r["conversation_id"] for r in records} == {conv}
    assert main(["export", str(conv - 1)]) == 0
    assert capsys.readouterr().out.startswith("# older\n")


def test_export_writes_a_private_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, conv = _default_store_with_sample()
    out = tmp_path / "pools.md"
    out.write_text("old")
    out.chmod(0o644)
    assert main(["export", str(conv), "-o", str(out)]) == 0
    assert capsys.readouterr().out == ""
    assert out.read_text(encoding="utf-8").startswith("# Pools\n")
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert main(["export", "last", "-o", str(tmp_path / "no" / "such" / "dir.md")]) == 2
    assert "cannot write" in _stderr_line(capsys)


@pytest.mark.parametrize("bad", ["abc", "0", "-3", "1.5"])
def test_export_refuses_a_bad_id(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    _default_store_with_sample()
    assert main(["export", "--", bad]) == 2
    assert "ID must be a conversation number or `last`" in _stderr_line(capsys)


def test_export_of_an_unknown_id_lists_recent_ones(capsys: pytest.CaptureFixture[str]) -> None:
    _, conv = _default_store_with_sample()
    assert main(["export", "999"]) == 2
    assert _stderr_line(capsys) == (f"llmchat: no conversation 999 in the history; recent ones are {conv}, "
                                    f"{conv - 1} (or use `last`)")


def test_export_with_no_history_creates_none(capsys: pytest.CaptureFixture[str]) -> None:
    path = HistoryStore().path
    assert main(["export", "last"]) == 2
    assert "no history yet" in _stderr_line(capsys)
    assert not path.exists() and not path.parent.exists()


def test_export_from_an_empty_history(capsys: pytest.CaptureFixture[str]) -> None:
    async def create() -> None:
        async with HistoryStore():
            pass
    asyncio.run(create())
    assert main(["export", "last"]) == 2
    assert "the history is empty" in _stderr_line(capsys)


@pytest.mark.parametrize(("content", "words"), [
    (b"garbage " * 100, ("damaged", "mv ")),
    (None, ("newer llmchat", "upgrade llmchat")),
])
def test_export_from_a_broken_history_is_one_line(content: bytes | None, words: tuple[str, ...],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = HistoryStore().path
    path.parent.mkdir(parents=True)
    if content is None:
        with closing(sqlite3.connect(path)) as conn:
            conn.execute("PRAGMA user_version = 99")
    else:
        path.write_bytes(content)
    assert main(["export", "last"]) == 1
    line = _stderr_line(capsys)
    assert str(path) in line and all(w in line for w in words), line
