"""A leaf widget that paints lines rendered beforehand, so layout never renders anything.

Textual's own Markdown is a tree of widgets; every size change anywhere re-arranges all of them, and
each earlier message left live makes the current one slower. A ``FrozenLines`` has no children, its
height is the length of a cached list, and painting a row is a list lookup: a layout pass costs it
nothing, however much text it holds.
"""

from __future__ import annotations

from textual.app import RenderResult
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

from llmchat.tui.widgets.chat._render import MarkdownRenderer, renderer_for_app


class FrozenLines(Widget):
    """Base for message widgets: subclasses say what their lines are at a width (``build_lines``)."""

    DEFAULT_CSS = """
    FrozenLines {
        height: auto;
    }
    """

    # Painting comes from cached strips, not from render(); Textual's text selection reads render().
    ALLOW_SELECT = False

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._lines_key: tuple[int, str] | None = None
        self._lines: list[Strip] = []

    @property
    def renderer(self) -> MarkdownRenderer:
        """The shared renderer for the app's current theme."""
        return renderer_for_app(self.app)

    def build_lines(self, width: int) -> list[Strip]:
        """The widget's content ``width`` cells wide. Called only when the width or theme changed,
        or after ``invalidate_lines()``."""
        raise NotImplementedError

    def lines_for(self, width: int) -> list[Strip]:
        """The content lines at ``width``, built at most once per width, theme and invalidation."""
        key = (width, self.app.theme)
        if key != self._lines_key:
            self._lines = self.build_lines(width) if width > 0 else []
            self._lines_key = key
        return self._lines

    def invalidate_lines(self) -> None:
        """Forget the cached lines; the next paint or layout builds them again."""
        self._lines_key = None

    def rendered_text(self) -> str:
        """The text of the lines as painted at the current width (trailing spaces dropped)."""
        return "\n".join(strip.text.rstrip() for strip in self.lines_for(self.content_size.width))

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return container.width

    def content_height(self, width: int) -> int:
        """The height the widget takes at ``width``: its line count unless a subclass says otherwise."""
        return len(self.lines_for(width))

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return self.content_height(width)

    def render(self) -> RenderResult:
        return ""

    def render_line(self, y: int) -> Strip:
        width = self.content_size.width
        lines = self.lines_for(width)
        # visual_style is cached per style change; rich_style walks every ancestor on each call.
        style = self.visual_style.rich_style
        if 0 <= y < len(lines):
            return lines[y].apply_style(style)
        return Strip.blank(width, style)
