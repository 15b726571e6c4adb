"""The search screen: type words, see the messages of every conversation that hold them, best first, each with
its snippet and the matches highlighted; Enter opens the conversation at that message.

It asks an open :class:`~llmchat.core.history.HistoryStore` in an exclusive worker as the text changes, so a
search never blocks typing and an older answer never replaces a newer one. It dismisses with
``(conversation id, message id)`` to open, or None when closed.
"""

from __future__ import annotations

import time
from typing import ClassVar

from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Input, OptionList, Static
from textual.widgets.option_list import Option

from llmchat.core.history import HistoryError, HistoryStore, SearchHit
from llmchat.tui.keys import binding
from llmchat.tui.screens.history import when

#: Hits shown at most: a screenful or two; more words narrow it down.
LIMIT = 50


def hit_text(hit: SearchHit, now: float) -> Text:
    """Two lines for a hit: the conversation's title, who wrote it and when; then the snippet, each match
    in bold reverse."""
    title = hit.title or f"conversation {hit.conversation_id}"
    head = Text.assemble((title, "bold"), (f"  · {'you' if hit.role == 'user' else hit.role}"
                                           f" · {when(hit.created_at, now)}", "dim"))
    body = Text(hit.snippet)
    for start, end in hit.highlights:
        body.stylize("bold reverse", start, end)
    return Text("\n").join([head, body])


class SearchScreen(ModalScreen[tuple[int, int] | None]):
    """A modal search over every message (``search.open`` opens it; ``search.hit`` and
    ``search.close`` are its own keys)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        # Priority: Enter in the Input would only submit it; here it opens the highlighted hit.
        binding("search.hit", "open", priority=True),
        binding("search.close", "close"),
    ]

    def __init__(self, store: HistoryStore, text: str = "") -> None:
        super().__init__()
        self.store = store
        self._text = text
        self._hits: list[SearchHit] = []
        self.now = 0.0
        """The wall clock the hits' times are shown against (0: read it when hits arrive)."""

    def compose(self) -> ComposeResult:
        with Vertical(id="search-dialog"):
            yield Input(self._text, placeholder="words in any message of any conversation", id="search-input")
            yield Static("type to search", id="search-status")
            yield OptionList(id="search-hits")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(Input).focus()
        if self._text:
            self._search(self._text)

    @on(Input.Changed, "#search-input")
    def _changed(self, event: Input.Changed) -> None:
        self._search(event.value)

    @work(exclusive=True, group="search")
    async def _search(self, text: str) -> None:
        status = self.query_one("#search-status", Static)
        try:
            hits = await self.store.search(text, limit=LIMIT) if text.strip() else []
        except HistoryError as exc:
            status.update(Text(str(exc), style="red"))
            return
        now = self.now or time.time()
        self._hits = hits
        options = self.query_one(OptionList)
        options.clear_options()
        options.add_options([Option(hit_text(hit, now), id=f"{hit.conversation_id}:{hit.message_id}")
                             for hit in hits])
        if hits:
            options.highlighted = 0
        if not text.strip():
            status.update("type to search")
        elif not hits:
            status.update(f"no message holds {text.strip()!r}")
        else:
            more = " (the best ones; more words narrow it down)" if len(hits) == LIMIT else ""
            status.update(f"{len(hits)} {'hit' if len(hits) == 1 else 'hits'}{more} · Enter opens")

    @property
    def hits(self) -> list[SearchHit]:
        """The hits on screen, best first."""
        return list(self._hits)

    def action_open(self) -> None:
        options = self.query_one(OptionList)
        index = options.highlighted
        if index is None or not 0 <= index < len(self._hits):
            return
        hit = self._hits[index]
        self.dismiss((hit.conversation_id, hit.message_id))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.action_open()

    def on_key(self, event: events.Key) -> None:
        # Up and Down move through the hits while the words keep focus.
        if event.key in ("up", "down") and self._hits:
            options = self.query_one(OptionList)
            if event.key == "up":
                options.action_cursor_up()
            else:
                options.action_cursor_down()
            event.stop()

    def action_close(self) -> None:
        self.dismiss(None)
