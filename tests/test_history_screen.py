"""The history screen in a tiny app over a real history file: open, close, rename, delete, remapped keys."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from textual.app import App
from textual.pilot import Pilot
from textual.widgets import DataTable, Input, Static

from llmchat.core.history._store import HistoryStore
from llmchat.tui.app import ChatApp
from llmchat.tui.screens.history import HistoryScreen, when

WAIT_S = 5.0


class HistoryApp(App[None]):
    """Pushes the screen at start and keeps what it dismissed with, posted and notified."""

    # The screen's look and its modes (the rename and confirm rows) live in the app's one stylesheet.
    CSS_PATH = Path(inspect.getfile(ChatApp)).with_name("app.tcss")

    def __init__(self, store: HistoryStore, **screen_kw: Any) -> None:
        super().__init__()
        self.screen_under_test = HistoryScreen(store, **screen_kw)
        self.results: list[int | None] = []
        self.dismissed = asyncio.Event()
        self.posted: list[tuple[str, int, str]] = []
        self.notes: list[str] = []

    def on_mount(self) -> None:
        self.push_screen(self.screen_under_test, callback=self._done)

    def _done(self, result: int | None) -> None:
        self.results.append(result)
        self.dismissed.set()

    def on_history_screen_renamed(self, event: HistoryScreen.Renamed) -> None:
        self.posted.append(("renamed", event.conversation_id, event.title))

    def on_history_screen_deleted(self, event: HistoryScreen.Deleted) -> None:
        self.posted.append(("deleted", event.conversation_id, ""))

    def notify(self, message: Any, **kw: Any) -> None:
        self.notes.append(str(message))
        super().notify(message, **kw)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[HistoryStore]:
    async with HistoryStore(tmp_path / "history.sqlite3") as s:
        yield s


async def _fill(store: HistoryStore) -> list[int]:
    """Three conversations; returns their ids newest first, as the screen lists them."""
    ids = []
    for title, model, n in (("oldest", "m-a", 1), ("middle", "m-b", 2), ("newest", "m-c", 3)):
        conv = await store.new_conversation(title=title, model=model)
        for i in range(n):
            await store.add_user_message(conv, f"{title} {i}")
        ids.append(conv)
    return ids[::-1]


async def settled(app: HistoryApp, pilot: Pilot[None]) -> None:
    """Waits (bounded) until the screen's workers are done and their updates are on screen."""
    await asyncio.wait_for(app.workers.wait_for_complete(), WAIT_S)
    await pilot.pause()


def rows(screen: HistoryScreen) -> list[list[str]]:
    table = screen.query_one(DataTable)
    return [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]


async def test_lists_newest_first_and_enter_opens_the_row_under_the_cursor(store: HistoryStore) -> None:
    ids = await _fill(store)
    app = HistoryApp(store)
    async with app.run_test(size=(100, 30)) as pilot:
        await settled(app, pilot)
        screen = app.screen_under_test
        assert [r[0] for r in rows(screen)] == ["newest", "middle", "oldest"]
        assert [r[2:] for r in rows(screen)] == [["3", "m-c"], ["2", "m-b"], ["1", "m-a"]]
        assert "3 conversations" in str(screen.query_one("#history-title", Static).render())
        await pilot.press("down", "enter")
        await asyncio.wait_for(app.dismissed.wait(), WAIT_S)
    assert app.results == [ids[1]]


async def test_escape_closes_with_none_and_an_empty_history_opens_nothing(store: HistoryStore) -> None:
    app = HistoryApp(store)
    async with app.run_test() as pilot:
        await settled(app, pilot)
        assert rows(app.screen_under_test) == []
        await pilot.press("enter", "r", "d")  # nothing to open, rename or delete
        assert not app.dismissed.is_set() and app.screen is app.screen_under_test
        await pilot.press("escape")
        await asyncio.wait_for(app.dismissed.wait(), WAIT_S)
    assert app.results == [None]


async def test_the_current_conversation_is_marked_and_under_the_cursor(store: HistoryStore) -> None:
    ids = await _fill(store)
    app = HistoryApp(store, current_id=ids[2])
    async with app.run_test() as pilot:
        await settled(app, pilot)
        assert [r[0] for r in rows(app.screen_under_test)] == ["newest", "middle", "● oldest"]
        await pilot.press("enter")
        await asyncio.wait_for(app.dismissed.wait(), WAIT_S)
    assert app.results == [ids[2]]


async def test_rename_saves_the_new_title_and_escape_keeps_the_old_one(store: HistoryStore) -> None:
    ids = await _fill(store)
    app = HistoryApp(store)
    async with app.run_test() as pilot:
        await settled(app, pilot)
        screen = app.screen_under_test
        await pilot.press("r")
        field = screen.query_one("#history-rename", Input)
        assert screen.mode == "rename" and field.has_focus and field.value == "newest"
        await pilot.press("end", "ctrl+u", "x", "escape")
        assert screen.mode == "list" and screen.query_one(DataTable).has_focus
        await pilot.press("down", "r", "end", "ctrl+u", *"h2", "enter")
        await settled(app, pilot)
        assert [r[0] for r in rows(screen)] == ["newest", "h2", "oldest"]
        assert screen.query_one(DataTable).cursor_row == 1  # the cursor stays on the renamed row
        assert not app.dismissed.is_set()
    assert {c.id: c.title for c in await store.list_conversations()} == {
        ids[0]: "newest", ids[1]: "h2", ids[2]: "oldest"}
    assert app.posted == [("renamed", ids[1], "h2")]


async def test_delete_asks_first_and_only_a_yes_deletes(store: HistoryStore) -> None:
    ids = await _fill(store)
    app = HistoryApp(store)
    async with app.run_test() as pilot:
        await settled(app, pilot)
        screen = app.screen_under_test
        await pilot.press("d")
        assert screen.mode == "confirm"
        question = str(screen.query_one("#history-confirm", Static).render())
        assert "Delete “newest” and its 3 messages?" in question
        await pilot.press("n")
        await pilot.press("d", "escape")  # Esc withdraws the question, it does not close the screen
        await pilot.press("d", "down", "y")  # moving away withdraws it too: this y is not a yes
        await settled(app, pilot)
        assert screen.mode == "list" and not app.dismissed.is_set()
        assert len(await store.list_conversations()) == 3
        await pilot.press("d", "y")  # the cursor is on "middle" now
        await settled(app, pilot)
        assert [r[0] for r in rows(screen)] == ["newest", "oldest"]
        await pilot.press("d", "d")  # the delete key twice is a yes too
        await settled(app, pilot)
        assert [r[0] for r in rows(screen)] == ["newest"]
    assert [c.id for c in await store.list_conversations()] == [ids[0]]
    assert app.posted == [("deleted", ids[1], ""), ("deleted", ids[2], "")]


async def test_keys_follow_the_keymap(store: HistoryStore) -> None:
    ids = await _fill(store)
    app = HistoryApp(store)
    async with app.run_test() as pilot:
        app.set_keymap({"history.delete": "x", "history.confirm": "j", "history.resume": "o"})
        await settled(app, pilot)
        await pilot.press("d", "x", "j")
        await settled(app, pilot)
        assert [r[0] for r in rows(app.screen_under_test)] == ["middle", "oldest"]
        await pilot.press("o")
        await asyncio.wait_for(app.dismissed.wait(), WAIT_S)
    assert app.results == [ids[1]]


async def test_a_store_error_is_a_notification_and_the_list_is_refreshed(store: HistoryStore) -> None:
    ids = await _fill(store)
    app = HistoryApp(store)
    async with app.run_test() as pilot:
        await settled(app, pilot)
        await store.delete(ids[0])  # gone behind the screen's back, e.g. from another window
        await pilot.press("r", "x", "enter")
        await settled(app, pilot)
        assert [r[0] for r in rows(app.screen_under_test)] == ["middle", "oldest"]
        assert not app.dismissed.is_set()
    assert len(app.notes) == 1 and app.notes[0].startswith(f"no conversation {ids[0]} in the history")
    assert app.posted == []


def test_when_is_short_and_local() -> None:
    now = time.mktime((2025, 6, 15, 12, 0, 0, 0, 0, -1))
    assert when(now - 3600, now) == "11:00"
    assert when(time.mktime((2025, 3, 3, 14, 2, 0, 0, 0, -1)), now) == "Mar 03 14:02"
    assert when(time.mktime((2023, 3, 3, 14, 2, 0, 0, 0, -1)), now) == "2023-03-03"
