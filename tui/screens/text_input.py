"""A small modal that asks for one line of text (a generation setting, a new title)."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.suggester import Suggester
from textual.widgets import Input, Label, Static

from llmchat.tui.keys import binding


class TextInputScreen(ModalScreen[str | None]):
    """Dismisses with the text on Enter, or None on Esc.

    ``check(text)`` returns the one line that says what is wrong with ``text`` ("" when it is fine): the box
    then stays open with the text as typed and the line under it, so nothing typed is lost. ``hint`` is a
    muted line under the title (what the value does, what empty means); ``suggester`` completes what is typed
    (→ takes the suggestion).
    """

    BINDINGS: ClassVar[list[BindingType]] = [binding("input.cancel", "cancel")]

    def __init__(self, title: str, value: str = "", *, hint: str = "",
                 check: Callable[[str], str] | None = None, suggester: Suggester | None = None) -> None:
        super().__init__()
        self._suggester = suggester
        self._title = title
        self._value = value
        self._hint = hint
        self._check = check

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self._title)
            if self._hint:
                yield Static(self._hint, id="hint", markup=False)
            yield Input(value=self._value, id="text", suggester=self._suggester)
            problem = Static("", id="problem", markup=False)
            problem.display = False
            yield problem

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        problem = self._check(event.value) if self._check is not None else ""
        if problem:
            line = self.query_one("#problem", Static)
            line.update(problem)
            line.display = True
            return
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)
