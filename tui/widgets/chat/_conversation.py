"""The scrolling conversation: follows new text while the user is at the bottom, and only then."""

from __future__ import annotations

from collections.abc import Iterable

from textual.await_remove import AwaitRemove
from textual.containers import VerticalScroll
from textual.widget import AwaitMount, Widget

from llmchat.tui.widgets.chat._message import ChatMessage, Status, UserMessage


class Conversation(VerticalScroll):
    """Holds the messages of one conversation, oldest first.

    Following uses Textual's anchor: while anchored, each layout keeps the view at the bottom; any
    scroll by the user releases it, and reaching the bottom again restores it.
    """

    DEFAULT_CSS = """
    Conversation {
        height: 1fr;
        /* The width must not change when the scrollbar appears: every message would render again. */
        scrollbar-gutter: stable;
    }
    """

    def on_mount(self) -> None:
        self.anchor()

    @property
    def following(self) -> bool:
        """True while new text keeps the view at the bottom."""
        # Textual keeps "released" private; it is the other half of the anchor state.
        return self.is_anchored and not self._anchor_released

    def add_user(self, text: str) -> UserMessage:
        """Mount the user's message at the end and return it (mounting completes on the next turn)."""
        message = UserMessage(text)
        self.mount(message)
        return message

    def add_assistant(self, text: str = "", *, status: Status | None = None, note: str = "") -> ChatMessage:
        """Mount an assistant reply at the end and return it: streaming unless ``status`` is given."""
        message = ChatMessage(text, status=status, note=note)
        self.mount(message)
        return message

    def add_history(self, messages: Iterable[Widget]) -> AwaitMount:
        """Mount many finished messages at once (resuming a conversation): one layout for all."""
        return self.mount_all(list(messages))

    def clear(self) -> AwaitRemove:
        """Remove every message; the view follows new text again."""
        self.anchor()
        return self.remove_children()

    def release_anchor(self) -> None:
        # Textual releases the anchor on every user scroll, even one that cannot move because the
        # view is already at the bottom (End, or the wheel down); following would then stop for no
        # reason. Re-anchor once the scroll settles if it did not leave the bottom.
        super().release_anchor()
        self.call_after_refresh(self._follow_if_at_bottom)

    def _follow_if_at_bottom(self) -> None:
        at_bottom = self.scroll_target_y >= self.max_scroll_y and self.scroll_y >= self.max_scroll_y
        if self.is_anchored and self._anchor_released and at_bottom:
            self.anchor()

    def messages(self) -> list[UserMessage | ChatMessage]:
        """The messages in order."""
        return [child for child in self.children if isinstance(child, UserMessage | ChatMessage)]

    def last_reply(self) -> ChatMessage | None:
        """The most recent assistant reply, if any."""
        replies = [child for child in self.children if isinstance(child, ChatMessage)]
        return replies[-1] if replies else None
