"""`llmchat export ID [--format markdown|json] [-o FILE]`: a conversation as Markdown, or its timings."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from llmchat.core.errors import UsageError
from llmchat.core.history import HistoryStore, export_markdown, export_records_json, write_private


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "export",
        help="print or save a conversation as Markdown, or its timing records as JSON",
        description="Export a conversation from the chat history ($XDG_DATA_HOME/llmchat/history.sqlite3).",
    )
    p.add_argument("conversation", metavar="ID", help="a conversation number, or `last` for the latest one")
    p.add_argument("--format", choices=("markdown", "json"), default="markdown",
                   help="markdown: the conversation; json: one timing record per reply (default: markdown)")
    p.add_argument("--thinking", action="store_true",
                   help="include each reply's reasoning (a reasoning model's thinking); tool calls are always in")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE (mode 0600) instead of stdout")
    p.set_defaults(func=run)


def _parse_id(text: str) -> int | None:
    """None for `last`, the number otherwise; UsageError for anything else."""
    if text.strip().lower() == "last":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise UsageError(f"export: ID must be a conversation number or `last`, got {text!r}")
    return value


async def _render(store: HistoryStore, conv_id: int | None, fmt: str, thinking: bool = False) -> str:
    async with store:
        if conv_id is None:
            conv_id = await store.last_conversation_id()
            if conv_id is None:
                raise UsageError("export: the history is empty; chat first, then export `last`")
        conv = await store.load(conv_id)
    if fmt == "json":
        return export_records_json(conv, thinking=thinking)
    return export_markdown(conv, thinking=thinking)


def _write_private(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` readable by its owner only (a conversation is private); UsageError if the
    file cannot be written."""
    try:
        write_private(Path(path), text)
    except OSError as exc:
        raise UsageError(f"export: cannot write {path}: {exc.strerror or exc}; pick a file in a folder you"
                         " can write to") from None


def run(args: argparse.Namespace) -> int:
    """Prints or writes the export. Exit 2 for a bad or unknown ID or an unwritable file, 1 for a history
    file that cannot be read (damaged, newer, unreadable: the line the chat app shows too); each as one line
    on stderr. A history one may read but not write exports as any other."""
    conv_id = _parse_id(args.conversation)
    # Read-only: an export needs no write access, never migrates or creates anything, and works beside a
    # running chat (SQLite's read-only mode still sees what the chat commits).
    store = HistoryStore(read_only=True)
    if not store.path.exists():
        # Opening would create an empty history just to say it is empty.
        raise UsageError(f"export: no history yet at {store.path}; chat first, then export")
    text = asyncio.run(_render(store, conv_id, args.format, args.thinking))
    if args.output:
        _write_private(args.output, text)
    else:
        sys.stdout.write(text)
    return 0
