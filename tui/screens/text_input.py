"""A small modal that asks for one line of text (a system prompt, a new title)."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label

from llmchat.tui.keys import binding


class TextInputScreen(ModalScreen[str | None]):
    """Dismisses with the text on Enter, or None on Esc."""

    DEFAULT_CSS = """
    TextInputScreen { align: center middle; }
    TextInputScreen > Vertical { width: 70%; height: auto; border: round $accent; padding: 1 2; background: $panel; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [binding("input.cancel", "cancel")]

    def __init__(self, title: str, value: str = "") -> None:
        super().__init__()
        self._title = title
        self._value = value

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self._title)
            yield Input(value=self._value, id="text")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)
