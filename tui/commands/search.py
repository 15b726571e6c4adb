"""`llmchat search TEXT [--json] [--limit N]`: the messages of every saved conversation that hold TEXT."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from llmchat.core.errors import UsageError
from llmchat.core.history import HistoryStore, SearchHit


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "search",
        help="find messages in the chat history by the words in them",
        description="Full-text search over every message of every saved conversation, every branch "
        "included: each word must appear, the last one as a prefix; best match first.",
    )
    p.add_argument("text", metavar="TEXT", nargs="+", help="the words to look for")
    p.add_argument("--json", action="store_true", help="one JSON object per hit (JSON Lines)")
    p.add_argument("--limit", type=int, default=20, metavar="N", help="at most N hits (default: 20)")
    p.set_defaults(func=run)


async def _search(store: HistoryStore, text: str, limit: int) -> list[SearchHit]:
    async with store:
        return await store.search(text, limit=limit)


def _line(hit: SearchHit) -> str:
    # Tab-separated, so `cut -f1` gives CONVERSATION:MESSAGE; the snippet is on one line already.
    title = " ".join(hit.title.split()) or f"conversation {hit.conversation_id}"
    return "\t".join((f"{hit.conversation_id}:{hit.message_id}", title, hit.role, hit.marked()))


def run(args: argparse.Namespace) -> int:
    """Prints the hits, best first: ``CONV:MSG<TAB>title<TAB>role<TAB>snippet`` with each match in
    brackets, or JSON Lines with ``--json``. Exit 0 with hits, 1 with none (as grep), 2 for text without a
    word, a limit under 1 or no history yet. Reads the history only (it may be read-only)."""
    text = " ".join(args.text)
    if args.limit < 1:
        raise UsageError(f"search: --limit must be at least 1, got {args.limit}")
    if not any(ch.isalnum() for ch in text):
        raise UsageError(f"search: give a word to search for, got {text!r}")
    store = HistoryStore(read_only=True)
    if not store.path.exists():
        raise UsageError(f"search: no history yet at {store.path}; chat first, then search")
    hits = asyncio.run(_search(store, text, args.limit))
    if not hits:
        print(f'search: no message holds "{text}"', file=sys.stderr)
        return 1
    for hit in hits:
        sys.stdout.write((json.dumps(hit.as_json(), ensure_ascii=False) if args.json else _line(hit)) + "\n")
    return 0
