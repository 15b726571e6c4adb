"""Full-text search over every message of every conversation: SQLite FTS5, ranked by BM25.

The index (``messages_fts``, an external-content FTS5 table over ``messages.content``) is kept in step by
triggers on ``messages`` (see the migration in :mod:`llmchat.core.history._db`), so nothing here writes. What
a person types is never passed to FTS5's query language as it is (a stray ``"`` or ``AND`` would be a syntax
error or mean something else): each word becomes a quoted term, the last one a prefix, so ``tcp kee`` finds
"TCP keep-alive" while it is being typed.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass

#: Marks around each matched term in a snippet as SQLite returns it; never in stored text (control
#: characters are cleaned from what is saved), and taken out by :func:`_spans`.
_OPEN, _CLOSE = "\x02", "\x03"
#: Tokens of context a snippet shows around its matches.
SNIPPET_TOKENS = 16
_WORD = re.compile(r"\w+", re.UNICODE)


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchHit:
    """One message that matches, with a snippet of it. ``highlights`` are ``(start, end)`` character spans of
    ``snippet`` that matched; ``rank`` is BM25's (lower is better), for ordering only."""

    conversation_id: int
    message_id: int
    title: str
    role: str
    created_at: float
    snippet: str
    highlights: tuple[tuple[int, int], ...]
    rank: float

    def marked(self, open_mark: str = "[", close_mark: str = "]") -> str:
        """The snippet with each match between ``open_mark`` and ``close_mark``: ``a [word] in it``."""
        out, last = [], 0
        for start, end in self.highlights:
            out += [self.snippet[last:start], open_mark, self.snippet[start:end], close_mark]
            last = end
        out.append(self.snippet[last:])
        return "".join(out)

    def as_json(self) -> dict[str, object]:
        """The hit as ``llmchat search --json`` prints it."""
        return {"conversation_id": self.conversation_id, "message_id": self.message_id, "title": self.title,
                "role": self.role, "created_at": self.created_at, "snippet": self.snippet,
                "highlights": [list(span) for span in self.highlights], "rank": self.rank}


def fts_query(text: str) -> str:
    """The FTS5 query for what a person typed: every word must appear, the last as a prefix. "" when the text
    has no word (nothing to search for)."""
    words = _WORD.findall(text)
    if not words:
        return ""
    # A quoted term is a string to FTS5: an operator word or a column name inside it is just a word.
    terms = [f'"{w}"' for w in words]
    terms[-1] += "*"
    return " ".join(terms)


def _spans(marked: str) -> tuple[str, tuple[tuple[int, int], ...]]:
    text: list[str] = []
    spans: list[tuple[int, int]] = []
    length, start = 0, None
    for part in re.split(f"([{_OPEN}{_CLOSE}])", marked):
        if part == _OPEN:
            start = length
        elif part == _CLOSE:
            if start is not None and length > start:
                spans.append((start, length))
            start = None
        else:
            text.append(part)
            length += len(part)
    return "".join(text), tuple(spans)


def search(conn: sqlite3.Connection, text: str, limit: int) -> list[SearchHit]:
    """Up to ``limit`` messages matching ``text``, best first; [] when ``text`` has no word."""
    query = fts_query(text)
    if not query or limit <= 0:
        return []
    rows = conn.execute(
        "SELECT m.conversation_id, m.id, c.title, m.role, m.created_at,"
        f" snippet(messages_fts, 0, '{_OPEN}', '{_CLOSE}', '…', {SNIPPET_TOKENS:d}), bm25(messages_fts)"
        " FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid"
        " JOIN conversations c ON c.id = m.conversation_id"
        " WHERE messages_fts MATCH ? ORDER BY bm25(messages_fts), m.id DESC LIMIT ?", (query, limit)).fetchall()
    hits = []
    for conv_id, msg_id, title, role, created_at, marked, rank in rows:
        snippet, spans = _spans(" ".join(str(marked).split()))
        hits.append(SearchHit(conversation_id=int(conv_id), message_id=int(msg_id), title=str(title),
                              role=str(role), created_at=float(created_at), snippet=snippet, highlights=spans,
                              rank=float(rank)))
    return hits
