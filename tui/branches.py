"""The chat app's keys for reading and reworking a conversation: select a message, copy it or a code block of
it, regenerate the last reply, edit a prompt into a new branch, switch between alternatives, search.

A mixin of :class:`llmchat.tui.app.ChatApp` (kept apart so the app module stays about wiring): the tree
itself is the history's (:meth:`HistoryStore.select`, ``alternative_to=``); this only says what is on screen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llmchat.core.history import HistoryError
from llmchat.tui.screens.search import SearchScreen
from llmchat.tui.widgets.chat import ChatMessage, Conversation, PromptInput, UserMessage
from llmchat.tui.widgets.hud import Hud

if TYPE_CHECKING:
    from textual.app import App

    from llmchat.core import ChatClient
    from llmchat.core.history import Conversation as SavedConversation
    from llmchat.core.history import HistoryStore

    class _Base(App[None]):
        """What these actions use of ChatApp (which mixes them in: it cannot be their base here)."""

        client: ChatClient
        store: HistoryStore
        history: list[dict[str, str]]
        conversation_id: int | None
        stream_mode: bool
        _last_reply: ChatMessage | None

        @property
        def replying(self) -> bool: ...
        def _say_reply_coming(self) -> None: ...
        def _hold_prompt(self) -> None: ...
        async def _show(self, conv: SavedConversation) -> None: ...
        def _reply(self, prompt: str, reply: ChatMessage, stream: bool,
                   alternative_to: ChatMessage | None = None,
                   messages: list[dict[str, Any]] | None = None) -> Any: ...  # a @work method: its Worker
        async def _load_conversation(self, conv_id: int, *, at_start: bool = False,
                                     at_message: int | None = None) -> None: ...
else:
    _Base = object


class BranchActions(_Base):
    """Actions bound in ``ChatApp.BINDINGS`` (ids in tui/keys.py)."""

    _editing: int | None = None
    """The id of the prompt being edited: the next send is its alternative (a new branch)."""
    _edit_saved = ""
    """What the prompt held before an edit began, put back when the edit is abandoned."""
    _code_cursor: tuple[int, int] = (0, 0)
    """(id() of the message, how many code blocks back the last copy was): F4 again copies the one before."""

    # -- selection and reading ------------------------------------------------------------------------------
    def action_select(self, step: int) -> None:
        view = self.query_one(Conversation)
        if view.select_step(step) is None:
            self.notify("nothing to select yet", severity="warning", timeout=2)

    def on_prompt_input_read(self, event: PromptInput.Read) -> None:
        self.query_one(Conversation).read(event.where)

    def _copy_target(self) -> UserMessage | ChatMessage | None:
        return self.query_one(Conversation).selected or self._last_reply

    def action_copy_reply(self) -> None:
        target = self._copy_target()
        if target is None or not target.text:
            self.notify("nothing to copy yet", severity="warning")
            return
        self.copy_to_clipboard(target.text)
        what = "reply" if isinstance(target, ChatMessage) else "prompt"
        self.notify(f"{'selected ' if target is not self._last_reply else ''}{what} copied", timeout=2)

    def action_copy_code(self) -> None:
        target = self._copy_target()
        blocks = target.code_blocks() if isinstance(target, ChatMessage) else []
        if not blocks:
            where = "the selected message" if self.query_one(Conversation).selected else "the last reply"
            self.notify(f"{where} has no code block", severity="warning")
            return
        # Pressed again on the same message: the block before the last one copied, round to the last again.
        key, back = self._code_cursor
        back = (back + 1) % len(blocks) if key == id(target) else 0
        self._code_cursor = (id(target), back)
        index = len(blocks) - 1 - back
        self.copy_to_clipboard(blocks[index])
        self.notify(f"code block {index + 1} of {len(blocks)} copied", timeout=2)

    # -- regenerate, edit, alternatives ---------------------------------------------------------------------
    async def action_regenerate(self) -> None:
        if self.replying:
            self._say_reply_coming()
            return
        view = self.query_one(Conversation)
        messages = view.messages()
        last = messages[-1] if messages else None
        if not isinstance(last, ChatMessage) or last.message_id is None or self.conversation_id is None:
            self.notify("no saved reply to regenerate yet", severity="warning")
            return
        prompt = next((m.text for m in reversed(messages) if isinstance(m, UserMessage)), "")
        if self.history and self.history[-1]["role"] == "assistant":
            self.history.pop()  # the new reply answers the same prompt, not the old reply
        await last.remove()
        reply = view.add_assistant(label=self.client.model)
        self._last_reply = reply
        self._reply(prompt, reply, self.stream_mode, alternative_to=last)
        self._hold_prompt()

    def action_edit(self) -> None:
        if self.replying:
            self._say_reply_coming()
            return
        view = self.query_one(Conversation)
        selected = view.selected
        target = selected if isinstance(selected, UserMessage) else next(
            (m for m in reversed(view.messages()) if isinstance(m, UserMessage)), None)
        if target is None or target.message_id is None:
            self.notify("no saved prompt to edit", severity="warning")
            return
        prompt = self.query_one(PromptInput)
        if self._editing is None:
            self._edit_saved = prompt.text
        self._editing = target.message_id
        view.select(target)
        prompt.load_text(target.text)
        prompt.move_cursor(prompt.document.end)
        prompt.focus()
        self.notify("editing this prompt: sending it starts a new branch (the old one is kept); Esc backs out",
                    timeout=5)

    def stop_editing(self) -> bool:
        """Abandon an edit in progress, putting back what the prompt held; False when there was none."""
        if self._editing is None:
            return False
        self._editing = None
        prompt = self.query_one(PromptInput)
        prompt.load_text(self._edit_saved)
        prompt.move_cursor(prompt.document.end)
        self._edit_saved = ""
        self.notify("edit abandoned", timeout=2)
        return True

    async def action_alternative(self, step: int) -> None:
        view = self.query_one(Conversation)
        selected = view.selected
        target = selected if selected is not None and selected.marker else next(
            (m for m in reversed(view.messages()) if m.marker), None)
        if target is None or target.message_id is None or self.conversation_id is None:
            self.notify("no alternatives here: Ctrl+R regenerates the last reply, F9 edits a prompt",
                        severity="warning", timeout=4)
            return
        if self.replying:
            self._say_reply_coming()
            return
        ids = target.alternatives
        new = ids[(ids.index(target.message_id) + step) % len(ids)]
        position = view.messages().index(target)
        try:
            conv = await self.store.select(self.conversation_id, new)
        except (HistoryError, ValueError) as exc:
            self.notify(str(exc), severity="error", timeout=10, markup=False)
            return
        await self._show(conv)
        shown = view.messages()
        if position < len(shown):
            view.select(shown[position])
            self.notify(f"alternative {shown[position].marker}", timeout=2)
            await self.compare_alternatives(shown[position])

    async def compare_alternatives(self, message: ChatMessage | UserMessage) -> None:
        """The HUD shows the replies to ``message``'s prompt side by side, from the records history kept; for a
        message without alternatives (or a user message) it hides the comparison."""
        hud = self.query_one(Hud)
        ids = message.alternatives if isinstance(message, ChatMessage) else ()
        if len(ids) < 2 or message.message_id not in ids:
            hud.compare_alternatives([], 0)
            return
        try:
            records = await self.store.records(ids)
        except HistoryError:
            hud.compare_alternatives([], 0)  # the comparison is a view of history: none without it
            return
        hud.compare_alternatives([records.get(i) for i in ids], ids.index(message.message_id))

    # -- search ---------------------------------------------------------------------------------------------
    def action_search(self) -> None:
        self.push_screen(SearchScreen(self.store), self._open_hit)

    async def _open_hit(self, hit: tuple[int, int] | None) -> None:
        if hit is None:
            return
        if self.replying:
            self.workers.cancel_group(self, "reply")
        try:
            await self._load_conversation(hit[0], at_message=hit[1])
        except (HistoryError, ValueError) as exc:
            self.notify(str(exc), severity="error", timeout=10, markup=False)

    def _select_message(self, msg_id: int) -> Any:
        view = self.query_one(Conversation)
        widget = next((m for m in view.messages() if m.message_id == msg_id), None)
        if widget is not None:
            widget.render_now()
            view.select(widget)
        return widget
