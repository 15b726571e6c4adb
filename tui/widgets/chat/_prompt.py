"""The prompt: a TextArea where Enter sends and Shift+Enter, Ctrl+J or Alt+Enter start a new line, and PageUp,
PageDown, Ctrl+Home and Ctrl+End (Home and End in an empty prompt) scroll the conversation."""

from __future__ import annotations

from functools import partial
from typing import ClassVar

from textual import events
from textual.binding import BindingType
from textual.message import Message
from textual.widgets import TextArea

from llmchat.tui.keys import BY_ID, binding, key_label, key_names

#: Where the reading keys scroll the conversation to, by the suffix of their binding id.
READING = ("pageup", "pagedown", "top", "bottom")
#: Keys that edit text in a prompt that has some, and read the conversation only in an empty one.
_EDITING = frozenset({"home", "end"})


class PromptInput(TextArea):
    """Multi-line input for the next prompt.

    Send and new line are handled by the prompt's own key handler, in the order the keys arrived. A terminal
    delivers a typed line and its Enter in one burst (fast typing, a paste without bracketed paste, tmux or
    ssh, a busy loop); a priority binding would run at the App before this widget had applied the keys queued
    ahead of Enter, and a plain binding after the key bubbled up, when keys typed after Enter may be in.

    The keys it acts on are ``send_keys`` and ``newline_keys`` (Textual key strings; :meth:`use_keys` changes
    them); ChatApp passes those of ``[keymap]``. The bindings below carry the same ids for the footer, so an
    app's ``set_keymap`` moves what the footer shows. Many terminals never report Shift+Enter, and without the
    kitty keyboard protocol Alt+Enter arrives as plain Enter; Ctrl+J works everywhere.

    While :attr:`held` is set (an app sets it while a reply is in flight) sending leaves the text where it is
    and posts :class:`Held` instead. With ``hold_on_send`` the prompt holds itself the moment it sends, until
    the app says otherwise: a second Enter in the same burst cannot clear the input before the app has even
    seen the first.
    """

    DEFAULT_CSS = """
    PromptInput {
        height: auto;
        min-height: 3;
        max-height: 12;
    }
    """

    READING: ClassVar[tuple[str, ...]] = READING
    """Where the reading keys scroll to (``conversation.WHERE`` in the key registry)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        binding("prompt.send", "send"),
        binding("prompt.newline", "newline", show=False),
        *(binding(f"conversation.{where}", f"read('{where}')", show=False) for where in READING),
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

    class Read(Message):
        """A reading key was pressed: scroll the conversation to ``where`` (one of :data:`READING`)."""

        def __init__(self, prompt_input: PromptInput, where: str) -> None:
            super().__init__()
            self.prompt_input = prompt_input
            self.where = where

        @property
        def control(self) -> PromptInput:
            return self.prompt_input

    class Held(Message):
        """The user pressed send while the prompt was held; the text is still in the input."""

        def __init__(self, prompt_input: PromptInput) -> None:
            super().__init__()
            self.prompt_input = prompt_input

        @property
        def control(self) -> PromptInput:
            """The input that was held."""
            return self.prompt_input

    def __init__(
        self,
        text: str = "",
        *,
        placeholder: str | None = None,
        send_keys: str = BY_ID["prompt.send"].keys,
        newline_keys: str = BY_ID["prompt.newline"].keys,
        hold_on_send: bool = False,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(
            text,
            soft_wrap=True,
            tab_behavior="focus",
            placeholder=placeholder or "",
            name=name,
            id=id,
            classes=classes,
        )
        self.held = False
        """While True, send keeps the text and posts Held."""
        self.hold_on_send = hold_on_send
        """Set ``held`` on each send (the app clears it)."""
        self._send_keys: tuple[str, ...] = ()
        self._newline_keys: tuple[str, ...] = ()
        self._reading_keys: dict[str, str] = {}
        # Without a placeholder of its own the prompt names the keys it acts on, and follows them.
        self._own_placeholder = placeholder is None
        self.use_keys(send=send_keys, newline=newline_keys)
        self.use_reading_keys({where: BY_ID[f"conversation.{where}"].keys for where in READING})

    def use_reading_keys(self, keys: dict[str, str]) -> None:
        """The keys that scroll the conversation, by where they go (``{"pageup": "pageup"}``, see
        :data:`READING`). A bare Home or End among them scrolls only while the prompt is empty: in text they
        move the cursor, as in any editor."""
        self._reading_keys = {key: where for where, spec in keys.items() for key in key_names(spec)}

    def use_keys(self, *, send: str | None = None, newline: str | None = None) -> None:
        """Act on these keys (Textual key strings such as ``"ctrl+s"`` or ``"enter,ctrl+m"``) from now on;
        None keeps the current ones. A key in both sends."""
        if send is not None:
            self._send_keys = key_names(send)
        if newline is not None:
            self._newline_keys = key_names(newline)
        if self._own_placeholder:
            # Ctrl+J by preference: it is the one new-line key every terminal reports.
            newline_key = "ctrl+j" if "ctrl+j" in self._newline_keys else self._newline_keys[0]
            send_key = key_label(self._send_keys[0])
            self.placeholder = f"Ask anything · {send_key} sends · {key_label(newline_key)} new line"

    def on_key(self, event: events.Key) -> None:
        # Dispatch runs this before TextArea._on_key (the MRO, subclass first): prevent_default skips that
        # one, stop keeps the key from bubbling up to a binding.
        if event.key in self._send_keys:
            action = self.action_send
        elif event.key in self._newline_keys:
            action = self.action_newline
        elif event.key in self._reading_keys:
            if event.key in _EDITING and self.text:
                # The binding of the same key (for the footer and help) would win over TextArea's own:
                # in text, Home and End do what they do in any editor.
                action = self.action_cursor_line_start if event.key == "home" else self.action_cursor_line_end
            else:
                action = partial(self.action_read, self._reading_keys[event.key])
        else:
            return
        event.stop()
        event.prevent_default()
        action()

    def action_send(self) -> None:
        """Post ``Submitted`` with the text and clear the input; nothing happens for blank text. While held,
        the text stays and ``Held`` is posted."""
        text = self.text
        if not text.strip():
            return
        if self.held:
            self.post_message(self.Held(self))
            return
        self.held = self.hold_on_send
        self.clear()
        self.post_message(self.Submitted(self, text))

    def action_read(self, where: str) -> None:
        """Post :class:`Read`: the app scrolls the conversation."""
        self.post_message(self.Read(self, where))

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
