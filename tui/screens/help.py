"""The help screen (F1): every key binding of the registry with the key in effect and what it does."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import groupby
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Static

from llmchat.tui.keys import REGISTRY, binding, effective_keys, key_label


class HelpScreen(ModalScreen[None]):
    """A modal table of the bindings by where they apply: key, id, what it does. Esc closes it.

    ``keys`` maps ids to the keys in effect (the defaults with ``[keymap]`` applied); ids it lacks show their
    defaults.
    """

    BINDINGS: ClassVar[list[BindingType]] = [binding("help.close", "close")]

    def __init__(self, keys: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.keys = {**effective_keys({}), **(keys or {})}

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
        table: DataTable[object] = self.query_one("#help-table", DataTable)
        table.add_columns("Key", "Id", "What it does")
        for where, entries in groupby(REGISTRY, key=lambda entry: entry.where):
            # A heading row per place: a column for it would not fit beside the rest in 100 columns.
            table.add_row(Text(where[0].upper() + where[1:], style="italic"), "", "", key=f"where:{where}")
            for entry in entries:
                table.add_row(Text(key_label(self.keys[entry.id]), style="bold"), entry.id, entry.help,
                              key=entry.id)
        table.focus()

    def action_close(self) -> None:
        self.dismiss(None)
