"""The prompt: a TextArea where Enter sends and Shift+Enter, Ctrl+J or Alt+Enter start a new line."""

from __future__ import annotations

from typing import ClassVar

from textual.binding import BindingType
from textual.message import Message
from textual.widgets import TextArea

from llmchat.tui.keys import binding


class PromptInput(TextArea):
    """Multi-line input for the next prompt.

    TextArea inserts a newline on Enter from its key handler, which runs before ordinary bindings;
    these bindings are priority bindings so Enter reaches ``send`` first. Both carry ids, so an app
    keymap can move them (``App.set_keymap({"prompt.send": "ctrl+s"})``). Many terminals never
    report Shift+Enter, and without the kitty keyboard protocol Alt+Enter arrives as plain Enter;
    Ctrl+J works everywhere.
    """

    DEFAULT_CSS = """
    PromptInput {
        height: auto;
        min-height: 3;
        max-height: 12;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        binding("prompt.send", "send", priority=True),
        binding("prompt.newline", "newline", priority=True, show=False),
    ]

    class Submitted(Message):
        """The user sent a prompt (its text is never empty or only whitespace)."""

        def __init__(self, prompt_input: PromptInput, text: str) -> None:
            super().__init__()
            self.prompt_input = prompt_input
            """The input the text came from."""
            self.text = text
            """The prompt as typed."""

        @property
        def control(self) -> PromptInput:
            """The input the text came from."""
            return self.prompt_input

    def __init__(
        self,
        text: str = "",
        *,
        placeholder: str = "Ask anything · Enter sends · Ctrl+J new line",
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(
            text,
            soft_wrap=True,
            tab_behavior="focus",
            placeholder=placeholder,
            name=name,
            id=id,
            classes=classes,
        )

    def action_send(self) -> None:
        """Post ``Submitted`` with the text and clear the input; nothing happens for blank text."""
        text = self.text
        if not text.strip():
            return
        self.clear()
        self.post_message(self.Submitted(self, text))

    def action_newline(self) -> None:
        """Insert a line break at the cursor, replacing any selection."""
        if self.read_only:
            return
        start, end = self.selection
        self.replace("\n", start, end, maintain_selection_offset=False)

    def restore(self, text: str) -> None:
        """Put ``text`` back (after a failed request), cursor at the end, so nothing typed is lost.

        Text typed since the prompt was sent is kept after it, on its own line.
        """
        current = self.text
        combined = f"{text}\n{current}" if current.strip() else text
        self.load_text(combined)
        self.move_cursor(self.document.end)
