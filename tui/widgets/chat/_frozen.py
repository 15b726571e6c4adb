"""A leaf widget that paints lines rendered beforehand, so layout never renders anything.

Textual's own Markdown is a tree of widgets; every size change anywhere re-arranges all of them, and
each earlier message left live makes the current one slower. A ``FrozenLines`` has no children, its
height is the length of a cached list, and painting a row is a list lookup: a layout pass costs it
nothing, however much text it holds.

Its margins are painted with each row rather than set as CSS padding or border: Textual pads every
row of a padded widget on each repaint, which nearly doubles the cost of a row.

A widget can also be *deferred* (``defer_rendering``): until it is painted or ``render_now`` is
called it reports an estimated height and renders nothing, so a long history mounts at once and is
rendered in the background (see ``Conversation.add_history``).
"""

from __future__ import annotations

from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
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

    # Painting comes from cached lines, not from render(); Textual's text selection reads render().
    ALLOW_SELECT = False

    LEFT: ClassVar[int] = 1
    """Cells of margin painted left of the text."""
    RIGHT: ClassVar[int] = 1
    """Cells of margin painted right of the text."""

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._lines_key: tuple[int, str] | None = None
        self._lines: list[Line] = []
        self._deferred = False
        self._seen = False
        self._estimate: tuple[int, int] = (0, 0)
        """(width, estimated height) while deferred."""
        self.message_id: int | None = None
        """The history's id of the message shown (None until saved, or not saved)."""
        self.alternatives: tuple[int, ...] = ()
        """The ids of the message's alternatives in the history, its own included (regenerated replies,
        edited prompts); () for none."""

    @property
    def marker(self) -> str:
        """``"2/3"`` when the message is the second of three alternatives, else ""."""
        if len(self.alternatives) < 2 or self.message_id not in self.alternatives:
            return ""
        return f"{self.alternatives.index(self.message_id) + 1}/{len(self.alternatives)}"

    @property
    def renderer(self) -> MarkdownRenderer:
        """The shared renderer for the app's current theme."""
        return renderer_for_app(self.app)

    @property
    def inner_width(self) -> int:
        """The width the text is rendered at: the content width less the painted margins."""
        return self._inner(self.content_size.width)

    def _inner(self, width: int) -> int:
        return max(0, width - self.LEFT - self.RIGHT)

    def build_lines(self, width: int) -> list[Line]:
        """The widget's text ``width`` cells wide. Called only when the width or theme changed, or
        after ``invalidate_lines()``."""
        raise NotImplementedError

    def lines_for(self, width: int) -> list[Line]:
        """The text's lines at inner ``width``, built at most once per width, theme and invalidation."""
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
        return "\n".join(text_of(line).rstrip() for line in self.lines_for(self.inner_width))

    def content_height(self, width: int) -> int:
        """The height at inner ``width``: the line count unless a subclass says otherwise."""
        return len(self.lines_for(width))

    # -- deferred rendering

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
        width = self.inner_width
        if width <= 0:
            return 0
        laid_out = self.content_size.height
        self._deferred = False
        change = self.content_height(width) - laid_out
        if change and layout:
            self.refresh(layout=True)
        return change

    def estimate_height(self, width: int) -> int:
        """A cheap guess at the height at inner ``width``, without rendering; subclasses say how."""
        return len(self.lines_for(width))

    def first_painted(self) -> None:
        """Called when a row is first painted; subclasses start work that only matters once seen."""

    def row_after_lines(self, index: int, width: int) -> Line | None:
        """What is painted ``index`` rows below the last line (0 is the row right after it), ``width`` cells
        wide, in rows a subclass reserves beyond its lines (``content_height``); None paints a blank row."""
        return None

    # -- Textual

    def left_margin(self) -> Segment:
        """What is painted left of each row (``LEFT`` cells)."""
        return Segment(" " * self.LEFT)

    def _size_updated(
        self, size: Size, virtual_size: Size, container_size: Size, layout: bool = True
    ) -> bool:
        # Textual sets a widget's virtual size as a reactive that requests a layout; for a leaf it only
        # mirrors the size the layout just gave it, so every height change of a reply laid the whole
        # screen out twice. Store it without that second layout.
        #
        # A new size also makes Textual repaint every row. When only the height changed and nothing is
        # drawn around the rows (no padding, no border), the rows painted before are still right, and
        # the ones that changed were marked already: keep them (a repainted row costs ~0.1 ms).
        cache = self._styles_cache
        rows: dict[int, Strip] | None = getattr(cache, "_cache", None)
        marked: set[int] | None = getattr(cache, "_dirty_lines", None)
        keep = (
            rows is not None
            and marked is not None
            and size.width == self._size.width
            and size.height != self._size.height
            and not any(self.styles.gutter)
        )
        saved = (dict(rows), set(marked)) if keep and rows is not None and marked is not None else None
        changed = super()._size_updated(size, virtual_size, container_size, layout=False)
        if saved is not None and changed:
            cache._cache, cache._dirty_lines = saved
        return changed

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return container.width

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        inner = self._inner(width)
        if self._deferred:
            if self._estimate[0] != inner:
                self._estimate = (inner, self.estimate_height(inner))
            return self._estimate[1]
        return self.content_height(inner)

    def render(self) -> RenderResult:
        return ""

    def render_line(self, y: int) -> Strip:
        if not self._seen:
            self._seen = True
            # Painted while deferred: it is on screen, so it renders for real now.
            self.render_now()
            self.first_painted()
        width = self.content_size.width
        lines = self.lines_for(self._inner(width))
        # visual_style is cached per style change; rich_style walks every ancestor on each call.
        style = self.visual_style.rich_style
        if 0 <= y < len(lines):
            line = lines[y]
        else:
            after = self.row_after_lines(y - len(lines), self._inner(width)) if y >= len(lines) else None
            if after is None:
                return Strip.blank(width, style)
            line = after
        row = [self.left_margin(), *line, Segment(" " * self.RIGHT)]
        return Strip(Segment.apply_style(row, style), width)


def bar(style: Style, width: int) -> Segment:
    """A left bar ``width`` cells wide: a thick stroke, then spaces."""
    return Segment("▌" + " " * (width - 1), style)
