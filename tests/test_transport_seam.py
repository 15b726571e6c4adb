"""The transport seam: ``ChatClient(transport=...)`` sends through whatever satisfies ``HTTPTransport``
(``MockTransport`` here: no socket), and pools belong to the ``Pools`` a caller holds, never to a module.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import llmchat.core.errors as errors
from llmchat.core import ChatClient, RetrySettings, Settings
from llmchat.core.http import (
    Endpoint,
    HTTPTransport,
    MockRequest,
    MockResponse,
    MockTransport,
    Pools,
    Transport,
)
from llmchat.core.load._run import Target, bench_pools, make_client

HI = [{"role": "user", "content": "hi"}]


def _delta(text: str) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


def _stop() -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2}}


def test_the_mock_and_the_default_transport_satisfy_the_protocol() -> None:
    mock: HTTPTransport = MockTransport(lambda r: MockResponse())
    real: HTTPTransport = Transport(Endpoint(name="x", base_url="http://127.0.0.1:9/v1"))
    assert mock.endpoint.name == "mock" and real.endpoint.name == "x"
    assert not real.is_open  # nothing is built before prepare() or the first request


async def test_a_stream_goes_through_the_given_transport() -> None:
    def handler(request: MockRequest) -> MockResponse:
        assert (request.method, request.path, request.stream) == ("POST", "chat/completions", True)
        assert request.json()["messages"] == HI and request.json()["stream"] is True
        return MockResponse.sse([_delta("Hel"), _delta("lo"), _stop()])

    transport = MockTransport(handler)
    async with ChatClient(transport=transport, model="m", use_cache=False) as client:
        assert client.endpoint is transport.endpoint
        stream = client.stream(HI)
        pieces = [piece async for piece in stream]
    assert pieces == ["Hel", "lo"]
    record = stream.record
    assert record.finish_reason == "stop" and record.output_tokens == 2 and record.usage_from_server
    assert record.http_version == "HTTP/2" and record.status == 200 and record.attempts == 1
    assert record.phases.reused and record.phases.headers_ns is not None
    assert record.first_token_ns is not None and record.end_ns is not None
    assert [r.path for r in transport.requests] == ["chat/completions"]
    assert not transport.closed  # the caller's: the client leaves it open


async def test_a_failure_before_the_headers_goes_through_the_retry_layer() -> None:
    calls = 0

    async def handler(request: MockRequest) -> MockResponse:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise errors.DisconnectedError("mock.invalid:80 closed the connection; try again", reused=True)
        return MockResponse.json({"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]})

    client = ChatClient(transport=MockTransport(handler), model="m", use_cache=False)
    reply = await client.complete(HI)
    assert reply.text == "ok" and calls == 2
    assert reply.record.attempts == 2 and [r.reason for r in reply.record.retries] == ["stale connection"]


async def test_a_stream_cut_mid_reply_keeps_what_arrived() -> None:
    cut = errors.StreamCutError("the connection to mock.invalid:80 dropped mid-reply; try again")
    transport = MockTransport(lambda r: MockResponse.sse([_delta("par"), _delta("tial"), cut], done=False))
    client = ChatClient(transport=transport, model="m", use_cache=False,
                        retry=RetrySettings(max_attempts=1))
    with pytest.raises(errors.StreamCutError) as caught:
        async for _ in client.stream(HI):
            pass
    assert caught.value.partial_text == "partial"
    assert "2 tokens arrived and are kept" in str(caught.value)
    assert caught.value.record is not None


async def test_an_error_status_is_the_typed_error_with_the_servers_message() -> None:
    body = {"error": {"message": "slow down", "type": "rate_limit"}}
    transport = MockTransport(lambda r: MockResponse.json(body, status=429, headers={"retry-after": "0"}))
    client = ChatClient(transport=transport, model="m", use_cache=False, retry=RetrySettings(max_attempts=1))
    with pytest.raises(errors.RateLimitError) as caught:
        await client.complete(HI)
    assert "slow down" in str(caught.value) and caught.value.status == 429


async def test_no_model_named_asks_the_transport_for_the_list() -> None:
    def handler(request: MockRequest) -> MockResponse:
        if request.path == "models":
            return MockResponse.json({"data": [{"id": "first"}, {"id": "second"}]})
        assert request.json()["model"] == "first"
        return MockResponse.sse([_delta("x"), _stop()])

    transport = MockTransport(handler)
    client = ChatClient(transport=transport, use_cache=False)
    assert [p async for p in client.stream(HI)] == ["x"]
    assert client.model == "first" and [r.method for r in transport.requests] == ["GET", "POST"]


def test_a_transport_and_an_endpoint_together_is_one_clear_line() -> None:
    with pytest.raises(errors.UsageError) as caught:
        ChatClient(transport=MockTransport(lambda r: MockResponse()), base_url="http://127.0.0.1:9/v1")
    assert "pass transport= or provider / base_url" in str(caught.value)
    assert "\n" not in str(caught.value)


async def test_clients_of_one_pools_share_a_transport_that_closes_with_the_last() -> None:
    made: list[MockTransport] = []

    def factory(endpoint: Endpoint) -> HTTPTransport:
        made.append(MockTransport(lambda r: MockResponse(), endpoint=endpoint))
        return made[-1]

    pools = Pools(factory=factory)
    first = ChatClient(base_url="http://127.0.0.1:9/v1", model="m", use_cache=False, pools=pools)
    second = ChatClient(base_url="http://127.0.0.1:9/v1", model="m", use_cache=False, pools=pools)
    other = ChatClient(base_url="http://127.0.0.1:10/v1", model="m", use_cache=False, pools=pools)
    async with first, second, other:
        assert first.transport is second.transport is made[0]
        assert other.transport is made[1]
        await first.aclose()
        assert not made[0].closed  # second still holds it
    assert made[0].closed and made[1].closed
    own = pools.open(first.endpoint)  # nobody else's, closed with the pools
    assert own is not made[0]
    await pools.aclose()
    assert own.closed


async def test_clients_given_no_pools_share_nothing() -> None:
    # No module-global registry: two clients of the same endpoint, each with its own pools.
    a = ChatClient(base_url="http://127.0.0.1:9/v1", model="m", use_cache=False)
    b = ChatClient(base_url="http://127.0.0.1:9/v1", model="m", use_cache=False)
    try:
        assert a.pools is not b.pools and a.transport is not b.transport
    finally:
        await a.aclose()
        await b.aclose()


async def test_each_bench_configuration_has_a_pool_of_its_own_the_run_closes(tmp_path: Path) -> None:
    target = Target(settings=Settings(), base_url="http://127.0.0.1:9/v1", http2="h2c", model="m")
    pools = bench_pools()
    clients = [make_client(name, target, str(tmp_path / name), pools, connections=4)
               for name in ("h2", "h2+nocache")]
    first, second = (c.transport for c in clients)
    assert first.endpoint == second.endpoint  # the same endpoint ...
    assert first is not second  # ... yet never one shared pool: the pool is what is compared
    assert first.endpoint.http.max_connections == 4
    assert all(c.pools is None for c in clients)  # the run's, not the clients'
    for client in clients:
        await client.aclose()
    assert pools._own == [first, second]  # still open: the run closes them
    await pools.aclose()
    assert pools._own == []


def test_mock_sse_frames_each_event() -> None:
    response = MockResponse.sse([{"a": 1}, b": comment\n\n"])
    assert response.headers["content-type"] == "text/event-stream"
    assert response.chunks == [b"data: " + json.dumps({"a": 1}).encode() + b"\n\n", b": comment\n\n",
                               b"data: [DONE]\n\n"]
