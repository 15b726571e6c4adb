"""Markdown blocks to Textual strips, in the app theme's colours, without any widget.

Rendering goes through Rich's Markdown elements (paragraphs, lists, quotes, headings) fed with tokens
parsed already, with three elements replaced for speed and looks: code blocks (``_code``), tables
(laid out directly when they fit, which is most of the time) and left-aligned headings.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar

from markdown_it import MarkdownIt
from markdown_it.token import Token
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.markdown import Heading, HorizontalRule, MarkdownElement, TableElement, TextElement
from rich.markdown import Markdown as RichMarkdown
from rich.rule import Rule
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from rich.theme import Theme
from textual.app import App
from textual.color import Color, ColorParseError

from llmchat.tui.widgets.chat._blocks import Block
from llmchat.tui.widgets.chat._code import cut, language_of
from llmchat.tui.widgets.chat._highlight import FenceHighlight, highlight_now
from llmchat.tui.widgets.chat._lines import CodeLine, Line, blank

_DARK_DEFAULTS = {
    "background": "#121212",
    "foreground": "#E0E0E0",
    "text-primary": "#57A5E2",
    "text-accent": "#FFC473",
    "text-warning": "#FFC473",
    "text-error": "#D17E92",
    "text-success": "#8AD4A1",
}
_LIGHT_DEFAULTS = {
    "background": "#EFEFEF",
    "foreground": "#1F1F1F",
    "text-primary": "#004578",
    "text-accent": "#8C5300",
    "text-warning": "#8C5300",
    "text-error": "#8A1F36",
    "text-success": "#1E6B34",
}


@dataclass(frozen=True, slots=True)
class Palette:
    """The colours a reply is drawn in, taken from a Textual theme. Hashable: it keys render caches."""

    dark: bool
    foreground: str
    primary: str
    accent: str
    muted: str
    code_background: str
    warning: str
    error: str
    success: str

    @property
    def code_theme(self) -> str:
        """The Pygments style for code on ``code_background``."""
        return "monokai" if self.dark else "friendly"

    @classmethod
    def from_variables(cls, variables: Mapping[str, str], *, dark: bool) -> Palette:
        """Build a palette from a Textual app's CSS variables (``App.get_css_variables()``).

        Missing or unparsable colours fall back to built-in ones; never raises.
        """
        defaults = _DARK_DEFAULTS if dark else _LIGHT_DEFAULTS

        def color(name: str) -> Color:
            try:
                return Color.parse(variables.get(name) or defaults[name])
            except ColorParseError:
                return Color.parse(defaults[name])

        background, foreground = color("background"), color("foreground")
        return cls(
            dark=dark,
            foreground=(background + foreground).hex,
            primary=(background + color("text-primary")).hex,
            accent=(background + color("text-accent")).hex,
            muted=background.blend(foreground, 0.55).hex,
            # A faint wash of the text colour marks code off in any theme, dark or light.
            code_background=background.blend(foreground, 0.07).hex,
            warning=(background + color("text-warning")).hex,
            error=(background + color("text-error")).hex,
            success=(background + color("text-success")).hex,
        )

    def rich_theme(self) -> Theme:
        """Rich styles for the ``markdown.*`` names Rich's elements look up."""
        return Theme(
            {
                "markdown.h1": f"bold underline {self.primary}",
                "markdown.h2": f"bold {self.primary}",
                "markdown.h3": f"bold {self.foreground}",
                "markdown.h4": f"bold italic {self.foreground}",
                "markdown.h5": f"italic {self.foreground}",
                "markdown.h6": f"italic {self.muted}",
                "markdown.code": f"{self.accent} on {self.code_background}",
                "markdown.block_quote": f"italic {self.muted}",
                "markdown.item.bullet": f"bold {self.primary}",
                "markdown.item.number": f"{self.primary}",
                "markdown.hr": self.muted,
                "markdown.link": f"underline {self.primary}",
                "markdown.link_url": f"{self.muted}",
                "markdown.table.border": self.muted,
                "markdown.table.header": f"bold {self.foreground}",
                "status.muted": f"italic {self.muted}",
                "status.warning": f"bold {self.warning}",
                "status.error": f"bold {self.error}",
                "status.cached": f"bold {self.success}",
                "status.label": f"bold {self.muted}",
                "status.live": self.muted,
            }
        )


class _LeftHeading(Heading):
    LEVEL_ALIGN: ClassVar[dict[str, str]] = dict.fromkeys(("h1", "h2", "h3", "h4", "h5", "h6"), "left")  # type: ignore[assignment]


class _Rule(HorizontalRule):
    new_line = True

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Rule(style=console.get_style("markdown.hr", default="none"), characters="─")


class _Code(TextElement):
    """A code block inside a list or a quote (top-level ones skip Rich altogether)."""

    @classmethod
    def create(cls, markdown: RichMarkdown, token: Token) -> _Code:
        assert isinstance(markdown, _TokenMarkdown)
        return cls(markdown.renderer, language_of(token.info))

    def __init__(self, renderer: MarkdownRenderer, language: str) -> None:
        self.renderer = renderer
        self.language = language

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        code = self.text.plain
        for line in self.renderer.code(code, self.language, options.max_width):
            yield from line
            yield Segment.line()


class _Table(TableElement):
    """A table laid out cell by cell when its natural width fits, else by Rich's Table (it wraps)."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        header = self.header.row.cells if self.header is not None and self.header.row is not None else []
        body = [row.cells for row in self.body.rows] if self.body is not None else []
        rows = [header, *body] if header else body
        columns = max((len(row) for row in rows), default=0)
        if not columns:
            return
        widths = [0] * columns
        for row in rows:
            for index, cell in enumerate(row):
                widths[index] = max(widths[index], cell.content.cell_len)
        fits = sum(widths) + 3 * (columns - 1) <= options.max_width
        if not fits or any("\n" in cell.content.plain for row in rows for cell in row):
            yield from super().__rich_console__(console, options)
            return
        border = console.get_style("markdown.table.border", default="none")
        header_style = console.get_style("markdown.table.header", default="none")
        separator = Segment(" │ ", border)
        for row_index, row in enumerate(rows):
            line: list[Segment] = []
            for index in range(columns):
                if index:
                    line.append(separator)
                present = row[index] if index < len(row) else None
                content = present.content if present is not None else Text()
                spare = widths[index] - content.cell_len
                justify = present.justify if present is not None else "left"
                left = spare if justify == "right" else spare // 2 if justify == "center" else 0
                segments = list(content.render(console))
                if header and row_index == 0:
                    segments = list(Segment.apply_style(segments, post_style=header_style))
                if left:
                    line.append(Segment(" " * left))
                line.extend(segments)
                if spare - left:
                    line.append(Segment(" " * (spare - left)))
            yield from line
            yield Segment.line()
            if header and row_index == 0:
                yield Segment("─┼─".join("─" * width for width in widths), border)
                yield Segment.line()


class _TokenMarkdown(RichMarkdown):
    elements: ClassVar[dict[str, type[MarkdownElement]]] = {
        **RichMarkdown.elements,
        "heading_open": _LeftHeading,
        "hr": _Rule,
        "fence": _Code,
        "code_block": _Code,
        "table_open": _Table,
    }

    def __init__(self, tokens: Sequence[Token], renderer: MarkdownRenderer) -> None:
        # Rich's __init__ parses its markup; these tokens are parsed already, so its fields are set here.
        self.markup = ""
        self.parsed = list(tokens)
        self.code_theme = renderer.palette.code_theme
        self.justify = None
        self.style = "none"
        self.hyperlinks = False
        self.inline_code_lexer = None
        self.inline_code_theme = self.code_theme
        self.renderer = renderer


class MarkdownRenderer:
    """Renders blocks for one palette. One instance per palette is shared (see ``renderer_for``)."""

    def __init__(self, palette: Palette) -> None:
        self.palette = palette
        self.console = Console(
            file=io.StringIO(),
            width=80,
            force_terminal=True,
            color_system="truecolor",
            theme=palette.rich_theme(),
            markup=False,
            emoji=False,
            highlight=False,
            legacy_windows=False,
            _environ={},
        )
        self.code_background = Style(bgcolor=palette.code_background)
        self._label_style = Style(color=palette.muted, italic=True)

    def block(self, block: Block, width: int, parser: MarkdownIt) -> list[Line]:
        """Render one block ``width`` cells wide; a code block is highlighted now, whole.

        ``parser`` parses the block's source again if its tokens were released.
        """
        if width <= 0:
            return []
        if block.code is not None:
            return self.code(block.code, language_of(block.info), width)
        return self.rich(_TokenMarkdown(block.tokens(parser), self), width)

    def blocks(self, blocks: Iterable[Block], width: int, parser: MarkdownIt) -> list[Line]:
        """Render blocks as one document: a blank line between blocks, as Rich does."""
        lines: list[Line] = []
        for block in blocks:
            join(lines, self.block(block, width, parser), width)
        return lines

    def code(self, code: str, language: str, width: int) -> list[Line]:
        """A whole code block (``code`` may end with a newline), highlighted now, ``width`` wide.

        For small blocks only; top-level blocks go through ``fence_highlight`` and ``code_lines``.
        """
        if code.endswith("\n"):
            code = code[:-1]
        lines = highlight_now(code, language, self.palette.code_theme, self.code_background)
        return self.code_lines(lines, language, width)

    def fence_highlight(self, language: str) -> FenceHighlight:
        """A resumable highlighter for one code block, in this palette."""
        return FenceHighlight(language, self.palette.code_theme, self.code_background)

    def code_lines(self, lines: list[CodeLine], language: str, width: int) -> list[Line]:
        """Highlighted code lines as a code block ``width`` wide."""
        return cut(lines, width, self.code_background, label=language, label_style=self._label_style)

    def line(self, text: Text, width: int) -> Line:
        """A Text that fits on one row (no wrapping: cut if longer) as a row exactly ``width`` cells wide;
        a quarter of what laying it out with ``rich`` costs, for a line repainted ten times a second."""
        if width <= 0:
            return ()
        if text.cell_len > width:
            text = text.copy()
            text.truncate(width, overflow="ellipsis")
        segments: Iterable[Segment] = text.render(self.console)
        if text.style and not text.spans:
            # Text.render leaves a span-less text's own style to its caller (Rich applies it in
            # __rich_console__), so a Text("label", style=...) would come out unstyled.
            segments = Segment.apply_style(segments, self.console.get_style(text.style, default=Style.null()))
        return tuple(Segment.adjust_line_length(list(segments), width))

    def rich(self, renderable: RenderableType, width: int) -> list[Line]:
        """Any Rich renderable as lines exactly ``width`` cells wide."""
        if width <= 0:
            return []
        options = self.console.options.update(width=width, min_width=width, max_width=width, height=None)
        return [tuple(line) for line in self.console.render_lines(renderable, options, pad=True)]


def is_code(block: Block) -> bool:
    """True for a top-level fenced or indented code block."""
    return block.kind in ("fence", "code_block")


def join(lines: list[Line], block: list[Line], width: int) -> None:
    """Append a rendered block to ``lines``, after a blank line if ``lines`` has any."""
    if not block:
        return
    if lines:
        lines.append(blank(width))
    lines.extend(block)


@lru_cache(maxsize=8)
def renderer_for(palette: Palette) -> MarkdownRenderer:
    """The shared renderer for ``palette``."""
    return MarkdownRenderer(palette)


def renderer_for_app(app: App[object]) -> MarkdownRenderer:
    """The shared renderer for ``app``'s current theme (its colours are read once per theme name)."""
    theme = app.theme
    palette = _palettes.get(theme)
    if palette is None:
        palette = _palettes[theme] = Palette.from_variables(
            app.get_css_variables(), dark=app.current_theme.dark
        )
    return renderer_for(palette)


_palettes: dict[str, Palette] = {}
