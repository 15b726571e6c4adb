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


#: A reply long enough that the server is still generating it seconds after a cancel: llama-server with
#: room for it in its window (one slot of 8,192) and --ignore-eos, so the tiny model never stops early.
LONG_TOKENS = 6000


async def test_cancel_over_tls_h2_ends_the_request_at_nginx_at_once(
    llama_factory: Callable[..., LlamaServer], nginx_factory: Callable[[LlamaServer], Nginx]
) -> None:
    server = llama_factory(n_ctx=8192, parallel=1, extra=("--ignore-eos",))
    nginx = nginx_factory(server)
    async with _client(nginx.tls_url, http2=True, verify=nginx.ca_file) as client:
        stream = client.stream(MSG, max_tokens=LONG_TOKENS)
        pieces = 0
        async for _ in stream:
            pieces += 1
            if pieces == 3:
                break  # Esc after the first tokens
        await stream.aclose()
        cancelled_at = time.monotonic()
        assert stream.record.http_version == "HTTP/2"
        # nginx logs the request once it ends, within a second of the reset, not when llama-server would have
        # finished its thousands of tokens (without the reset: seconds later, with every byte of them). The
        # status is the 200 it had already sent; the bytes are the few chunks before the cancel.
        await _until(lambda: len(_chat_lines(nginx.access_log_text())) >= 1, "the cancelled request's log line",
                     within=1.0)
        status, sent, protocol = _chat_lines(nginx.access_log_text())[-1]
        assert protocol == "HTTP/2.0"
        assert status in (200, 499) and sent < LONG_TOKENS * 10, (status, sent)
        # And the server stopped: its slot is free for the next request at once, which is answered whole on
        # the same connection.
        again = await client.complete(MSG, max_tokens=4)
        assert time.monotonic() - cancelled_at < 2.0
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
    assert "client_max_body_size" in str(caught.value), "the fix named is the request's size, not the URL"
    assert stream.record.attempts == 1 and stream.record.retries == []
    assert stream.record.http_version == "HTTP/2"
    assert took < 10.0
