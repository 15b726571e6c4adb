"""The request log: real requests against the local server, the lines they leave in a real file."""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from llmchat.core import (
    AuthError,
    CacheSettings,
    ChatClient,
    LogSettings,
    RetrySettings,
    Settings,
    StreamCutError,
)
from llmchat.core.errors import ConfigError
from llmchat.core.observe import _requestlog as _requestlog
from llmchat.core.observe._attribution import attribute
from llmchat.core.observe._bus import Bus
from llmchat.core.observe._requestlog import RequestLog, attach_observers
from llmchat.core.server import RunningServer

KEY = "sk-llmchat-test-" + "9f3a" * 8  # what the server demands; must never reach the log
MODEL = "llmchat-local"
PROMPT = "A secret prompt about otters"
WAIT_S = 10.0


def _settings(tmp_path: Path, **log: Any) -> Settings:
    return Settings(
        cache=CacheSettings(path=str(tmp_path / "cache")),
        log=LogSettings(requests_path=str(tmp_path / "logs" / "requests.jsonl"), **log),
        retry=RetrySettings(max_attempts=1),
    )


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


async def _run_a_mix(server: RunningServer, settings: Settings, key: str = KEY) -> tuple[str, str]:
    """Two streams, a batch reply asked twice (the second from the cache), embeddings, and a refused key."""
    messages = [{"role": "user", "content": PROMPT}]
    bus = Bus()
    observers = attach_observers(bus, settings)
    try:
        async with ChatClient(settings, base_url=server.base_url, api_key=key, model=MODEL, http2="h2c",
                              bus=bus) as client:
            for _ in range(2):
                stream = client.stream(messages, max_tokens=30)
                async for _ in stream:
                    pass
            reply = await client.complete(messages, max_tokens=30, temperature=0)
            again = await client.complete(messages, max_tokens=30, temperature=0)
            assert again.record.cache_hit
            await client.embed(["otters", "beavers"])
        async with ChatClient(settings, base_url=server.base_url, api_key="sk-wrong-" + "77" * 10,
                              model=MODEL, bus=bus) as wrong:
            with pytest.raises(AuthError):
                await wrong.complete(messages, max_tokens=5)
    finally:
        await observers.aclose()
    return stream.text, reply.text


async def test_one_line_per_request_with_its_figures_and_no_key_or_text(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    server = server_factory(profile="instant", api_key=KEY)
    settings = _settings(tmp_path)
    stream_text, reply_text = await _run_a_mix(server, settings)
    path = Path(settings.log.requests_path)
    raw = path.read_text(encoding="utf-8")
    lines = _lines(path)
    assert [(e["mode"], e["cache_hit"], e["status"], e["error_kind"]) for e in lines] == [
        ("stream", False, 200, None),
        ("stream", False, 200, None),
        ("batch", False, 200, None),
        ("batch", True, None, None),
        ("embed", False, 200, None),
        ("batch", False, 401, "http_401"),
    ]
    assert len({e["request_id"] for e in lines}) == 6
    first = lines[0]
    assert first["http_version"] == "HTTP/2" and first["model"] == MODEL and first["output_tokens"] == 30
    assert isinstance(first["ttft_ms"], float) and isinstance(first["total_ms"], float)
    assert first["total_ms"] >= first["ttft_ms"] > 0
    assert lines[1]["connection_reused"] is True
    assert "401" in str(lines[-1]["error"])
    for secret in (KEY, "sk-wrong-", "77" * 10):
        assert secret not in raw
    for text in (PROMPT, stream_text[:40], reply_text[:40]):
        assert text not in raw
    assert all("messages" not in e and "reply" not in e for e in lines)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


async def test_include_text_adds_the_messages_and_the_reply(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    server = server_factory(profile="instant", api_key=KEY)
    settings = _settings(tmp_path, include_text=True)
    stream_text, reply_text = await _run_a_mix(server, settings)
    lines = _lines(Path(settings.log.requests_path))
    assert lines[1]["messages"] == [{"role": "user", "content": PROMPT}]
    assert lines[1]["reply"] == stream_text and lines[2]["reply"] == reply_text
    assert lines[3]["reply"] == reply_text  # the cache hit gave the same text
    assert lines[4]["messages"] == [] and lines[4]["reply"] is None  # embeddings: inputs are not logged
    assert lines[5]["messages"] == [{"role": "user", "content": PROMPT}] and lines[5]["reply"] is None
    assert KEY not in Path(settings.log.requests_path).read_text(encoding="utf-8")


async def test_a_cut_stream_logs_its_error_and_the_text_that_arrived(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    server = server_factory(profile="instant", drop_rate=1.0, tokens_per_s=2000)
    settings = _settings(tmp_path, include_text=True)
    log = RequestLog(settings.log)
    async with ChatClient(settings, base_url=server.base_url, model=MODEL, use_cache=False) as client:
        log.subscribe(client.bus)
        stream = client.stream([{"role": "user", "content": PROMPT}], max_tokens=100)
        with pytest.raises(StreamCutError):
            async for _ in stream:
                pass
    await log.aclose()
    (entry,) = _lines(Path(settings.log.requests_path))
    assert entry["error_kind"] == "stream_cut" and entry["reply"] == stream.text and stream.text


async def test_lines_are_appended_and_a_loose_file_is_made_private(
    local_server: RunningServer, tmp_path: Path
) -> None:
    settings = _settings(tmp_path)
    path = Path(settings.log.requests_path)
    path.parent.mkdir()
    path.write_text('{"earlier": true}\n', encoding="utf-8")
    path.chmod(0o644)
    for _ in range(2):
        log = RequestLog(settings.log)
        async with ChatClient(settings, base_url=local_server.base_url, model=MODEL, use_cache=False) as c:
            log.subscribe(c.bus)
            await c.complete([{"role": "user", "content": "hi"}], max_tokens=3)
        await log.aclose()
        assert log.written == 1 and log.dropped == 0
    lines = _lines(path)
    assert lines[0] == {"earlier": True} and len(lines) == 3
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_path_that_cannot_be_opened_is_one_line_naming_it(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("", encoding="utf-8")
    target = blocker / "requests.jsonl"  # a folder that is a file
    with pytest.raises(ConfigError) as caught:
        RequestLog(LogSettings(requests_path=str(target)))
    message = str(caught.value)
    assert message.startswith("log.requests_path: cannot open") and str(target) in message
    assert "\n" not in message and "writable" in message


def test_no_path_means_no_file_and_nothing_attached(tmp_path: Path) -> None:
    bus = Bus()
    observers = attach_observers(bus, Settings())
    assert not observers.request_log.enabled
    from llmchat.core.observe._bus import RequestDone

    assert not bus.wants(RequestDone)
    observers.close()
    assert list(tmp_path.iterdir()) == []


def test_a_stuck_disk_never_blocks_the_caller_and_drops_what_does_not_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A FIFO nobody reads stands in for a disk that stopped: the writer thread blocks in write() once the
    # pipe's buffer is full, and put() must still return at once.
    monkeypatch.setattr(_requestlog, "_QUEUE_MAX", 8)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        log = RequestLog(LogSettings(requests_path=str(fifo)))
        line = json.dumps({"pad": "x" * 4000}) + "\n"
        total = 200  # ~800 KB: far more than a pipe buffer and the queue hold
        done = threading.Event()

        def produce() -> None:
            for _ in range(total):
                log.put(line)
            done.set()

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        assert done.wait(WAIT_S), "put() blocked behind a stuck writer"
        assert log.dropped > 0
        received = bytearray()

        def drain() -> None:
            while True:
                try:
                    chunk = os.read(reader, 1 << 16)
                except BlockingIOError:
                    if log.flush(0.05):
                        # Everything is written now, but the last lines may have landed in the pipe while
                        # flush() waited: read what is left before stopping.
                        while True:
                            try:
                                rest = os.read(reader, 1 << 16)
                            except BlockingIOError:
                                return
                            received.extend(rest)
                    continue
                received.extend(chunk)

        drainer = threading.Thread(target=drain, daemon=True)
        drainer.start()
        drainer.join(WAIT_S)
        assert not drainer.is_alive()
        assert log.flush(WAIT_S)
        assert log.written + log.dropped == total
        assert received.count(b"\n") == log.written
        log.close()
    finally:
        os.close(reader)


async def test_close_twice_and_put_after_close_are_harmless(tmp_path: Path) -> None:
    log = RequestLog(LogSettings(requests_path=str(tmp_path / "r.jsonl")))
    log.put('{"a":1}\n')
    await log.aclose()
    await log.aclose()
    log.put('{"b":2}\n')
    assert log.written == 1 and log.dropped == 1
    assert (tmp_path / "r.jsonl").read_text(encoding="utf-8") == '{"a":1}\n'


def test_the_summary_written_has_no_field_for_headers_keys_or_text() -> None:
    # The log writes record.summary(): nothing in it may carry a header, a URL with a key, or text.
    from llmchat.core import TimingRecord

    keys = set(TimingRecord().summary())
    assert not keys & {"headers", "url", "api_key", "authorization", "messages", "reply", "text"}


def test_close_gives_up_on_a_stuck_disk_within_its_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_requestlog, "_QUEUE_MAX", 2)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # opened, never read: writes block once it is full
    try:
        log = RequestLog(LogSettings(requests_path=str(fifo)))
        for _ in range(100):
            log.put("x" * 200_000 + "\n")  # one line is more than a pipe holds
        closer = threading.Thread(target=log.close, kwargs={"timeout": 0.5}, daemon=True)
        closer.start()
        closer.join(WAIT_S)
        assert not closer.is_alive(), "close() hung behind a stuck writer"
        assert not log.flush(0.1)
    finally:
        os.close(reader)


async def test_each_line_carries_where_its_time_went(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    server = server_factory(profile="instant", ttft_ms=15.0, tokens_per_s=2000)
    settings = _settings(tmp_path)
    log = RequestLog(settings.log)
    records = []
    async with ChatClient(settings, base_url=server.base_url, model=MODEL, http2="h2c") as client:
        log.subscribe(client.bus)
        for _ in range(2):
            stream = client.stream([{"role": "user", "content": PROMPT}], max_tokens=20)
            async for _ in stream:
                pass
            records.append(stream.record)
        for _ in range(2):  # a miss, then a hit
            records.append((await client.complete([{"role": "user", "content": PROMPT}], max_tokens=5,
                                                  temperature=0)).record)
    await log.aclose()
    lines: list[dict[str, Any]] = _lines(Path(settings.log.requests_path))
    assert [e["request_id"] for e in lines] == [r.request_id for r in records]
    splits = [e["attribution"] for e in lines]
    for entry, split, record in zip(lines, splits, records, strict=True):
        assert split == attribute(record).to_dict()  # the engine's own attribution, as JSON
        assert split["total_ms"] == pytest.approx(entry["total_ms"], abs=0.002)
        assert sum(p["ms"] for p in split["parts"]) == pytest.approx(split["total_ms"], abs=0.01)
    keys = [{p["key"] for p in split["parts"]} for split in splits]
    assert {"server_prefill", "server_generation", "network_first_token"} <= keys[0]
    assert splits[0]["reporter"] == "llmchat serve"
    assert splits[3]["flags"] == ["cache_hit"] and keys[3] == {"cache", "unexplained"}
