"""The reply and embedding cache: keys, policy, hit/miss, TTL, size limit, folder mode, no pickle, failures, CLI.

Everything runs against real diskcache/SQLite files in tmp_path; failures are provoked for real (a file where
the folder should be, a second SQLite connection holding the write lock, SQLite's max_page_count).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import pickle
import secrets
import sqlite3
import stat
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import diskcache
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmchat.core.config._settings import CacheSettings
from llmchat.core.policy._cache import CacheUnavailableError, ReplyCache, replay_chunks, resolve_cache_dir

BASE = "http://127.0.0.1:8000/v1"
MESSAGES: list[dict[str, object]] = [{"role": "user", "content": "Say hi"}]
WAIT_S = 10.0  # bound on every await that would hang on a bug


def chat_key(**params: object) -> str:
    return ReplyCache.chat_key(base_url=BASE, model="m", messages=MESSAGES, params=params)


@pytest.fixture
async def make_cache(tmp_path: Path) -> AsyncIterator[Callable[..., ReplyCache]]:
    made: list[ReplyCache] = []

    def make(folder: Path | None = None, **kw: Any) -> ReplyCache:
        kw.setdefault("policy", "always")
        cache = ReplyCache(CacheSettings(path=str(folder or tmp_path / "cache"), **kw))
        made.append(cache)
        return cache

    yield make
    for cache in made:
        await asyncio.wait_for(cache.aclose(), WAIT_S)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "llmchat.cache" and r.levelno >= logging.WARNING]


def rows(folder: Path) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(folder / "cache.db")
    try:
        return con.execute("SELECT key, raw, mode, filename, store_time, expire_time FROM Cache").fetchall()
    finally:
        con.close()


# ----- keys and policy -----


def test_chat_key_is_canonical_and_ignores_transport_and_trailing_slash() -> None:
    key = chat_key(temperature=0, max_tokens=10)
    assert len(key) == 64 and int(key, 16) >= 0
    assert chat_key(max_tokens=10, temperature=0) == key  # order of params does not matter
    assert chat_key(temperature=0, max_tokens=10, stream=True, stream_options={"include_usage": True}) == key
    assert ReplyCache.chat_key(base_url=BASE + "/", model="m", messages=MESSAGES,
                               params={"temperature": 0, "max_tokens": 10}) == key
    # Anything that can change the answer changes the key.
    assert chat_key(temperature=0, max_tokens=11) != key
    assert chat_key(temperature=0, max_tokens=10, seed=1) != key
    assert ReplyCache.chat_key(base_url=BASE, model="m2", messages=MESSAGES,
                               params={"temperature": 0, "max_tokens": 10}) != key
    assert ReplyCache.chat_key(base_url="http://127.0.0.1:9/v1", model="m", messages=MESSAGES,
                               params={"temperature": 0, "max_tokens": 10}) != key
    other = [{"role": "user", "content": "Say bye"}]
    assert ReplyCache.chat_key(base_url=BASE, model="m", messages=other,
                               params={"temperature": 0, "max_tokens": 10}) != key


def test_key_functions_cannot_see_an_api_key_or_headers() -> None:
    assert set(inspect.signature(ReplyCache.chat_key).parameters) == {"base_url", "model", "messages", "params"}
    assert set(inspect.signature(ReplyCache.embedding_key).parameters) == {"base_url", "model", "text",
                                                                           "dimensions"}
    with pytest.raises(TypeError):
        ReplyCache.chat_key(base_url=BASE, model="m", messages=MESSAGES, params={},  # type: ignore[call-arg]
                            api_key="sk-a")
    # Two users with different keys asking the same thing share one entry.
    requests: list[dict[str, dict[str, Any]]] = [
        {"headers": {"Authorization": f"Bearer sk-{who}"}, "params": {"temperature": 0}} for who in "ab"
    ]
    keys = {ReplyCache.chat_key(base_url=BASE, model="m", messages=MESSAGES, params=r["params"]) for r in requests}
    assert len(keys) == 1


def test_embedding_key_depends_on_text_model_dimensions_and_base_url() -> None:
    def ek(**kw: object) -> str:
        args: dict[str, Any] = {"base_url": BASE, "model": "e", "text": "hello", "dimensions": None}
        args.update(kw)
        return ReplyCache.embedding_key(**args)

    base = ek()
    assert ek(base_url=BASE + "/") == base
    assert len({base, ek(text="hello "), ek(model="e2"), ek(dimensions=64), ek(base_url="http://127.0.0.1:1")}) == 5
    assert base != chat_key()  # kinds never collide


@pytest.mark.parametrize(
    ("policy", "params", "allowed"),
    [
        ("deterministic", {"temperature": 0}, True),
        ("deterministic", {"temperature": 0.0, "top_p": 1}, True),
        ("deterministic", {"temperature": 0.7, "seed": 42}, True),
        ("deterministic", {"seed": 0}, True),
        ("deterministic", {"temperature": 0.7}, False),
        ("deterministic", {}, False),
        ("deterministic", {"seed": None, "temperature": 1}, False),
        ("deterministic", {"temperature": False}, False),
        ("always", {"temperature": 1.2}, True),
        ("off", {"temperature": 0, "seed": 1}, False),
    ],
)
def test_policy_allows(policy: str, params: dict[str, object], allowed: bool, tmp_path: Path) -> None:
    cache = ReplyCache(CacheSettings(policy=policy, path=str(tmp_path)))  # type: ignore[arg-type]
    try:
        assert cache.policy_allows(params) is allowed
    finally:
        cache.close()


def test_resolve_cache_dir_follows_xdg_and_expands_home(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert resolve_cache_dir("", env) == tmp_path / "xdg" / "llmchat"
    assert resolve_cache_dir("", {"HOME": env["HOME"]}) == tmp_path / "home" / ".cache" / "llmchat"
    assert resolve_cache_dir("", {"HOME": env["HOME"], "XDG_CACHE_HOME": "rel"}) == (
        tmp_path / "home" / ".cache" / "llmchat"
    )
    assert resolve_cache_dir("~/c", env) == tmp_path / "home" / "c"
    assert resolve_cache_dir(str(tmp_path / "x"), env) == tmp_path / "x"


# ----- hits, misses, embeddings -----


async def test_chat_miss_then_hit_counts_and_survives_reopen(make_cache: Callable[..., ReplyCache]) -> None:
    cache = make_cache()
    key = chat_key(temperature=0)
    value: dict[str, object] = {"text": "héllo 👋", "finish_reason": "stop", "usage": {"total_tokens": 3},
                                "model": "m"}
    assert await asyncio.wait_for(cache.get_chat(key), WAIT_S) is None
    await asyncio.wait_for(cache.put_chat(key, value), WAIT_S)
    assert await asyncio.wait_for(cache.get_chat(key), WAIT_S) == value
    assert (cache.hits, cache.misses, cache.hit_ratio) == (1, 1, 0.5)
    stats = cache.stats()
    assert (stats.entries, stats.hits, stats.misses, stats.hit_ratio) == (1, 1, 1, 0.5)
    assert stats.bytes > 0 and stats.path == cache.path
    await cache.aclose()

    again = make_cache()  # a new process reads what the last one stored
    assert await asyncio.wait_for(again.get_chat(key), WAIT_S) == value


async def test_embeddings_mixed_hits_and_one_executor_hop(make_cache: Callable[..., ReplyCache]) -> None:
    cache = make_cache()
    keys = [ReplyCache.embedding_key(base_url=BASE, model="e", text=t) for t in ("a", "b", "c", "d")]
    # Values exactly representable as float32, plus one that is not (float32 keeps ~7 digits).
    vectors = {keys[0]: [0.5, -0.25, 1.0], keys[2]: [0.1, 2.0 / 3.0, -1e-3]}
    hops = 0
    submit = cache._executor.submit

    def counting_submit(*args: Any, **kw: Any) -> Any:
        nonlocal hops
        hops += 1
        return submit(*args, **kw)

    cache._executor.submit = counting_submit  # type: ignore[method-assign]
    await asyncio.wait_for(cache.put_embeddings(list(vectors.items())), WAIT_S)
    got = await asyncio.wait_for(cache.get_embeddings(keys), WAIT_S)
    assert hops == 2  # one for the whole put, one for the whole get
    assert got[1] is None and got[3] is None
    assert got[0] == [0.5, -0.25, 1.0]
    assert got[2] == pytest.approx(vectors[keys[2]], rel=1e-6)
    assert (cache.hits, cache.misses) == (2, 2)
    assert await cache.get_embeddings([]) == []
    # float32: 4 bytes a dimension, nothing else.
    stored = {r[0]: r for r in rows(cache.path)}
    con = sqlite3.connect(cache.path / "cache.db")
    try:
        (blob,) = con.execute("SELECT value FROM Cache WHERE key = ?", (keys[0],)).fetchone()
    finally:
        con.close()
    assert len(blob) == 12 and set(stored) == {keys[0], keys[2]}


async def test_every_row_is_raw_or_binary_never_pickle(make_cache: Callable[..., ReplyCache]) -> None:
    cache = make_cache()
    await cache.put_chat(chat_key(), {"text": "small"})
    await cache.put_chat(chat_key(seed=1), {"text": "x" * 40_000})  # large enough for a value file
    await cache.put_embeddings([(ReplyCache.embedding_key(base_url=BASE, model="e", text="t"), [1.0])])
    modes = {(r[1], r[2]) for r in rows(cache.path)}
    assert modes == {(1, diskcache.core.MODE_RAW), (1, diskcache.core.MODE_BINARY)}
    assert await cache.get_chat(chat_key(seed=1)) == {"text": "x" * 40_000}
    with pytest.raises(TypeError):
        await cache.put_chat(chat_key(), {"not json": object()})


async def test_policy_off_never_touches_the_disk(make_cache: Callable[..., ReplyCache]) -> None:
    cache = make_cache(policy="off")
    await cache.put_chat(chat_key(), {"text": "x"})
    assert await cache.get_chat(chat_key()) is None
    assert not cache.path.exists()
    assert cache.replay_streams is False


async def test_the_event_loop_keeps_running_while_the_cache_waits(make_cache: Callable[..., ReplyCache]) -> None:
    cache = make_cache()
    await cache.put_chat(chat_key(), {"text": "x"})
    lock = _hold_write_lock(cache.path)
    try:
        ticks = 0
        put = asyncio.ensure_future(cache.put_chat(chat_key(seed=2), {"text": "y"}))
        while not put.done():
            await asyncio.sleep(0.005)
            ticks += 1
            assert ticks < WAIT_S / 0.005, "put never finished"
        await put
        # The put waited for the lock (LOCK_TIMEOUT_S) on the cache thread while this loop kept ticking.
        assert ticks >= 3
    finally:
        _release(lock)


# ----- TTL and size limit -----


async def test_entry_expires_after_ttl(make_cache: Callable[..., ReplyCache]) -> None:
    cache = make_cache(ttl_s=0.05)
    key = chat_key()
    await cache.put_chat(key, {"text": "soon gone"})
    ((_, _, _, _, store_time, expire_time),) = rows(cache.path)
    assert expire_time == pytest.approx(store_time + 0.05, abs=1e-3)  # the row really carries the TTL
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while await cache.get_chat(key) is not None:
        assert asyncio.get_running_loop().time() < deadline, "entry never expired"
        await asyncio.sleep(0.01)
    assert cache.misses >= 1


async def test_ttl_zero_keeps_entries(make_cache: Callable[..., ReplyCache]) -> None:
    cache = make_cache(ttl_s=0)
    await cache.put_chat(chat_key(), {"text": "kept"})
    ((_, _, _, _, _, expire_time),) = rows(cache.path)
    assert expire_time is None


async def test_size_limit_evicts_least_recently_stored(make_cache: Callable[..., ReplyCache]) -> None:
    cache = make_cache(size_limit_mb=1)
    limit = 2**20
    filler = "x" * 8000
    # 3 MB through a 1 MiB cache. diskcache culls on each write once its volume reaches the limit, so the
    # volume never exceeds the limit by more than the entry just written plus page slack.
    for i in range(400):
        await cache.put_chat(f"{i:064x}", {"text": filler, "i": i})
        if i % 50 == 49:
            assert cache.stats().bytes <= limit + 64 * 1024
    stats = cache.stats()
    assert 0 < stats.entries < 400 and stats.size_limit == limit
    assert await cache.get_chat(f"{399:064x}") == {"text": filler, "i": 399}  # newest kept
    assert await cache.get_chat(f"{0:064x}") is None  # oldest evicted first


# ----- folder mode and secrets -----


async def test_folder_is_created_mode_0700_and_tightened(
    make_cache: Callable[..., ReplyCache], tmp_path: Path
) -> None:
    old = os.umask(0o022)
    try:
        cache = make_cache(tmp_path / "new" / "cache")
        await cache.put_chat(chat_key(), {"text": "x"})
        assert stat.S_IMODE(os.stat(cache.path).st_mode) == 0o700

        loose = tmp_path / "loose"
        loose.mkdir(mode=0o755)
        os.chmod(loose, 0o755)
        cache2 = make_cache(loose)
        await cache2.put_chat(chat_key(), {"text": "x"})
        assert stat.S_IMODE(os.stat(loose).st_mode) == 0o700
    finally:
        os.umask(old)


async def test_no_api_key_anywhere_in_the_cache_folder(make_cache: Callable[..., ReplyCache]) -> None:
    api_key = "sk-test-" + secrets.token_hex(16)
    headers = {"Authorization": f"Bearer {api_key}"}  # what the client holds; the cache API has no slot for it
    assert api_key in headers["Authorization"]
    cache = make_cache()
    params = {"temperature": 0, "max_tokens": 5}
    await cache.put_chat(
        ReplyCache.chat_key(base_url=BASE, model="m", messages=MESSAGES, params=params),
        {"text": "hi", "finish_reason": "stop", "usage": {"total_tokens": 2}, "model": "m"},
    )
    await cache.put_embeddings([(ReplyCache.embedding_key(base_url=BASE, model="e", text="hi"), [0.25, 0.5])])
    await cache.aclose()  # flush: every byte is now in files
    files = [p for p in cache.path.rglob("*") if p.is_file()]
    assert any(p.name == "cache.db" for p in files)
    for path in files:
        data = path.read_bytes()
        for needle in (api_key, api_key[3:], "Bearer"):
            assert needle.encode() not in data, f"{needle!r} found in {path}"


# ----- never unpickle -----


class _Payload:
    """Pickles to a call of os.mkdir(marker): unpickling it is running code."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.mkdir, (self.marker,))


async def test_a_planted_pickle_is_never_run(
    make_cache: Callable[..., ReplyCache], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "cache"
    small_key, file_key = chat_key(), chat_key(seed=9)
    emb_key = ReplyCache.embedding_key(base_url=BASE, model="e", text="t")
    markers = [tmp_path / f"pwned-{i}" for i in range(3)]
    # An attacker with write access uses plain diskcache, which pickles, to plant rows under our keys:
    # one in the database, one (min_file_size 0) as a value file.
    with diskcache.Cache(str(folder)) as plain:
        plain.set(small_key, _Payload(markers[0]))
        plain.set(emb_key, _Payload(markers[2]))
    with diskcache.Cache(str(folder), disk_min_file_size=0) as plain:
        plain.set(file_key, _Payload(markers[1]))
    planted = {r[0]: r for r in rows(folder)}
    assert {planted[k][2] for k in (small_key, file_key, emb_key)} == {diskcache.core.MODE_PICKLE}
    assert planted[file_key][3] is not None  # really stored as a file
    # The payload is live: the stock Disk would run it.
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(_Payload(control)))
    assert control.is_dir()

    cache = make_cache(folder)
    assert await cache.get_chat(small_key) is None
    assert await cache.get_chat(file_key) is None
    assert await cache.get_embeddings([emb_key]) == [None]
    assert not any(m.exists() for m in markers)
    assert cache.misses == 3 and cache.hits == 0
    found = warnings_of(caplog)
    assert len(found) == 1 and "did not write" in found[0] and str(folder) in found[0]
    # The refused rows are dropped, and the cache still works.
    assert not {small_key, file_key, emb_key} & {r[0] for r in rows(folder)}
    await cache.put_chat(small_key, {"text": "clean"})
    assert await cache.get_chat(small_key) == {"text": "clean"}


async def test_a_row_that_is_not_json_is_a_miss(
    make_cache: Callable[..., ReplyCache], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "cache"
    with diskcache.Cache(str(folder)) as plain:
        plain.set(chat_key(), b"\xff not json")
        plain.set(chat_key(seed=1), b"[1, 2]")  # JSON, but not the object a reply is
    cache = make_cache(folder)
    assert await cache.get_chat(chat_key()) is None
    assert await cache.get_chat(chat_key(seed=1)) is None
    assert len(warnings_of(caplog)) == 1


# ----- failures never fail a request -----


async def _assert_uncached(cache: ReplyCache) -> None:
    key = chat_key()
    await asyncio.wait_for(cache.put_chat(key, {"text": "x"}), WAIT_S)
    assert await asyncio.wait_for(cache.get_chat(key), WAIT_S) is None
    await asyncio.wait_for(cache.put_embeddings([("e" * 64, [1.0])]), WAIT_S)
    assert await asyncio.wait_for(cache.get_embeddings(["e" * 64]), WAIT_S) == [None]


async def test_a_file_where_the_folder_should_be(
    make_cache: Callable[..., ReplyCache], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "cache"
    blocker.write_text("not a folder")
    cache = make_cache(blocker)
    await _assert_uncached(cache)
    await _assert_uncached(cache)
    (message,) = warnings_of(caplog)
    assert message.startswith(f"cache disabled: cannot create {blocker} (")
    assert "cache.path" in message and "\n" not in message
    assert blocker.read_text() == "not a folder"


async def test_a_folder_under_a_regular_file(
    make_cache: Callable[..., ReplyCache], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Works as root too, unlike a read-only parent: nothing can create a folder inside a file.
    parent = tmp_path / "file"
    parent.write_text("")
    cache = make_cache(parent / "sub" / "cache")
    await _assert_uncached(cache)
    (message,) = warnings_of(caplog)
    assert "Not a directory" in message and str(parent / "sub" / "cache") in message


def _hold_write_lock(folder: Path) -> sqlite3.Connection:
    con = sqlite3.connect(folder / "cache.db", timeout=0, isolation_level=None)
    con.execute("BEGIN EXCLUSIVE")
    return con


def _release(con: sqlite3.Connection) -> None:
    con.execute("ROLLBACK")
    con.close()


async def test_a_locked_database_degrades_to_a_miss_and_recovers(
    make_cache: Callable[..., ReplyCache], caplog: pytest.LogCaptureFixture
) -> None:
    cache = make_cache()
    stored = chat_key(seed=1)
    await cache.put_chat(stored, {"text": "before"})
    lock = _hold_write_lock(cache.path)
    try:
        # diskcache's own retry would wait 60 s; these must come back within the lock timeout.
        await asyncio.wait_for(cache.put_chat(chat_key(), {"text": "x"}), WAIT_S)
        await asyncio.wait_for(cache.put_embeddings([("e" * 64, [1.0])]), WAIT_S)
        assert await asyncio.wait_for(cache.get_chat(chat_key()), WAIT_S) is None
        # WAL readers are not blocked by a writer, so what was stored before still reads.
        assert await asyncio.wait_for(cache.get_chat(stored), WAIT_S) == {"text": "before"}
    finally:
        _release(lock)
    (message,) = warnings_of(caplog)
    assert "held by another process" in message and str(cache.path / "cache.db") in message
    # A lock is transient: the cache was not disabled.
    assert await cache.get_chat(chat_key()) is None  # the put during the lock was a no-op
    await cache.put_chat(chat_key(), {"text": "after"})
    assert await cache.get_chat(chat_key()) == {"text": "after"}


async def test_a_database_locked_before_first_use(
    make_cache: Callable[..., ReplyCache], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "cache"
    with diskcache.Cache(str(folder)):
        pass
    lock = _hold_write_lock(folder)
    cache = make_cache(folder)
    try:
        assert await asyncio.wait_for(cache.get_chat(chat_key()), WAIT_S) is None
    finally:
        _release(lock)
    assert len(warnings_of(caplog)) == 1
    await cache.put_chat(chat_key(), {"text": "opened later"})
    assert await cache.get_chat(chat_key()) == {"text": "opened later"}


async def test_a_full_database_disables_the_cache(
    make_cache: Callable[..., ReplyCache], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "cache"
    with diskcache.Cache(str(folder)) as plain:
        ((pages,),) = plain._sql("PRAGMA page_count").fetchall()
    # SQLite's own cap, stored where every connection to this cache applies it: writing past it is the real
    # "database or disk is full" error a full disk gives.
    with diskcache.Cache(str(folder), sqlite_max_page_count=pages):
        pass
    cache = make_cache(folder)
    await asyncio.wait_for(cache.put_chat(chat_key(), {"text": "y" * 20_000}), WAIT_S)
    await _assert_uncached(cache)
    (message,) = warnings_of(caplog)
    assert message.startswith(f"cache disabled: cannot use {folder} (database or disk is full)")


# ----- replay -----


def test_replay_chunks_keeps_glyphs_whole() -> None:
    text = "ab" + "e\u0301" + "👍🏽" + "👩\u200d💻" + "xyz"
    pieces = list(replay_chunks(text, size=1))
    assert "".join(pieces) == text
    assert "e\u0301" in pieces and "👍🏽" in pieces and "👩\u200d💻" in pieces
    assert list(replay_chunks("", size=4)) == []
    assert list(replay_chunks("abcdefghij", size=4)) == ["abcd", "efgh", "ij"]
    with pytest.raises(ValueError):
        list(replay_chunks("x", size=0))


@given(st.text(max_size=200), st.integers(min_value=1, max_value=40))
def test_replay_chunks_reassemble_exactly(text: str, size: int) -> None:
    pieces = list(replay_chunks(text, size=size))
    assert "".join(pieces) == text
    assert all(pieces)
    assert all(p.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass") == p for p in pieces)


# ----- lifecycle -----


async def test_aclose_ends_the_thread_and_later_calls_are_misses(make_cache: Callable[..., ReplyCache]) -> None:
    cache = make_cache()
    await cache.put_chat(chat_key(), {"text": "x"})
    threads = {t for t in threading.enumerate() if t.name.startswith("llmchat-cache")}
    assert threads
    await cache.aclose()
    for t in threads:
        t.join(WAIT_S)
    assert not any(t.is_alive() for t in threads)
    assert await cache.get_chat(chat_key()) is None
    await cache.put_chat(chat_key(), {"text": "y"})
    await cache.aclose()
    with pytest.raises(CacheUnavailableError):
        cache.stats()


# ----- llmchat cache -----


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.delenv("LLMCHAT_CONFIG", raising=False)
    return tmp_path / "xdg-cache" / "llmchat"


def test_cli_path_stats_clear(cli_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from llmchat.tui.cli import main

    assert main(["cache", "path"]) == 0
    assert capsys.readouterr().out.strip() == str(cli_env)

    assert main(["cache", "stats"]) == 0
    out = capsys.readouterr().out
    assert "entries  0" in out and not cli_env.exists()  # looking does not create the folder

    async def fill() -> None:
        cache = ReplyCache(CacheSettings(policy="always"))
        try:
            await cache.put_chat(chat_key(), {"text": "a"})
            await cache.put_embeddings([("e" * 64, [1.0, 2.0])])
        finally:
            await cache.aclose()

    asyncio.run(fill())
    assert main(["cache", "stats"]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = dict(line.split(None, 1) for line in lines)
    assert table["path"] == str(cli_env) and table["entries"] == "2"
    assert table["size"].endswith("of 512.0 MiB") and table["policy"] == "deterministic"
    assert table["ttl"] == "7 d"
    assert len({line.index(line.split(None, 1)[1]) for line in lines}) == 1  # values aligned

    assert main(["cache", "clear"]) == 0
    assert capsys.readouterr().out.strip() == f"removed 2 entries from {cli_env}"
    assert main(["cache", "stats"]) == 0
    assert "entries  0" in capsys.readouterr().out


def test_cli_unusable_folder_is_one_line_exit_1(cli_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from llmchat.tui.cli import main

    cli_env.parent.mkdir(parents=True)
    cli_env.write_text("in the way")
    assert main(["cache", "stats"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"llmchat: cache disabled: cannot create {cli_env} (") and err.count("\n") == 1
    assert "Traceback" not in err


def test_cli_needs_an_action(cli_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from llmchat.tui.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["cache"])
    assert exc.value.code == 2
    assert "ACTION" in capsys.readouterr().err


def test_cli_takes_cache_settings_from_the_config_file(
    cli_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from llmchat.tui.cli import main

    folder = tmp_path / "elsewhere"
    config = tmp_path / "config.toml"
    config.write_text(f'[cache]\npath = "{folder}"\nsize_limit_mb = 2\npolicy = "always"\nttl_s = 3600\n')
    assert main(["--config", str(config), "cache", "path"]) == 0
    assert capsys.readouterr().out.strip() == str(folder)
    assert main(["--config", str(config), "cache", "stats"]) == 0
    table = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert table["size"] == "0 B of 2.0 MiB" and table["policy"] == "always" and table["ttl"] == "1 h"


def test_chat_key_treats_equal_numbers_and_unset_params_alike() -> None:
    base: dict[str, Any] = {"base_url": "http://h/v1", "model": "m", "messages": [{"role": "user", "content": "x"}]}
    k0 = ReplyCache.chat_key(**base, params={"temperature": 0, "max_tokens": 10})
    assert k0 == ReplyCache.chat_key(**base, params={"temperature": 0.0, "max_tokens": 10, "seed": None})
    assert k0 != ReplyCache.chat_key(**base, params={"temperature": 0.5, "max_tokens": 10})
    assert k0 != ReplyCache.chat_key(**base, params={"temperature": 0, "max_tokens": 10, "seed": 1})
