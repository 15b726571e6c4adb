"""Code highlighting done a slice at a time, so a big code block never stalls the event loop.

Pygments lexes a 160-line Python block in about 30 ms; a chat app that lexes it in one go stalls
for that long. Its token stream is a generator, though, so the lexing can stop at a deadline and
resume on the next turn of the loop. Until a block is highlighted it shows its plain text, which
has the same height, so the layout never waits for the highlighter.
"""

from __future__ import annotations

from collections.abc import Iterator
from time import perf_counter_ns

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style

from llmchat.tui.widgets.chat._code import TAB_SIZE, lexer_for, token_style
from llmchat.tui.widgets.chat._lines import CodeLine

_CHECK_EVERY = 32
"""Tokens lexed between two looks at the clock."""


def plain_lines(code: str, background: Style) -> list[CodeLine]:
    """``code`` split into unhighlighted lines on ``background`` (tabs expanded as highlighting does)."""
    if not code:
        return []
    return [((Segment(line, background),), cell_len(line)) for line in code.expandtabs(TAB_SIZE).split("\n")]


def highlight_now(code: str, language: str, theme: str, background: Style) -> list[CodeLine]:
    """Highlight ``code`` in one go: for small blocks only (code nested in lists and quotes)."""
    lexing = Lexing(code, language, theme, background)
    lexing.advance(2**63)
    return lexing.lines


class Lexing:
    """The highlighting of one fixed piece of code, resumable: ``advance`` until it returns True."""

    def __init__(self, code: str, language: str, theme: str, background: Style) -> None:
        self._theme = theme
        self._background = background
        lexer = lexer_for(language) if code else None
        self._tokens: Iterator[tuple[tuple[str, ...], str]] | None = None
        self.lines: list[CodeLine] = []
        """The complete lines highlighted so far."""
        self.done = False
        if lexer is None:
            self.lines = plain_lines(code, background)
            self.done = True
        else:
            self._tokens = iter(lexer.get_tokens(code.expandtabs(TAB_SIZE)))
        self._current: list[Segment] = []
        self._length = 0

    def advance(self, deadline_ns: int) -> bool:
        """Lex until done or until ``perf_counter_ns()`` passes ``deadline_ns``; True once done."""
        if self.done or self._tokens is None:
            return True
        theme, background = self._theme, self._background
        lines, current, length = self.lines, self._current, self._length
        count = 0
        for token_type, value in self._tokens:
            style = token_style(theme, background, token_type)
            first, *rest = value.split("\n")
            if first:
                current.append(Segment(first, style))
                length += cell_len(first)
            for piece in rest:
                lines.append((tuple(current), length))
                current = [Segment(piece, style)] if piece else []
                length = cell_len(piece)
            count += 1
            if count % _CHECK_EVERY == 0 and perf_counter_ns() > deadline_ns:
                self._current, self._length = current, length
                return False
        lines.append((tuple(current), length))
        self._current, self._length = [], 0
        self.done = True
        return True


class FenceHighlight:
    """Everything known about the colours of one code block, growing or whole.

    While the block grows, each batch of new complete lines is lexed on its own (a string spanning
    batches may be coloured wrongly for a while); once the code is final it is lexed whole, which
    is exact. ``lines()`` always gives one strip per source line: the best colours known so far,
    plain text for the rest.
    """

    def __init__(self, language: str, theme: str, background: Style) -> None:
        self.language = language
        self._theme = theme
        self._background = background
        self._code = ""
        self._final = False
        self._approx: list[CodeLine] = []
        self._approx_source_lines = 0
        self._batch: Lexing | None = None
        self._batch_lines = 0
        self._exact: Lexing | None = None
        self.version = 0
        """Bumps whenever ``lines()`` would return something different."""

    @property
    def exact(self) -> bool:
        """True once the whole final code is highlighted in one pass."""
        return self._exact is not None and self._exact.done

    @property
    def busy(self) -> bool:
        """True while there is lexing left to do."""
        if self._final:
            return not self.exact
        return self._batch is not None or self._complete_line_count() > self._approx_source_lines

    def set_code(self, code: str, *, final: bool) -> None:
        """Give the code as it stands (it only ever grows); ``final`` once it can no longer change."""
        if code.endswith("\n") and final:
            code = code[:-1]
        if code != self._code:
            self._code = code
            self.version += 1
        if final and not self._final:
            self._final = True
            self._batch = None
            self._exact = Lexing(code, self.language, self._theme, self._background)
            self.version += 1

    def work(self, deadline_ns: int) -> None:
        """Lex until there is nothing left or the deadline passes."""
        if self._final:
            assert self._exact is not None
            if not self._exact.done and self._exact.advance(deadline_ns):
                self.version += 1
            return
        while perf_counter_ns() < deadline_ns:
            if self._batch is None:
                complete = self._complete_line_count()
                if complete <= self._approx_source_lines:
                    return
                fresh = "\n".join(self._code.split("\n")[self._approx_source_lines : complete])
                self._batch = Lexing(fresh, self.language, self._theme, self._background)
                self._batch_lines = complete - self._approx_source_lines
            if not self._batch.advance(deadline_ns):
                return
            self._approx.extend(self._batch.lines[: self._batch_lines])
            self._approx_source_lines += self._batch_lines
            self._batch = None
            self.version += 1

    def lines(self) -> list[CodeLine]:
        """One strip per source line: exact colours once known, else batch colours, else plain text."""
        if self._exact is not None and self._exact.done:
            return self._exact.lines
        source = self._code.split("\n") if self._code else []
        known = self._approx
        if len(known) >= len(source):
            return known[: len(source)]
        rest = "\n".join(source[len(known) :])
        return [*known, *plain_lines(rest, self._background)]

    def _complete_line_count(self) -> int:
        return self._code.count("\n")
