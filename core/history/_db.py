"""The history's SQLite side: the file, its schema and migrations, and every query. All synchronous.

Only :class:`llmchat.core.history._store.HistoryStore` uses this, and only from its one worker thread: a sqlite3
connection belongs to the thread that made it, and the chat app's event loop must never wait on the disk.

The schema version lives in ``PRAGMA user_version``; ``MIGRATIONS[n]`` takes a database from version n to
n + 1, each in its own transaction. A database from a newer llmchat is refused before anything is written.
How the file is opened, checked and described when it fails is :mod:`llmchat.core.history._file`'s.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

from llmchat.core.history._file import (
    HistoryError,
    HistoryState,
    check,
    connect_read_only,
    connect_read_write,
    describe,
    enable_wal,
    in_memory,
    in_memory_line,
    read_only_line,
    schema_version,
    trouble,
)
from llmchat.core.history._model import (
    Conversation,
    ConversationInfo,
    Generation,
    Message,
    Origin,
    Role,
    Status,
    one_line,
    storable_url,
    title_from,
)
from llmchat.core.history._search import SearchHit, search
from llmchat.core.history._tree import alternatives, branch_ids, children_of, newest_leaf_under

T = TypeVar("T")

#: Longest title kept by a rename; a title is a list line, not a document.
TITLE_MAX = 200

#: The triggers that keep the search index (messages_fts, external content) in step with every insert, update
#: of content and delete of a message. Created with the index (migration 4) and again by any migration that
#: rebuilds the messages table (6), since dropping a table drops its triggers.
_FTS_TRIGGERS = (
        "CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN"
        " INSERT INTO messages_fts (rowid, content) VALUES (new.id, new.content); END",
        "CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN"
        " INSERT INTO messages_fts (messages_fts, rowid, content) VALUES ('delete', old.id, old.content); END",
        "CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN"
        " INSERT INTO messages_fts (messages_fts, rowid, content) VALUES ('delete', old.id, old.content);"
        " INSERT INTO messages_fts (rowid, content) VALUES (new.id, new.content); END",
)

MIGRATIONS: list[tuple[str, ...]] = [
    # 1: conversations and their messages. `touched` orders the list by activity without trusting the wall
    # clock (which can step back); AUTOINCREMENT so an id the user once exported never names another one.
    (
        """CREATE TABLE conversations (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            title TEXT NOT NULL DEFAULT '',
            system_prompt TEXT NOT NULL DEFAULT '',
            provider TEXT NOT NULL DEFAULT '',
            model TEXT NOT NULL DEFAULT '',
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            touched INTEGER NOT NULL
        )""",
        "CREATE INDEX conversations_by_touched ON conversations (touched)",
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            role TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'system')),
            content TEXT NOT NULL DEFAULT '',
            status TEXT NOT NULL DEFAULT 'done' CHECK (status IN ('streaming', 'done', 'cancelled', 'error')),
            error TEXT,
            provider TEXT NOT NULL DEFAULT '',
            model TEXT NOT NULL DEFAULT '',
            mode TEXT NOT NULL DEFAULT '',
            record TEXT,
            created_at REAL NOT NULL
        )""",
        "CREATE INDEX messages_by_conversation ON messages (conversation_id, id)",
    ),
    # 2: status 'interrupted', for a reply cut by llmchat quitting (not the user's cancel, not a crash, which
    # leaves 'streaming'). SQLite cannot change a CHECK in place: the table is rebuilt, ids and the
    # AUTOINCREMENT counter kept (a deleted message's id is never given again).
    (
        """CREATE TABLE messages_v2 (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            role TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'system')),
            content TEXT NOT NULL DEFAULT '',
            status TEXT NOT NULL DEFAULT 'done'
                CHECK (status IN ('streaming', 'done', 'cancelled', 'interrupted', 'error')),
            error TEXT,
            provider TEXT NOT NULL DEFAULT '',
            model TEXT NOT NULL DEFAULT '',
            mode TEXT NOT NULL DEFAULT '',
            record TEXT,
            created_at REAL NOT NULL
        )""",
        "INSERT INTO messages_v2 (id, conversation_id, role, content, status, error, provider, model,"
        " mode, record, created_at) SELECT id, conversation_id, role, content, status, error, provider,"
        " model, mode, record, created_at FROM messages ORDER BY id",
        "DELETE FROM sqlite_sequence WHERE name = 'messages_v2'",
        "INSERT INTO sqlite_sequence (name, seq) SELECT 'messages_v2', seq FROM sqlite_sequence"
        " WHERE name = 'messages'",
        "DROP TABLE messages",
        "ALTER TABLE messages_v2 RENAME TO messages",
        "CREATE INDEX messages_by_conversation ON messages (conversation_id, id)",
    ),
    # 3: what a conversation needs to be resumed faithfully: how it reached its provider (origin), the
    # provider's API root (never a key: see storable_url) and the generation settings it sends (NULL: none).
    # Older rows get origin '' (unknown: only the provider's name was kept) and no settings, which is what
    # they were sent with.
    (
        "ALTER TABLE conversations ADD COLUMN origin TEXT NOT NULL DEFAULT ''"
        " CHECK (origin IN ('', 'provider', 'base_url', 'offline'))",
        "ALTER TABLE conversations ADD COLUMN base_url TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE conversations ADD COLUMN temperature REAL",
        "ALTER TABLE conversations ADD COLUMN seed INTEGER",
        "ALTER TABLE conversations ADD COLUMN max_tokens INTEGER",
    ),
    # 4: a conversation is a tree, and searchable. The tree (regenerate and edit keep every alternative): each
    # message names its parent, each conversation the leaf of its current branch. Until now a conversation
    # was one line, so each message's parent is the one before it and the leaf is the newest message.
    (
        "ALTER TABLE messages ADD COLUMN parent_id INTEGER",
        "UPDATE messages SET parent_id = (SELECT MAX(p.id) FROM messages p"
        " WHERE p.conversation_id = messages.conversation_id AND p.id < messages.id)",
        "CREATE INDEX messages_by_parent ON messages (parent_id)",
        "ALTER TABLE conversations ADD COLUMN leaf_id INTEGER",
        "UPDATE conversations SET leaf_id = (SELECT MAX(m.id) FROM messages m"
        " WHERE m.conversation_id = conversations.id)",
        # And full-text search (FTS5) over every message. External content: the text is stored once, in
        # messages; triggers keep the index in step with every insert, update of content and delete (a
        # streaming reply's timed saves included), and 'rebuild' indexes what an existing database holds.
        # A later migration that rebuilds messages must create these triggers again.
        "CREATE VIRTUAL TABLE messages_fts USING fts5(content, content='messages', content_rowid='id',"
        " tokenize='unicode61 remove_diacritics 2')",
        *_FTS_TRIGGERS,
        "INSERT INTO messages_fts (messages_fts) VALUES ('rebuild')",
    ),
    # 5: a reasoning model's thinking, kept apart from the answer (never sent back to the model), and the tool
    # calls a reply asked for, as OpenAI's JSON list (NULL: none). Older replies had neither.
    (
        "ALTER TABLE messages ADD COLUMN reasoning TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE messages ADD COLUMN tool_calls TEXT",
    ),
    # 6: a reply the model refused: status 'refused' and the refusal in its words, kept apart from the answer
    # (OpenAI sends it in `refusal`, the content null). A new status means a new CHECK: the table is rebuilt as
    # in 2, ids and the AUTOINCREMENT counter kept, then its indexes and the search triggers made again (the
    # search index itself is by rowid, and the rowids are the same). Older replies refused nothing.
    (
        """CREATE TABLE messages_v6 (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            role TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'system')),
            content TEXT NOT NULL DEFAULT '',
            status TEXT NOT NULL DEFAULT 'done'
                CHECK (status IN ('streaming', 'done', 'cancelled', 'interrupted', 'error', 'refused')),
            error TEXT,
            provider TEXT NOT NULL DEFAULT '',
            model TEXT NOT NULL DEFAULT '',
            mode TEXT NOT NULL DEFAULT '',
            record TEXT,
            created_at REAL NOT NULL,
            parent_id INTEGER,
            reasoning TEXT NOT NULL DEFAULT '',
            tool_calls TEXT,
            refusal TEXT NOT NULL DEFAULT ''
        )""",
        "INSERT INTO messages_v6 (id, conversation_id, role, content, status, error, provider, model, mode,"
        " record, created_at, parent_id, reasoning, tool_calls) SELECT id, conversation_id, role, content,"
        " status, error, provider, model, mode, record, created_at, parent_id, reasoning, tool_calls"
        " FROM messages ORDER BY id",
        "DELETE FROM sqlite_sequence WHERE name = 'messages_v6'",
        "INSERT INTO sqlite_sequence (name, seq) SELECT 'messages_v6', seq FROM sqlite_sequence"
        " WHERE name = 'messages'",
        "DROP TABLE messages",  # its indexes and triggers go with it
        "ALTER TABLE messages_v6 RENAME TO messages",
        "CREATE INDEX messages_by_conversation ON messages (conversation_id, id)",
        "CREATE INDEX messages_by_parent ON messages (parent_id)",
        *_FTS_TRIGGERS,
    ),
]


class ConversationNotFoundError(HistoryError):
    """No conversation has that id (never had, or deleted since). Exit status 2: the id came from the user."""

    exit_code = 2

    def __init__(self, conv_id: int, recent: list[int] | None = None) -> None:
        self.conv_id = conv_id
        hint = "; recent ones are " + ", ".join(map(str, recent)) if recent else "; the history is empty"
        super().__init__(f"no conversation {conv_id} in the history{hint} (or use `last`)")


#: What a failure mid-session makes of the history when the store may fall back: a file that can no longer be
#: written is copied into memory; a damaged one is left for an empty history in memory. A locked file is not
#: a fallback: the write is refused (the caller keeps its data and may try again) and the file stays in use.
_FALLS_BACK = ("unwritable", "damaged")


class Database:
    """One connection to the history. Every method runs on the store's thread and may raise ``sqlite3.Error``
    or ``OSError``; :meth:`guard` turns those into one-line :class:`HistoryError`, or, for a database opened
    with :meth:`open_best`, into a fallback (see :attr:`state`)."""

    def __init__(self, path: Path, *, private_folder: bool, read_only: bool = False) -> None:
        self.path = path
        self._private_folder = private_folder
        self._read_only = read_only
        self._conn: sqlite3.Connection | None = None
        self._fallback = False
        #: How the history is held; :attr:`problem` is the line that says why when it is not "ok".
        self.state: HistoryState = "read-only" if read_only else "ok"
        self.problem = ""
        #: Called on this thread after a fallback mid-session changed :attr:`state`.
        self.on_change: Callable[[], None] | None = None

    def guard(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, with sqlite3 and OS errors raised as :class:`HistoryError` naming the file.

        After :meth:`open_best`, a file that fails mid-session (it became read-only, the disk is full, damage
        found late) is replaced as :meth:`open_best` would have, and ``fn`` runs once more on the replacement.
        """
        try:
            return fn(*args)
        except (sqlite3.Error, OSError) as exc:
            if not self._fallback or self.state != "ok" or trouble(exc) not in _FALLS_BACK:
                raise describe(self.path, exc) from None
            try:
                self._fall_back(exc)
            except (sqlite3.Error, OSError):
                raise describe(self.path, exc) from None
        try:
            return fn(*args)
        except (sqlite3.Error, OSError) as exc:
            raise describe(self.path, exc) from None

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("the history database is not open")
        return self._conn

    # -- lifecycle -------------------------------------------------------------------------------------------
    def open(self) -> None:
        """Opens (creating when missing) and migrates the file; read-only, opens it without writing a byte.

        Raises HistoryError for a newer schema, sqlite3 or OS errors for a damaged file (one that fails
        ``quick_check`` included) or one that cannot be opened; a refused file is left exactly as it was.
        """
        self._conn = self._open_read_only() if self._read_only else self._open_read_write()

    def open_best(self) -> None:
        """Opens the file in the best mode it allows and never raises for the file: read-write; else, for a
        file that can be read but not written, a copy of it in memory ("read-only"); else an empty history in
        memory ("in-memory"). :attr:`problem` says which and why; later failures fall back the same way."""
        self._fallback = True
        try:
            self.open()
            return
        except (sqlite3.Error, OSError, HistoryError) as exc:
            failure: BaseException = exc
        if trouble(failure) == "unwritable" and self.path.is_file():
            try:
                self._conn = self._copy_of_file()
                self._set_state("read-only", read_only_line(self.path, failure))
                return
            except (sqlite3.Error, OSError, HistoryError) as exc:
                failure = exc  # unreadable too, damaged or newer: say that instead
        self._conn = self._prepared(in_memory())
        self._set_state("in-memory", in_memory_line(self.path, failure))

    def _open_read_write(self) -> sqlite3.Connection:
        conn = connect_read_write(self.path, private_folder=self._private_folder)
        return _set_up(conn, self._set_up_read_write)

    def _set_up_read_write(self, conn: sqlite3.Connection) -> sqlite3.Connection:
        version = schema_version(conn, self.path, len(MIGRATIONS))
        check(conn)
        enable_wal(conn)
        # NORMAL in WAL mode: a commit survives the process being killed; only power loss can undo it.
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        if version < len(MIGRATIONS):
            # Only then take the write lock: an up-to-date file opens without waiting on other writers.
            self._migrate(conn)
        return conn

    def _open_read_only(self) -> sqlite3.Connection:
        return _set_up(connect_read_only(self.path), self._set_up_read_only)

    def _set_up_read_only(self, conn: sqlite3.Connection) -> sqlite3.Connection:
        if schema_version(conn, self.path, len(MIGRATIONS)) < len(MIGRATIONS):
            # An older file is read through today's queries from a migrated copy; the file stays as it is.
            copy = self._copy_of(conn)
            conn.close()
            return copy
        check(conn)
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    def _copy_of_file(self) -> sqlite3.Connection:
        source = connect_read_only(self.path)
        try:
            return self._copy_of(source)
        finally:
            source.close()

    def _copy_of(self, source: sqlite3.Connection) -> sqlite3.Connection:
        schema_version(source, self.path, len(MIGRATIONS))
        check(source)
        return self._prepared(in_memory(copy_of=source))

    def _prepared(self, conn: sqlite3.Connection) -> sqlite3.Connection:
        """A database in memory, brought up to today's schema."""
        def migrated(conn: sqlite3.Connection) -> sqlite3.Connection:
            conn.execute("PRAGMA foreign_keys=ON")
            self._migrate(conn)
            return conn

        return _set_up(conn, migrated)

    def _set_state(self, state: HistoryState, problem: str) -> None:
        self.state, self.problem = state, problem

    def _fall_back(self, exc: BaseException) -> None:
        """Swaps the file for memory after ``exc`` mid-session: a copy when the file can still be read, else
        an empty history (damage found late may be anywhere: a copy would carry it)."""
        old = self.conn
        replacement = None
        if trouble(exc) == "unwritable":
            try:
                replacement = self._prepared(in_memory(copy_of=old))
            except sqlite3.Error:
                replacement = None
        if replacement is not None:
            self._set_state("read-only", read_only_line(self.path, exc, mid_session=True))
        else:
            replacement = self._prepared(in_memory())
            self._set_state("in-memory", in_memory_line(self.path, exc))
        self._conn = replacement
        try:
            old.close()
        except sqlite3.Error:
            pass
        if self.on_change is not None:
            self.on_change()

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        for target in range(1, len(MIGRATIONS) + 1):
            with _transaction(conn):
                # Read again under the write lock: another llmchat may have migrated since we looked.
                if int(conn.execute("PRAGMA user_version").fetchone()[0]) >= target:
                    continue
                for statement in MIGRATIONS[target - 1]:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {target:d}")

    def close(self) -> None:
        """Closes the connection (SQLite folds the WAL back into the file when it is the last one)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    # -- conversations ---------------------------------------------------------------------------------------
    def _touch(self, conv_id: int, now: float) -> None:
        cur = self.conn.execute(
            "UPDATE conversations SET updated_at = ?, touched = (SELECT MAX(touched) FROM conversations) + 1 "
            "WHERE id = ?", (now, conv_id))
        if cur.rowcount == 0:
            raise self.not_found(conv_id)

    def not_found(self, conv_id: int) -> ConversationNotFoundError:
        """The error for an unknown id, listing the few most recent ids so the user can pick one."""
        rows = self.conn.execute("SELECT id FROM conversations ORDER BY touched DESC LIMIT 5").fetchall()
        return ConversationNotFoundError(conv_id, [int(r[0]) for r in rows])

    def new_conversation(self, title: str, system_prompt: str, provider: str, model: str, origin: Origin,
                         base_url: str, generation: Generation) -> int:
        now = time.time()
        with _transaction(self.conn):
            cur = self.conn.execute(
                "INSERT INTO conversations"
                " (title, system_prompt, provider, model, origin, base_url, temperature, seed, max_tokens,"
                " created_at, updated_at, touched)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
                " (SELECT COALESCE(MAX(touched), 0) + 1 FROM conversations))",
                (one_line(title)[:TITLE_MAX], system_prompt, provider, model, origin, _url(origin, base_url),
                 generation.temperature, generation.seed, generation.max_tokens, now, now))
            return int(cast(int, cur.lastrowid))

    def set_endpoint(self, conv_id: int, provider: str, model: str, origin: Origin, base_url: str) -> None:
        cur = self.conn.execute(
            "UPDATE conversations SET provider = ?, model = ?, origin = ?, base_url = ? WHERE id = ?",
            (provider, model, origin, _url(origin, base_url), conv_id))
        if cur.rowcount == 0:
            raise self.not_found(conv_id)

    def set_generation(self, conv_id: int, generation: Generation) -> None:
        cur = self.conn.execute(
            "UPDATE conversations SET temperature = ?, seed = ?, max_tokens = ? WHERE id = ?",
            (generation.temperature, generation.seed, generation.max_tokens, conv_id))
        if cur.rowcount == 0:
            raise self.not_found(conv_id)

    def list_conversations(self, limit: int) -> list[ConversationInfo]:
        rows = self.conn.execute(
            "SELECT c.id, c.title, c.created_at, c.updated_at, c.provider, c.model,"
            " (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id)"
            " FROM conversations c ORDER BY c.touched DESC LIMIT ?", (limit,)).fetchall()
        return [_info(row) for row in rows]

    def last_conversation_id(self) -> int | None:
        row = self.conn.execute("SELECT id FROM conversations ORDER BY touched DESC LIMIT 1").fetchone()
        return None if row is None else int(row[0])

    def rename(self, conv_id: int, title: str) -> None:
        cur = self.conn.execute("UPDATE conversations SET title = ? WHERE id = ?",
                                (one_line(title)[:TITLE_MAX], conv_id))
        if cur.rowcount == 0:
            raise self.not_found(conv_id)

    def set_system_prompt(self, conv_id: int, text: str) -> None:
        cur = self.conn.execute("UPDATE conversations SET system_prompt = ? WHERE id = ?", (text, conv_id))
        if cur.rowcount == 0:
            raise self.not_found(conv_id)

    def delete(self, conv_id: int) -> None:
        # foreign_keys=ON makes this take the conversation's messages with it.
        cur = self.conn.execute("DELETE FROM conversations WHERE id = ?", (conv_id,))
        if cur.rowcount == 0:
            raise self.not_found(conv_id)

    def load(self, conv_id: int) -> Conversation:
        """The conversation with its current branch (see :mod:`llmchat.core.history._tree`), each message
        knowing its alternatives."""
        with _transaction(self.conn, "BEGIN"):  # one snapshot: the count matches the messages
            row = self.conn.execute(
                "SELECT c.id, c.title, c.created_at, c.updated_at, c.provider, c.model,"
                " (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id), c.system_prompt,"
                " c.origin, c.base_url, c.temperature, c.seed, c.max_tokens, c.leaf_id"
                " FROM conversations c WHERE c.id = ?", (conv_id,)).fetchone()
            if row is None:
                raise self.not_found(conv_id)
            # One query for every message, as when a conversation was a line: alternatives are few, and
            # asking for the branch's rows by id costs more than reading the others.
            rows = self.conn.execute(f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE conversation_id = ?"
                                     " ORDER BY id", (conv_id,)).fetchall()
        by_id = {int(r[0]): r for r in rows}
        parents = {msg_id: (None if r[11] is None else int(r[11])) for msg_id, r in by_id.items()}
        children = children_of(parents.items())
        messages = [_message(by_id[msg_id], alternatives(children, parents, msg_id))
                    for msg_id in branch_ids(parents, row[13])]
        return Conversation(info=_info(row[:7]), system_prompt=str(row[7]), messages=messages,
                            origin=_origin(row[8]), base_url=str(row[9]), generation=_generation(row[10:13]))

    def records(self, ids: Sequence[int]) -> dict[int, dict[str, Any] | None]:
        """The timing record of each message in ``ids`` that exists (None for a message without one)."""
        if not ids:
            return {}
        marks = ", ".join("?" * len(ids))
        rows = self.conn.execute(f"SELECT id, record FROM messages WHERE id IN ({marks})", tuple(ids)).fetchall()
        return {int(i): _record(r) for i, r in rows}

    def _links(self, conv_id: int) -> list[tuple[int, int | None]]:
        return [(int(i), None if p is None else int(p)) for i, p in self.conn.execute(
            "SELECT id, parent_id FROM messages WHERE conversation_id = ?", (conv_id,))]

    def select(self, conv_id: int, msg_id: int) -> None:
        """Makes the branch through ``msg_id`` current: nothing changes when it is on the current branch
        already, else the branch goes on from it by the newest child at each step. ValueError for a message
        that is not in the conversation."""
        with _transaction(self.conn):
            row = self.conn.execute("SELECT leaf_id FROM conversations WHERE id = ?", (conv_id,)).fetchone()
            if row is None:
                raise self.not_found(conv_id)
            links = self._links(conv_id)
            parents = dict(links)
            if msg_id not in parents:
                raise ValueError(f"message {msg_id} is not in conversation {conv_id}")
            if msg_id in branch_ids(parents, row[0]):
                return
            leaf = newest_leaf_under(children_of(links), msg_id)
            self.conn.execute("UPDATE conversations SET leaf_id = ? WHERE id = ?", (leaf, conv_id))

    def search(self, text: str, limit: int) -> list[SearchHit]:
        return search(self.conn, text, limit)

    def _parent_for(self, conv_id: int, alternative_to: int | None) -> int | None:
        """The parent of a new message: the current leaf, or ``alternative_to``'s own parent (the new message
        is its alternative). ValueError for a message that is not in the conversation."""
        if alternative_to is None:
            row = self.conn.execute("SELECT leaf_id FROM conversations WHERE id = ?", (conv_id,)).fetchone()
            return None if row is None or row[0] is None else int(row[0])
        row = self.conn.execute("SELECT parent_id FROM messages WHERE id = ? AND conversation_id = ?",
                                (alternative_to, conv_id)).fetchone()
        if row is None:
            raise ValueError(f"message {alternative_to} is not in conversation {conv_id}")
        return None if row[0] is None else int(row[0])

    # -- messages -------------------------------------------------------------------------------------------
    def add_message(self, conv_id: int, role: Role, text: str, alternative_to: int | None = None) -> int:
        now = time.time()
        with _transaction(self.conn):
            self._touch(conv_id, now)
            parent = self._parent_for(conv_id, alternative_to)
            cur = self.conn.execute(
                "INSERT INTO messages (conversation_id, role, content, status, created_at, parent_id)"
                " VALUES (?, ?, ?, 'done', ?, ?)", (conv_id, role, text, now, parent))
            self._set_leaf(conv_id, int(cast(int, cur.lastrowid)))
            if role == "user":
                self.conn.execute("UPDATE conversations SET title = ? WHERE id = ? AND title = ''",
                                  (title_from(text), conv_id))
            return int(cast(int, cur.lastrowid))

    def _set_leaf(self, conv_id: int, msg_id: int) -> None:
        self.conn.execute("UPDATE conversations SET leaf_id = ? WHERE id = ?", (msg_id, conv_id))

    def start_reply(self, conv_id: int, provider: str, model: str, mode: str, origin: Origin,
                    base_url: str, alternative_to: int | None = None) -> int:
        now = time.time()
        with _transaction(self.conn):
            self._touch(conv_id, now)
            # The conversation remembers where its latest reply came from: the list shows it, resuming (from
            # the list or with --continue) reconnects to it.
            self.conn.execute(
                "UPDATE conversations SET provider = ?, model = ?, origin = ?, base_url = ? WHERE id = ?",
                (provider, model, origin, _url(origin, base_url), conv_id))
            parent = self._parent_for(conv_id, alternative_to)
            cur = self.conn.execute(
                "INSERT INTO messages"
                " (conversation_id, role, content, status, provider, model, mode, created_at, parent_id)"
                " VALUES (?, 'assistant', '', 'streaming', ?, ?, ?, ?, ?)",
                (conv_id, provider, model, mode, now, parent))
            msg_id = int(cast(int, cur.lastrowid))
            self._set_leaf(conv_id, msg_id)
            return msg_id

    def save_reply_text(self, msg_id: int, text: str, reasoning: str = "") -> None:
        # No row (the user deleted the conversation mid-reply) is not an error: there is nothing to keep.
        self.conn.execute("UPDATE messages SET content = ?, reasoning = ? WHERE id = ? AND status = 'streaming'",
                          (text, reasoning, msg_id))

    def finish_reply(self, msg_id: int, text: str, status: Status, error: str | None,
                     record: str | None, reasoning: str = "", tool_calls: str | None = None,
                     refusal: str = "") -> None:
        now = time.time()
        with _transaction(self.conn):
            row = self.conn.execute("SELECT conversation_id FROM messages WHERE id = ?", (msg_id,)).fetchone()
            if row is None:
                return
            self.conn.execute(
                "UPDATE messages SET content = ?, status = ?, error = ?, record = ?, reasoning = ?,"
                " tool_calls = ?, refusal = ? WHERE id = ?",
                (text, status, error, record, reasoning, tool_calls, refusal, msg_id))
            self._touch(int(row[0]), now)


def _set_up(conn: sqlite3.Connection, setup: Callable[[sqlite3.Connection], sqlite3.Connection]
            ) -> sqlite3.Connection:
    """``setup(conn)``; ``conn`` is closed when that fails, so a refused file is never left open."""
    try:
        return setup(conn)
    except BaseException:
        conn.close()
        raise


@contextmanager
def _transaction(conn: sqlite3.Connection, begin: str = "BEGIN IMMEDIATE") -> Iterator[None]:
    """One transaction; IMMEDIATE takes the write lock up front so a read-then-write cannot deadlock."""
    conn.execute(begin)
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        # A COMMIT that fails (disk full, I/O error) may leave the transaction open: end it, or the
        # connection stays inside it and nothing after it is ever saved.
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _info(row: tuple[Any, ...]) -> ConversationInfo:
    return ConversationInfo(id=int(row[0]), title=str(row[1]), created_at=float(row[2]),
                            updated_at=float(row[3]), provider=str(row[4]), model=str(row[5]),
                            message_count=int(row[6]))


def _url(origin: Origin, base_url: str) -> str:
    """The URL to keep: none for the offline demo (its port is this run's), and never a key."""
    return "" if origin == "offline" else storable_url(base_url)


def _origin(value: object) -> Origin:
    return value if value in ("provider", "base_url", "offline") else ""


def _generation(row: tuple[Any, ...]) -> Generation:
    # Typed on the way out: a hand-edited row ('0.7' as text, a float seed) must not reach a request as such.
    temperature, seed, max_tokens = row
    return Generation(
        temperature=float(temperature) if isinstance(temperature, int | float) else None,
        seed=int(seed) if isinstance(seed, int) else None,
        max_tokens=int(max_tokens) if isinstance(max_tokens, int) and max_tokens > 0 else None,
    )


def _record(text: object) -> dict[str, Any] | None:
    if not isinstance(text, str):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        # A hand-edited or cut record must not make the whole conversation unreadable.
        return None
    return value if isinstance(value, dict) else None


def _tool_calls(text: object) -> list[dict[str, Any]]:
    if not isinstance(text, str):
        return []
    try:
        value = json.loads(text)
    except ValueError:
        return []  # a hand-edited list must not make the conversation unreadable
    return [c for c in value if isinstance(c, dict)] if isinstance(value, list) else []


_MESSAGE_COLUMNS = ("id, conversation_id, role, content, status, error, provider, model, mode, record,"
                    " created_at, parent_id, reasoning, tool_calls, refusal")


def _message(row: tuple[Any, ...], alternatives: tuple[int, ...] = ()) -> Message:
    return Message(id=int(row[0]), conversation_id=int(row[1]), role=row[2], content=str(row[3]),
                   status=row[4], error=row[5], provider=str(row[6]), model=str(row[7]), mode=str(row[8]),
                   record=_record(row[9]), created_at=float(row[10]),
                   parent_id=None if row[11] is None else int(row[11]), alternatives=alternatives,
                   reasoning=str(row[12] or ""), tool_calls=_tool_calls(row[13]), refusal=str(row[14] or ""))
