"""Conversations in SQLite: the store and its streaming writer, the schema and its migrations, the file's
state (read-only, damaged), the tree of alternatives, search, export.
"""

from __future__ import annotations

from llmchat.core.history._db import ConversationNotFoundError
from llmchat.core.history._export import ExportError, export_folder, save_export, write_private
from llmchat.core.history._file import HistoryError
from llmchat.core.history._model import (
    Conversation,
    ConversationInfo,
    Generation,
    Origin,
    export_markdown,
    export_records_json,
    pretty_arguments,
)
from llmchat.core.history._search import SearchHit
from llmchat.core.history._store import HistoryStore, ReplyWriter

__all__ = [
    "Conversation",
    "ConversationInfo",
    "ConversationNotFoundError",
    "ExportError",
    "Generation",
    "HistoryError",
    "HistoryStore",
    "Origin",
    "ReplyWriter",
    "SearchHit",
    "export_folder",
    "export_markdown",
    "export_records_json",
    "pretty_arguments",
    "save_export",
    "write_private",
]
