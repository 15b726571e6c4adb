"""Markdown text as top-level blocks, and that split kept current while a reply streams in.

A top-level block (a paragraph, a list, a table, a fence...) renders the same on its own as inside the
whole document, so a streaming reply is rendered block by block: blocks that can no longer change are
rendered once and kept, and only the live tail is rendered again as text arrives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.token import Token

# A link reference definition changes links anywhere in the document, so a reply holding one is
# rendered whole at the end instead of reusing blocks rendered before the definition arrived.
_REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]\n]+\]:", re.M)


def new_parser() -> MarkdownIt:
    """A CommonMark parser with GitHub's tables and strikethrough.

    Raw HTML stays literal text: a reply is untrusted, and an HTML block would otherwise vanish.
    """
    return MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])


@dataclass(frozen=True, slots=True)
class Block:
    """One top-level block: its tokens and the lines [start, end) it spans in the whole text."""

    tokens: tuple[Token, ...]
    start: int
    end: int

    @property
    def kind(self) -> str:
        """The markdown-it type of the opening token: ``paragraph_open``, ``fence``, ``table_open``..."""
        return self.tokens[0].type


def split_blocks(
    parser: MarkdownIt, source: str, first_line: int = 0, env: dict[str, Any] | None = None
) -> list[Block]:
    """Parse ``source`` and group its tokens into top-level blocks.

    ``first_line`` is the line number of ``source``'s first line in the whole text, so the blocks'
    line ranges are absolute. Never raises for any text (markdown-it accepts everything).
    """
    tokens = parser.parse(source, env if env is not None else {})
    blocks: list[Block] = []
    group: list[Token] = []
    for token in tokens:
        if token.level == 0 and token.nesting >= 0 and group:
            blocks.append(_block(group, first_line))
            group = []
        group.append(token)
    if group:
        blocks.append(_block(group, first_line))
    return blocks


def _block(tokens: list[Token], first_line: int) -> Block:
    line_map = tokens[0].map or [0, 0]
    return Block(tuple(tokens), first_line + line_map[0], first_line + line_map[1])


def has_reference_definitions(text: str) -> bool:
    """True if ``text`` may define a link reference (a cheap over-approximation)."""
    return _REFERENCE_DEFINITION.search(text) is not None


class BlockStream:
    """A growing Markdown text, split into settled blocks and the live tail after them.

    A block settles once a later top-level block has begun on a complete line: no text appended after
    that can change it. The split is re-derived from the settled point only, so each update costs
    the size of the tail, not of the whole text.
    """

    def __init__(self, parser: MarkdownIt | None = None) -> None:
        self._parser = parser or new_parser()
        self._text = ""
        self._pending: list[str] = []
        self._settled: list[Block] = []
        self._tail: list[Block] = []
        self._tail_char = 0
        """Where the unsettled text starts, as an offset into the text."""
        self._tail_line = 0
        self._checked_to = 0
        """The end of the complete lines already used to settle blocks."""
        self._finished = False

    @property
    def text(self) -> str:
        """The whole text appended so far (including text not yet synced)."""
        if self._pending:
            self._text += "".join(self._pending)
            self._pending.clear()
        return self._text

    @property
    def settled(self) -> list[Block]:
        """Blocks that can no longer change, in order (the list only grows)."""
        return self._settled

    @property
    def tail(self) -> list[Block]:
        """The blocks after the settled ones, as of the last ``sync()``; final after ``finish()``."""
        return self._tail

    @property
    def finished(self) -> bool:
        """True once ``finish()`` was called."""
        return self._finished

    @property
    def tail_line(self) -> int:
        """The first line of the tail: blocks starting before it are settled."""
        return self._tail_line

    def append(self, text: str) -> None:
        """Buffer ``text``; O(1). Raises RuntimeError after ``finish()``."""
        if self._finished:
            raise RuntimeError("the text is finished; nothing can be appended")
        self._pending.append(text)

    def sync(self) -> int:
        """Take in the buffered text, settle what can be settled, re-split the tail.

        Returns how many blocks settled in this call.
        """
        text = self.text
        settled_before = len(self._settled)
        complete_end = text.rfind("\n") + 1
        if complete_end > self._checked_to and not self._finished:
            # Settle only from complete lines: a partial last line such as "#" parses as a heading
            # now and may become "#include" (paragraph text) with the next token.
            self._checked_to = complete_end
            self._settle(text[self._tail_char : complete_end])
        self._tail = split_blocks(self._parser, text[self._tail_char :], self._tail_line)
        return len(self._settled) - settled_before

    def finish(self) -> bool:
        """Take in the buffered text and split the rest of it as final: ``tail`` is then final too.

        Returns True if the settled blocks were dropped and everything was split again from the whole
        text (``settled`` is then empty and ``tail`` holds every block): that happens when the text may
        define link references, since a definition can change a block settled before it.
        """
        text = self.text
        self._finished = True
        if has_reference_definitions(text):
            self._settled = []
            self._tail_char = self._tail_line = 0
            self._tail = split_blocks(self._parser, text, 0)
            return True
        self._tail = split_blocks(self._parser, text[self._tail_char :], self._tail_line)
        return False

    def _settle(self, complete: str) -> None:
        blocks = split_blocks(self._parser, complete, self._tail_line)
        if len(blocks) < 2:
            return
        last = blocks[-1]
        self._settled.extend(blocks[:-1])
        # Move the tail start to the first line of the last block, counting the lines crossed.
        position = self._tail_char
        text = self._text
        for _ in range(last.start - self._tail_line):
            position = text.index("\n", position) + 1
        self._tail_char = position
        self._tail_line = last.start


def code_blocks(text: str, parser: MarkdownIt | None = None) -> list[str]:
    """The code of every fenced or indented code block in ``text``, nested ones included, in order.

    One trailing newline is dropped from each; an unclosed fence runs to the end of the text.
    """
    tokens = (parser or new_parser()).parse(text)
    return [token.content.removesuffix("\n") for token in tokens if token.type in ("fence", "code_block")]
