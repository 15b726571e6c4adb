"""The history file itself: opening it read-write, read-only or not at all, checking it, and the one line that
says what is wrong with it and what to type to fix it. All synchronous, on the store's thread.

A file llmchat may read but not write (its mode, its folder's, ``chattr +i``, a read-only mount) is opened
with SQLite's ``mode=ro``; a file SQLite cannot use (damaged, from a newer llmchat, locked, impossible to
create) is reported in the words of :func:`describe`, the same words the app and ``llmchat export`` show.

Errors are sorted by SQLite's result code (``sqlite_errorcode``) and ``errno``, never by message text.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
import stat
from collections.abc import Mapping
from pathlib import Path
from time import perf_counter_ns, sleep
from typing import Literal

from llmchat.core.errors import LLMChatError
from llmchat.core.history._model import one_line

#: How the store holds the history. "ok": the file, read and written. "read-only": a copy of the file in
#: memory; this session's changes are not saved. "in-memory": the file is not used; an empty history in
#: memory.
HistoryState = Literal["ok", "read-only", "in-memory"]

#: How long a write waits for another llmchat's write lock before it gives up ("locked").
BUSY_TIMEOUT_S = 5.0

#: The most time opening spends on ``PRAGMA quick_check``: a small history is checked whole in milliseconds; a
#: huge one on a cold disk is checked only this far, and damage further in is found on first use instead.
CHECK_BUDGET_S = 1.0

Trouble = Literal["locked", "damaged", "unwritable", "newer", "other"]

_LOCKED = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}
_DAMAGED = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}
#: Result codes for a file that can still be read but not written: its mode, its folder, a full disk, EIO.
_UNWRITABLE = {sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM, sqlite3.SQLITE_IOERR,
               sqlite3.SQLITE_FULL}
_UNWRITABLE_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT}
_FS_IOC_GETFLAGS, _FS_IMMUTABLE_FL = 0x80086601, 0x10  # linux/fs.h: what `lsattr` reads


class HistoryError(LLMChatError):
    """The history file cannot be used: damaged, from a newer llmchat, locked or unreadable. Exit status 1."""


class NewerHistoryError(HistoryError):
    """The file's schema is newer than this llmchat knows: it is left untouched."""


class CheckFailed(sqlite3.DatabaseError):
    """``PRAGMA quick_check`` found damage (the message is its first finding)."""


def default_history_path(env: Mapping[str, str]) -> Path:
    """``$XDG_DATA_HOME/llmchat/history.sqlite3``, where an unset, empty or relative XDG_DATA_HOME means
    ``~/.local/share`` as the XDG spec says. Pure: touches no file."""
    home = Path(env.get("HOME") or Path.home())
    xdg = env.get("XDG_DATA_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else home / ".local" / "share"
    return base / "llmchat" / "history.sqlite3"


# -- what went wrong -----------------------------------------------------------------------------------------

def result_code(exc: BaseException) -> int:
    """SQLite's primary result code for ``exc`` (``sqlite3.SQLITE_BUSY``...), 0 when it has none."""
    return (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF


def trouble(exc: BaseException) -> Trouble:
    """What kind of failure ``exc`` is, from its type, SQLite result code or errno."""
    if isinstance(exc, NewerHistoryError):
        return "newer"
    if isinstance(exc, CheckFailed):
        return "damaged"
    if isinstance(exc, sqlite3.Error):
        code = result_code(exc)
        if code in _LOCKED:
            return "locked"
        if code in _DAMAGED:
            return "damaged"
        if code in _UNWRITABLE:
            return "unwritable"
        return "other"
    if isinstance(exc, OSError) and exc.errno in _UNWRITABLE_ERRNOS:
        return "unwritable"
    return "other"


def _reason(exc: BaseException) -> str:
    return one_line(exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)) or "unknown"


def shell_quote(path: Path | str) -> str:
    """``path`` quoted for a POSIX shell, on one line: ``'…'`` (``$'…'`` with escapes for a path holding
    control characters or runs of spaces, which a one-line message could not carry)."""
    text = str(path)
    if text.isprintable() and "  " not in text:
        return "'" + text.replace("'", "'\\''") + "'"
    out = []
    for ch in text:
        if ch.isprintable() and ch not in "\\' ":
            out.append(ch)
        elif ch == " ":
            out.append("\\x20")
        else:
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")
    return "$'" + "".join(out) + "'"


def set_aside_command(path: Path) -> str:
    """The shell command that moves a damaged history (and its -wal when it holds anything: it belongs to the
    file) out of the way, to a name not taken yet: ``mv '/p/history.sqlite3' '/p/history.sqlite3.damaged'``.
    """
    target = Path(f"{path}.damaged")
    n = 2
    while target.exists() and n < 100:
        target, n = Path(f"{path}.damaged-{n}"), n + 1
    command = f"mv {shell_quote(path)} {shell_quote(target)}"
    wal = Path(f"{path}-wal")
    if wal.is_file() and wal.stat().st_size > 0:
        # A -wal left beside a new file could be replayed into it; it moves with its database. (An empty one,
        # as a read-only connection leaves, holds nothing.)
        command += f" && mv {shell_quote(wal)} {shell_quote(f'{target}-wal')}"
    return command


def describe(path: Path, exc: BaseException) -> HistoryError:
    """The one-line error for a failure on the history file ``path``: what went wrong, then what to do."""
    if isinstance(exc, HistoryError):
        return exc
    reason, kind = _reason(exc), trouble(exc)
    if kind == "locked":
        return HistoryError(f"history {path} is locked by another program ({reason}); close it and try again")
    aside = f"set it aside with `{set_aside_command(path)}` and the next llmchat starts a new history"
    if kind == "damaged" or (isinstance(exc, sqlite3.DatabaseError)
                             and not isinstance(exc, sqlite3.OperationalError)):
        return HistoryError(f"history {path} is damaged ({reason}); {aside}")
    if isinstance(exc, sqlite3.OperationalError) and kind == "other":
        return HistoryError(f"history {path} cannot be used ({reason}); {aside}")
    return HistoryError(f"cannot open history {path}: {reason}; check that its folder is yours and writable, "
                        "or set XDG_DATA_HOME to another folder")


def _immutable(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        flags = bytearray(8)
        fcntl.ioctl(fd, _FS_IOC_GETFLAGS, flags)
        return bool(int.from_bytes(flags[:4], "little") & _FS_IMMUTABLE_FL)
    except OSError:  # not Linux, or a file system without attributes
        return False
    finally:
        os.close(fd)


def _read_only_mount(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def read_only_line(path: Path, exc: BaseException, *, mid_session: bool = False) -> str:
    """What to say when the history can be read but not written (at the start, or ``mid_session`` when a
    write was refused): the cause, and the command that fixes it."""
    folder = path.parent
    immutable = next((p for p in (path, folder) if _immutable(p)), None)
    if result_code(exc) == sqlite3.SQLITE_FULL or getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT):
        cause, fix = f"{path}: the disk is full", "free some disk space"
    elif immutable is not None:
        cause, fix = f"{immutable} is immutable", f"clear that (sudo chattr -i {shell_quote(immutable)})"
    elif _read_only_mount(folder):
        cause, fix = f"{folder} is on a read-only file system", "remount it writable"
    elif not os.access(path, os.W_OK):
        cause, fix = f"{path} is not writable", f"make it writable (chmod u+w {shell_quote(path)})"
    elif not os.access(folder, os.W_OK):
        cause = f"its folder {folder} is not writable"
        fix = f"make it writable (chmod u+w {shell_quote(folder)})"
    else:
        cause, fix = f"{path}: {_reason(exc)}", "check the disk and that the file and its folder are writable"
    what = "can no longer be written" if mid_session else "is read-only"
    return f"history {what}: new messages are not saved ({cause}); to save them, {fix} and restart llmchat"


def in_memory_line(path: Path, exc: BaseException) -> str:
    """What to say when the file is not used at all: :func:`describe`'s line, and where this session goes."""
    return f"{describe(path, exc)}; meanwhile this session's messages are kept in memory only"


# -- opening -------------------------------------------------------------------------------------------------

def private_file(path: Path, *, private_folder: bool) -> None:
    """Creates the folder (0700) and the file (0600) before SQLite opens it, so neither is ever readable by
    others; SQLite gives its -wal and -shm files the database file's mode. Tightening only takes the group's
    and others' bits away: a folder or file its owner made read-only stays read-only."""
    folder = path.parent
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if private_folder:
        info = folder.stat()
        if stat.S_IMODE(info.st_mode) & 0o077 and info.st_uid == os.geteuid():
            folder.chmod(stat.S_IMODE(info.st_mode) & 0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise IsADirectoryError(21, "not a regular file", str(path))
        if stat.S_IMODE(info.st_mode) & 0o077 and info.st_uid == os.geteuid():
            os.fchmod(fd, stat.S_IMODE(info.st_mode) & 0o600)
    finally:
        os.close(fd)


def connect_read_only(path: Path) -> sqlite3.Connection:
    """A connection that never writes the file.

    ``mode=ro`` first: SQLite's read-only open keeps its locks and reads the WAL, so it sees what another
    llmchat window commits, and it is what a file we may not write needs. It has to open the -shm file,
    creating it when missing; in a folder we may not write, with no -shm there, it cannot, and
    ``immutable=1`` is the only way in: no locks and no WAL, right for a file nobody is writing (its last
    writer closed it, which folds the WAL back into it), wrong for a live one, which is why it is the second
    choice and never the first.
    """
    uri = path.absolute().as_uri()
    conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    try:
        conn.execute("PRAGMA user_version").fetchone()  # the first read is when SQLite opens the WAL side
        return conn
    except sqlite3.OperationalError as exc:
        conn.close()
        # No -shm and no right to make one: CANTOPEN for an immutable folder, READONLY (_DIRECTORY) for a
        # folder whose mode says so.
        if result_code(exc) not in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY):
            raise
    return sqlite3.connect(f"{uri}?immutable=1", uri=True, isolation_level=None)


def connect_read_write(path: Path, *, private_folder: bool) -> sqlite3.Connection:
    """A connection to ``path``, creating the file (private) when missing. Autocommit: every write says where
    its transaction starts and ends."""
    private_file(path, private_folder=private_folder)
    return sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)


def schema_version(conn: sqlite3.Connection, path: Path, known: int) -> int:
    """The file's ``user_version``: the first read of its header, so a file that is not SQLite fails here,
    before anything is written. NewerHistoryError for a version past ``known``."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > known:
        raise NewerHistoryError(
            f"history {path} is from a newer llmchat (schema version {version}, this one knows up to"
            f" {known}); upgrade llmchat, or set it aside with `{set_aside_command(path)}` to start a new"
            " history"
        )
    return version


def check(conn: sqlite3.Connection, budget_s: float = CHECK_BUDGET_S) -> None:
    """``PRAGMA quick_check``, given up (silently) after ``budget_s``; CheckFailed naming the first damage."""
    deadline = perf_counter_ns() + int(budget_s * 1e9)
    conn.set_progress_handler(lambda: perf_counter_ns() > deadline, 10_000)
    try:
        rows = conn.execute("PRAGMA quick_check(1)").fetchall()
    except sqlite3.OperationalError as exc:
        if result_code(exc) == sqlite3.SQLITE_INTERRUPT:
            return  # out of time: what was not checked is checked by using it
        raise
    finally:
        conn.set_progress_handler(None, 0)
    if rows != [("ok",)]:
        raise CheckFailed(f"integrity check: {one_line(str(rows[0][0]) if rows else 'no answer')}")


def in_memory(copy_of: sqlite3.Connection | None = None) -> sqlite3.Connection:
    """An empty history in memory, or a copy of everything ``copy_of`` holds."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    if copy_of is not None:
        try:
            copy_of.backup(conn)
        except BaseException:
            conn.close()
            raise
    return conn


def enable_wal(conn: sqlite3.Connection, budget_ns: int = 5_000_000_000) -> None:
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
            if trouble(exc) != "locked" or perf_counter_ns() - start > budget_ns:
                raise
            sleep(0.005)
