"""Test-only: the terminal side of tests/terminal.py. A pyte screen that lays text out as the app does, and
the filter that turns the app's output into whole frames and answers what a modern terminal answers.

pyte is the Python standard for reading a program's screen: a VT100/xterm emulator with no display. Two things
keep it from showing what a user's terminal shows, and both are fixed here rather than worked around in tests:

- it lays text out code point by code point, where Textual (through Rich) measures grapheme clusters;
- it applies output as it arrives, so a screen read while the app writes is half of one frame and half of the
  next. Terminals that support synchronized output (kitty, WezTerm, foot, iTerm2, tmux 3.4+) hold a frame
  between Begin and End Synchronized Update and show it whole; Textual uses that when the terminal says it
  can. ``Frames`` says so and releases output frame by frame.
"""

from __future__ import annotations

import unicodedata

import pyte
from rich.cells import split_graphemes
from wcwidth import wcwidth  # pyte's own measure (a dependency of pyte)

SYNC_START, SYNC_END = b"\x1b[?2026h", b"\x1b[?2026l"
#: Queries a terminal answers, and the answer: DECRQM for synchronized output, "supported, not set".
ANSWERS: dict[bytes, bytes] = {b"\x1b[?2026$p": b"\x1b[?2026;2$y"}
#: Sequences pyte misreads and draws part of as text: Textual's "pop the kitty keyboard flags" on exit (pyte
#: knows no ``CSI <``, so the ``u`` lands on the screen). A terminal without that protocol ignores them.
IGNORED = (b"\x1b[<u",)
#: A frame longer than this is shown as far as it came (a terminal also gives up waiting for the end).
FRAME_CAP = 4 << 20

_MARKERS = (SYNC_START, SYNC_END, *ANSWERS, *IGNORED)


class AppScreen(pyte.Screen):
    """A pyte screen that counts cells as the app does: one grapheme cluster at a time, as wide as Rich says.

    pyte 0.8 draws code point by code point: a ZWJ emoji (👩‍💻) comes out wider than the app laid it out,
    pushing the rest of the row right, and a zero-width code point it cannot combine (U+200D) makes it drop
    the rest of what was drawn. Textual lays rows out with Rich's grapheme widths, so this screen draws each
    cluster Rich measures differently from pyte as one cell group of Rich's width; the rest goes to pyte.
    """

    def draw(self, data: str) -> None:
        if data.isascii():
            super().draw(data)
            return
        spans, _width = split_graphemes(data)
        done = 0
        for start, end, width in spans:
            char = data[start]
            if end - start == 1 and wcwidth(char) == width and (width or unicodedata.combining(char)):
                continue  # pyte measures it as Rich does: drawn with its neighbours
            super().draw(data[done:start])
            self._draw_cluster(unicodedata.normalize("NFC", data[start:end]), width)
            done = end
        super().draw(data[done:])

    @property
    def display(self) -> list[str]:
        """Each row as text. A cluster's cell holds it whole and the cell after a wide one holds "" (pyte's
        own ``display`` re-measures code point by code point and fails on a cluster)."""
        return ["".join(self.buffer[y][x].data for x in range(self.columns)) for y in range(self.lines)]

    def _draw_cluster(self, cluster: str, width: int) -> None:
        if width <= 0:
            return  # nothing to show and no cell to take (a stray joiner)
        # A stand-in of the right width gets pyte's wrapping and insert-mode handling; then the cell it took
        # holds the cluster.
        stand_in = "x" if width == 1 else "\u4e00"
        super().draw(stand_in)
        line, x = self.buffer[self.cursor.y], self.cursor.x - width
        if x >= 0 and line[x].data == stand_in:
            line[x] = line[x]._replace(data=cluster)


class Frames:
    """Cuts the app's output into what a synchronizing terminal would show, frame by frame.

    ``push(data)`` returns ``(show, answer)``: the bytes the screen may take now (everything up to the end of
    the last complete frame, none of a frame still being written) and the bytes to send back as the terminal's
    answers to queries in ``data``. A marker split between two reads is held until it is whole.
    """

    def __init__(self) -> None:
        self._held = b""
        self._in_frame = False

    def push(self, data: bytes) -> tuple[bytes, bytes]:
        buf = self._held + data
        answer = b""
        for query, reply in ANSWERS.items():
            answer += reply * buf.count(query)
            buf = buf.replace(query, b"")
        for seq in IGNORED:
            buf = buf.replace(seq, b"")
        cut = len(buf) - _partial_marker(buf)
        buf, tail = buf[:cut], buf[cut:]
        ready, pos = 0, 0
        while True:
            marker = SYNC_END if self._in_frame else SYNC_START
            found = buf.find(marker, pos)
            if found < 0:
                if not self._in_frame:
                    ready = len(buf)
                break
            pos = found + len(marker)
            ready = pos if self._in_frame else found
            self._in_frame = not self._in_frame
        if self._in_frame and len(buf) - ready > FRAME_CAP:
            ready = len(buf)
        self._held = buf[ready:] + tail
        return buf[:ready], answer

    def flush(self) -> bytes:
        """Everything still held (the program has ended)."""
        held, self._held, self._in_frame = self._held, b"", False
        return held


def _partial_marker(buf: bytes) -> int:
    """The length of the longest end of ``buf`` that could be the start of a marker."""
    for n in range(min(max(len(m) for m in _MARKERS) - 1, len(buf)), 0, -1):
        if any(m.startswith(buf[-n:]) for m in _MARKERS):
            return n
    return 0
