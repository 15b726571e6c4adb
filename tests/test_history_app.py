"""The chat app on a history it cannot fully use, and on replies that did not finish: Pilot drives the app
against the local server over real sockets, on real SQLite files in tmp (see history_files.py)."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from history_files import damage_while_open, file_state, make_history, overwrite_pages, read_only
from test_app import MODEL, _send, _settings, _until

from llmchat.core import ChatClient
from llmchat.core.history import _file as _history_file
from llmchat.core.history._store import HistoryStore, export_markdown
from llmchat.core.server import RunningServer
from llmchat.tui.app import ChatApp, make_app
from llmchat.tui.widgets.chat import ChatMessage, PromptInput
from llmchat.tui.widgets.chat._lines import text_of

Factory = Callable[..., RunningServer]


def _app(server: RunningServer, tmp_path: Path, db: Path, **kw: Any) -> ChatApp:
    settings = _settings(tmp_path)
    client = ChatClient(settings, base_url=server.base_url, model=MODEL, http2="h2c")
    return make_app(settings=settings, client=client, store=HistoryStore(db), **kw)


def _history_notes(app: ChatApp) -> list[str]:
    return [str(n.message) for n in app._notifications if n.title == "History"]


def _said(app: ChatApp, words: str) -> bool:
    return any(words in str(n.message) for n in app._notifications)


async def _garbage(db: Path) -> None:
    db.parent.mkdir(parents=True)
    db.write_bytes(b"not a database, just text\n" * 200)


async def _pages_overwritten(db: Path) -> None:
    await make_history(db, conversations=12)
    overwrite_pages(db)


async def _newer(db: Path) -> None:
    db.parent.mkdir(parents=True)
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA user_version = 99")


async def _a_folder(db: Path) -> None:
    db.mkdir(parents=True)


CASES: dict[str, tuple[Callable[[Path], Awaitable[None]] | str, str, str]] = {
    # name: (how the file is made, or which of it is made read-only; the state; words of the one line)
    "read-only file": ("file", "read-only", "history is read-only: new messages are not saved"),
    "read-only folder": ("folder", "read-only", "history is read-only: new messages are not saved"),
    "garbage": (_garbage, "in-memory", "is damaged"),
    "pages overwritten": (_pages_overwritten, "in-memory", "is damaged (integrity check"),
    "from a newer llmchat": (_newer, "in-memory", "newer llmchat"),
    "a folder in its place": (_a_folder, "in-memory", "cannot open history"),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_the_app_starts_says_why_and_chats_on_any_history(
    case: str, local_server: RunningServer, tmp_path: Path
) -> None:
    make, state, words = CASES[case]
    db = tmp_path / "my [data]" / "history.sqlite3"  # a space to quote, brackets that are not markup
    if isinstance(make, str):
        await make_history(db, conversations=2)
        locked: Path | None = db if make == "file" else db.parent
    else:
        await make(db)
        locked = None
    before = file_state(db) if db.is_file() else None
    app = _app(local_server, tmp_path, db)
    with read_only(locked) if locked is not None else _nothing():
        async with app.run_test(size=(140, 40)) as pilot:
            await _until(pilot, lambda: bool(_history_notes(app)))
            notes = _history_notes(app)
            assert len(notes) == 1 and words in notes[0] and "\n" not in notes[0], notes
            assert app.store.state == state
            if state == "in-memory" and case != "a folder in its place":
                assert f"mv '{db}' '{db}.damaged'" in notes[0]  # the exact command, quoted
            reply = await _send(pilot, app, "still there?")
            await _until(pilot, lambda: reply.is_final)
            assert reply.status == "done" and "still there?" in reply.text
            conv = await app.store.load(app.conversation_id)  # type: ignore[arg-type]
            assert [m.content for m in conv.messages] == ["still there?", reply.text]
        assert not app.return_code  # None (the test closed it) or 0; a crash is 1
    if before is not None:
        assert file_state(db) == before  # nothing was written to a file llmchat could not use


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


async def test_a_prompt_that_cannot_be_saved_stays_in_the_input(
    local_server: RunningServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "data" / "history.sqlite3"
    await make_history(db, conversations=1)
    monkeypatch.setattr(_history_file, "BUSY_TIMEOUT_S", 0.2)
    app = _app(local_server, tmp_path, db)
    async with app.run_test(size=(140, 40)) as pilot:
        prompt = app.query_one(PromptInput)
        with closing(sqlite3.connect(db, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")  # another program holds the write lock
            prompt.text = "keep me"
            await pilot.press("enter")
            await _until(pilot, lambda: _said(app, "locked by another program"))
            assert prompt.text == "keep me" and not app.query(ChatMessage) and not app.replying
            assert _said(app, "your message is back in the input")
            other.execute("ROLLBACK")
        await pilot.press("enter")  # the lock is gone: the same text goes out
        await _until(pilot, lambda: len(app.query(ChatMessage)) == 1)
        reply = app.query_one(ChatMessage)
        await _until(pilot, lambda: reply.is_final)
        assert reply.status == "done" and prompt.text == "" and app.store.state == "ok"
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT COUNT(*) FROM messages WHERE content = 'keep me'").fetchone() == (1,)


async def test_damage_found_mid_session_is_one_notification_and_the_chat_goes_on(
    local_server: RunningServer, tmp_path: Path
) -> None:
    db = tmp_path / "data" / "history.sqlite3"
    await make_history(db, conversations=12)
    app = _app(local_server, tmp_path, db)
    async with app.run_test(size=(140, 40)) as pilot:
        first = await _send(pilot, app, "before")
        await _until(pilot, lambda: first.is_final and not app.replying)
        assert _history_notes(app) == []
        damage_while_open(db)
        second = await _send(pilot, app, "after the damage")
        await _until(pilot, lambda: second.is_final)
        assert second.status == "done" and "after the damage" in second.text
        notes = _history_notes(app)
        assert len(notes) == 1 and "is damaged" in notes[0] and "kept in memory only" in notes[0], notes
        assert app.store.state == "in-memory"
        third = await _send(pilot, app, "and on")
        await _until(pilot, lambda: third.is_final)
        assert len(_history_notes(app)) == 1  # said once, not at every message
        conv = await app.store.load(app.conversation_id)  # type: ignore[arg-type]
        assert [m.content for m in conv.messages if m.role == "user"] == ["after the damage", "and on"]
    assert not app.return_code  # None (the test closed it) or 0; a crash is 1


async def test_quitting_mid_stream_keeps_the_reply_marked_interrupted(server_factory: Factory, tmp_path: Path) -> None:
    server = server_factory(tokens_per_s=40)
    db = tmp_path / "history.sqlite3"
    app = _app(server, tmp_path, db)
    async with app.run_test(size=(140, 40)) as pilot:
        reply = await _send(pilot, app, "a long one please")
        await _until(pilot, lambda: len(reply.text) > 10)
        app.exit()  # what Ctrl+Q does
    shown = reply.text
    async with HistoryStore(db) as store:
        conv = await store.load(await store.last_conversation_id() or 0)
    saved = conv.messages[-1]
    assert (saved.role, saved.status, saved.content) == ("assistant", "interrupted", shown)
    assert saved.record is not None and saved.record["cancelled"] is True
    assert "_(interrupted: the reply was cut off)_" in export_markdown(conv)

    again = _app(server, tmp_path, db, continue_last=True)
    async with again.run_test(size=(140, 40)) as pilot:
        await _until(pilot, lambda: len(again.query(ChatMessage)) == 1)
        restored = again.query_one(ChatMessage)
        # "interrupted", not "cancelled": nobody stopped it.
        assert restored.text == shown and restored.status == "interrupted"
        end = " ".join(text_of(line) for line in restored.lines_for(restored.inner_width)[-2:])
        assert "interrupted: the reply was cut off · " in end and "cancelled" not in end, end
        assert again.history[-1]["content"].endswith("[reply cut short: interrupted]")
