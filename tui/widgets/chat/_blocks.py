"""Markdown text as top-level blocks, and that split kept current while a reply streams in.

A top-level block (a paragraph, a list, a table, a fence...) renders the same on its own as inside the
whole document, so a streaming reply is rendered block by block: blocks that can no longer change are
rendered once and kept, and only the live tail is rendered again as text arrives.
"""

from __future__ import annotations

import re
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.token import Token

# A link reference definition changes links anywhere in the document, so a reply holding one is
# rendered whole at the end instead of reusing blocks rendered before the definition arrived.
_REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]\n]+\]:", re.M)
_BLANK_LINE = re.compile(r"^[ \t]*\n", re.M)
_OPENER = re.compile(r"^ {0,3}[#`~>*+\-_=|<0-9]", re.M)
_MARKUP = re.compile(r"[^\S ]|[\0\\`*_~\[\]!<&|\ufeff]")
"""A character that may open or close inline markup (or a line break, or space other than " ")."""
_CLOSED_BY_BLANK = frozenset(("paragraph_open", "heading_open", "table_open", "hr"))
"""Blocks that nothing after a blank line can extend or change (a list, a quote or a fence can go on)."""


def new_parser() -> MarkdownIt:
    """A CommonMark parser with GitHub's tables and strikethrough.

    Raw HTML stays literal text: a reply is untrusted, and an HTML block would otherwise vanish.
    """
    return MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])


class Block:
    """One top-level block: the lines [start, end) it spans in the whole text, its source, its tokens.

    Tokens are many small objects; once a block is rendered they can be dropped (``release``) and are
    parsed again from the block's own source if it must be rendered again (at another width).
    """

    __slots__ = ("_tokens", "code", "end", "info", "kind", "source", "start")

    def __init__(self, tokens: tuple[Token, ...], start: int, end: int, source: str) -> None:
        self._tokens: tuple[Token, ...] | None = tokens
        self.start = start
        self.end = end
        self.source = source
        opening = tokens[0]
        self.kind: str = opening.type
        """The markdown-it type of the opening token: ``paragraph_open``, ``fence``, ``table_open``..."""
        code = self.kind in ("fence", "code_block")
        self.code: str | None = opening.content if code else None
        """A code block's code (as markdown-it gives it, ending with a newline if complete)."""
        self.info = opening.info if code else ""
        """A fence's info string (its language first)."""

    def tokens(self, parser: MarkdownIt) -> tuple[Token, ...]:
        """The block's tokens, parsed again from its source if they were released."""
        if self._tokens is None:
            self._tokens = tuple(parser.parse(self.source))
        return self._tokens

    def release(self) -> None:
        """Drop the tokens; ``tokens()`` parses them again when asked."""
        self._tokens = None

    def __repr__(self) -> str:
        return f"Block({self.kind}, lines {self.start}-{self.end})"


def split_blocks(
    parser: MarkdownIt, source: str, first_line: int = 0, env: dict[str, Any] | None = None
) -> list[Block]:
    """Parse ``source`` and group its tokens into top-level blocks.

    ``first_line`` is the line number of ``source``'s first line in the whole text, so the blocks'
    line ranges are absolute. Never raises for any text (markdown-it accepts everything).
    """
    tokens = parser.parse(source, env if env is not None else {})
    # markdown-it's line numbers count "\n" only (splitlines() would also split on \f, \u2028...).
    pieces = source.split("\n")
    lines = [piece + "\n" for piece in pieces[:-1]] + pieces[-1:]
    blocks: list[Block] = []
    group: list[Token] = []
    for token in tokens:
        if token.level == 0 and token.nesting >= 0 and group:
            blocks.append(_block(group, first_line, lines))
            group = []
        group.append(token)
    if group:
        blocks.append(_block(group, first_line, lines))
    return blocks


def _block(tokens: list[Token], first_line: int, lines: list[str]) -> Block:
    start, end = tokens[0].map or [0, 0]
    return Block(tuple(tokens), first_line + start, first_line + end, "".join(lines[start:end]))


def _may_start_block(text: str, start: int, end: int) -> bool:
    """Could a new top-level block begin on one of the complete lines text[start:end]?

    Only then can a block settle, so the parse that settles blocks is skipped otherwise. True when a
    line follows a blank line or starts (after up to three spaces) with a character that opens a
    block or closes a fence; False only for plain continuation lines, which is most of a paragraph
    and of indented code. A False can only delay settling, never settle wrongly.
    """
    previous = text.rfind("\n", 0, max(0, start - 1)) + 1
    return _BLANK_LINE.search(text, previous, end) is not None or _OPENER.search(text, start, end) is not None


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
        self._raw: list[str] = []
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
        """The text appended so far (synced or not) as parsed: carriage returns dropped, since
        markdown-it counts them as line breaks and the line counting here counts "\\n" only."""
        if self._pending:
            self._text += "".join(self._pending).replace("\r", "")
            self._pending.clear()
        return self._text

    @property
    def raw_text(self) -> str:
        """The text exactly as appended."""
        if len(self._raw) > 1:
            self._raw[:] = ["".join(self._raw)]
        return self._raw[0] if self._raw else ""

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
    def parser(self) -> MarkdownIt:
        """The parser the text is split with (blocks parse their source again with it)."""
        return self._parser

    @property
    def tail_line(self) -> int:
        """The first line of the tail: blocks starting before it are settled."""
        return self._tail_line

    def append(self, text: str) -> None:
        """Buffer ``text``; O(1). Raises RuntimeError after ``finish()``."""
        if self._finished:
            raise RuntimeError("the text is finished; nothing can be appended")
        self._pending.append(text)
        self._raw.append(text)

    def sync(self) -> int:
        """Take in the buffered text, settle what can be settled, re-split the tail.

        Returns how many blocks settled in this call.
        """
        if self._pending and self._lengthen_paragraph():
            return 0
        text = self.text
        settled_before = len(self._settled)
        complete_end = text.rfind("\n") + 1
        if complete_end > self._checked_to and not self._finished:
            # Settle only from complete lines: a partial last line such as "#" parses as a heading
            # now and may become "#include" (paragraph text) with the next token.
            if _may_start_block(text, self._checked_to, complete_end):
                last_line = text.rfind("\n", 0, complete_end - 1) + 1
                closed = _BLANK_LINE.match(text, last_line) is not None
                self._settle(text[self._tail_char : complete_end], closed=closed)
            self._checked_to = complete_end
        self._tail = split_blocks(self._parser, text[self._tail_char :], self._tail_line)
        return len(self._settled) - settled_before

    def _lengthen_paragraph(self) -> bool:
        """Take in the buffered text without parsing it where parsing would only lengthen the tail's
        last paragraph by it, which is most tokens of prose; True if it did.

        That holds when the text goes on the paragraph's last line, which starts with a letter (so it
        stays paragraph text whatever follows), holds no line break and no character that opens or
        closes inline markup, and meets the text before at a space (delimiters next to the join see a
        space either way): the paragraph's last text token then grows, and nothing else changes.
        """
        if self._finished or not self._tail:
            return False
        block = self._tail[-1]
        tokens = block._tokens
        if block.kind != "paragraph_open" or tokens is None or len(tokens) != 3:
            return False
        inline = tokens[1]
        children = inline.children
        if not children or children[-1].type != "text":
            return False
        delta, text = "".join(self._pending), self._text
        if _MARKUP.search(delta) or not (text.endswith(" ") or delta.startswith(" ")):
            return False
        line = text[text.rfind("\n") + 1 :]
        words = line.lstrip(" ")
        if len(line) - len(words) > 3 or not words[:1].isalpha():
            return False
        if block.end != self._tail_line + text.count("\n", self._tail_char) + 1:
            return False
        spaces = text[len(text.rstrip()) :]
        if spaces.strip(" "):
            return False
        # The paragraph's content is trimmed: spaces at its end count only once text follows them.
        added = (spaces + delta).rstrip(" ")
        if added:
            last = children[-1].copy(content=children[-1].content + added)
            grown = inline.copy(content=inline.content + added, children=[*children[:-1], last])
            tokens = (tokens[0], grown, tokens[2])
        self._tail[-1] = Block(tokens, block.start, block.end, block.source + delta)
        self._text += delta
        self._pending.clear()
        return True

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

    def _settle(self, complete: str, *, closed: bool) -> None:
        """Settle the blocks of the complete lines ``complete`` but the last, which can still grow; the
        last too if ``closed`` (the lines end with a blank one) and nothing can follow it: a prose
        paragraph then stops being rendered again with every token of the one after it."""
        blocks = split_blocks(self._parser, complete, self._tail_line)
        if closed and blocks and blocks[-1].kind in _CLOSED_BY_BLANK:
            self._settled.extend(blocks)
            self._tail_char += len(complete)
            self._tail_line += complete.count("\n")
            return
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
