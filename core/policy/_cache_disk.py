"""diskcache without pickle: a Disk that stores only bytes under str keys, and a Cache that never stalls.

diskcache's stock ``Disk`` pickles every key or value that is not bytes/str/int/float, and *unpickles* any row
marked ``MODE_PICKLE`` when it reads it back. Anyone who can write to the cache folder could then make llmchat
run code (CVE-2025-69872). :class:`SafeDisk` closes both directions: ``store``/``put`` refuse anything but bytes
values and str keys, and ``fetch``/``get`` raise :class:`RefusedRowError` for a row in any other mode instead of
decoding it. Only :mod:`llmchat.core.policy._cache` uses this module.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from typing import Any

import diskcache
from diskcache.core import MODE_BINARY, MODE_RAW, UNKNOWN

#: diskcache's "could not take the write lock within the timeout".
LockTimeout: type[Exception] = diskcache.Timeout


class RefusedRowError(Exception):
    """A cache row that llmchat did not write: pickled, text or file-backed outside the folder.

    Deliberately not an ``OSError``: ``diskcache.Cache.get`` swallows ``OSError`` as a plain miss, and the
    caller must see this one to warn about a tampered cache.
    """


def _safe_relative(filename: object) -> str:
    """``filename`` if it names a file inside the cache folder, else :class:`RefusedRowError`.

    A row's ``filename`` column is joined to the folder to read or delete the value file; an absolute path or
    ``..`` in a tampered row would otherwise read or delete any file the user can reach.
    """
    if not isinstance(filename, str) or not filename:
        raise RefusedRowError("value file name missing")
    norm = os.path.normpath(filename)
    if os.path.isabs(norm) or norm.startswith(os.pardir) or norm != filename.replace("/", os.sep):
        raise RefusedRowError(f"value file name {filename!r} points outside the cache folder")
    return norm


class SafeDisk(diskcache.Disk):  # type: ignore[misc]
    """Serialises str keys and bytes values only; refuses to decode anything it would not have written."""

    def put(self, key: Any) -> tuple[Any, bool]:
        """The database form of ``key``; raises ``TypeError`` for anything but ``str`` (never pickles)."""
        if type(key) is not str:
            raise TypeError(f"cache keys are str, got {type(key).__name__}")
        return key, True

    def get(self, key: Any, raw: bool) -> Any:
        """The key a row holds; raises :class:`RefusedRowError` for a pickled key instead of unpickling it."""
        if not raw:
            raise RefusedRowError("key stored in pickle format")
        return bytes(key) if isinstance(key, bytes | bytearray | memoryview) else key

    def store(self, value: Any, read: bool, key: Any = UNKNOWN) -> tuple[int, int, str | None, Any]:
        """The row fields for a bytes ``value``; raises ``TypeError`` for anything else (never pickles)."""
        if read or type(value) is not bytes:
            raise TypeError(f"cache values are bytes, got {type(value).__name__}")
        return super().store(value, False, key=key)  # type: ignore[no-any-return]

    def fetch(self, mode: int, filename: Any, value: Any, read: bool) -> bytes:
        """The bytes of a row written by :meth:`store`.

        Raises :class:`RefusedRowError` for any other row (pickle or text mode, a non-bytes raw value, a value
        file outside the folder) and ``OSError`` when a value file vanished (diskcache reads that as a miss).
        """
        if read:
            raise RefusedRowError("file handles are not supported")
        if mode == MODE_RAW:
            if isinstance(value, bytes):
                return value
            raise RefusedRowError(f"raw value of type {type(value).__name__}")
        if mode == MODE_BINARY:
            with open(os.path.join(self._directory, _safe_relative(filename)), "rb") as reader:
                return reader.read()
        raise RefusedRowError(f"value stored in mode {mode!r}, pickle or text")

    def remove(self, file_path: Any) -> None:
        """Deletes a value file inside the folder; a path pointing elsewhere is left alone."""
        try:
            _safe_relative(file_path)
        except RefusedRowError:
            return
        super().remove(file_path)


def is_locked(exc: BaseException) -> bool:
    """Whether ``exc`` means another connection holds the database (worth a retry later, not a disable)."""
    if isinstance(exc, LockTimeout):
        return True
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc)
        return "locked" in text or "busy" in text
    return False


class BoundedCache(diskcache.Cache):  # type: ignore[misc]
    """A ``diskcache.Cache`` whose own lock retries give up after ``timeout`` seconds instead of 60.

    diskcache retries "database is locked" for a fixed minute while it opens and while it reads its settings;
    a locked cache must degrade to a miss within the request's budget, not stall it.
    """

    @property
    def _sql_retry(self) -> Callable[..., sqlite3.Cursor]:
        sql = self._sql
        # During __init__ diskcache sets _timeout to 0 and relies on this loop; give it a floor of 0.1 s.
        budget_ns = int(max(float(self._timeout or 0.0), 0.1) * 1e9)

        def execute(statement: str, *args: Any, **kwargs: Any) -> sqlite3.Cursor:
            start = time.perf_counter_ns()
            while True:
                try:
                    return sql(statement, *args, **kwargs)  # type: ignore[no-any-return]
                except sqlite3.OperationalError as exc:
                    if not is_locked(exc) or time.perf_counter_ns() - start > budget_ns:
                        raise
                    time.sleep(0.002)

        return execute
