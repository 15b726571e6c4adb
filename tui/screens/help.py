"""The help screen (F1): every key binding of the registry with the key in effect and what it does."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import groupby
from typing import ClassVar

from rich.cells import cell_len
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Static

from llmchat.tui.keys import REGISTRY, binding, effective_keys, key_label

_CELL = 2
"""Cells a DataTable column takes beyond its width (its cell padding, one each side)."""
_CHROME = 2 + 3 * _CELL
"""Cells of the table that are not text with three columns: a vertical scrollbar and each column's padding."""
_MIN_HELP = 24
"""The fewest cells "What it does" gets before the id moves under the key."""


class HelpScreen(ModalScreen[None]):
    """A modal table of the bindings by where they apply: key, id, what it does. Esc closes it.

    ``keys`` maps ids to the keys in effect (the defaults with ``[keymap]`` applied); ids it lacks show their
    defaults.
    """

    BINDINGS: ClassVar[list[BindingType]] = [binding("help.close", "close")]

    def __init__(self, keys: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.keys = {**effective_keys({}), **(keys or {})}
        self._filled_at = 0

    def compose(self) -> ComposeResult:
        with Vertical(id="help-dialog"):
            yield Static("Keys", id="help-title")
            yield Static(
                "Move any of these under [keymap] in the config file by its id, "
                'e.g. "prompt.send" = "ctrl+s". Ctrl+P opens the command palette.',
                id="help-note",
                markup=False,
            )
            yield DataTable(id="help-table", cursor_type="none")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#help-table", DataTable).focus()
        self.call_after_refresh(self._fill)  # once the table is laid out: its width decides its columns

    def on_resize(self, _event: events.Resize) -> None:
        self.call_after_refresh(self._fill)

    def _fill(self) -> None:
        """The rows, fitted to the table's width: each row on one line where that fits; else the keys one
        under another and "What it does" wrapped; under _MIN_HELP cells for it, the id under the key too
        (a table wider than the screen scrolls its last column, what a key does, out of sight)."""
        table: DataTable[object] = self.query_one("#help-table", DataTable)
        width = table.size.width - _CHROME
        if width <= 0 or width == self._filled_at:
            return
        self._filled_at = width
        labels = {entry.id: key_label(self.keys[entry.id]) for entry in REGISTRY}
        joined = max(cell_len(label) for label in labels.values())
        # A key column at least as wide as the headings of the places, which it holds too.
        one_key = max([cell_len(key) for label in labels.values() for key in label.split(" / ")]
                      + [cell_len(entry.where) for entry in REGISTRY])
        ids = max(len(entry.id) for entry in REGISTRY)
        helps = max(cell_len(entry.help) for entry in REGISTRY)
        stack = joined + ids + helps > width
        key_width = one_key if stack else joined
        help_width = width - key_width - ids
        with_id = help_width >= _MIN_HELP  # the id in a column of its own
        if not with_id:
            key_width, help_width = max(one_key, ids), width - max(one_key, ids) + _CELL
        table.clear(columns=True)
        table.add_column("Key", width=key_width)
        if with_id:
            table.add_column("Id", width=ids)
        table.add_column("What it does", width=max(help_width, 1))
        blank = ("", "") if with_id else ("",)
        for where, entries in groupby(REGISTRY, key=lambda entry: entry.where):
            # A heading row per place: a column for it would not fit beside the rest in 100 columns.
            table.add_row(Text(where[0].upper() + where[1:], style="italic"), *blank, key=f"where:{where}")
            for entry in entries:
                label = labels[entry.id]
                keys = Text(label.replace(" / ", "\n") if stack else label, style="bold")
                if not with_id:
                    keys.append(f"\n{entry.id}", style="not bold dim")
                cells = (keys, entry.id, entry.help) if with_id else (keys, entry.help)
                table.add_row(*cells, key=entry.id, height=None if stack else 1)

    def action_close(self) -> None:
        self.dismiss(None)
