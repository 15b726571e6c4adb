"""An HTTP/2 stream's life cycle against scripted h2 peers (``tests/peers.py:H2Peer``, on the h2 library):
a stream closed early is reset at once with CANCEL and the connection goes on; an h2c attempt answered in
HTTP/1.1 fails in one round trip; an answer that comes while the body is still going out (nginx's 413 and
RST_STREAM) is read and reported, not retried, also when the server's SETTINGS have shrunk the stream's
window below what was already sent (a negative window is waited on, not overrun); a connection the server
closes after its GOAWAY, under a stream it had taken, is named as the server's cut.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from peers import H2Peer

from llmchat.core import ChatClient, HttpSettings, RetrySettings, Settings, errors

MSG = [{"role": "user", "content": "hello"}]
DEADLINE_S = 10.0
"""The bound on each wait below (a condition with a deadline, not a timing assertion)."""


@pytest.fixture
def h2peer() -> Iterator[Callable[..., H2Peer]]:
    made: list[H2Peer] = []

    def make(mode: Any = "stream", **kw: Any) -> H2Peer:
        peer = H2Peer(mode, **kw)
        peer.start()
        made.append(peer)
        return peer

    yield make
    for peer in made:
        peer.close()


def _client(peer: H2Peer, *, retries: int = 4, **http: Any) -> ChatClient:
    base = HttpSettings(http2="h2c", warmup=False, max_requests_per_connection=0, read_timeout_s=30.0)
    settings = replace(Settings(), http=replace(base, **http))
    return ChatClient(settings, base_url=peer.base_url, model="peer-model", use_cache=False,
                      retry=RetrySettings(max_attempts=retries, base_delay_s=0.01, max_delay_s=0.05))


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {DEADLINE_S} s: {what}"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("how", ["break", "cancel"])
async def test_a_stream_closed_early_is_reset_with_cancel_and_the_connection_goes_on(
    h2peer: Callable[..., H2Peer], how: str
) -> None:
    peer = h2peer("stream", chunks=500, interval_s=0.01)
    async with _client(peer) as client:
        stream = client.stream(MSG, max_tokens=500)
        if how == "break":
            async for _ in stream:
                break  # the caller stops reading: the response closes early
            await stream.aclose()
        else:
            first = asyncio.Event()

            async def read() -> None:
                async for _ in stream:
                    first.set()

            task = asyncio.create_task(read())
            await asyncio.wait_for(first.wait(), DEADLINE_S)
            task.cancel()  # Esc
            with pytest.raises(asyncio.CancelledError):
                await task
        await _until(lambda: bool(peer.resets), "the peer gets a RST_STREAM")
        assert peer.resets == [(1, 8)]  # stream 1, CANCEL
        assert peer.ended == []  # it stopped generating
        again = await client.complete(MSG, max_tokens=3)  # the same connection takes the next stream
    assert again.text and again.record.connection_reused and again.record.retries == []


async def test_a_stream_read_to_its_end_is_not_reset(h2peer: Callable[..., H2Peer]) -> None:
    peer = h2peer("stream", chunks=3, interval_s=0.0)
    async with _client(peer) as client:
        text = "".join([piece async for piece in client.stream(MSG)])
        await client.complete(MSG)
    assert text and peer.resets == [] and len(peer.ended) == 2


async def test_h2c_to_an_http11_only_server_fails_at_once_with_one_line(h2peer: Callable[..., H2Peer]) -> None:
    # llama-server answers the h2c preface with HTTP/1.1 400 and keeps the connection: h2 would read that as
    # the header of a 4.7 MB frame and wait for it until the read timeout (30 s here; DEADLINE_S bounds it).
    peer = h2peer("http11")
    async with _client(peer) as client:
        stream = client.stream(MSG)
        with pytest.raises(errors.ProtocolError) as caught:
            await asyncio.wait_for(_drain(stream), DEADLINE_S)
    message = str(caught.value)
    assert message == (
        f"{client.endpoint.hostport}: this server does not speak h2c (it answered 'HTTP/1.1 400 Bad Request'): "
        "set http2 = false (or true over https)"
    )
    assert not caught.value.retryable and stream.record.attempts == 1 and stream.record.retries == []


async def _drain(stream: Any) -> str:
    return "".join([piece async for piece in stream])


@pytest.mark.parametrize("reset_code", [0, 8], ids=["NO_ERROR", "CANCEL"])
async def test_an_answer_while_the_body_is_still_sent_is_read_and_not_retried(
    h2peer: Callable[..., H2Peer], reset_code: int
) -> None:
    # nginx's client_max_body_size: 413 and RST_STREAM as soon as it sees the request, the body still going
    # out (the peer's window is 16 KiB and never reopens, so a 1 MB body cannot all be sent).
    peer = h2peer("refuse", reset_code=reset_code)
    big = [{"role": "user", "content": "x" * 1_000_000}]
    async with _client(peer) as client:
        stream = client.stream(big)
        with pytest.raises(errors.HTTPStatusError) as caught:
            await asyncio.wait_for(_drain(stream), DEADLINE_S)
        again = await client.models()  # the connection is still good for others
    assert caught.value.status == 413 and not caught.value.retryable
    assert "Request Entity Too Large" in str(caught.value) and "\n" not in str(caught.value)
    assert stream.record.attempts == 1 and stream.record.retries == [] and peer.requests == 2
    assert again == ["peer-model"] and peer.protocol_errors == []


async def test_a_window_the_servers_settings_shrink_below_what_was_sent_is_waited_on_not_overrun(
    h2peer: Callable[..., H2Peer],
) -> None:
    # The client sends 64 KiB on the default window before it reads the server's SETTINGS (16 KiB): the
    # stream's window is then -48 KiB (RFC 9113 6.9.2), which is a wait for WINDOW_UPDATE, not room to send.
    # The answer comes only after the client's ACK, so the client meets that window every time.
    peer = h2peer("refuse", refuse_after_ack=True)
    big = [{"role": "user", "content": "x" * 1_000_000}]
    async with _client(peer) as client:
        stream = client.stream(big)
        with pytest.raises(errors.HTTPStatusError) as caught:
            await asyncio.wait_for(_drain(stream), DEADLINE_S)
    assert caught.value.status == 413 and not caught.value.retryable
    assert stream.record.attempts == 1 and stream.record.retries == [] and peer.requests == 1
    assert peer.protocol_errors == []


async def test_a_connection_closed_after_its_goaway_under_a_taken_stream_is_named_the_servers_cut(
    h2peer: Callable[..., H2Peer],
) -> None:
    peer = h2peer("goaway-cut", chunks=10, interval_s=0.01)
    async with _client(peer) as client:
        stream = client.stream(MSG)
        with pytest.raises(errors.StreamCutError) as caught:
            await asyncio.wait_for(_drain(stream), DEADLINE_S)
    message = str(caught.value)
    assert message.startswith(
        f"{client.endpoint.hostport} closed its HTTP/2 connection after its GOAWAY (NO_ERROR) before finishing "
        "this reply, which it had taken (stream 1); the server cut it: try again"
    ), message
    assert caught.value.partial_text == "t0 t1 "
