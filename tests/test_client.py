"""ChatClient against the local server over real sockets: HTTP/1.1, h2c and TLS h2."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from llmchat.core import (
    Bus,
    CacheSettings,
    ChatClient,
    Chunk,
    FirstToken,
    HttpSettings,
    RequestDone,
    RequestStarted,
    Settings,
)
from llmchat.core.server import RunningServer
from llmchat.tui.cli import main

Factory = Callable[..., RunningServer]

MSG = [{"role": "user", "content": "tell me about pools"}]
MODEL = "llmchat-local"


def _settings(tmp_path: Path, **http: Any) -> Settings:
    return replace(Settings(), http=replace(HttpSettings(), **http),
                   cache=CacheSettings(path=str(tmp_path / "cache")))


PROTOCOLS = [
    pytest.param("h2c", "HTTP/2", id="h2c"),
    pytest.param(False, "HTTP/1.1", id="http1"),
]


@pytest.mark.parametrize(("http2", "version"), PROTOCOLS)
async def test_stream_records_every_phase(local_server: RunningServer, tmp_path: Path, http2: object,
                                          version: str) -> None:
    async with ChatClient(_settings(tmp_path), base_url=local_server.base_url, model=MODEL,
                          http2=http2) as client:  # type: ignore[arg-type]
        stream = client.stream(MSG, max_tokens=50)
        pieces = [p async for p in stream]
        r = stream.record
    assert "".join(pieces) == stream.text and len(pieces) > 10
    assert r.http_version == version and r.status == 200 and r.error is None
    assert not r.connection_reused and r.connect_ms is not None and r.tls_ms is None
    # Every stamp in order: start <= connect <= send <= headers <= first token <= last token <= end.
    p = r.phases
    assert p.start_ns <= p.connect_start_ns <= p.connect_end_ns <= p.send_start_ns <= p.headers_ns  # type: ignore[operator]
    assert p.headers_ns <= r.first_token_ns <= r.last_token_ns <= r.end_ns  # type: ignore[operator]
    assert r.ttfb_ms <= r.ttft_ms <= r.total_ms  # type: ignore[operator]
    # Usage from the server wins over counting chunks; the server sent 50 tokens.
    assert r.usage_from_server and r.output_tokens == 50 and r.prompt_tokens
    assert len(r.chunk_ns) == r.content_chunks == len(pieces)
    # The instant profile may deliver every token in one read: TPOT is then 0 and no rate is claimed.
    assert r.tpot_ms is not None and (r.tokens_per_s is None) == (r.tpot_ms == 0)
    assert r.finish_reason == "length"
    assert r.server_timing and r.server_timing["first_token_ns"] <= r.server_timing["last_token_ns"]
    # The server stamped its first token before we received it, on the same monotonic clock.
    assert r.to_mono_ns(r.first_token_ns) >= r.server_timing["first_token_ns"]  # type: ignore[arg-type]


async def test_paced_stream_has_a_token_rate(server_factory: Factory, tmp_path: Path) -> None:
    server = server_factory(tokens_per_s=400)
    async with ChatClient(_settings(tmp_path), base_url=server.base_url, model=MODEL, http2="h2c") as c:
        stream = c.stream(MSG, max_tokens=20)
        _ = [p async for p in stream]
    r = stream.record
    assert r.content_chunks > 1 and r.tpot_ms and r.tpot_ms > 0
    assert r.tokens_per_s == pytest.approx(1000.0 / r.tpot_ms)
    assert len(r.itl_ms) == r.content_chunks - 1 and all(g >= 0 for g in r.itl_ms)


async def test_second_request_reuses_the_connection(local_server: RunningServer, tmp_path: Path) -> None:
    async with ChatClient(_settings(tmp_path), base_url=local_server.base_url, model=MODEL, http2="h2c") as c:
        first = c.stream(MSG, max_tokens=5)
        _ = [p async for p in first]
        second = c.stream(MSG, max_tokens=5)
        _ = [p async for p in second]
    assert not first.record.connection_reused and second.record.connection_reused
    assert second.record.connect_ms is None


async def test_tls_negotiates_http2_by_alpn(tls_server: RunningServer, tmp_path: Path) -> None:
    settings = _settings(tmp_path, verify=tls_server.cert_path)
    async with ChatClient(settings, base_url=tls_server.base_url, model=MODEL) as client:
        stream = client.stream(MSG, max_tokens=10)
        text = "".join([p async for p in stream])
    assert text and stream.record.http_version == "HTTP/2"
    assert stream.record.tls_ms is not None and stream.record.tls_ms > 0


async def test_tls_with_http2_off_stays_on_http1(tls_server: RunningServer, tmp_path: Path) -> None:
    settings = _settings(tmp_path, verify=tls_server.cert_path, http2=False)
    async with ChatClient(settings, base_url=tls_server.base_url, model=MODEL) as client:
        reply = await client.complete(MSG, max_tokens=5)
    assert reply.text and reply.record.http_version == "HTTP/1.1"


async def test_plain_http_with_http2_true_is_http1(local_server: RunningServer, tmp_path: Path) -> None:
    # http2 = true means "by ALPN over TLS"; Ollama and llama.cpp speak no h2c, so plain http stays HTTP/1.1.
    async with ChatClient(_settings(tmp_path), base_url=local_server.base_url, model=MODEL, http2=True) as c:
        reply = await c.complete(MSG, max_tokens=5)
    assert reply.record.http_version == "HTTP/1.1"


async def test_bus_sees_the_request_as_it_happens(local_server: RunningServer, tmp_path: Path) -> None:
    bus = Bus()
    seen: list[str] = []
    bus.subscribe(RequestStarted, lambda e: seen.append("started"))
    bus.subscribe(FirstToken, lambda e: seen.append("first"))
    bus.subscribe(Chunk, lambda e: seen.append("chunk"))
    done: list[RequestDone] = []
    bus.subscribe(RequestDone, done.append)
    async with ChatClient(_settings(tmp_path), base_url=local_server.base_url, model=MODEL, http2="h2c",
                          bus=bus) as client:
        stream = client.stream(MSG, max_tokens=8)
        pieces = [p async for p in stream]
    assert seen[0] == "started" and seen[1] == "first"
    assert seen.count("chunk") == len(pieces)
    assert len(done) == 1 and done[0].record is stream.record and done[0].record.end_ns is not None


async def test_breaking_out_marks_the_record_cancelled(local_server: RunningServer, tmp_path: Path) -> None:
    async with ChatClient(_settings(tmp_path), base_url=local_server.base_url, model=MODEL, http2="h2c") as c:
        stream = c.stream(MSG, max_tokens=100)
        got = []
        async for piece in stream:
            got.append(piece)
            if len(got) == 3:
                break
        await stream.aclose()
        # The pool survives a cancelled stream: the next request works.
        again = await c.complete(MSG, max_tokens=3)
    assert stream.record.cancelled and stream.text == "".join(got)
    assert again.text


async def test_task_cancel_keeps_partial_text(server_factory: Factory, tmp_path: Path) -> None:
    server = server_factory(tokens_per_s=200)
    async with ChatClient(_settings(tmp_path), base_url=server.base_url, model=MODEL, http2="h2c") as c:
        stream = c.stream(MSG, max_tokens=300)
        three = asyncio.Event()
        got: list[str] = []

        async def consume() -> None:
            async for piece in stream:
                got.append(piece)
                if len(got) >= 3:
                    three.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(three.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)
    assert stream.record.cancelled and stream.text == "".join(got) and len(got) >= 3


async def test_complete_and_cache(local_server: RunningServer, tmp_path: Path) -> None:
    async with ChatClient(_settings(tmp_path), base_url=local_server.base_url, model=MODEL, http2="h2c") as c:
        a = await c.complete(MSG, temperature=0, max_tokens=20)
        b = await c.complete(MSG, temperature=0, max_tokens=20)
        streamed = c.stream(MSG, temperature=0, max_tokens=20)
        s_text = "".join([p async for p in streamed])
    assert not a.record.cache_hit and b.record.cache_hit and a.text == b.text
    assert b.record.attempts == 0 and b.record.output_tokens == a.record.output_tokens
    # A stream and a batch request for the same thing get the same reply from the server.
    assert s_text == a.text and not streamed.record.cache_hit
    assert a.record.mode == "batch" and a.record.ttft_ms is None and a.record.tokens_per_s


async def test_deterministic_replies_differ_by_seed(local_server: RunningServer, tmp_path: Path) -> None:
    async with ChatClient(_settings(tmp_path), base_url=local_server.base_url, model=MODEL, use_cache=False) as c:
        one = await c.complete(MSG, seed=1, max_tokens=40)
        again = await c.complete(MSG, seed=1, max_tokens=40)
        other = await c.complete(MSG, seed=2, max_tokens=40)
    assert one.text == again.text and one.text != other.text


async def test_embeddings(local_server: RunningServer, tmp_path: Path) -> None:
    async with ChatClient(_settings(tmp_path), base_url=local_server.base_url, model=MODEL) as c:
        v = await c.embed(["alpha", "beta"])
        w = await c.embed(["alpha"])
    assert len(v) == 2 and len(v[0]) == 256 and v[0] != v[1]
    assert w[0] == pytest.approx(v[0], rel=1e-6)
    assert abs(sum(x * x for x in v[0]) - 1.0) < 1e-3


async def test_model_defaults_to_the_first_the_server_lists(
    local_server: RunningServer, tmp_path: Path
) -> None:
    async with ChatClient(_settings(tmp_path), base_url=local_server.base_url) as c:
        models = await c.models()
        stream = c.stream(MSG, max_tokens=3)
        _ = [p async for p in stream]
    assert stream.model == models[0] and stream.record.model == models[0]


@pytest.mark.parametrize("flags", [[], ["--http1"], ["--batch"]], ids=["h2c", "http1", "batch"])
def test_ask_json_prints_a_full_record(
    local_server: RunningServer, capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    status = main(["ask", "hello", "--json", "--base-url", local_server.base_url, "--model", MODEL,
                   "--max-tokens", "12", *flags])
    out = capsys.readouterr().out
    assert status == 0
    obj = json.loads(out)
    for key in ("reply", "model", "mode", "http_version", "connection_reused", "status", "ttfb_ms", "ttft_ms",
                "total_ms", "tpot_ms", "itl_ms_p50", "output_tokens", "tokens_per_s", "retries", "cache_hit",
                "error"):
        assert key in obj, key
    assert obj["reply"] and obj["status"] == 200 and obj["error"] is None and obj["output_tokens"] == 12
    # --base-url over plain http with http2 on by default stays on HTTP/1.1 (no h2c unless asked)
    assert obj["http_version"] == "HTTP/1.1"
    assert obj["mode"] == ("batch" if "--batch" in flags else "stream")


def test_ask_over_tls_h2(
    tls_server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'[http]\nverify = "{tls_server.cert_path}"\n', encoding="utf-8")
    status = main(["--config", str(config), "ask", "hi", "--json", "--base-url", tls_server.base_url,
                   "--model", MODEL, "--max-tokens", "5"])
    obj = json.loads(capsys.readouterr().out)
    assert status == 0 and obj["http_version"] == "HTTP/2" and obj["connection_reused"] is False


def test_ask_streams_text_and_stats(local_server: RunningServer, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["ask", "hello", "--stats", "--base-url", local_server.base_url, "--model", MODEL,
                   "--max-tokens", "12"])
    captured = capsys.readouterr()
    assert status == 0 and captured.out.strip()
    line = captured.err.strip().splitlines()[-1]
    assert line.startswith("llmchat: HTTP/1.1") and "ttft" in line and "12 tokens" in line


def test_ask_reads_stdin(
    local_server: RunningServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("from stdin"))
    status = main(["ask", "-", "--json", "--base-url", local_server.base_url, "--model", MODEL,
                   "--max-tokens", "30"])
    assert status == 0 and "from stdin" in json.loads(capsys.readouterr().out)["reply"]


def test_ask_with_no_provider_uses_the_local_server(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["ask", "hello", "--json", "--max-tokens", "5"])
    captured = capsys.readouterr()
    assert status == 0 and "local server (offline demo)" in captured.err
    obj = json.loads(captured.out)
    assert obj["http_version"] == "HTTP/2" and obj["model"] == MODEL


def test_ask_empty_prompt_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ask", "  "]) == 2
    assert "prompt is empty" in capsys.readouterr().err
