"""The reply and embeddings cache through ChatClient, against the local server, in a temp folder.

What went out is read off the wire: a recording relay on 127.0.0.1 sits between the client (HTTP/1.1) and
the server and keeps every byte the client sends, so "answered from the cache" means "no request was sent",
and "only the missing text went out" is the body the server received.
"""

from __future__ import annotations

import asyncio
import json
import logging
import stat
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from llmchat.core import CacheSettings, ChatClient, RequestDone, Settings
from llmchat.core.server import RunningServer

Factory = Callable[..., RunningServer]
MESSAGES = [{"role": "user", "content": "What does a cache key hold?"}]
MODEL = "llmchat-local"
BOUND_S = 5.0
API_KEY = "sk-llmchat-test-5f0c1e2d3b4a69788796a5b4c3d2e1f0"


@dataclass(frozen=True)
class WireRequest:
    method: str
    path: str
    headers: bytes
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class RecordingRelay:
    """A TCP relay on 127.0.0.1 to ``server`` that keeps what each client connection sent."""

    def __init__(self, server: RunningServer) -> None:
        self.server = server
        self._sent: list[bytearray] = []
        self._listener: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def base_url(self) -> str:
        assert self._listener is not None
        return f"http://127.0.0.1:{self._listener.sockets[0].getsockname()[1]}/v1"

    async def __aenter__(self) -> RecordingRelay:
        self._listener = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._listener is not None
        self._listener.close()
        for writer in self._writers:
            writer.close()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=BOUND_S)
        await self._listener.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        up_reader, up_writer = await asyncio.open_connection(self.server.host, self.server.port)
        self._writers |= {writer, up_writer}
        sent = bytearray()
        self._sent.append(sent)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, sink: bytearray | None) -> None:
            try:
                while data := await src.read(65536):
                    if sink is not None:
                        sink += data
                    dst.write(data)
                    await dst.drain()
            except ConnectionError:
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_writer, sent), pump(up_reader, writer, None))

    def requests(self, path_suffix: str = "") -> list[WireRequest]:
        """Every request sent through the relay (HTTP/1.1, bodies by Content-Length), optionally by path."""
        found: list[WireRequest] = []
        for data in self._sent:
            rest = bytes(data)
            while rest:
                head, sep, rest = rest.partition(b"\r\n\r\n")
                assert sep, "a request head was cut short"
                request_line, _, headers = head.partition(b"\r\n")
                method, path, _ = request_line.decode().split(" ", 2)
                length = 0
                for line in headers.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body, rest = rest[:length], rest[length:]
                found.append(WireRequest(method, path, headers, body))
        return [r for r in found if r.path.endswith(path_suffix)]


@pytest.fixture
async def relay(local_server: RunningServer) -> AsyncIterator[RecordingRelay]:
    async with RecordingRelay(local_server) as running:
        yield running


def client_for(relay: RecordingRelay, tmp_path: Path, **cache: Any) -> ChatClient:
    settings = Settings(cache=CacheSettings(path=str(tmp_path / "cache"), **cache))
    return ChatClient(settings, base_url=relay.base_url, http2=False, model=MODEL)


async def test_a_deterministic_batch_reply_is_served_from_the_cache(
    relay: RecordingRelay, tmp_path: Path
) -> None:
    async with client_for(relay, tmp_path) as client:
        done: list[bool] = []
        client.bus.subscribe(RequestDone, lambda e: done.append(e.record.cache_hit))
        first = await client.complete(MESSAGES, temperature=0, max_tokens=20)
        second = await client.complete(MESSAGES, temperature=0, max_tokens=20)
    assert len(relay.requests("/chat/completions")) == 1
    assert first.record.cache_hit is False and first.record.attempts == 1
    assert second.record.cache_hit is True and second.record.attempts == 0
    assert second.record.phases.send_start_ns is None  # nothing was sent for it
    assert (second.text, second.finish_reason, second.usage) == (first.text, first.finish_reason, first.usage)
    assert second.record.output_tokens == first.record.output_tokens
    assert done == [False, True]


async def test_what_the_policy_allows(relay: RecordingRelay, tmp_path: Path) -> None:
    async with client_for(relay, tmp_path / "deterministic") as client:
        sampled = [await client.complete(MESSAGES, temperature=0.7, max_tokens=5) for _ in range(2)]
        seeded = [await client.complete(MESSAGES, temperature=0.7, seed=7, max_tokens=5) for _ in range(2)]
    assert [r.record.cache_hit for r in sampled] == [False, False]  # sampling without a seed: never cached
    assert [r.record.cache_hit for r in seeded] == [False, True]
    assert len(relay.requests("/chat/completions")) == 3

    async with client_for(relay, tmp_path / "always", policy="always") as client:
        always = [await client.complete(MESSAGES, temperature=0.7, max_tokens=5) for _ in range(2)]
    assert [r.record.cache_hit for r in always] == [False, True]
    assert len(relay.requests("/chat/completions")) == 4

    async with client_for(relay, tmp_path / "off", policy="off") as client:
        assert client.cache is None
        off = [await client.complete(MESSAGES, temperature=0, max_tokens=5) for _ in range(2)]
    assert [r.record.cache_hit for r in off] == [False, False]
    assert len(relay.requests("/chat/completions")) == 6
    assert not (tmp_path / "off" / "cache").exists()


async def test_a_cached_reply_is_replayed_as_a_stream_only_when_asked(relay: RecordingRelay,
                                                                      tmp_path: Path) -> None:
    async with client_for(relay, tmp_path, replay_streams=True) as client:
        stored = await client.complete(MESSAGES, temperature=0, max_tokens=40)
        stream = client.stream(MESSAGES, temperature=0, max_tokens=40)
        pieces = [p async for p in stream]
    assert len(relay.requests("/chat/completions")) == 1
    assert "".join(pieces) == stream.text == stored.text
    assert len(pieces) > 1  # replayed as a stream, piece by piece
    record = stream.record
    assert record.cache_hit is True and record.attempts == 0 and record.mode == "stream"
    assert record.first_token_ns is not None and record.content_chunks == len(pieces)
    assert stream.finish_reason == stored.finish_reason
    assert record.output_tokens == stored.record.output_tokens

    async with client_for(relay, tmp_path, replay_streams=False) as client:
        live = client.stream(MESSAGES, temperature=0, max_tokens=40)
        live_text = "".join([p async for p in live])
    assert live.record.cache_hit is False and live_text == stored.text
    streamed = relay.requests("/chat/completions")
    assert len(streamed) == 2 and streamed[1].json()["stream"] is True


async def test_entries_expire_after_the_ttl(relay: RecordingRelay, tmp_path: Path) -> None:
    async with client_for(relay, tmp_path, ttl_s=0.05) as client:
        first = await client.complete(MESSAGES, temperature=0, max_tokens=5)
        await asyncio.sleep(0.1)  # twice the TTL: the entry is certainly past its expiry
        second = await client.complete(MESSAGES, temperature=0, max_tokens=5)
    assert [first.record.cache_hit, second.record.cache_hit] == [False, False]
    assert len(relay.requests("/chat/completions")) == 2


async def test_embeddings_only_the_texts_not_cached_go_out_in_one_request(relay: RecordingRelay,
                                                                           tmp_path: Path) -> None:
    async with client_for(relay, tmp_path) as client:
        records: list[Any] = []
        client.bus.subscribe(RequestDone, lambda e: records.append(e.record))
        ab = await client.embed(["alpha", "beta"])
        ac = await client.embed(["alpha", "gamma"])
        cba = await client.embed(["gamma", "beta", "alpha"])
    sent = relay.requests("/embeddings")
    assert [r.json()["input"] for r in sent] == [["alpha", "beta"], ["gamma"]]
    assert ac[0] == ab[0] and cba == [ac[1], ab[1], ab[0]]  # cached vectors come back in the caller's order
    assert len({tuple(v) for v in (*ab, ac[1])}) == 3 and all(len(v) == 256 for v in cba)
    assert [r.cache_hit for r in records] == [False, False, True]


async def test_the_size_limit_evicts_through_the_client(server_factory: Factory, tmp_path: Path) -> None:
    # 64 KiB float32 vectors against a 1 MiB cap: the folder stays under the cap by dropping the oldest.
    server = server_factory(embedding_dim=16384)
    settings = Settings(cache=CacheSettings(path=str(tmp_path / "cache"), size_limit_mb=1))
    texts = [f"text number {i}" for i in range(24)]
    async with RecordingRelay(server) as relay:
        async with ChatClient(settings, base_url=relay.base_url, http2=False, model=MODEL) as client:
            for text in texts:
                await client.embed([text])
            assert client.cache is not None
            newest = await client.embed([texts[-1]])
            oldest = await client.embed([texts[0]])
            stats = await asyncio.get_running_loop().run_in_executor(None, client.cache.stats)
    sent = [r.json()["input"] for r in relay.requests("/embeddings")]
    assert sent[:24] == [[t] for t in texts]
    assert sent[24:] == [[texts[0]]]  # the newest was still cached, the oldest had been evicted
    assert len(newest[0]) == len(oldest[0]) == 16384
    assert stats.entries < 24
    # diskcache culls after a write takes it over the cap, so one value's worth of slack.
    assert stats.bytes <= stats.size_limit + 16384 * 4 + 64 * 1024


async def test_no_api_key_anywhere_in_the_cache_folder(server_factory: Factory, tmp_path: Path) -> None:
    server = server_factory(api_key=API_KEY)
    folder = tmp_path / "cache"
    settings = Settings(cache=CacheSettings(path=str(folder), policy="always", replay_streams=True))
    async with ChatClient(settings, base_url=server.base_url, http2="h2c", model=MODEL,
                          api_key=API_KEY) as client:
        reply = await client.complete(MESSAGES, max_tokens=30)
        await client.complete(MESSAGES, max_tokens=30, temperature=0, seed=3)
        await client.embed(["alpha", "beta"])
        replay = client.stream(MESSAGES, max_tokens=30)
        assert "".join([p async for p in replay]) == reply.text and replay.record.cache_hit
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert files and sum(p.stat().st_size for p in files) > 0
    needles = [API_KEY.encode(), API_KEY.encode("utf-16-le"), API_KEY[-16:].encode(), b"Bearer"]
    for path in files:
        data = path.read_bytes()
        for needle in needles:
            assert needle not in data, f"{needle!r} found in {path}"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


async def test_a_cache_folder_that_is_a_file_warns_once_and_requests_go_on(
    relay: RecordingRelay, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "cache"
    blocker.write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="llmchat.cache"):
        async with client_for(relay, tmp_path) as client:
            replies = [await client.complete(MESSAGES, temperature=0, max_tokens=5) for _ in range(3)]
            vectors = await client.embed(["alpha"])
    assert all(r.text and not r.record.cache_hit and r.record.error is None for r in replies)
    assert len(vectors) == 1 and len(relay.requests("/chat/completions")) == 3
    warnings = [r for r in caplog.records if r.name == "llmchat.cache" and r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "cache disabled" in message and str(blocker) in message and "\n" not in message
    assert blocker.read_text() == "not a folder"


def test_the_relay_parses_what_it_forwards() -> None:
    # The relay's parser is what every "nothing was sent" above rests on: check it on a known byte stream.
    relay = RecordingRelay.__new__(RecordingRelay)
    relay._sent = [bytearray(
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
        b"POST /v1/embeddings HTTP/1.1\r\nContent-Length: 13\r\n\r\n{\"input\":[1]}"
        b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}"
    )]
    assert [(r.method, r.path) for r in relay.requests()] == [
        ("GET", "/v1/models"), ("POST", "/v1/embeddings"), ("POST", "/v1/chat/completions")]
    assert relay.requests("/embeddings")[0].json() == {"input": [1]}


# -- no model named: a hit sends nothing, not even GET /models -----------------------------------------------


def unnamed_client(relay: RecordingRelay, tmp_path: Path, **cache: Any) -> ChatClient:
    """A client that names no model, as `llmchat ask` against a local server does; each one is a new process's."""
    settings = Settings(cache=CacheSettings(path=str(tmp_path / "cache"), **cache))
    return ChatClient(settings, base_url=relay.base_url, http2=False)


async def test_a_hit_with_no_model_named_sends_nothing_at_all(relay: RecordingRelay, tmp_path: Path) -> None:
    # The first client asks the server its model (GET /models) and stores the replies; the cache remembers
    # the model it named, so a later client (the next `llmchat ask`) keys on it without asking again.
    async with unnamed_client(relay, tmp_path, replay_streams=True) as client:
        stored = await client.complete(MESSAGES, temperature=0, max_tokens=20)
        vectors = await client.embed(["alpha", "beta"])
    before = len(relay.requests())
    assert [r.path for r in relay.requests()] == ["/v1/models", "/v1/chat/completions", "/v1/embeddings"]
    assert stored.record.model == MODEL and stored.record.model_lookup_ms is not None

    records: list[Any] = []
    async with unnamed_client(relay, tmp_path, replay_streams=True) as client:
        client.bus.subscribe(RequestDone, lambda e: records.append(e.record))
        again = await client.complete(MESSAGES, temperature=0, max_tokens=20)
        again_vectors = await client.embed(["alpha", "beta"])
        replay = client.stream(MESSAGES, temperature=0, max_tokens=20)
        replayed = "".join([p async for p in replay])
    assert len(relay.requests()) == before  # zero requests: no /models, no completion, no embedding
    assert (again.text, again_vectors, replayed) == (stored.text, vectors, stored.text)
    assert [r.cache_hit for r in records] == [True, True, True]
    assert [r.model for r in records] == [MODEL] * 3  # each record still names the model
    assert all(r.model_lookup_ms is None and r.attempts == 0 for r in records if r.mode != "embed")


async def test_the_model_the_server_names_now_wins_over_the_one_remembered(
    relay: RecordingRelay, tmp_path: Path
) -> None:
    # The cache remembered a model the server no longer names: the lookup under it misses, the client asks
    # the server, sends the request with the model it names now, and remembers that one from then on.
    async with unnamed_client(relay, tmp_path) as client:
        assert client.cache is not None
        await client.cache.remember_server_model(relay.base_url, "gone-model")
    async with unnamed_client(relay, tmp_path) as client:
        first = await client.complete(MESSAGES, temperature=0, max_tokens=20)
    async with unnamed_client(relay, tmp_path) as client:
        second = await client.complete(MESSAGES, temperature=0, max_tokens=20)
    sent = relay.requests()
    assert [r.path for r in sent] == ["/v1/models", "/v1/chat/completions"]
    assert sent[1].json()["model"] == MODEL
    assert (first.record.model, first.record.cache_hit) == (MODEL, False)
    assert (second.record.model, second.record.cache_hit, second.text) == (MODEL, True, first.text)


async def test_the_remembered_model_holds_no_credentials(tmp_path: Path) -> None:
    from llmchat.core import ReplyCache

    secret = "pw-5f0c1e2d3b4a6978"
    with_creds = f"http://user:{secret}@127.0.0.1:9/v1/?api_key={secret}"
    assert ReplyCache.server_model_key(base_url=with_creds) == ReplyCache.server_model_key(
        base_url="http://127.0.0.1:9/v1")
    cache = ReplyCache(CacheSettings(path=str(tmp_path / "cache")))
    try:
        await cache.remember_server_model(with_creds, "m1")
        fresh = ReplyCache(CacheSettings(path=str(tmp_path / "cache")))
        try:
            assert await fresh.server_model("http://127.0.0.1:9/v1") == "m1"
            assert await fresh.server_model("http://127.0.0.1:10/v1") is None
            assert (fresh.hits, fresh.misses) == (0, 0)  # not a reply lookup: the hit ratio ignores it
        finally:
            await fresh.aclose()
    finally:
        await cache.aclose()
    for path in (tmp_path / "cache").rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes()
