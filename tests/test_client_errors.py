"""Every failure a user can meet, through ChatClient and the `llmchat ask` command line.

Each error must be a typed APIError whose ``str()`` is one line naming the cause and then the fix, that never
holds the API key (nor its tail), in the message, the repr, a formatted traceback or the timing record; a
failure mid-stream keeps the text that arrived. The tolerance tests feed the client what real servers send
(no role delta, empty deltas, reasoning deltas, no [DONE], a whole JSON reply, usage, errors inside the
stream).

Peers: the local server (``server_factory``, ``tls_server``) for faults it can play, and the raw peers of
``peers.py`` for what only a broken proxy or another server sends. Every socket is on 127.0.0.1; the one
exception is a name under the reserved ``.invalid`` TLD, which must fail to resolve.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import peers as P
import pytest

from llmchat.core import (
    APIError,
    AuthError,
    CacheSettings,
    ChatClient,
    ChatStream,
    Chunk,
    ConnectError,
    DisconnectedError,
    FirstToken,
    HttpSettings,
    NotFoundError,
    ProtocolError,
    ProviderSettings,
    RateLimitError,
    RetrySettings,
    ServerError,
    Settings,
    StreamCutError,
    TimeoutError,
    TimingRecord,
    TLSError,
)
from llmchat.core.server import RunningServer
from llmchat.tui.cli import main

Factory = Callable[..., RunningServer]
MESSAGES = [{"role": "user", "content": "hi"}]
MODEL = "llmchat-local"
PEER_MODEL = "peer-model"
#: The key every client below sends: no error may show it, nor its last 8 characters.
KEY = "sk-test-" + "qwertyuiopasdfghjklzxcvb"
SERVER_KEY = "sk-test-" + "mnbvcxzlkjhgfdsapoiuytre"
KEY_ENV = "PEER_TEST_API_KEY"
FAST_RETRY = RetrySettings(max_attempts=2, base_delay_s=0.01, max_delay_s=0.05)
WAIT_S = 10.0
"""The bound on any one request here: far past what each needs, so a bug fails instead of hanging."""


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No real config, cache or key: fresh XDG homes, no OPENAI_* or LLMCHAT_* variables."""
    for var in list(os.environ):
        if var.startswith(("OPENAI_", "LLMCHAT_")) or var in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY",
                                                               "https_proxy", "http_proxy", "all_proxy"):
            monkeypatch.delenv(var)
    for name in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def settings(tmp_path: Path, **http: Any) -> Settings:
    return Settings(http=HttpSettings(**http), cache=CacheSettings(path=str(tmp_path / "cache")))


def client(base_url: str, tmp_path: Path, *, model: str = PEER_MODEL, retry: RetrySettings = FAST_RETRY,
           http2: Any = None, **http: Any) -> ChatClient:
    return ChatClient(settings(tmp_path, **http), base_url=base_url, api_key=KEY, model=model, retry=retry,
                      http2=http2)


async def drain(stream: ChatStream) -> tuple[str, APIError | None]:
    """The text the iterator yielded and the APIError that ended it (None for a clean end). Bounded."""
    pieces: list[str] = []

    async def run() -> None:
        async for piece in stream:
            pieces.append(piece)

    try:
        await asyncio.wait_for(run(), WAIT_S)
    except APIError as exc:
        return "".join(pieces), exc
    return "".join(pieces), None


async def fails(stream: ChatStream) -> tuple[str, APIError]:
    yielded, exc = await drain(stream)
    assert exc is not None, f"expected an error, the stream ended cleanly with {yielded!r}"
    return yielded, exc


async def batch_fails(c: ChatClient) -> APIError:
    with pytest.raises(APIError) as info:
        await asyncio.wait_for(c.complete(MESSAGES), WAIT_S)
    return info.value


def assert_no_secret(*texts: str, secrets: tuple[str, ...] = (KEY,)) -> None:
    for secret in secrets:
        for text in texts:
            assert secret not in text
            assert secret[-8:] not in text


def record_of(exc: APIError) -> TimingRecord:
    """The timing record the client attached to a failed request's error."""
    assert isinstance(exc.record, TimingRecord), "a failed request's error carries its timing record"
    return exc.record


def check_message(exc: APIError, cause: str, fix: str, *, secrets: tuple[str, ...] = (KEY,)) -> str:
    """``exc``'s message is one line holding ``cause`` and then ``fix``, and no secret is anywhere near it."""
    msg = str(exc)
    assert msg and "\n" not in msg and msg == msg.strip(), msg
    assert cause in msg, msg
    assert fix in msg, msg
    assert msg.index(cause) < msg.index(fix), f"the fix comes before the cause: {msg}"
    texts = [msg, repr(exc), "".join(traceback.format_exception(exc))]
    summary = record_of(exc).summary()
    texts.append(json.dumps(summary))
    assert summary["error"] == msg and summary["error_kind"] == exc.kind
    assert_no_secret(*texts, secrets=secrets)
    return msg


def check_partial(yielded: str, exc: APIError) -> None:
    """A mid-stream failure keeps exactly what the iterator yielded, and counts it."""
    assert yielded, "the failure came before any text: not a mid-stream failure"
    assert exc.partial_text == yielded
    assert exc.tokens_received > 0
    assert record_of(exc).output_tokens > 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def sse(*parts: P.Step) -> list[P.Step]:
    return [P.SSE_HEAD, *parts]


# -- connecting ---------------------------------------------------------------------------------------------
async def test_connection_refused_names_host_port_and_llmchat_serve(tmp_path: Path) -> None:
    port = free_port()
    async with client(f"http://127.0.0.1:{port}/v1", tmp_path) as c:
        _, exc = await fails(c.stream(MESSAGES))
    assert isinstance(exc, ConnectError)
    check_message(exc, f"connection refused by 127.0.0.1:{port}", "`llmchat serve`")
    # Nothing was sent, so it was worth retrying: the message says how often it was.
    assert record_of(exc).attempts == 2 and len(record_of(exc).retries) == 1
    assert str(exc).endswith("(after 2 attempts)")


async def test_dns_failure_names_the_host(tmp_path: Path) -> None:
    # RFC 2606 reserves .invalid: no resolver may answer it, so this is a DNS failure wherever it runs.
    host = "llmchat-test.invalid"
    async with client(f"http://{host}/v1", tmp_path, connect_timeout_s=2.0) as c:
        started = time.perf_counter_ns()
        _, exc = await fails(c.stream(MESSAGES))
    if isinstance(exc, TimeoutError) and exc.phase == "connect":
        took = (time.perf_counter_ns() - started) / 1e9
        pytest.skip(f"this machine's resolver timed out on {host} after {took:.1f} s instead of failing: "
                    "the DNS failure path cannot be reached deterministically here")
    assert isinstance(exc, ConnectError)
    check_message(exc, f"cannot resolve host {host}", "check the spelling of base_url")


async def test_tls_failure_says_to_set_http_verify(tls_server: RunningServer, tmp_path: Path) -> None:
    async with client(tls_server.base_url, tmp_path, model=MODEL) as c:
        _, exc = await fails(c.stream(MESSAGES))
    assert isinstance(exc, TLSError)
    msg = check_message(exc, f"TLS handshake with 127.0.0.1:{tls_server.port} failed", "http.verify")
    assert "certificate verify failed" in msg
    assert record_of(exc).attempts == 1  # a bad certificate does not fix itself
    # The same server with its certificate trusted answers: the failure was the trust, nothing else.
    async with client(tls_server.base_url, tmp_path, model=MODEL, verify=str(tls_server.cert_path)) as c:
        text, error = await drain(c.stream(MESSAGES, max_tokens=3))
    assert error is None and text


async def test_https_url_to_a_plain_http_server_says_check_the_scheme(
    local_server: RunningServer, tmp_path: Path
) -> None:
    async with client(f"https://127.0.0.1:{local_server.port}/v1", tmp_path, model=MODEL) as c:
        _, exc = await fails(c.stream(MESSAGES))
    assert isinstance(exc, TLSError)
    check_message(exc, f"TLS handshake with 127.0.0.1:{local_server.port} failed", "check base_url's scheme")


async def test_http_url_to_a_tls_server_says_use_https(tls_server: RunningServer, tmp_path: Path) -> None:
    async with client(f"http://127.0.0.1:{tls_server.port}/v1", tmp_path, model=MODEL, http2=False) as c:
        _, exc = await fails(c.stream(MESSAGES))
    assert isinstance(exc, DisconnectedError) and not exc.reused
    check_message(exc, "closed a new connection without sending a response", "base_url start with https://")
    assert record_of(exc).attempts == 1  # the same request would meet the same close


async def test_a_reset_before_any_response_is_a_close_not_a_retried_connect_error(
    peer: Callable[..., P.Peer], tmp_path: Path
) -> None:
    # What plain http to a TLS port meets when the server's TLS layer hangs up with the request unread: a TCP
    # reset instead of a FIN (the intermittent case of the test above). Same cause, same line, same decision.
    p = peer([], then="reset")
    async with client(p.base_url, tmp_path, http2=False) as c:
        _, exc = await fails(c.stream(MESSAGES))
    assert isinstance(exc, DisconnectedError) and not exc.reused
    check_message(exc, "closed a new connection without sending a response", "base_url start with https://")
    assert record_of(exc).attempts == 1 and p.requests == 1


# -- statuses -----------------------------------------------------------------------------------------------
async def test_401_names_the_env_var_that_supplied_the_key_never_the_key(
    server_factory: Factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = server_factory(profile="instant", api_key=SERVER_KEY)
    monkeypatch.setenv(KEY_ENV, KEY)
    provider = ProviderSettings(name="peer", base_url=server.base_url, api_key_env=KEY_ENV, model=MODEL)
    s = Settings(providers={"peer": provider}, cache=CacheSettings(path=str(tmp_path / "cache")))
    async with ChatClient(s, provider="peer", retry=FAST_RETRY) as c:
        assert c.endpoint.api_key == KEY  # the key did come from the variable
        _, exc = await fails(c.stream(MESSAGES))
        batch = await batch_fails(c)
    for e in (exc, batch):
        assert isinstance(e, AuthError) and e.status == 401
        check_message(e, "rejected the API key (HTTP 401", f"env {KEY_ENV}", secrets=(KEY, SERVER_KEY))
        assert record_of(e).attempts == 1  # a wrong key is not retried


async def test_404_lists_the_models_the_server_offers(local_server: RunningServer, tmp_path: Path) -> None:
    async with client(local_server.base_url, tmp_path, model="no-such-model") as c:
        _, exc = await fails(c.stream(MESSAGES))
        batch = await batch_fails(c)
    for e in (exc, batch):
        assert isinstance(e, NotFoundError) and e.status == 404
        msg = check_message(e, "no model 'no-such-model'", "--model")
        assert msg.endswith("available: " + ", ".join(local_server.settings.models))


async def test_429_with_a_wait_past_max_delay_fails_fast_and_says_when(
    server_factory: Factory, tmp_path: Path
) -> None:
    server = server_factory(profile="instant", rate_limit=1)
    retry = RetrySettings(max_attempts=2, base_delay_s=0.01, max_delay_s=1.0)
    async with client(server.base_url, tmp_path, model=MODEL, retry=retry) as c:
        text, first = await drain(c.stream(MESSAGES, max_tokens=3))
        assert first is None and text  # the one request the window allows
        started = time.perf_counter_ns()
        _, exc = await fails(c.stream(MESSAGES, max_tokens=3))
        took_s = (time.perf_counter_ns() - started) / 1e9
    assert isinstance(exc, RateLimitError) and exc.status == 429
    msg = check_message(exc, "rate limited (429): the server asks to wait", "retry.max_delay_s")
    assert "try again after " in msg
    # The server asked for up to a minute; failing fast means no attempt was spent waiting for it.
    assert record_of(exc).attempts == 1 and record_of(exc).retries == []
    assert took_s < 5.0


async def test_429_after_every_retry_is_spent(peer: Callable[..., P.Peer], tmp_path: Path) -> None:
    body = {"error": {"message": "Rate limit reached for requests", "type": "requests"}}
    limited = P.json_response(429, body, headers={"retry-after-ms": "20"})
    p = peer([limited], then="keep")
    async with client(p.base_url, tmp_path) as c:
        _, exc = await fails(c.stream(MESSAGES))
    assert isinstance(exc, RateLimitError)
    msg = check_message(exc, "is rate limiting (HTTP 429: Rate limit reached", "wait and try again")
    assert msg.endswith("(after 2 attempts)")
    record = record_of(exc)
    assert record.attempts == 2 and p.requests == 2
    [event] = record.retries
    assert (event.reason, event.wait_source, event.wait_s) == ("429", "retry-after-ms", 0.02)


@pytest.mark.parametrize("mode", ["stream", "batch"])
async def test_5xx_after_retries(server_factory: Factory, tmp_path: Path, mode: str) -> None:
    server = server_factory(profile="instant", error_rate=1.0)
    async with client(server.base_url, tmp_path, model=MODEL) as c:
        exc = (await fails(c.stream(MESSAGES)))[1] if mode == "stream" else await batch_fails(c)
    assert isinstance(exc, ServerError) and exc.status in (500, 502, 503)
    msg = check_message(exc, f"failed with HTTP {exc.status}", "try again later")
    assert msg.endswith("(after 2 attempts)")
    assert record_of(exc).attempts == 2
    assert len(record_of(exc).retries) == 1


# -- bodies that are not what the protocol says ------------------------------------------------------------
@pytest.mark.parametrize("mode", ["stream", "batch"])
async def test_html_502_from_a_proxy(peer: Callable[..., P.Peer], tmp_path: Path, mode: str) -> None:
    p = peer([P.NGINX_502], then="keep")
    async with client(p.base_url, tmp_path) as c:
        exc = (await fails(c.stream(MESSAGES)))[1] if mode == "stream" else await batch_fails(c)
    assert isinstance(exc, ServerError | ProtocolError) and exc.status == 502
    msg = check_message(exc, "answered HTTP 502 with an HTML page", "HTTPS_PROXY")
    assert f'("{P.NGINX_502_TITLE}")' in msg and "base_url" in msg
    assert p.requests == 2  # a gateway error may pass: it was retried once


@pytest.mark.parametrize("mode", ["stream", "batch"])
async def test_html_page_with_200_where_json_was_expected(
    peer: Callable[..., P.Peer], tmp_path: Path, mode: str
) -> None:
    page = b"\n\n  Please sign in to the guest network\n<p>...</p>"
    portal = P.response(200, page, content_type="text/html")
    p = peer([portal], then="keep")
    async with client(p.base_url, tmp_path) as c:
        exc = (await fails(c.stream(MESSAGES)))[1] if mode == "stream" else await batch_fails(c)
    assert isinstance(exc, ProtocolError)
    msg = check_message(exc, "answered HTTP 200 with an HTML page", "check base_url and HTTPS_PROXY")
    assert "Please sign in to the guest network" in msg  # no title: the first line of text


async def test_invalid_json_chunk_mid_stream_keeps_the_partial_text(
    peer: Callable[..., P.Peer], tmp_path: Path
) -> None:
    p = peer(sse(P.event(P.delta(role="assistant")), P.event(P.delta("Hello")), P.event(P.delta(" world")),
                 P.raw_line('data: {"choices": [oops'), P.event(P.delta(" lost")), P.DONE, P.END))
    async with client(p.base_url, tmp_path) as c:
        yielded, exc = await fails(c.stream(MESSAGES))
    assert isinstance(exc, ProtocolError)
    check_message(exc, "a stream chunk that is not JSON", "the partial reply is kept")
    check_partial(yielded, exc)
    assert yielded == "Hello world" and exc.tokens_received == 2


async def test_llama_cpp_bare_error_line_mid_stream(peer: Callable[..., P.Peer], tmp_path: Path) -> None:
    # llama.cpp's server writes this outside the SSE framing when generation fails after it started.
    line = 'error: {"code":500,"message":"context shift is disabled","type":"server_error"}'
    p = peer(sse(P.event(P.delta("Hello")), P.raw_line(line), P.END))
    async with client(p.base_url, tmp_path) as c:
        yielded, exc = await fails(c.stream(MESSAGES))
    assert isinstance(exc, ProtocolError)
    check_message(exc, "reported an error mid-stream: context shift is disabled", "the partial reply is kept")
    check_partial(yielded, exc)


async def test_error_object_mid_stream(peer: Callable[..., P.Peer], tmp_path: Path) -> None:
    error = {"error": {"message": "upstream model crashed", "type": "server_error", "code": "internal"}}
    p = peer(sse(P.event(P.delta("Hel")), P.event(P.delta("lo")), P.event(error), P.END))
    async with client(p.base_url, tmp_path) as c:
        yielded, exc = await fails(c.stream(MESSAGES))
    assert isinstance(exc, ProtocolError)
    check_message(exc, "reported an error mid-stream: upstream model crashed", "the partial reply is kept")
    check_partial(yielded, exc)
    assert yielded == "Hello"


# -- streams cut short --------------------------------------------------------------------------------------
@pytest.mark.parametrize("http2", [False, "h2c"], ids=["http1", "h2c"])
async def test_stream_cut_mid_way_keeps_the_text_and_counts_it(
    server_factory: Factory, tmp_path: Path, http2: Any
) -> None:
    server = server_factory(profile="instant", drop_rate=1.0)
    async with client(server.base_url, tmp_path, model=MODEL, http2=http2) as c:
        stream = c.stream(MESSAGES)
        yielded, exc = await fails(stream)
    assert isinstance(exc, StreamCutError)
    msg = check_message(exc, "dropped mid-reply", "try again")
    check_partial(yielded, exc)
    assert f"({exc.tokens_received} tokens arrived and are kept)" in msg
    assert exc.tokens_received == stream.record.content_chunks
    assert stream.record.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
    assert record_of(exc).attempts == 1  # never retried once text was shown


@pytest.mark.parametrize(("pieces", "count"), [(["Half"], "1 token arrived and is kept"),
                                               (["Half a", " sent"], "2 tokens arrived and are kept")])
async def test_stream_ending_with_neither_done_nor_finish_reason_is_cut(
    peer: Callable[..., P.Peer], tmp_path: Path, pieces: list[str], count: str
) -> None:
    p = peer(sse(P.event(P.delta(role="assistant")), *(P.event(P.delta(t)) for t in pieces), P.END))
    async with client(p.base_url, tmp_path) as c:
        yielded, exc = await fails(c.stream(MESSAGES))
    assert isinstance(exc, StreamCutError)
    msg = check_message(exc, "ended without [DONE] or a finish_reason", "try again")
    check_partial(yielded, exc)
    assert yielded == "".join(pieces) and exc.tokens_received == len(pieces)
    assert msg.endswith(f"({count})")


async def test_no_response_within_the_read_timeout(peer: Callable[..., P.Peer], tmp_path: Path) -> None:
    p = peer([], then="hang")
    async with client(p.base_url, tmp_path, read_timeout_s=0.3) as c:
        _, exc = await fails(c.stream(MESSAGES))
    assert isinstance(exc, TimeoutError) and exc.phase == "read"
    check_message(exc, "sent no response for 0.3 s", "raise http.read_timeout_s")
    assert p.requests == 1  # a read timeout is not retried: the server may be working on it


async def test_stall_mid_stream_past_the_read_timeout(peer: Callable[..., P.Peer], tmp_path: Path) -> None:
    p = peer(sse(P.event(P.delta(role="assistant")), P.event(P.delta("Still")), P.event(P.delta(" here"))),
             then="hang")
    async with client(p.base_url, tmp_path, read_timeout_s=0.3) as c:
        yielded, exc = await fails(c.stream(MESSAGES))
    assert isinstance(exc, TimeoutError) and exc.phase == "read"
    msg = check_message(exc, "stopped sending for 0.3 s (http.read_timeout_s) mid-reply", "raise "
                        "http.read_timeout_s")
    check_partial(yielded, exc)
    assert yielded == "Still here" and msg.endswith("(2 tokens arrived and are kept)")


@pytest.mark.parametrize("http2", [False, "h2c"], ids=["http1", "h2c"])
async def test_server_stall_past_the_read_timeout(
    server_factory: Factory, tmp_path: Path, http2: Any
) -> None:
    server = server_factory(profile="instant", stall_ms=3000)
    async with client(server.base_url, tmp_path, model=MODEL, http2=http2, read_timeout_s=0.3) as c:
        yielded, exc = await fails(c.stream(MESSAGES))
    assert isinstance(exc, TimeoutError) and exc.phase == "read"
    check_message(exc, "stopped sending for 0.3 s", "raise http.read_timeout_s")
    check_partial(yielded, exc)


# -- what real servers send ---------------------------------------------------------------------------------
async def test_content_without_a_role_delta_first(peer: Callable[..., P.Peer], tmp_path: Path) -> None:
    p = peer(sse(P.event(P.delta("No")), P.event(P.delta(" role")), P.event(P.delta(finish_reason="stop")),
                 P.DONE, P.END))
    async with client(p.base_url, tmp_path) as c:
        stream = c.stream(MESSAGES)
        text, exc = await drain(stream)
    assert exc is None and text == "No role" == stream.text
    assert stream.finish_reason == "stop" and stream.record.error is None


async def test_ttft_stamps_the_first_non_empty_content(peer: Callable[..., P.Peer], tmp_path: Path) -> None:
    gap_s = 0.05
    p = peer(sse(P.event(P.delta("", role="assistant")), P.event(P.delta("")), P.event(P.delta()),
                 P.Pause(gap_s), P.event(P.delta("First")), P.event(P.delta(" words")),
                 P.event(P.delta(finish_reason="stop")), P.DONE, P.END))
    chunk_stamps: list[int] = []
    first_tokens: list[int | None] = []
    async with client(p.base_url, tmp_path) as c:
        c.bus.subscribe(Chunk, lambda e: chunk_stamps.append(e.arrived_ns))
        c.bus.subscribe(FirstToken, lambda e: first_tokens.append(e.record.first_token_ns))
        stream = c.stream(MESSAGES)
        text, exc = await drain(stream)
    record = stream.record
    assert exc is None and text == "First words"
    assert record.first_token_ns == chunk_stamps[0] == record.chunk_ns[0]
    assert first_tokens == [record.first_token_ns]
    assert record.content_chunks == 2 and len(chunk_stamps) == 2
    # The peer sent the headers and the empty deltas at once, then paused: only the content counts.
    assert record.ttfb_ms is not None and record.ttft_ms is not None
    assert record.ttft_ms >= gap_s * 1000
    assert record.ttfb_ms < record.ttft_ms


async def test_reasoning_deltas_are_kept_apart_from_the_answer(
    peer: Callable[..., P.Peer], tmp_path: Path
) -> None:
    p = peer(sse(P.event(P.delta(role="assistant")), P.event(P.delta(reasoning_content="Think")),
                 P.event(P.delta(reasoning=" harder.")), P.event(P.delta("The answer")),
                 P.event(P.delta(" is 4.", finish_reason="stop")), P.DONE, P.END))
    async with client(p.base_url, tmp_path) as c:
        stream = c.stream(MESSAGES)
        text, exc = await drain(stream)
    assert exc is None
    assert text == stream.text == "The answer is 4."
    assert stream.reasoning == "Think harder."
    # Reasoning is not the answer: TTFT waits for the answer's first chunk.
    assert stream.record.content_chunks == 2


async def test_finish_reason_without_done_is_a_clean_end(peer: Callable[..., P.Peer], tmp_path: Path) -> None:
    p = peer(sse(P.event(P.delta("Short")), P.event(P.delta(finish_reason="length")), P.END))
    async with client(p.base_url, tmp_path) as c:
        stream = c.stream(MESSAGES)
        text, exc = await drain(stream)
    assert exc is None and text == "Short"
    assert stream.finish_reason == stream.record.finish_reason == "length"


async def test_a_whole_json_reply_to_a_stream_request(peer: Callable[..., P.Peer], tmp_path: Path) -> None:
    p = peer([P.json_response(200, P.completion("All at once"))])
    async with client(p.base_url, tmp_path) as c:
        stream = c.stream(MESSAGES)
        text, exc = await drain(stream)
    assert exc is None and text == "All at once"
    assert stream.finish_reason == "stop"
    assert stream.record.output_tokens == 2 and stream.record.usage_from_server


async def test_usage_chunk_sets_the_token_counts(peer: Callable[..., P.Peer], tmp_path: Path) -> None:
    p = peer(sse(P.event(P.delta("Two")), P.event(P.delta(" chunks", finish_reason="stop")),
                 P.event(P.usage_chunk(11, 7)), P.DONE, P.END))
    async with client(p.base_url, tmp_path) as c:
        stream = c.stream(MESSAGES)
        text, exc = await drain(stream)
    assert exc is None and text == "Two chunks"
    record = stream.record
    # The server's count wins over the number of chunks (a chunk may carry several tokens).
    assert record.content_chunks == 2
    assert (record.output_tokens, record.prompt_tokens, record.usage_from_server) == (7, 11, True)


# -- the command line ---------------------------------------------------------------------------------------
def ask(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["ask", *argv, "hi"])
    out, err = capsys.readouterr()
    return status, out, err


def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("llmchat: ")
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Fast retries and a bounded read timeout for commands run in-process, set the way a user would."""
    monkeypatch.setenv("LLMCHAT_RETRY__MAX_ATTEMPTS", "2")
    monkeypatch.setenv("LLMCHAT_RETRY__BASE_DELAY_S", "0.01")
    monkeypatch.setenv("LLMCHAT_RETRY__MAX_DELAY_S", "0.05")
    monkeypatch.setenv("LLMCHAT_HTTP__READ_TIMEOUT_S", "5")
    return monkeypatch


def test_cli_connection_refused(capsys: pytest.CaptureFixture[str], cli_env: pytest.MonkeyPatch) -> None:
    port = free_port()
    status, out, err = ask(capsys, "--base-url", f"http://127.0.0.1:{port}/v1", "--model", "m")
    assert status == 1 and out == ""
    line = one_error_line(err)
    assert f"connection refused by 127.0.0.1:{port}" in line and "`llmchat serve`" in line


@pytest.mark.parametrize("batch", [False, True], ids=["stream", "batch"])
def test_cli_html_502(capsys: pytest.CaptureFixture[str], cli_env: pytest.MonkeyPatch,
                      peer: Callable[..., P.Peer], batch: bool) -> None:
    p = peer([P.NGINX_502], then="keep")
    mode = ["--batch"] if batch else []
    status, out, err = ask(capsys, "--base-url", p.base_url, "--model", PEER_MODEL, *mode)
    assert status == 1 and out == ""
    line = one_error_line(err)
    assert "HTTP 502" in line and P.NGINX_502_TITLE in line and "HTTPS_PROXY" in line


def test_cli_keeps_the_partial_text_of_an_invalid_chunk(
    capsys: pytest.CaptureFixture[str], cli_env: pytest.MonkeyPatch, peer: Callable[..., P.Peer]
) -> None:
    p = peer(sse(P.event(P.delta("Kept")), P.event(P.delta(" text")), P.raw_line("data: <not json>"), P.END))
    status, out, err = ask(capsys, "--base-url", p.base_url, "--model", PEER_MODEL)
    assert status == 1
    assert out == "Kept text\n"
    assert "not JSON" in one_error_line(err)


def test_cli_stream_cut_keeps_the_partial_text(
    capsys: pytest.CaptureFixture[str], cli_env: pytest.MonkeyPatch, server_factory: Factory
) -> None:
    server = server_factory(profile="instant", drop_rate=1.0)
    status, out, err = ask(capsys, "--base-url", server.base_url, "--model", MODEL, "--http1")
    assert status == 1
    assert out.strip()  # what arrived before the cut
    line = one_error_line(err)
    assert "dropped mid-reply" in line and "tokens arrived and are kept" in line


def test_cli_read_stall(capsys: pytest.CaptureFixture[str], cli_env: pytest.MonkeyPatch,
                        peer: Callable[..., P.Peer]) -> None:
    cli_env.setenv("LLMCHAT_HTTP__READ_TIMEOUT_S", "0.3")
    p = peer(sse(P.event(P.delta("Waiting")), P.event(P.delta(" for"))), then="hang")
    status, out, err = ask(capsys, "--base-url", p.base_url, "--model", PEER_MODEL)
    assert status == 1 and out == "Waiting for\n"
    assert "http.read_timeout_s" in one_error_line(err)


def test_cli_401_names_the_key_source_and_never_the_key(
    capsys: pytest.CaptureFixture[str], cli_env: pytest.MonkeyPatch, server_factory: Factory,
    isolated_env: Path,
) -> None:
    server = server_factory(profile="instant", api_key=SERVER_KEY)
    config = isolated_env / "xdg_config_home" / "llmchat" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'[providers.peer]\nbase_url = "{server.base_url}"\napi_key_env = "{KEY_ENV}"\n'
                      f'model = "{MODEL}"\n')
    cli_env.setenv(KEY_ENV, KEY)
    for extra in ([], ["--json"]):
        status, out, err = ask(capsys, "--provider", "peer", *extra)
        assert status == 1
        line = one_error_line(err)
        assert "HTTP 401" in line and f"env {KEY_ENV} (providers.peer.api_key_env)" in line
        assert_no_secret(out, err, secrets=(KEY, SERVER_KEY))
        if extra:
            assert json.loads(out)["error"] == line.removeprefix("llmchat: ")
