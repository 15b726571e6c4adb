"""The disk cache of batch-mode chat replies and embeddings.

:class:`ReplyCache` keys an entry by the sha256 of canonical JSON of what decides the answer (base URL, model,
messages, every generation parameter) and never sees an API key or a header. Values are JSON or float32 bytes,
never pickle (see :mod:`llmchat.core.policy._cache_disk`). Every diskcache call runs on one dedicated thread, so the
event loop never waits on SQLite. A cache that cannot be opened, is locked or is full never fails a request: it
logs one warning (logger ``llmchat.cache``) and answers as if uncached.

One more kind of entry: the model each server named the last time a request had to ask it (GET /models), keyed
by the server's URL without credentials (:meth:`ReplyCache.server_model`), so that a request naming no model can
look up its answer without sending anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import sqlite3
import stat
import sys
import unicodedata
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

from llmchat.core.config import CacheSettings
from llmchat.core.errors import LLMChatError
from llmchat.core.policy._cache_disk import BoundedCache, LockTimeout, RefusedRowError, SafeDisk, is_locked

log = logging.getLogger("llmchat.cache")

T = TypeVar("T")

#: Bumped whenever the key recipe or a stored value's layout changes, so old entries simply stop matching.
KEY_VERSION = 1
#: Request fields that change how the reply travels, not what it says: a stream and a batch request share a key.
TRANSPORT_PARAMS = frozenset({"stream", "stream_options"})
#: How long a diskcache call waits on another process's lock before the request goes on uncached.
LOCK_TIMEOUT_S = 0.2
#: Rows evicted per write at most once the size limit is reached (diskcache's cull_limit).
CULL_LIMIT = 16


class CacheUnavailableError(LLMChatError):
    """`llmchat cache stats|clear` could not open or lock the cache folder. Exit status 1."""


@dataclass(frozen=True, kw_only=True)
class CacheStats:
    """What `llmchat cache stats` and the HUD show."""

    path: Path
    entries: int
    """Entries stored (expired ones are dropped before counting)."""
    bytes: int
    """Size as diskcache measures it against the limit: database pages plus value files."""
    size_limit: int
    """The size limit in bytes."""
    hits: int
    """Hits counted by this ReplyCache instance (one per text for embeddings)."""
    misses: int

    @property
    def hit_ratio(self) -> float:
        """hits / (hits + misses), 0.0 before any lookup."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


def resolve_cache_dir(configured: str, env: Mapping[str, str]) -> Path:
    """The absolute cache folder: ``configured`` (``~`` expanded) or $XDG_CACHE_HOME/llmchat or ~/.cache/llmchat.

    Pure: touches no file. A relative $XDG_CACHE_HOME is ignored, as the XDG spec says.
    """
    home = Path(env.get("HOME") or Path.home())
    if configured:
        path = Path(configured)
        if configured == "~" or configured.startswith("~/"):
            path = home / configured[2:]
        return path.expanduser().absolute()
    xdg = env.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else home / ".cache"
    return base / "llmchat"


def _canonical_sha256(obj: object) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _server_of(base_url: str) -> str:
    """``base_url`` as the server's name: scheme, host, port and path, without credentials, query or fragment."""
    try:
        parts = urlsplit(base_url.strip())
        host, port = parts.hostname or "", parts.port
    except ValueError:
        return base_url.rstrip("/")
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def _pack_vector(vector: list[float]) -> bytes:
    packed = array("f", vector)
    # Stored little-endian so a cache folder means the same on every machine that shares it.
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def _unpack_vector(data: bytes) -> list[float]:
    if len(data) % 4:
        raise ValueError("vector bytes not a multiple of 4")
    packed = array("f")
    packed.frombytes(data)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tolist()


def _decode_chat(data: bytes) -> dict[str, object]:
    value = json.loads(data.decode("utf-8"))
    if not isinstance(value, dict):
        raise ValueError("cached reply is not a JSON object")
    return value


def _ensure_private_dir(path: Path) -> None:
    """Creates ``path`` mode 0700 (parents as needed) or tightens an existing folder we own.

    Raises ``OSError`` when it cannot be created or is not a folder. A looser folder owned by someone else is
    used as it is, with a warning: only its owner can change its mode.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if not stat.S_ISDIR(info.st_mode):  # pragma: no cover - mkdir(exist_ok) already refuses a non-folder
        raise NotADirectoryError(20, "Not a directory", str(path))
    if stat.S_IMODE(info.st_mode) != 0o700:
        if info.st_uid == os.geteuid():
            # mkdir's mode is filtered by the umask and says nothing about a folder that already existed.
            path.chmod(0o700)
        else:
            log.warning(
                "cache folder %s is mode %o and owned by uid %d, so others may read or plant replies; "
                "set cache.path to a folder of your own",
                path, stat.S_IMODE(info.st_mode), info.st_uid,
            )


def _strerror(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return " ".join(str(exc).split()) or type(exc).__name__


def _is_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    return isinstance(exc, sqlite3.Error) and "full" in str(exc)


def _count_read_only(db: Path) -> int:
    """Entries in a cache database, read without writing a byte (a full disk allows no more); 0 if unreadable."""
    try:
        with contextlib.closing(sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)) as con:
            return int(con.execute("SELECT COUNT(*) FROM Cache").fetchone()[0])
    except (sqlite3.Error, OSError, ValueError):
        return 0


def _remove_cache_files(folder: Path) -> None:
    """Delete what diskcache keeps in ``folder`` (its database and the two-hex-digit folders of value files),
    and nothing else: cache.path may name a folder that holds other files too."""
    for entry in folder.iterdir():
        if entry.name.startswith("cache.db") and entry.is_file():
            entry.unlink(missing_ok=True)
        elif entry.is_dir() and len(entry.name) == 2 and all(c in "0123456789abcdef" for c in entry.name):
            shutil.rmtree(entry, ignore_errors=True)


class _Unavailable(Exception):
    """The cache cannot be used right now; ``args[0]`` is the one-line message, ``permanent`` says for how long."""

    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


class ReplyCache:
    """The reply and embedding cache of one llmchat process.

    Opens lazily on first use, on its own single thread (SQLite connections belong to the thread that made
    them, and one thread keeps every diskcache call off the event loop). The async methods never raise for a
    cache problem: a folder that cannot be created, a broken database or a full disk disables the cache, a
    lock held by another process turns that one call into a miss or a no-op, a row llmchat did not write is a
    miss; each logs one warning per instance (later ones go to debug). ``policy = "off"`` makes every lookup a
    miss without touching the disk.
    """

    def __init__(self, settings: CacheSettings, *, env: Mapping[str, str] | None = None) -> None:
        self._settings = settings
        self._path = resolve_cache_dir(settings.path, os.environ if env is None else env)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmchat-cache")
        # _cache, _disabled and _warned are touched only on the executor thread.
        self._cache: BoundedCache | None = None
        self._disabled = False
        self._warned = False
        self._closed = False
        # What server_model read or remember_server_model wrote, by server: one disk read per server at most.
        self._server_models: dict[str, str] = {}
        self.hits = 0
        """Lookups answered from the cache (one per text for embeddings)."""
        self.misses = 0
        """Lookups not answered from the cache, disabled cache included."""

    @property
    def path(self) -> Path:
        """The resolved cache folder (it may not exist yet)."""
        return self._path

    @property
    def settings(self) -> CacheSettings:
        return self._settings

    @property
    def replay_streams(self) -> bool:
        """Whether a stream request whose reply is cached should be replayed from the cache."""
        return self._settings.replay_streams and self._settings.policy != "off"

    @property
    def hit_ratio(self) -> float:
        """hits / (hits + misses) of this instance, 0.0 before any lookup."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    # ----- keys and policy (pure) -----

    @staticmethod
    def chat_key(*, base_url: str, model: str, messages: Sequence[Mapping[str, object]],
                 params: Mapping[str, object]) -> str:
        """The cache key of a chat request: sha256 hex of canonical JSON of what decides its answer.

        ``params`` are every generation parameter the request carries (temperature, top_p, max_tokens, seed,
        stop, tools, response_format, ...); ``stream`` and ``stream_options`` are dropped so a stream and a
        batch request for the same thing share a key. There is deliberately no way to pass headers or an API
        key: the key must not depend on, or leak, who asked. A trailing ``/`` on ``base_url`` is ignored.
        Raises ``TypeError`` if something is not JSON-serialisable.
        """
        # None means "not sent" (the wire layer drops it), and 0 and 0.0 ask for the same thing: normalise both
        # so a temperature from the command line (0.0) and one from a file (0) share a key.
        kept = {
            k: float(v) if isinstance(v, int | float) and not isinstance(v, bool) else v
            for k, v in params.items()
            if k not in TRANSPORT_PARAMS and v is not None
        }
        return _canonical_sha256({
            "v": KEY_VERSION, "kind": "chat", "base_url": base_url.rstrip("/"), "model": model,
            "messages": messages, "params": kept,
        })

    @staticmethod
    def server_model_key(*, base_url: str) -> str:
        """The key of the entry that remembers which model the server at ``base_url`` named (sha256 hex).

        Only the scheme, host, port and path count: a user name, a password, a query or a fragment in the URL
        are dropped first, so the entry is the server's whoever asked, and nothing secret goes into the hash.
        """
        return _canonical_sha256({"v": KEY_VERSION, "kind": "server_model", "base_url": _server_of(base_url)})

    @staticmethod
    def embedding_key(*, base_url: str, model: str, text: str, dimensions: int | None = None) -> str:
        """The cache key of one text's embedding (sha256 hex); like :meth:`chat_key`, never sees a key."""
        return _canonical_sha256({
            "v": KEY_VERSION, "kind": "embedding", "base_url": base_url.rstrip("/"), "model": model,
            "text": text, "dimensions": dimensions,
        })

    def policy_allows(self, params: Mapping[str, object]) -> bool:
        """Whether a request with these generation parameters may be cached.

        ``off``: never; ``always``: always; ``deterministic``: temperature exactly 0 or a seed that is set.
        """
        policy = self._settings.policy
        if policy == "off":
            return False
        if policy == "always":
            return True
        temperature = params.get("temperature")
        zero = isinstance(temperature, int | float) and not isinstance(temperature, bool) and temperature == 0
        return zero or params.get("seed") is not None

    # ----- async API for the client -----

    async def get_chat(self, key: str) -> dict[str, object] | None:
        """The reply stored under ``key``, or None (miss, expired, or any cache problem). Never raises."""
        result = await self._submit(lambda c: self._read_chat(c, key), None)
        if result is None:
            self.misses += 1
        else:
            self.hits += 1
        return result

    async def put_chat(self, key: str, value: dict[str, object]) -> None:
        """Stores ``value`` (a JSON object: reply text, finish_reason, usage, model; never headers).

        A cache problem makes it a no-op; only a value that is not JSON-serialisable raises (``TypeError``),
        since that is a bug in the caller.
        """
        data = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        expire = self._expire()
        await self._submit(lambda c: c.set(key, data, expire=expire), None)

    async def server_model(self, base_url: str) -> str | None:
        """The model the server at ``base_url`` named when a request last had to ask it (GET /models), or None.

        Lets a request that names no model look in the cache without asking the server first: the answer
        keyed on the model it named last time. Not counted as a hit or a miss. Never raises.
        """
        known = self._server_models.get(_server_of(base_url))
        if known is not None:
            return known
        key = self.server_model_key(base_url=base_url)
        model = await self._submit(lambda c: self._read_model(c, key), None)
        if model is not None:
            self._server_models[_server_of(base_url)] = model
        return model

    async def remember_server_model(self, base_url: str, model: str) -> None:
        """Stores ``model`` as the one the server at ``base_url`` named (a write only when it changed).

        A cache problem makes it a no-op, as for every write."""
        server = _server_of(base_url)
        if not model or self._server_models.get(server) == model:
            return
        self._server_models[server] = model
        key = self.server_model_key(base_url=base_url)
        data = json.dumps({"model": model}, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        expire = self._expire()
        await self._submit(lambda c: c.set(key, data, expire=expire), None)

    async def get_embeddings(self, keys: list[str]) -> list[list[float] | None]:
        """The vector stored under each key, or None where missing; one executor hop for the whole list."""
        if not keys:
            return []
        misses: list[list[float] | None] = [None] * len(keys)
        found = await self._submit(lambda c: self._read_vectors(c, keys), misses)
        hits = sum(1 for v in found if v is not None)
        self.hits += hits
        self.misses += len(keys) - hits
        return found

    async def put_embeddings(self, items: list[tuple[str, list[float]]]) -> None:
        """Stores each (key, vector) as float32 in one transaction; a cache problem makes it a no-op."""
        if not items:
            return
        packed = [(key, _pack_vector(vector)) for key, vector in items]
        expire = self._expire()

        def write(cache: BoundedCache) -> None:
            with cache.transact():
                for key, data in packed:
                    cache.set(key, data, expire=expire)

        await self._submit(write, None)

    async def aclose(self) -> None:
        """Closes the database and ends the cache thread; later calls are misses and no-ops."""
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(self._executor, self._close_on_thread)
        self._executor.shutdown(wait=False)

    # ----- blocking API for the command line -----

    def stats(self) -> CacheStats:
        """Entries, size and this instance's hit counters. Blocks; for the CLI, not the event loop.

        A folder that does not exist yet reads as empty and is not created. Raises
        :class:`CacheUnavailableError` when the cache cannot be opened.
        """
        return self._blocking(self._stats_on_thread)

    def clear(self) -> int:
        """Removes every entry and returns how many. Blocks; for the CLI, not the event loop.

        Raises :class:`CacheUnavailableError` when the cache cannot be opened or another process holds it.
        """
        return self._blocking(self._clear_on_thread)

    def close(self) -> None:
        """Blocking twin of :meth:`aclose` for code without an event loop."""
        if self._closed:
            return
        self._closed = True
        self._executor.submit(self._close_on_thread).result()
        self._executor.shutdown(wait=True)

    # ----- on the cache thread -----

    def _expire(self) -> float | None:
        ttl = self._settings.ttl_s
        return ttl if ttl > 0 else None

    async def _submit(self, op: Callable[[BoundedCache], T], default: T) -> T:
        if self._closed or self._settings.policy == "off":
            return default
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._guarded, op, default)

    def _blocking(self, op: Callable[[], T]) -> T:
        if self._closed:
            raise CacheUnavailableError("the cache was closed; open a new ReplyCache")
        return self._executor.submit(op).result()

    def _guarded(self, op: Callable[[BoundedCache], T], default: T) -> T:
        if self._disabled:
            return default
        try:
            return op(self._open())
        except _Unavailable as exc:
            self._disabled = exc.permanent
            self._warn(str(exc))
        except RefusedRowError as exc:
            self._warn(
                f"cache entry ignored: {self._db_path()} holds a row llmchat did not write ({exc}), which is never "
                f'decoded because it could run code; run "llmchat cache clear" or delete {self._path}'
            )
        except (sqlite3.Error, OSError, LockTimeout) as exc:
            if is_locked(exc):
                self._warn(self._locked_message(exc))
            else:
                self._disable(
                    f"cache disabled: cannot use {self._path} ({_strerror(exc)}); free disk space, lower "
                    f'cache.size_limit_mb, delete that folder or set cache.policy = "off"'
                )
        return default

    def _open(self) -> BoundedCache:
        if self._cache is not None:
            return self._cache
        try:
            _ensure_private_dir(self._path)
        except OSError as exc:
            raise _Unavailable(
                f"cache disabled: cannot create {self._path} ({_strerror(exc)}); set cache.path to a writable "
                f'folder or cache.policy = "off"', permanent=True,
            ) from None
        try:
            self._cache = BoundedCache(
                str(self._path),
                timeout=LOCK_TIMEOUT_S,
                disk=SafeDisk,
                size_limit=max(self._settings.size_limit_mb, 1) * 2**20,
                cull_limit=CULL_LIMIT,
                eviction_policy="least-recently-stored",
                statistics=0,
                tag_index=0,
                # Explicit, so a value left in the folder's Settings table by another program cannot change it.
                disk_min_file_size=2**15,
            )
        except (sqlite3.Error, OSError, TypeError, ValueError, LockTimeout) as exc:
            if is_locked(exc):
                raise _Unavailable(self._locked_message(exc), permanent=False) from None
            raise _Unavailable(
                f"cache disabled: cannot open {self._db_path()} ({_strerror(exc)}); delete {self._path} or set "
                f"cache.path to another folder", permanent=True,
            ) from None
        return self._cache

    def _locked_message(self, exc: BaseException) -> str:
        cause = _strerror(exc) if not isinstance(exc, LockTimeout) else "database is locked"
        return (
            f"cache skipped: {self._db_path()} is held by another process ({cause}), so this request went "
            f"uncached; close the other process or set cache.path to another folder"
        )

    def _db_path(self) -> Path:
        return self._path / "cache.db"

    def _warn(self, message: str) -> None:
        if self._warned:
            log.debug("%s", message)
            return
        self._warned = True
        log.warning("%s", message)

    def _disable(self, message: str) -> None:
        self._disabled = True
        self._close_on_thread()
        self._warn(message)

    def _read_chat(self, cache: BoundedCache, key: str) -> dict[str, object] | None:
        try:
            data = cache.get(key)
            return None if data is None else _decode_chat(data)
        except (RefusedRowError, ValueError) as exc:
            self._drop_refused(cache, key)
            raise RefusedRowError(str(exc)) from None

    def _read_model(self, cache: BoundedCache, key: str) -> str | None:
        value = self._read_chat(cache, key)
        model = None if value is None else value.get("model")
        return model if isinstance(model, str) and model else None

    def _read_vectors(self, cache: BoundedCache, keys: list[str]) -> list[list[float] | None]:
        out: list[list[float] | None] = []
        for key in keys:
            try:
                data = cache.get(key)
                out.append(None if data is None else _unpack_vector(data))
            except (RefusedRowError, ValueError) as exc:
                self._drop_refused(cache, key)
                raise RefusedRowError(str(exc)) from None
        return out

    def _drop_refused(self, cache: BoundedCache, key: str) -> None:
        # Deleting reads no value, so it is safe on a tampered row; it stops the same row warning again.
        try:
            cache.delete(key)
        except Exception:  # noqa: BLE001 - best effort: the caller already treats the row as a miss
            log.debug("could not delete refused cache row", exc_info=True)

    def _stats_on_thread(self) -> CacheStats:
        limit = max(self._settings.size_limit_mb, 1) * 2**20
        if not self._path.exists():
            return CacheStats(path=self._path, entries=0, bytes=0, size_limit=limit, hits=self.hits,
                              misses=self.misses)
        cache = self._open_for_cli()
        try:
            try:
                cache.expire()
            except LockTimeout:
                pass  # another writer holds the lock: expired entries are still counted, nothing worse
            entries, volume = len(cache), cache.volume()
        except (sqlite3.Error, OSError) as exc:
            raise CacheUnavailableError(
                f"cannot read {self._db_path()} ({_strerror(exc)}); close other llmchat processes or delete "
                f"{self._path}"
            ) from None
        return CacheStats(path=self._path, entries=int(entries), bytes=int(volume), size_limit=limit,
                          hits=self.hits, misses=self.misses)

    def _clear_on_thread(self) -> int:
        if not self._path.exists():
            return 0
        # Opening writes (pragmas, tables) and deleting rows needs room for the journal, and a full disk is
        # when a clear is needed most: then the cache's own files are removed instead, which needs no room.
        try:
            cache = self._open_for_cli()
        except CacheUnavailableError as exc:
            if "full" not in str(exc):
                raise
            return self._remove_files()
        try:
            return int(cache.clear())
        except (sqlite3.Error, OSError, LockTimeout) as exc:
            if _is_full(exc):
                return self._remove_files()
            cause = "another process holds it" if is_locked(exc) else _strerror(exc)
            raise CacheUnavailableError(
                f"cannot clear {self._db_path()} ({cause}); close other llmchat processes and try again, or "
                f"delete {self._path}"
            ) from None

    def _remove_files(self) -> int:
        self._close_on_thread()
        entries = _count_read_only(self._db_path())
        _remove_cache_files(self._path)
        return entries

    def _open_for_cli(self) -> BoundedCache:
        try:
            return self._open()
        except _Unavailable as exc:
            raise CacheUnavailableError(str(exc)) from None

    def _close_on_thread(self) -> None:
        cache, self._cache = self._cache, None
        if cache is not None:
            cache.close()


_JOINERS = frozenset({"\u200d"})


def _glues_to_previous(ch: str) -> bool:
    # Combining marks, variation selectors and emoji modifiers render as part of the character before them.
    return (
        unicodedata.combining(ch) != 0
        or "\ufe00" <= ch <= "\ufe0f"
        or "\U0001f3fb" <= ch <= "\U0001f3ff"
        or ch in _JOINERS
    )


def replay_chunks(text: str, *, size: int = 16) -> Iterator[str]:
    """Splits a cached reply into pieces of about ``size`` characters for a replayed stream.

    Pieces are str slices, so never cut a UTF-8 sequence, and a piece is never cut before a combining mark,
    variation selector, skin-tone modifier or zero-width joiner (or right after a joiner), so a glyph is not
    drawn in halves. Joined, the pieces are exactly ``text``. Raises ``ValueError`` if ``size < 1``.
    """
    if size < 1:
        raise ValueError(f"replay chunk size must be at least 1, got {size}")
    start, n = 0, len(text)
    while start < n:
        end = min(start + size, n)
        while end < n and (_glues_to_previous(text[end]) or text[end - 1] in _JOINERS):
            end += 1
        yield text[start:end]
        start = end
