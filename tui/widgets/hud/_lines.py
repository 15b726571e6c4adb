"""A Static painted line by line, whose height follows its line count.

The HUD's parts repaint with ``layout=False`` so a frame while a reply streams never re-lays out the screen.
A part whose text wraps (notes, errors) still needs its height to follow the text: this one sets its height to
the number of lines it was given, so it re-lays out only when that number changes, which happens when a
request finished or the width changed, never per frame of a stream.
"""

from __future__ import annotations

from collections.abc import Iterable

from textual.content import Content
from textual.widgets import Static


def wrap(content: Content, width: int) -> list[Content]:
    """``content`` folded at word boundaries into lines of at most ``width`` cells (a word longer than a line
    is folded inside); one empty line for empty content."""
    if not content.plain:
        return [Content("")]
    return content.wrap(max(1, width))


class Lines(Static):
    """Paint with ``paint_lines``; lines are not wrapped again: wrap them (``wrap``) to the content width."""

    DEFAULT_CSS = """
    Lines {
        height: 1;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__("", id=id, classes=classes)
        self.line_count = 0
        """How many lines were painted last: the widget's height."""
        self._painted_width = -1

    @property
    def width_for_text(self) -> int:
        """The content width, or 36 before the first layout (the HUD's, without its scrollbar)."""
        return self.content_size.width or 36

    def paint_lines(self, lines: Iterable[Content]) -> None:
        """Show ``lines``, one per row; the height changes (a re-layout) only when their count does."""
        self._painted_width = self.content_size.width
        shown = list(lines) or [Content("")]
        if len(shown) != self.line_count:
            self.line_count = len(shown)
            self.styles.height = len(shown)
        self.update(Content("\n").join(shown), layout=False)

    @property
    def width_changed(self) -> bool:
        """Whether the content width differs from the one last painted at: a resize that only changed the
        height (its own, after a new line count) needs no repaint."""
        return self.content_size.width != self._painted_width
