"""The history screen: the saved conversations, newest first, to open, rename or delete one.

It talks to a :class:`~llmchat.core.history._store.HistoryStore` (already open) in workers, so the list loads and
changes without ever blocking the app. It dismisses with the id to open, or None when closed. Renames and
deletions are posted as :class:`HistoryScreen.Renamed` and :class:`HistoryScreen.Deleted` (they bubble to the
app) so the shell can retitle or leave a conversation that is gone.
"""

from __future__ import annotations

import time
from typing import ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Vertical
from textual.content import Content
from textual.css.query import NoMatches
from textual.message import Message
from textual.reactive import reactive
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Input, Static

from llmchat.core.history import ConversationInfo, HistoryError, HistoryStore
from llmchat.tui.keys import binding


def when(wall: float, now: float) -> str:
    """A short local time for the list: ``14:02`` today, ``Mar 03 14:02`` this year, ``2023-03-03`` before."""
    then, today = time.localtime(wall), time.localtime(now)
    if then[:3] == today[:3]:
        return time.strftime("%H:%M", then)
    if then.tm_year == today.tm_year:
        return time.strftime("%b %d %H:%M", then)
    return time.strftime("%Y-%m-%d", then)


class HistoryScreen(ModalScreen[int | None]):
    """A modal list of conversations. Enter opens, r renames, d deletes (after a yes), Esc closes.

    The keys are bindings with ids from the registry (``history.resume``, ``history.rename``,
    ``history.delete``, ``history.confirm``, ``history.keep``, ``history.close``) so the app's keymap can move
    them; ``history.open`` is the app's key that opens this screen.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        # Priority, so the footer shows it over the table's own hidden Enter; hidden outside the list, the key
        # then falls through to the rename Input.
        binding("history.resume", "open", priority=True),
        binding("history.rename", "rename"),
        binding("history.delete", "delete"),
        binding("history.confirm", "confirm"),
        binding("history.keep", "keep"),
        binding("history.close", "close"),
    ]

    #: "list" to browse, "rename" while the title input is open, "confirm" while a delete waits for a yes.
    mode: reactive[str] = reactive("list", bindings=True, init=False)
    #: False until the first list has arrived from the store.
    loaded: reactive[bool] = reactive(False)

    class Renamed(Message):
        """A conversation got a new title."""

        def __init__(self, conversation_id: int, title: str) -> None:
            super().__init__()
            self.conversation_id = conversation_id
            self.title = title

    class Deleted(Message):
        """A conversation and its messages were deleted."""

        def __init__(self, conversation_id: int) -> None:
            super().__init__()
            self.conversation_id = conversation_id

    def __init__(self, store: HistoryStore, *, current_id: int | None = None, limit: int = 200) -> None:
        super().__init__()
        self.store = store
        self.current_id = current_id
        self.limit = limit
        #: The conversations in table order: the row index is the index here.
        self.conversations: list[ConversationInfo] = []
        # The conversation a rename or delete question is about, fixed when asked: the cursor may move since.
        self._target: ConversationInfo | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="history-dialog"):
            yield Static("History", id="history-title")
            yield DataTable(id="history-table", cursor_type="row", zebra_stripes=True)
            yield Input(id="history-rename", placeholder="New title, Enter to save, Esc to keep the old one")
            yield Static(id="history-confirm")
        yield Footer()

    def on_mount(self) -> None:
        self.table.add_columns("Title", "Updated", "Msgs", "Model")
        self.table.focus()
        self.reload(select_id=self.current_id)

    @property
    def table(self) -> DataTable[object]:
        return self.query_one("#history-table", DataTable)

    @property
    def selected(self) -> ConversationInfo | None:
        """The conversation under the cursor, None when the list is empty."""
        try:
            row = self.table.cursor_row
        except NoMatches:  # asked for the footer before the table exists
            return None
        return self.conversations[row] if 0 <= row < len(self.conversations) else None

    # -- loading ---------------------------------------------------------------------------------------------
    @work(exclusive=True, group="history-load")
    async def reload(self, select_id: int | None = None) -> None:
        """Fetches the list again and keeps the cursor on ``select_id`` (or near where it was)."""
        try:
            infos = await self.store.list_conversations(self.limit)
        except HistoryError as exc:
            self.notify(str(exc), severity="error")
            return
        self._show(infos, select_id)

    def _show(self, infos: list[ConversationInfo], select_id: int | None) -> None:
        old_row = self.table.cursor_row
        self.conversations = infos
        table = self.table
        table.clear()
        now = time.time()
        for info in infos:
            mark = "● " if info.id == self.current_id else ""
            table.add_row(Text(mark + (info.title or "(untitled)")), when(info.updated_at, now),
                          str(info.message_count), Text(info.model), key=str(info.id))
        ids = [info.id for info in infos]
        row = ids.index(select_id) if select_id in ids else min(old_row, len(ids) - 1)
        if row >= 0:
            table.move_cursor(row=row)
        n = len(infos)
        count = f"{n} conversation{'' if n == 1 else 's'}" if n else "no conversations yet"
        self.query_one("#history-title", Static).update(Content(f"History · {count}"))
        self.loaded = True

    # -- modes -----------------------------------------------------------------------------------------------
    def watch_mode(self, old: str, new: str) -> None:
        self.remove_class(f"-{old}")
        self.add_class(f"-{new}")
        if new == "rename":
            self.query_one("#history-rename", Input).focus()
        elif new == "list":
            self._target = None
            self.table.focus()

    @on(DataTable.RowHighlighted, "#history-table")
    def _cursor_moved(self, event: DataTable.RowHighlighted) -> None:
        # A yes must answer the question about the row it was asked about; moving away withdraws it.
        selected, target = self.selected, self._target
        if self.mode == "confirm" and (selected is None or target is None or selected.id != target.id):
            self.mode = "list"

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # Hidden, not just greyed, outside their mode: the footer shows only the keys that do something now,
        # and a hidden binding lets the key fall through (Enter and letters reach the rename Input).
        if action in ("open", "rename"):
            return self.mode == "list" and self.selected is not None
        if action == "delete":
            return self.mode in ("list", "confirm") and self.selected is not None
        if action in ("confirm", "keep"):
            return self.mode == "confirm"
        return True

    # -- actions ---------------------------------------------------------------------------------------------
    def action_open(self) -> None:
        info = self.selected
        if self.mode == "list" and info is not None:
            self.dismiss(info.id)

    @on(DataTable.RowSelected, "#history-table")
    def _row_chosen(self, event: DataTable.RowSelected) -> None:
        # The table takes Enter (and clicks) itself while it has focus; both mean open.
        event.stop()
        self.action_open()

    def action_rename(self) -> None:
        info = self.selected
        if info is None:
            return
        self._target = info
        self.query_one("#history-rename", Input).value = info.title
        self.mode = "rename"

    @on(Input.Submitted, "#history-rename")
    def _rename_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        info = self._target
        self.mode = "list"
        if info is not None:
            self._rename(info.id, event.value)

    @work(group="history-change")
    async def _rename(self, conv_id: int, title: str) -> None:
        try:
            await self.store.rename(conv_id, title)
        except HistoryError as exc:
            self.notify(str(exc), severity="error")
        else:
            self.post_message(self.Renamed(conv_id, " ".join(title.split())))
        self.reload(select_id=conv_id)

    def action_delete(self) -> None:
        info = self.selected
        if info is None:
            return
        if self.mode == "confirm":
            # The delete key pressed twice is a yes too.
            self.action_confirm()
            return
        self._target = info
        n = info.message_count
        self.query_one("#history-confirm", Static).update(Content(
            f"Delete “{info.title or '(untitled)'}” and its {n} message{'' if n == 1 else 's'}?"))
        self.mode = "confirm"

    def action_confirm(self) -> None:
        info = self._target
        self.mode = "list"
        if info is not None:
            self._delete(info.id)

    @work(group="history-change")
    async def _delete(self, conv_id: int) -> None:
        try:
            await self.store.delete(conv_id)
        except HistoryError as exc:
            self.notify(str(exc), severity="error")
        else:
            self.post_message(self.Deleted(conv_id))
        self.reload()

    def action_keep(self) -> None:
        self.mode = "list"

    def action_close(self) -> None:
        """Esc backs out of a rename or a delete question first; from the list it closes the screen."""
        if self.mode != "list":
            self.mode = "list"
        else:
            self.dismiss(None)
