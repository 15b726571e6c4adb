"""Text made valid where it enters: every str llmchat keeps can be encoded as UTF-8.

Python strings can hold what UTF-8 cannot: lone surrogates, from JSON's ``\\ud83d`` escapes (a server that
splits an emoji's pair across two stream chunks, each chunk valid JSON) or from ``surrogateescape``-decoded
argv and stdin bytes that were not UTF-8. Left in, they raise ``UnicodeEncodeError`` far from where they came
in: in the terminal, in SQLite, in the request log. So the edges clean them, once: a surrogate pair split
across chunks is joined (``SurrogateJoiner``), what cannot be joined or decoded becomes U+FFFD, and the
caller is told how many characters were replaced so it can say so once.
"""

from __future__ import annotations

import os

REPLACEMENT = "\ufffd"


def clean(text: str) -> tuple[str, int]:
    """``text`` with every lone surrogate replaced by U+FFFD (valid pairs joined), and how many were replaced.

    O(n), and for valid text one C-level encode; never raises.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        pass
    else:
        return text, 0
    # UTF-16 with surrogatepass joins a high and a low surrogate that stand next to each other; decoding with
    # "replace" turns the lone ones into U+FFFD.
    fixed = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return fixed, fixed.count(REPLACEMENT) - text.count(REPLACEMENT)


def decode(data: bytes) -> tuple[str, int]:
    """UTF-8 ``data`` as text, bytes that are not UTF-8 replaced by U+FFFD, and how many replacements."""
    text = data.decode("utf-8", "replace")
    if REPLACEMENT not in text:
        return text, 0
    return text, text.count(REPLACEMENT) - data.count(REPLACEMENT.encode())


def from_os(value: str) -> tuple[str, int]:
    """An argv or environment string as the user meant it: bytes that were not UTF-8 (which Python keeps as
    ``surrogateescape`` surrogates) become U+FFFD; how many were replaced."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return decode(os.fsencode(value))
    return value, 0


class SurrogateJoiner:
    """Joins a surrogate pair that a stream split across two deltas; cleans everything else.

    ``feed`` each delta in order, ``flush`` at the end. A delta that ends in a high surrogate keeps it back
    until the next one shows whether its low half follows. ``replaced`` counts the U+FFFD put in.
    """

    __slots__ = ("_held", "replaced")

    def __init__(self) -> None:
        self._held = ""
        self.replaced = 0

    @property
    def holding(self) -> bool:
        """A high surrogate is held back for the next delta."""
        return bool(self._held)

    def feed(self, text: str) -> str:
        """The part of ``text`` (after anything held) that is final now, valid UTF-8."""
        if self._held:
            text, self._held = self._held + text, ""
        if text and "\ud800" <= text[-1] <= "\udbff":
            text, self._held = text[:-1], text[-1]
        fixed, n = clean(text)
        self.replaced += n
        return fixed

    def flush(self) -> str:
        """What is still held, as text (a high surrogate nothing followed is U+FFFD)."""
        if not self._held:
            return ""
        self._held = ""
        self.replaced += 1
        return REPLACEMENT


def may_need_cleaning(text: str) -> bool:
    """Whether ``text`` holds a surrogate (cheap for the ASCII most deltas are)."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
