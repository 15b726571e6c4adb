"""The system prompt editor: a modal with a multi-line text area. Save (Ctrl+S or the button) dismisses with
the text, Cancel (Esc or the button) with None; the caller decides what saving means."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static, TextArea

from llmchat.tui.keys import BY_ID, binding, key_label


class SystemPromptScreen(ModalScreen[str | None]):
    """Edits ``text``, the conversation's system prompt; dismisses with the new text (surrounding blank
    lines and spaces trimmed; "" clears it) or None when cancelled. ``save_keys`` and ``cancel_keys`` are the
    keys in effect, for the hint line ([keymap] may have moved them)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        binding("system.save", "save"),
        binding("system.cancel", "cancel"),
    ]

    def __init__(self, text: str = "", *, save_keys: str | None = None,
                 cancel_keys: str | None = None) -> None:
        super().__init__()
        self._text = text
        self._save = key_label(save_keys or BY_ID["system.save"].keys)
        self._cancel = key_label(cancel_keys or BY_ID["system.cancel"].keys)

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("System prompt for this conversation")
            yield Static(f"Sent first with every message of it. Enter starts a new line; {self._save} saves, "
                         f"{self._cancel} cancels; an empty prompt clears it.", id="hint", markup=False)
            yield TextArea(self._text, id="system-text", soft_wrap=True, show_line_numbers=False)
            with Horizontal():
                yield Button("Cancel", id="cancel")
                yield Button("Save", id="save", variant="primary")

    def on_mount(self) -> None:
        area = self.query_one(TextArea)
        area.focus()
        area.move_cursor(area.document.end)

    @property
    def text(self) -> str:
        """What the editor holds now."""
        return self.query_one(TextArea).text

    def action_save(self) -> None:
        self.dismiss(self.text.strip())

    def action_cancel(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#save")
    def _save_pressed(self) -> None:
        self.action_save()

    @on(Button.Pressed, "#cancel")
    def _cancel_pressed(self) -> None:
        self.action_cancel()
