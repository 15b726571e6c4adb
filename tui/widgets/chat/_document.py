"""One Markdown text, possibly still growing, as rendered lines at any width.

Settled blocks are rendered once per width and kept; only the tail is rendered again after a sync.
Code blocks take their colours from resumable highlighters that ``work()`` advances a slice at a
time; until then they show plain text of the same height.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter_ns

from llmchat.tui.widgets.chat._blocks import Block, BlockStream
from llmchat.tui.widgets.chat._code import language_of
from llmchat.tui.widgets.chat._highlight import FenceHighlight
from llmchat.tui.widgets.chat._lines import Line
from llmchat.tui.widgets.chat._render import MarkdownRenderer, is_code, join

_WIDTHS_KEPT = 2
"""Widths whose lines are kept: the current one and the one before (a HUD toggled back and forth)."""


def estimate_rows(text: str, width: int) -> int:
    """A guess at how many rows ``text`` renders to at ``width``, from its source lines alone.

    Characters are counted, not cells: measuring cells costs more than the guess is worth.
    """
    rows = 0
    for line in text.split("\n"):
        length = len(line)
        rows += 1 if length <= width else -(-length // max(1, width - 2))
    return rows


@dataclass
class _View:
    """The lines at one width."""

    settled: list[tuple[int, list[Line]]] = field(default_factory=list)
    """Per settled block: the highlight version it was rendered with (-1 for prose), its lines."""
    tail_version: int = -1
    tail_blocks: list[tuple[int, list[Line]]] = field(default_factory=list)
    """Per tail block, as of ``tail_version``: the highlight version it was rendered with, its lines."""
    tail: list[Line] = field(default_factory=list)
    lines: list[Line] | None = None
    complete: bool = True
    """False while some blocks are not rendered yet (a deadline cut the last call short)."""


class MarkdownDocument:
    """A Markdown text and its rendered lines. Not thread-safe; use from the event loop."""

    def __init__(self, text: str = "") -> None:
        self._stream = BlockStream()
        if text:
            self._stream.append(text)
        self._renderer: MarkdownRenderer | None = None
        self._fences: dict[int, FenceHighlight] = {}
        """Highlighters by the block's first line, which stays put as a fence grows and settles."""
        self._views: dict[int, _View] = {}
        self._tail_version = 0
        self._resplit = False
        """True once the whole text was split again at the end (it defines link references): block
        tokens then carry those references and are kept rather than parsed again on their own."""

    @property
    def text(self) -> str:
        """The whole text so far, exactly as appended."""
        return self._stream.raw_text

    @property
    def finished(self) -> bool:
        """True once ``finish()`` was called."""
        return self._stream.finished

    @property
    def busy(self) -> bool:
        """True while a code block still has highlighting to do (see ``work``)."""
        return any(fence.busy for fence in self._fences.values())

    def complete(self, width: int) -> bool:
        """False while ``lines(width, deadline)`` has blocks left to render."""
        view = self._views.get(width)
        return view is None or view.complete

    def append(self, text: str) -> None:
        """Buffer text; O(1). It shows after the next ``sync()``."""
        self._stream.append(text)

    def sync(self) -> None:
        """Take in buffered text: settle blocks that can no longer change, re-split the tail."""
        settled = self._stream.sync()
        self._tail_version += 1
        self._track_fences(self._stream.settled[len(self._stream.settled) - settled :])

    def finish(self) -> None:
        """Take in buffered text and treat it as complete: every block is final from here on."""
        if self._stream.finish():
            self._resplit = True
            self._views.clear()
            self._fences.clear()
        self._tail_version += 1
        self._track_fences([])

    def bind(self, renderer: MarkdownRenderer) -> None:
        """Render with ``renderer`` from now on; a new palette (theme) drops everything rendered."""
        if renderer is self._renderer:
            return
        self._renderer = renderer
        self._fences.clear()
        self._views.clear()
        self._track_fences(self._stream.settled)

    def work(self, deadline_ns: int) -> None:
        """Advance code highlighting until done or until ``perf_counter_ns()`` passes ``deadline_ns``."""
        for fence in list(self._fences.values()):
            if perf_counter_ns() >= deadline_ns:
                return
            if fence.busy:
                fence.work(deadline_ns)

    def lines(self, width: int, deadline_ns: int | None = None) -> list[Line]:
        """The document's lines ``width`` cells wide (a list to read, not to change).

        Renders only what changed since the last call at this width. With a deadline it stops
        rendering new blocks once ``perf_counter_ns()`` passes it (after at least one) and returns
        the blocks rendered so far; ``complete(width)`` then says False and the next call goes on.
        Raises RuntimeError before ``bind()``.
        """
        if self._renderer is None:
            raise RuntimeError("bind() a renderer before asking for lines")
        if width <= 0:
            return []
        view = self._view(width)
        changed = view.lines is None
        out_of_time = False
        for index, block in enumerate(self._stream.settled):
            stamp = self._stamp(block)
            if index < len(view.settled):
                if view.settled[index][0] != stamp:
                    # Only a code block's colours changed: re-cutting its lines is cheap.
                    view.settled[index] = (stamp, self._render(block, width))
                    changed = True
                continue
            if out_of_time:
                break
            view.settled.append((stamp, self._render(block, width)))
            changed = True
            out_of_time = deadline_ns is not None and perf_counter_ns() > deadline_ns
        settled_done = len(view.settled) == len(self._stream.settled)
        tail = self._stream.tail if settled_done else []
        if view.tail_version != self._tail_version:
            view.tail_version = self._tail_version
            view.tail_blocks = []
            view.tail = []
            changed = True
        # Until the next sync the tail blocks stay the same; only a code block's colours can change.
        tail_changed = False
        for index, block in enumerate(tail):
            stamp = self._stamp(block)
            if index < len(view.tail_blocks):
                if view.tail_blocks[index][0] != stamp:
                    view.tail_blocks[index] = (stamp, self._render(block, width))
                    tail_changed = True
                continue
            if out_of_time:
                break
            view.tail_blocks.append((stamp, self._render(block, width)))
            tail_changed = True
            out_of_time = deadline_ns is not None and perf_counter_ns() > deadline_ns
        view.complete = settled_done and len(view.tail_blocks) == len(self._stream.tail)
        if tail_changed:
            view.tail = []
            for _, block_lines in view.tail_blocks:
                join(view.tail, block_lines, width)
            changed = True
        if changed or view.lines is None:
            lines: list[Line] = []
            for _, block_lines in view.settled:
                join(lines, block_lines, width)
            join(lines, view.tail, width)
            view.lines = lines
        return view.lines

    def _view(self, width: int) -> _View:
        view = self._views.pop(width, None) or _View()
        self._views[width] = view
        while len(self._views) > _WIDTHS_KEPT:
            del self._views[next(iter(self._views))]
        return view

    def _stamp(self, block: Block) -> int:
        fence = self._fences.get(block.start) if is_code(block) else None
        return fence.version if fence is not None else -1

    def _render(self, block: Block, width: int) -> list[Line]:
        assert self._renderer is not None
        final = self.finished or block.start < self._stream.tail_line
        if block.code is None:
            lines = self._renderer.block(block, width, self._stream.parser)
            if final and not self._resplit:
                block.release()
            return lines
        fence = self._fence(block, final=final)
        return self._renderer.code_lines(fence.lines(), fence.language, width)

    def _fence(self, block: Block, *, final: bool) -> FenceHighlight:
        assert self._renderer is not None and block.code is not None
        language = language_of(block.info)
        fence = self._fences.get(block.start)
        # While its first line streams in, a fence's info string can read "py" and then "python".
        if fence is None or fence.language != language:
            fence = self._fences[block.start] = self._renderer.fence_highlight(language)
        fence.set_code(block.code, final=final)
        return fence

    def _track_fences(self, settled: list[Block]) -> None:
        """Hand the code of newly settled and tail code blocks to their highlighters."""
        if self._renderer is None:
            return
        for block in settled:
            if is_code(block):
                self._fence(block, final=True)
        for block in self._stream.tail:
            if is_code(block):
                self._fence(block, final=self.finished)
