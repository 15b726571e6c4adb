"""A leaf widget that paints lines rendered beforehand, so layout never renders anything.

Textual's own Markdown is a tree of widgets; every size change anywhere re-arranges all of them, and
each earlier message left live makes the current one slower. A ``FrozenLines`` has no children, its
height is the length of a cached list, and painting a row is a list lookup: a layout pass costs it
nothing, however much text it holds.

A widget can also be *deferred* (``defer_rendering``): until it is painted or ``render_now`` is
called it reports an estimated height and renders nothing, so a long history mounts at once and is
rendered in the background (see ``Conversation.add_history``).
"""

from __future__ import annotations

from rich.segment import Segment
from textual.app import RenderResult
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

from llmchat.tui.widgets.chat._lines import Line, text_of
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
        self._lines: list[Line] = []
        self._deferred = False
        self._seen = False
        self._estimate: tuple[int, int] = (0, 0)
        """(width, estimated height) while deferred."""

    @property
    def renderer(self) -> MarkdownRenderer:
        """The shared renderer for the app's current theme."""
        return renderer_for_app(self.app)

    def build_lines(self, width: int) -> list[Line]:
        """The widget's content ``width`` cells wide. Called only when the width or theme changed,
        or after ``invalidate_lines()``."""
        raise NotImplementedError

    def lines_for(self, width: int) -> list[Line]:
        """The content lines at ``width``, built at most once per width, theme and invalidation."""
        key = (width, self.app.theme)
        if key != self._lines_key:
            self._lines = self.build_lines(width) if width > 0 else []
            self._lines_key = key
        return self._lines

    @property
    def deferred(self) -> bool:
        """True while the widget reports an estimated height and has rendered nothing."""
        return self._deferred

    def defer_rendering(self) -> None:
        """Report an estimated height (``estimate_height``) until painted or ``render_now()``."""
        self._deferred = True

    def render_now(self, *, layout: bool = True) -> int:
        """Render for real if deferred. Returns how many rows the height laid out so far was off by
        (positive if it grows); unless ``layout`` is False, a layout is requested when it was off."""
        if not self._deferred:
            return 0
        width = self.content_size.width
        if width <= 0:
            return 0
        laid_out = self.content_size.height
        self._deferred = False
        change = self.content_height(width) - laid_out
        if change and layout:
            self.refresh(layout=True)
        return change

    def estimate_height(self, width: int) -> int:
        """A cheap guess at the height at ``width``, without rendering; subclasses say how."""
        return len(self.lines_for(width))

    def invalidate_lines(self) -> None:
        """Forget the cached lines; the next paint or layout builds them again."""
        self._lines_key = None

    def rendered_text(self) -> str:
        """The text of the lines as painted at the current width (trailing spaces dropped)."""
        return "\n".join(text_of(line).rstrip() for line in self.lines_for(self.content_size.width))

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return container.width

    def content_height(self, width: int) -> int:
        """The height the widget takes at ``width``: its line count unless a subclass says otherwise."""
        return len(self.lines_for(width))

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        if self._deferred:
            if self._estimate[0] != width:
                self._estimate = (width, self.estimate_height(width))
            return self._estimate[1]
        return self.content_height(width)

    def render(self) -> RenderResult:
        return ""

    def first_painted(self) -> None:
        """Called when a row is first painted; subclasses start work that only matters once seen."""

    def render_line(self, y: int) -> Strip:
        if not self._seen:
            self._seen = True
            # Painted while deferred: it is on screen, so it renders for real now.
            self.render_now()
            self.first_painted()
        width = self.content_size.width
        lines = self.lines_for(width)
        # visual_style is cached per style change; rich_style walks every ancestor on each call.
        style = self.visual_style.rich_style
        if 0 <= y < len(lines):
            return Strip(Segment.apply_style(lines[y], style), width)
        return Strip.blank(width, style)
