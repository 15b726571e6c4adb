"""HTTP/2 stream life cycle against llama.cpp's server and nginx (issue 21): a cancel reaches the server at
once, h2c to an HTTP/1.1-only server fails in one round trip, llama-server's close after every stream costs
no retry per request, and nginx's 413 while the body uploads is one clear line with no retry.

Needs the real-peer tier's fixtures (``llama_server``, ``nginx``, in tests/realpeer/conftest.py).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from llamacpp import LlamaServer
from nginx_peer import Nginx

from llmchat.core import ChatClient, HttpSettings, RetrySettings, Settings, errors

pytestmark = pytest.mark.realpeer

MODEL = "tiny"  # llama-server serves its one model under any name
MSG = [{"role": "user", "content": "Count from one to a thousand, in words."}]
DEADLINE_S = 20.0
_LOG_LINE = re.compile(r'^(\d{3}) (\d+) ([\d.]+) (\S+) "(\S+) (\S+) [^"]*"$')


def _client(base_url: str, *, http2: Any, verify: Any = True, retries: int = 4) -> ChatClient:
    base = HttpSettings(http2=http2, warmup=False, verify=verify, read_timeout_s=30.0)
    settings = replace(Settings(), http=base)
    return ChatClient(settings, base_url=base_url, model=MODEL, use_cache=False,
                      retry=RetrySettings(max_attempts=retries, base_delay_s=0.05, max_delay_s=0.2))


async def _until(condition: Callable[[], bool], what: str, within: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"not within {within} s: {what}"
        await asyncio.sleep(0.02)


def _chat_lines(log: str) -> list[tuple[int, int, str]]:
    """(status, bytes, protocol) of each chat completion in nginx's access log."""
    out = []
    for line in log.splitlines():
        m = _LOG_LINE.match(line.strip())
        if m and m[6].endswith("/chat/completions"):
            out.append((int(m[1]), int(m[2]), m[4]))
    return out


async def test_cancel_over_tls_h2_ends_the_request_at_nginx_at_once(nginx: Nginx) -> None:
    before = len(_chat_lines(nginx.access_log_text()))
    async with _client(nginx.tls_url, http2=True, verify=nginx.ca_file) as client:
        # A full reply first, so "less than a full reply" has a measure.
        full = client.stream(MSG, max_tokens=200)
        async for _ in full:
            pass
        await _until(lambda: len(_chat_lines(nginx.access_log_text())) >= before + 1, "the full reply's log line")
        full_bytes = _chat_lines(nginx.access_log_text())[-1][1]

        stream = client.stream(MSG, max_tokens=200)
        pieces = 0
        async for _ in stream:
            pieces += 1
            if pieces == 3:
                break  # Esc after the first tokens
        await stream.aclose()
        assert stream.record.http_version == "HTTP/2"
        # nginx logs the request once it ends: a reset stream is 499 (or fewer bytes than a whole reply), and
        # within a second, not when llama-server would have finished the 200 tokens.
        await _until(lambda: len(_chat_lines(nginx.access_log_text())) >= before + 2, "the cancelled request's log "
                     "line", within=1.0)
        status, sent, protocol = _chat_lines(nginx.access_log_text())[-1]
        assert protocol == "HTTP/2.0"
        assert status == 499 or sent < full_bytes, (status, sent, full_bytes)
        again = await client.complete(MSG, max_tokens=4)  # the same client, the same connection, still good
    assert again.text and again.record.error is None and again.record.connection_reused


async def test_h2c_straight_to_llama_server_fails_in_one_line_at_once(llama_server: LlamaServer) -> None:
    async with _client(llama_server.base_url, http2="h2c") as client:
        started = time.monotonic()
        stream = client.stream(MSG, max_tokens=4)
        with pytest.raises(errors.ProtocolError) as caught:
            async for _ in stream:
                pass
        took = time.monotonic() - started
    message = str(caught.value)
    assert "this server does not speak h2c" in message and "set http2 = false (or true over https)" in message
    assert "\n" not in message and "Traceback" not in message
    assert stream.record.attempts == 1 and stream.record.retries == []
    assert took < 2.0, f"took {took:.1f} s: the read timeout, not the server's answer"


async def test_sequential_requests_over_http11_pay_no_stale_connection_retry(llama_server: LlamaServer) -> None:
    # llama-server closes after every stream without saying so: at most the first reuse finds out, after
    # which the pool opens a fresh connection each time.
    records = []
    async with _client(llama_server.base_url, http2=False) as client:
        for _ in range(12):
            stream = client.stream(MSG, max_tokens=3)
            async for _ in stream:
                pass
            records.append(stream.record)
    stale = [r for r in records if any(e.reason == "stale connection" for e in r.retries)]
    assert all(r.error is None for r in records)
    assert len(stale) <= 1, [len(r.retries) for r in records]
    assert sum(r.phases.closes_after_response for r in records) <= 1


async def test_an_over_large_body_through_tls_h2_is_nginx_413_with_no_retry(nginx: Nginx) -> None:
    big = [{"role": "user", "content": "x" * 3_000_000}]  # past the fixture's client_max_body_size 1m
    async with _client(nginx.tls_url, http2=True, verify=nginx.ca_file) as client:
        stream = client.stream(big, max_tokens=4)
        started = time.monotonic()
        with pytest.raises(errors.HTTPStatusError) as caught:
            async for _ in stream:
                pass
        took = time.monotonic() - started
    assert caught.value.status == 413 and not caught.value.retryable
    assert "413" in str(caught.value) and "\n" not in str(caught.value)
    assert stream.record.attempts == 1 and stream.record.retries == []
    assert stream.record.http_version == "HTTP/2"
    assert took < 10.0
