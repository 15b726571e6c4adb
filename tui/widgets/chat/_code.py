"""Code blocks laid out at a width: highlighted lines (see ``_highlight``) cut to the block's width.

Highlighting is the costly part, so it is kept apart from the width: a resize re-cuts lines without
lexing again.
"""

from __future__ import annotations

from functools import lru_cache

# Pygments ships no type hints and its stubs are not installed.
from pygments.lexer import Lexer  # type: ignore[import-untyped]
from pygments.lexers import get_lexer_by_name  # type: ignore[import-untyped]
from pygments.util import ClassNotFound  # type: ignore[import-untyped]
from rich.cells import cell_len, get_character_cell_size
from rich.segment import Segment
from rich.style import Style
from rich.syntax import PygmentsSyntaxTheme
from textual.strip import Strip

TAB_SIZE = 4
"""Columns a tab stands for in code."""


@lru_cache(maxsize=64)
def lexer_for(language: str) -> Lexer | None:
    """The Pygments lexer for a fence's language name, or None for none or an unknown one."""
    if not language:
        return None
    try:
        return get_lexer_by_name(language, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return None


@lru_cache(maxsize=8)
def _syntax_theme(name: str) -> PygmentsSyntaxTheme:
    return PygmentsSyntaxTheme(name)


@lru_cache(maxsize=4096)
def token_style(theme: str, background: Style, token_type: tuple[str, ...]) -> Style:
    """The Rich style of a Pygments token type in ``theme``, on ``background``."""
    style = _syntax_theme(theme).get_style_for_token(token_type)
    # The block's own background is kept, not the Pygments theme's.
    return background + Style(
        color=style.color, bold=style.bold, italic=style.italic, underline=style.underline
    )


def language_of(info: str) -> str:
    """The language named by a fence's info string (```` ```python title="x" ```` -> ``python``)."""
    return info.strip().partition(" ")[0].lower()


def cut(
    lines: list[Strip], width: int, background: Style, *, label: str = "", label_style: Style | None = None
) -> list[Strip]:
    """Lay highlighted lines out as a block ``width`` cells wide on ``background``.

    A label line (the language) opens the block and a blank line closes it; one cell of margin on
    each side; lines longer than the block fold onto the next row, so no code is ever hidden.
    """
    if width <= 0:
        return []
    strips = [_label_line(label, width, background, label_style)]
    strips.extend(cut_lines(lines, width, background))
    strips.append(Strip.blank(width, background))
    return strips


def cut_lines(lines: list[Strip], width: int, background: Style) -> list[Strip]:
    """The code lines of a block ``width`` wide, without its label and closing lines."""
    inner = max(1, width - 2)
    pad = Segment(" ", background)
    strips: list[Strip] = []
    for line in lines:
        length = line.cell_length
        if length <= inner:
            strips.append(Strip([pad, *line, Segment(" " * (width - 1 - length), background)], width))
            continue
        for piece, piece_length in _fold(line, inner):
            strips.append(Strip([pad, *piece], piece_length + 1).extend_cell_length(width, background))
    return strips


def _fold(line: Strip, inner: int) -> list[tuple[list[Segment], int]]:
    """Cut a line into pieces at most ``inner`` cells wide, never through a double-width character
    (Strip.divide would blank a character cut in half)."""
    pieces: list[tuple[list[Segment], int]] = []
    current: list[Segment] = []
    length = 0
    for text, style, _ in line:
        while text:
            size = cell_len(text)
            if length + size <= inner:
                current.append(Segment(text, style))
                length += size
                break
            taken = used = 0
            for character in text:
                cells = get_character_cell_size(character)
                if length + used + cells > inner:
                    break
                taken += 1
                used += cells
            if not taken and not length:
                # A character wider than the whole block: it goes on a row of its own.
                taken, used = 1, get_character_cell_size(text[0])
            if taken:
                current.append(Segment(text[:taken], style))
                length += used
                text = text[taken:]
            pieces.append((current, length))
            current, length = [], 0
    if current or not pieces:
        pieces.append((current, length))
    return pieces


def _label_line(label: str, width: int, background: Style, label_style: Style | None) -> Strip:
    if not label or width < 3:
        return Strip.blank(width, background)
    text = label[: width - 2]
    style = background + label_style if label_style is not None else background
    return Strip([Segment(" ", background), Segment(text, style)], 1 + cell_len(text)).extend_cell_length(
        width, background
    )
