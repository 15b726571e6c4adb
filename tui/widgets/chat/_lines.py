"""What rendered text is kept as: plain tuples of Rich segments, not Textual strips.

A Textual ``Strip`` carries seven small caches; a finished reply of a few hundred lines kept as strips
is thousands of objects for the garbage collector to walk on every full collection, and a full
collection pauses the event loop. Lines are kept as tuples and become strips only when painted.
"""

from __future__ import annotations

from functools import lru_cache

from rich.segment import Segment

Line = tuple[Segment, ...]
"""One rendered row, exactly as many cells wide as it was rendered for."""

CodeLine = tuple[tuple[Segment, ...], int]
"""One highlighted source line of any width: its segments and its width in cells."""


@lru_cache(maxsize=64)
def blank(width: int) -> Line:
    """An empty row ``width`` cells wide."""
    return (Segment(" " * width),) if width > 0 else ()


def text_of(line: Line) -> str:
    """The characters of a row, styles dropped."""
    return "".join(segment.text for segment in line)
