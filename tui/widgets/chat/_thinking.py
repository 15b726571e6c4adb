"""A reply's thinking, shown above its answer, and the tool calls it asked for, shown below it.

``ThinkingBlock`` is a ``ChatMessage`` (the same coalesced frames, tail-only rendering and render-lag
reports) drawn muted under a one-line header: open while the model thinks, folded to its header once the
answer begins unless ``ui.show_thinking`` keeps it open; ``reply.thinking`` (Ctrl+T) opens and folds it.
``ToolCallCard`` is one call the model asked for: its name, id and arguments, marked as not run (llmchat never
executes a tool). ``ReplyExtras`` is what the app hands a streaming reply's reasoning and calls to: it mounts
the block the moment thinking starts and keeps the writer's copy in step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.widget import Widget

from llmchat.core.history import ReplyWriter, pretty_arguments
from llmchat.tui.numbers import duration
from llmchat.tui.widgets.chat._document import estimate_rows
from llmchat.tui.widgets.chat._frozen import FrozenLines, bar
from llmchat.tui.widgets.chat._lines import Line
from llmchat.tui.widgets.chat._message import ChatMessage, Status

_MUTED = Style(dim=True, italic=True)


class ThinkingBlock(ChatMessage):
    """A reply's reasoning: Markdown, muted, under a header that says how long the model thought."""

    DEFAULT_CSS = """
    ThinkingBlock {
        margin: 0;
    }
    """

    LEFT = 3
    ASIDE = True

    def __init__(
        self,
        text: str = "",
        *,
        status: Status | None = None,
        thought_ms: float | None = None,
        expanded: bool = True,
        toggle_key: str = "Ctrl+T",
        frame_rate: float = 60.0,
    ) -> None:
        """``status`` given: a finished block (from history), folded unless ``expanded``."""
        super().__init__(text, status=status, frame_rate=frame_rate)
        self._expanded = expanded
        self._thought_ms = thought_ms
        self._key = toggle_key
        self._muted: dict[int, tuple[Line, Line]] = {}
        """Muted copies of the document's rows, by the id of the row (kept alive beside it): a frame re-mutes
        only the rows the document rendered anew, as it re-renders only its tail."""

    @property
    def expanded(self) -> bool:
        """True while the thinking itself is shown, not only its header."""
        return self._expanded

    def set_expanded(self, expanded: bool) -> None:
        """Show (True) or fold (False) the thinking under its header."""
        if expanded == self._expanded:
            return
        self._expanded = expanded
        self.invalidate_lines()
        self.refresh(layout=True)

    def toggle(self) -> None:
        self.set_expanded(not self._expanded)

    def end(self, thought_ms: float | None, *, keep_open: bool) -> None:
        """The answer began (or the reply ended): stamp how long the model thought, fold unless
        ``keep_open``. How the reply ended is the reply's to say, under it, not the thinking's."""
        self._thought_ms = thought_ms
        self._expanded = self._expanded and keep_open
        self.finish(status="done")

    def header(self) -> str:
        """``▾ thinking…`` while it streams; ``▸ thought for 4.2 s · Ctrl+T shows it`` once done."""
        if self.status is None:
            return "▾ thinking…"
        took = f" for {duration(self._thought_ms)}" if self._thought_ms is not None else ""
        arrow, verb = ("▾", "hides") if self._expanded else ("▸", "shows")
        return f"{arrow} thought{took} · {self._key} {verb} it"

    def build_lines(self, width: int) -> list[Line]:
        head = self.renderer.rich(Text(self.header(), style="status.muted", end=""), width)
        if not self._expanded:
            return head
        return [*head, *(self._mute(line) for line in super().build_lines(width))]

    def _mute(self, line: Line) -> Line:
        kept = self._muted.get(id(line))
        if kept is not None and kept[0] is line:
            return kept[1]
        muted = tuple(Segment.apply_style(line, post_style=_MUTED))
        if len(self._muted) > 4096:
            self._muted.clear()
        self._muted[id(line)] = (line, muted)
        return muted

    def estimate_height(self, width: int) -> int:
        return 1 + (estimate_rows(self.text, width) if self._expanded else 0)


class ToolCallCard(FrozenLines):
    """One tool call the reply asked for: ``⚙ tool call get_weather (call_1) · not run`` and its arguments."""

    DEFAULT_CSS = """
    ToolCallCard {
        margin: 0 0 1 0;
    }
    """

    LEFT = 3

    def __init__(self, call: Mapping[str, Any]) -> None:
        super().__init__()
        self.call = dict(call)
        """The call in OpenAI's shape: ``id``, ``type``, ``function`` (``name``, ``arguments``)."""

    @property
    def function_name(self) -> str:
        """The function the model asked for."""
        fn = self.call.get("function")
        return str(fn.get("name") or "?") if isinstance(fn, Mapping) else "?"

    @property
    def arguments(self) -> str:
        """The arguments as shown: indented JSON when they parse."""
        fn = self.call.get("function")
        return pretty_arguments(fn.get("arguments", "")) if isinstance(fn, Mapping) else ""

    def build_lines(self, width: int) -> list[Line]:
        ident = f" ({self.call['id']})" if self.call.get("id") else ""
        head = Text.assemble(("⚙ tool call ", "status.warning"), (self.function_name, "bold"),
                             (f"{ident} · not run: llmchat never executes tools", "status.muted"), end="")
        body = Text(self.arguments, style="status.muted", end="")
        return [*self.renderer.rich(head, width), *self.renderer.rich(body, width)]

    def estimate_height(self, width: int) -> int:
        return 1 + estimate_rows(self.arguments, width)

    def left_margin(self) -> Segment:
        return bar(Style(color=self.renderer.palette.warning), self.LEFT)


class ReplyExtras:
    """A streaming reply's thinking and tool calls, put on screen beside ``reply`` and into ``writer``."""

    def __init__(self, reply: ChatMessage, writer: ReplyWriter | None, *, keep_open: bool,
                 toggle_key: str) -> None:
        self.reply = reply
        self.writer = writer
        self.keep_open = keep_open
        self.toggle_key = toggle_key
        self.block: ThinkingBlock | None = None
        self.thinking = False
        """True while thinking streams and no answer has come: the first answer delta ends it."""

    def reasoning(self, text: str, arrived_ns: int | None = None) -> None:
        """A delta of thinking (``ChatStream.on_reasoning``)."""
        if not text:
            return
        if self.block is None:
            parent = self.reply.parent
            if self.reply.status is not None or not self.reply.is_mounted or not isinstance(parent, Widget):
                if self.writer is not None:
                    self.writer.append_reasoning(text)
                return
            self.block = ThinkingBlock(toggle_key=self.toggle_key)
            parent.mount(self.block, before=self.reply)
            self.thinking = True
        self.block.append(text, arrived_ns)
        if self.writer is not None:
            self.writer.append_reasoning(text)

    def reclaim(self, text: str) -> None:
        """What was shown as the answer was thinking (``ChatStream.on_reclaim``: the template opened
        ``<think>`` in the prompt): it leaves the reply, and the writer's text, for the thinking block."""
        self.reply.restart()
        if self.writer is not None:
            self.writer.reclaim()
            # Already the writer's reasoning: the block takes it without saving it twice.
            writer, self.writer = self.writer, None
            try:
                self.reasoning(text)
            finally:
                self.writer = writer
        else:
            self.reasoning(text)

    def answer_started(self, thought_ms: float | None) -> None:
        """The first answer delta arrived: fold the thinking (unless kept open) and say how long it took."""
        self.thinking = False
        if self.block is not None and self.block.status is None:
            self.block.end(thought_ms, keep_open=self.keep_open)

    def finish(self, thought_ms: float | None, calls: Sequence[Mapping[str, Any]],
               status: Status = "done") -> None:
        """The reply ended: end the thinking (if the answer never came) and show the tool calls under it."""
        self.thinking = False
        if self.block is not None and self.block.status is None:
            # No answer came: the thinking is all there is, so it stays open unless the reply succeeded.
            self.block.end(thought_ms, keep_open=self.keep_open or status != "done" or not self.reply.text)
        parent = self.reply.parent
        if calls and isinstance(parent, Widget):
            cards = [ToolCallCard(c) for c in calls]
            parent.mount(*cards, after=self.reply)


def history_widgets(reasoning: str, thought_ms: object, calls: Sequence[Mapping[str, Any]], *,
                    keep_open: bool, toggle_key: str) -> tuple[list[ThinkingBlock], list[ToolCallCard]]:
    """A saved reply's extras: its thinking block (before it) and its tool-call cards (after it)."""
    ms = float(thought_ms) if isinstance(thought_ms, int | float) and not isinstance(thought_ms, bool) else None
    before = [ThinkingBlock(reasoning.strip(), status="done", thought_ms=ms, expanded=keep_open,
                            toggle_key=toggle_key)] if reasoning.strip() else []
    return before, [ToolCallCard(c) for c in calls]
