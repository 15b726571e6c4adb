"""The scrolling conversation: follows new text while the user is at the bottom, and only then."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from time import perf_counter_ns

from textual.await_remove import AwaitRemove
from textual.containers import VerticalScroll
from textual.geometry import Size
from textual.widget import AwaitMount, Widget
from textual.widgets import Static
from textual.worker import Worker

from llmchat.tui.widgets.chat._frozen import FrozenLines
from llmchat.tui.widgets.chat._message import ChatMessage, Status, UserMessage

_SLICE_NS = 8_000_000
"""Most time one slice of background history rendering takes before the loop gets a turn."""
_PAUSE_S = 0.001
"""Pause between background slices: input and frames get the loop in between."""
_LAYOUT_EVERY_NS = 250_000_000
"""Heights found by background rendering are laid out at most this often."""


class Welcome(Static):
    """What an empty conversation says until its first message: muted, gone with the first message."""

    DEFAULT_CSS = """
    Welcome {
        color: $text-muted;
        padding: 1 2;
    }
    """


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

    def __init__(
        self, *children: Widget, name: str | None = None, id: str | None = None, classes: str | None = None
    ) -> None:
        super().__init__(*children, name=name, id=id, classes=classes)
        self._renderer_worker: Worker[None] | None = None
        self._selected: UserMessage | ChatMessage | None = None

    def on_mount(self) -> None:
        self.anchor()

    def _size_updated(
        self, size: Size, virtual_size: Size, container_size: Size, layout: bool = True
    ) -> bool:
        # Textual stores a new virtual size through a reactive that requests another layout, although
        # the layout that measured it has just placed everything; a reply growing by a row then cost
        # two layouts of the whole screen. Scrollbars are still updated here, and showing or hiding
        # one requests its own layout.
        return super()._size_updated(size, virtual_size, container_size, layout=False)

    @property
    def following(self) -> bool:
        """True while new text keeps the view at the bottom."""
        # Textual keeps "released" private; it is the other half of the anchor state.
        return self.is_anchored and not self._anchor_released

    def show_welcome(self, text: str) -> None:
        """Say ``text`` (plain, no markup) while the conversation is empty; the first message removes it."""
        self._drop_welcome()
        if not self.messages():
            self.mount(Welcome(text, markup=False))

    @property
    def welcome(self) -> str:
        """The welcome shown now, "" when there is none."""
        shown = [w for w in self.children if isinstance(w, Welcome)]
        return str(shown[0].content) if shown else ""

    def _drop_welcome(self) -> None:
        for widget in self.children:
            if isinstance(widget, Welcome):
                widget.remove()

    def add_user(self, text: str) -> UserMessage:
        """Mount the user's message at the end and return it (mounting completes on the next turn)."""
        self._drop_welcome()
        message = UserMessage(text)
        self.mount(message)
        return message

    def add_assistant(
        self, text: str = "", *, status: Status | None = None, note: str = "", label: str | None = None,
        frame_rate: float = 60.0,
    ) -> ChatMessage:
        """Mount an assistant reply at the end and return it: streaming unless ``status`` is given.

        ``label`` is its muted first row (the model); ``frame_rate`` caps the frames a second while it
        streams; ValueError unless positive.
        """
        self._drop_welcome()
        message = ChatMessage(text, status=status, note=note, label=label, frame_rate=frame_rate)
        self.mount(message)
        return message

    def add_history(self, messages: Iterable[Widget]) -> AwaitMount:
        """Mount many finished messages at once (resuming a conversation).

        Only the messages nearest the end are rendered before the first paint; the others take an
        estimated height and are rendered in the background, newest first, a slice at a time, their
        real heights laid out together every 250 ms. While the view follows the end nothing moves; if
        the user has scrolled up, the view is moved with the text it shows, so that stays put.
        """
        widgets = list(messages)
        if widgets:
            self._drop_welcome()
        # Before its first layout the conversation has no size; the screen's is an upper bound.
        size = self.size if self.size.area else self.app.size
        budget = size.height * 2
        for widget in reversed(widgets):
            if not isinstance(widget, FrozenLines):
                continue
            if budget > 0:
                budget -= widget.estimate_height(max(20, size.width - 4))
            else:
                widget.defer_rendering()
        self.call_after_refresh(self._render_deferred)
        return self.mount_all(widgets)

    def _render_deferred(self) -> None:
        if self._renderer_worker is None or self._renderer_worker.is_finished:
            self._renderer_worker = self.run_worker(self._render_deferred_slices(), group="history")

    async def _render_deferred_slices(self) -> None:
        # A layout of a long conversation costs tens of ms, so heights found in many slices are
        # applied together: the messages rendered here are off screen, nothing visible waits on them.
        changed: list[FrozenLines] = []
        last_layout = perf_counter_ns()
        while waiting := [c for c in reversed(self.children) if isinstance(c, FrozenLines) and c.deferred]:
            deadline = perf_counter_ns() + _SLICE_NS
            for widget in waiting:
                if widget.render_now(layout=False):
                    changed.append(widget)
                if perf_counter_ns() > deadline:
                    break
            if changed and perf_counter_ns() - last_layout > _LAYOUT_EVERY_NS:
                self._apply_heights(changed)
                changed = []
                last_layout = perf_counter_ns()
            # Let the loop run (input, frames) between slices.
            await asyncio.sleep(_PAUSE_S)
        self._apply_heights(changed)

    def _apply_heights(self, changed: list[FrozenLines]) -> None:
        if not changed:
            return
        # Keep what is on screen in place: note the message at the top of the view and where in it
        # the view starts, then scroll back to that spot once the new heights are laid out.
        anchor = None if self.following else self._anchor_message()
        for widget in changed:
            widget.refresh(layout=True)
        if anchor is not None:
            self.call_after_refresh(self._scroll_back, *anchor)

    def _anchor_message(self) -> tuple[Widget, int] | None:
        # A selected message in view is what the reader looks at: it stays put, not the one at the top.
        selected, top = self.selected, round(self.scroll_y)
        if selected is not None:
            region = selected.virtual_region
            if region.y < top + self.size.height and region.bottom > top:
                return selected, top - region.y
        return self._message_at_top()

    def _message_at_top(self) -> tuple[Widget, int] | None:
        top = round(self.scroll_y)
        for child in self.children:
            region = child.virtual_region
            if region.bottom > top:
                return child, top - region.y
        return None

    def _scroll_back(self, widget: Widget, offset: int) -> None:
        if not self.following and widget.parent is self:
            y = widget.virtual_region.y + offset
            self.scroll_to(y=y, animate=False, immediate=True, release_anchor=False)

    def clear(self) -> AwaitRemove:
        """Remove every message; the view follows new text again."""
        self.anchor()
        self._selected = None
        return self.remove_children()

    # -- reading from the keyboard: scrolling and a selected message

    def read(self, where: str) -> None:
        """Scroll for the keyboard: "pageup", "pagedown", "top" or "bottom". Leaving the bottom stops
        following new text (a reply streaming in below leaves the view where it is); "bottom" follows
        again."""
        if where == "bottom":
            self.scroll_end(animate=False, immediate=True)
            self.anchor()
            return
        if where == "top":
            self.scroll_home(animate=False, immediate=True)
        elif where == "pageup":
            self.scroll_page_up(animate=False)
        elif where == "pagedown":
            self.scroll_page_down(animate=False)
        else:
            raise ValueError(f"unknown scroll {where!r}")

    @property
    def selected(self) -> UserMessage | ChatMessage | None:
        """The message the selection keys are on, if any (it has the ``-selected`` class)."""
        if self._selected is not None and self._selected.parent is not self:
            self._selected = None  # removed since
        return self._selected

    def select(self, message: UserMessage | ChatMessage | None) -> None:
        """Select ``message`` (None: nothing) and bring it into view."""
        old = self.selected
        if old is not None:
            old.remove_class("-selected")
        self._selected = message
        if message is not None:
            message.add_class("-selected")
            # Scrolled once the layout has the message's real place: computed now, from heights still
            # estimated (history rendered in the background), the scroll could land elsewhere.
            self.call_after_refresh(self._reveal, message)

    def _reveal(self, message: Widget) -> None:
        if message is self.selected:
            self.scroll_to_widget(message, animate=False, immediate=True,
                                  top=message.outer_size.height > self.size.height)

    def select_step(self, step: int) -> UserMessage | ChatMessage | None:
        """Move the selection ``step`` messages on (negative: back); from no selection, back starts at the
        last message. The selection stays at either end. Returns the selected message."""
        messages = self.messages()
        if not messages:
            return None
        current = self.selected
        if current is None:
            index = len(messages) - 1
        else:
            index = max(0, min(len(messages) - 1, messages.index(current) + step))
        self.select(messages[index])
        return messages[index]

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
        return [child for child in self.children
                if isinstance(child, UserMessage) or (isinstance(child, ChatMessage) and not child.ASIDE)]

    def last_reply(self) -> ChatMessage | None:
        """The most recent assistant reply, if any."""
        replies = [child for child in self.children if isinstance(child, ChatMessage) and not child.ASIDE]
        return replies[-1] if replies else None
