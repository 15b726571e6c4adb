"""The history's SQLite side: the file, its schema and migrations, and every query. All synchronous.

Only :class:`llmchat.core._history.HistoryStore` uses this, and only from its one worker thread: a sqlite3
connection belongs to the thread that made it, and the chat app's event loop must never wait on the disk.

The schema version lives in ``PRAGMA user_version``; ``MIGRATIONS[n]`` takes a database from version n to
n + 1, each in its own transaction. A database from a newer llmchat is refused before anything is written.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from time import perf_counter_ns, sleep
from typing import Any, TypeVar, cast

from llmchat.core._errors import LLMChatError
from llmchat.core._history_model import (
    Conversation,
    ConversationInfo,
    Message,
    Role,
    Status,
    one_line,
    title_from,
)

T = TypeVar("T")

#: Longest title kept by a rename; a title is a list line, not a document.
TITLE_MAX = 200

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
]


class HistoryError(LLMChatError):
    """The history file cannot be used: damaged, from a newer llmchat, locked or unreadable. Exit status 1."""


class ConversationNotFoundError(HistoryError):
    """No conversation has that id (never had, or deleted since). Exit status 2: the id came from the user."""

    exit_code = 2

    def __init__(self, conv_id: int, recent: list[int] | None = None) -> None:
        self.conv_id = conv_id
        hint = "; recent ones are " + ", ".join(map(str, recent)) if recent else "; the history is empty"
        super().__init__(f"no conversation {conv_id} in the history{hint} (or use `last`)")


def default_history_path(env: Mapping[str, str]) -> Path:
    """``$XDG_DATA_HOME/llmchat/history.sqlite3``, where an unset, empty or relative XDG_DATA_HOME means
    ``~/.local/share`` as the XDG spec says. Pure: touches no file."""
    home = Path(env.get("HOME") or Path.home())
    xdg = env.get("XDG_DATA_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else home / ".local" / "share"
    return base / "llmchat" / "history.sqlite3"


#: Words in SQLite's message for a failure the file's permissions or disk cause, not its content.
_ACCESS_WORDS = ("unable to open", "readonly", "disk I/O", "permission", "denied")


def describe(path: Path, exc: BaseException) -> HistoryError:
    """The one-line error for a failure on the history file ``path``: what went wrong, then what to do."""
    if isinstance(exc, HistoryError):
        return exc
    reason = one_line(exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)) or "unknown"
    aside = f"move it aside (mv {path} {path}.bad) and llmchat starts a new history"
    if isinstance(exc, sqlite3.OperationalError) and ("locked" in reason or "busy" in reason):
        return HistoryError(f"history {path} is locked by another program ({reason}); close it and try again")
    if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError):
        return HistoryError(f"history {path} is damaged ({reason}); {aside}")
    if isinstance(exc, sqlite3.OperationalError) and not any(w in reason for w in _ACCESS_WORDS):
        return HistoryError(f"history {path} cannot be used ({reason}); {aside}")
    return HistoryError(f"cannot open history {path}: {reason}; check that its folder is yours and writable, "
                        "or set XDG_DATA_HOME to another folder")


def _private_file(path: Path, *, private_folder: bool) -> None:
    """Creates the folder (0700) and the file (0600) before SQLite opens it, so neither is ever readable by
    others; SQLite gives its -wal and -shm files the database file's mode."""
    folder = path.parent
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if private_folder:
        info = folder.stat()
        if stat.S_IMODE(info.st_mode) != 0o700 and info.st_uid == os.geteuid():
            folder.chmod(0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise IsADirectoryError(21, "not a regular file", str(path))
        if stat.S_IMODE(info.st_mode) & 0o077 and info.st_uid == os.geteuid():
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def _enable_wal(conn: sqlite3.Connection, budget_ns: int = 5_000_000_000) -> None:
    """Switches the file to WAL, retrying for up to ``budget_ns`` while another connection holds it.

    The switch needs the file to itself, and SQLite reports "locked" at once, without its busy handler, when
    another llmchat opens the same new file at the same moment.
    """
    start = perf_counter_ns()
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or perf_counter_ns() - start > budget_ns:
                raise
            sleep(0.005)


class Database:
    """One connection to the history file. Every method runs on the store's thread and may raise
    ``sqlite3.Error`` or ``OSError``; :meth:`guard` turns those into one-line :class:`HistoryError`."""

    def __init__(self, path: Path, *, private_folder: bool) -> None:
        self.path = path
        self._private_folder = private_folder
        self._conn: sqlite3.Connection | None = None

    def guard(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, with sqlite3 and OS errors raised as :class:`HistoryError` naming the file."""
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
        """Opens (creating when missing) and migrates the file. Raises HistoryError for a newer schema, a
        damaged file or one that cannot be opened; a refused file is left exactly as it was."""
        _private_file(self.path, private_folder=self._private_folder)
        # Autocommit: every write below says where its transaction starts and ends.
        conn = sqlite3.connect(self.path, timeout=5.0, isolation_level=None)
        try:
            # The first read of the header: a file that is not SQLite fails here, before any write.
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version > len(MIGRATIONS):
                raise HistoryError(
                    f"history {self.path} is from a newer llmchat (schema version {version}, this one knows"
                    f" up to {len(MIGRATIONS)}); upgrade llmchat, or move the file aside to start a new"
                    " history"
                )
            _enable_wal(conn)
            # NORMAL in WAL mode: a commit survives the process being killed; only power loss can undo it.
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            if version < len(MIGRATIONS):
                # Only then take the write lock: an up-to-date file opens without waiting on other writers.
                self._migrate(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn

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

    def new_conversation(self, title: str, system_prompt: str, provider: str, model: str) -> int:
        now = time.time()
        with _transaction(self.conn):
            cur = self.conn.execute(
                "INSERT INTO conversations"
                " (title, system_prompt, provider, model, created_at, updated_at, touched)"
                " VALUES (?, ?, ?, ?, ?, ?, (SELECT COALESCE(MAX(touched), 0) + 1 FROM conversations))",
                (one_line(title)[:TITLE_MAX], system_prompt, provider, model, now, now))
            return int(cast(int, cur.lastrowid))

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
        with _transaction(self.conn, "BEGIN"):  # one snapshot: the count matches the messages
            row = self.conn.execute(
                "SELECT c.id, c.title, c.created_at, c.updated_at, c.provider, c.model,"
                " (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id), c.system_prompt"
                " FROM conversations c WHERE c.id = ?", (conv_id,)).fetchone()
            if row is None:
                raise self.not_found(conv_id)
            rows = self.conn.execute(
                "SELECT id, conversation_id, role, content, status, error, provider, model, mode, record,"
                " created_at FROM messages WHERE conversation_id = ? ORDER BY id", (conv_id,)).fetchall()
        return Conversation(info=_info(row[:7]), system_prompt=str(row[7]),
                            messages=[_message(r) for r in rows])

    # -- messages -------------------------------------------------------------------------------------------
    def add_message(self, conv_id: int, role: Role, text: str) -> int:
        now = time.time()
        with _transaction(self.conn):
            self._touch(conv_id, now)
            cur = self.conn.execute(
                "INSERT INTO messages (conversation_id, role, content, status, created_at)"
                " VALUES (?, ?, ?, 'done', ?)", (conv_id, role, text, now))
            if role == "user":
                self.conn.execute("UPDATE conversations SET title = ? WHERE id = ? AND title = ''",
                                  (title_from(text), conv_id))
            return int(cast(int, cur.lastrowid))

    def start_reply(self, conv_id: int, provider: str, model: str, mode: str) -> int:
        now = time.time()
        with _transaction(self.conn):
            self._touch(conv_id, now)
            # The conversation remembers the latest provider and model: the list shows it, --continue uses it.
            self.conn.execute("UPDATE conversations SET provider = ?, model = ? WHERE id = ?",
                              (provider, model, conv_id))
            cur = self.conn.execute(
                "INSERT INTO messages"
                " (conversation_id, role, content, status, provider, model, mode, created_at)"
                " VALUES (?, 'assistant', '', 'streaming', ?, ?, ?, ?)",
                (conv_id, provider, model, mode, now))
            return int(cast(int, cur.lastrowid))

    def save_reply_text(self, msg_id: int, text: str) -> None:
        # No row (the user deleted the conversation mid-reply) is not an error: there is nothing to keep.
        self.conn.execute("UPDATE messages SET content = ? WHERE id = ? AND status = 'streaming'",
                          (text, msg_id))

    def finish_reply(self, msg_id: int, text: str, status: Status, error: str | None,
                     record: str | None) -> None:
        now = time.time()
        with _transaction(self.conn):
            row = self.conn.execute("SELECT conversation_id FROM messages WHERE id = ?", (msg_id,)).fetchone()
            if row is None:
                return
            self.conn.execute(
                "UPDATE messages SET content = ?, status = ?, error = ?, record = ? WHERE id = ?",
                (text, status, error, record, msg_id))
            self._touch(int(row[0]), now)


@contextmanager
def _transaction(conn: sqlite3.Connection, begin: str = "BEGIN IMMEDIATE") -> Iterator[None]:
    """One transaction; IMMEDIATE takes the write lock up front so a read-then-write cannot deadlock."""
    conn.execute(begin)
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _info(row: tuple[Any, ...]) -> ConversationInfo:
    return ConversationInfo(id=int(row[0]), title=str(row[1]), created_at=float(row[2]),
                            updated_at=float(row[3]), provider=str(row[4]), model=str(row[5]),
                            message_count=int(row[6]))


def _record(text: object) -> dict[str, Any] | None:
    if not isinstance(text, str):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        # A hand-edited or cut record must not make the whole conversation unreadable.
        return None
    return value if isinstance(value, dict) else None


def _message(row: tuple[Any, ...]) -> Message:
    return Message(id=int(row[0]), conversation_id=int(row[1]), role=row[2], content=str(row[3]),
                   status=row[4], error=row[5], provider=str(row[6]), model=str(row[7]), mode=str(row[8]),
                   record=_record(row[9]), created_at=float(row[10]))
