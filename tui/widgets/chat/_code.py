"""Code blocks laid out at a width: highlighted lines (see ``_highlight``) cut to the block's width.

Highlighting is the costly part, so it is kept apart from the width: a resize re-cuts lines without
lexing again.
"""

from __future__ import annotations

from functools import lru_cache

# Pygments ships no type hints and its stubs are not installed.
from pygments.lexer import Lexer
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound
from rich.cells import cell_len, get_character_cell_size
from rich.segment import Segment
from rich.style import Style
from rich.syntax import PygmentsSyntaxTheme

from llmchat.tui.widgets.chat._lines import CodeLine, Line

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
    lines: list[CodeLine], width: int, background: Style, *, label: str = "", label_style: Style | None = None
) -> list[Line]:
    """Lay highlighted lines out as a block ``width`` cells wide on ``background``.

    A label line (the language) opens the block and a blank line closes it; one cell of margin on
    each side; lines longer than the block fold onto the next row, so no code is ever hidden.
    """
    if width <= 0:
        return []
    rows = [_label_line(label, width, background, label_style)]
    rows.extend(cut_lines(lines, width, background))
    rows.append(_fit([], 0, width, background))
    return rows


def cut_lines(lines: list[CodeLine], width: int, background: Style) -> list[Line]:
    """The code lines of a block ``width`` wide, without its label and closing lines."""
    inner = max(1, width - 2)
    pad = Segment(" ", background)
    rows: list[Line] = []
    for segments, length in lines:
        if length <= inner:
            rows.append((pad, *segments, Segment(" " * (width - 1 - length), background)))
            continue
        for piece, piece_length in _fold(segments, inner):
            rows.append(_fit([pad, *piece], piece_length + 1, width, background))
    return rows


def _fit(segments: list[Segment], length: int, width: int, background: Style) -> Line:
    if length == width:
        return tuple(segments)
    if length < width:
        return (*segments, Segment(" " * (width - length), background))
    return tuple(Segment.adjust_line_length(segments, width, style=background))


def _fold(line: tuple[Segment, ...], inner: int) -> list[tuple[list[Segment], int]]:
    """Cut a line into pieces at most ``inner`` cells wide, never through a double-width character
    (cutting one in half would blank it)."""
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


def _label_line(label: str, width: int, background: Style, label_style: Style | None) -> Line:
    if not label or width < 3:
        return _fit([], 0, width, background)
    text = label[: width - 2]
    style = background + label_style if label_style is not None else background
    return _fit([Segment(" ", background), Segment(text, style)], 1 + cell_len(text), width, background)
