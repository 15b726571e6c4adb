"""The local server's chat completions over HTTP/1.1, h2c and TLS h2: shapes, determinism, length, streams."""

from __future__ import annotations

import json
import ssl
from typing import Any

import httpx
import pytest

from llmchat.core.server import RunningServer

PROMPT = [{"role": "user", "content": "Tell me about connection pools"}]
TIMEOUT = httpx.Timeout(10.0)
# httpx builds a TLS context per client unless given one (a quarter second each); plain http never uses it.
UNUSED_TLS = ssl.create_default_context()


def client(server: RunningServer, protocol: str) -> httpx.AsyncClient:
    """An httpx client speaking ``protocol`` ("http1", "h2c" or "h2") to ``server``."""
    if protocol == "h2":
        context = ssl.create_default_context(cafile=server.cert_path)
        return httpx.AsyncClient(
            base_url=server.base_url, http1=False, http2=True, verify=context, timeout=TIMEOUT
        )
    return httpx.AsyncClient(
        base_url=server.base_url,
        http1=protocol == "http1",
        http2=protocol == "h2c",
        timeout=TIMEOUT,
        verify=UNUSED_TLS,
    )


def events(body: bytes) -> list[Any]:
    """The data payloads of an SSE body: parsed JSON, or the string ``[DONE]``."""
    out: list[Any] = []
    for block in body.decode("utf-8").split("\n\n"):
        if block:
            assert block.startswith("data: "), block
            data = block[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def content_of(chunks: list[Any]) -> str:
    return "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks if c != "[DONE]" and c["choices"]
    )


@pytest.fixture(params=["http1", "h2c", "h2"])
def any_protocol(
    request: pytest.FixtureRequest, local_server: RunningServer, tls_server: RunningServer
) -> tuple[RunningServer, str]:
    """Each of the three ways to talk to the server: (server, protocol)."""
    return (tls_server if request.param == "h2" else local_server), request.param


async def test_whole_reply_has_openai_shape_and_server_timing(
    any_protocol: tuple[RunningServer, str],
) -> None:
    server, protocol = any_protocol
    async with client(server, protocol) as c:
        r = await c.post("/chat/completions", json={"model": "llmchat-local", "messages": PROMPT})
    assert r.status_code == 200
    assert r.http_version == ("HTTP/1.1" if protocol == "http1" else "HTTP/2")
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["id"].startswith("chatcmpl-")
    assert body["object"] == "chat.completion"
    assert isinstance(body["created"], int) and body["model"] == "llmchat-local"
    assert body["system_fingerprint"]
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "stop"
    assert choice["message"]["role"] == "assistant" and len(choice["message"]["content"]) > 200
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 100
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    timing = body["server_timing"]
    assert 0 < timing["received_ns"] <= timing["first_token_ns"] <= timing["last_token_ns"]


async def test_stream_follows_openai_chunk_sequence(any_protocol: tuple[RunningServer, str]) -> None:
    server, protocol = any_protocol
    async with client(server, protocol) as c:
        whole = (await c.post("/chat/completions", json={"messages": PROMPT})).json()
        async with c.stream("POST", "/chat/completions", json={"messages": PROMPT, "stream": True}) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            body = await r.aread()
    chunks = events(body)
    assert chunks[-1] == "[DONE]"
    chunks = chunks[:-1]
    first, last = chunks[0], chunks[-1]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == first["id"] for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert last["choices"][0]["finish_reason"] == "stop" and last["choices"][0]["delta"]["content"]
    # One token per chunk: the stream has as many content chunks as the whole reply has completion tokens.
    assert len(chunks) - 1 == whole["usage"]["completion_tokens"]
    assert content_of(chunks) == whole["choices"][0]["message"]["content"]
    assert [c for c in chunks if "server_timing" in c] == [last]
    timing = last["server_timing"]
    assert timing["received_ns"] <= timing["first_token_ns"] <= timing["last_token_ns"]
    assert all("usage" not in c for c in chunks)


async def test_include_usage_adds_a_usage_chunk_that_carries_the_timing(local_server: RunningServer) -> None:
    request = {
        "messages": PROMPT,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 40,
    }
    async with client(local_server, "h2c") as c:
        r = await c.post("/chat/completions", json=request)
    chunks = events(r.content)
    assert chunks[-1] == "[DONE]"
    usage_chunk = chunks[-2]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 40
    assert usage_chunk["usage"]["total_tokens"] == usage_chunk["usage"]["prompt_tokens"] + 40
    assert "server_timing" in usage_chunk
    others = chunks[:-2]
    assert all(c["usage"] is None and "server_timing" not in c for c in others)
    assert others[-1]["choices"][0]["finish_reason"] == "length"


async def test_replies_are_fixed_by_model_messages_and_seed(local_server: RunningServer) -> None:
    async def text(**extra: Any) -> str:
        r = await c.post("/chat/completions", json={"messages": PROMPT, "max_tokens": 60, **extra})
        return str(r.json()["choices"][0]["message"]["content"])

    async with client(local_server, "http1") as c:
        base = await text(seed=7)
        assert await text(seed=7) == base
        assert await text(seed=8) != base
        assert await text(seed=7, model="llmchat-local-large") != base
        assert await text(seed=7, messages=[{"role": "user", "content": "something else"}]) != base


async def test_default_reply_exercises_every_rendering_path(local_server: RunningServer) -> None:
    async with client(local_server, "http1") as c:
        for seed in range(3):
            r = await c.post("/chat/completions", json={"messages": PROMPT, "seed": seed})
            text = r.json()["choices"][0]["message"]["content"]
            assert text.startswith("## ") and "**" in text
            assert "\n- " in text or "\n1. " in text
            assert "\n```" in text and text.count("```") % 2 == 0
            assert "|---|" in text
            assert "é" in text and "日本語" in text and "👩\u200d💻" in text and "🇫🇷" in text


@pytest.mark.parametrize("limit_name", ["max_tokens", "max_completion_tokens"])
async def test_length_follows_max_tokens(local_server: RunningServer, limit_name: str) -> None:
    async with client(local_server, "h2c") as c:
        for limit in (1, 17, 700):
            r = await c.post("/chat/completions", json={"messages": PROMPT, limit_name: limit})
            body = r.json()
            assert body["usage"]["completion_tokens"] == limit
            assert body["choices"][0]["finish_reason"] == "length"
            s = await c.post(
                "/chat/completions", json={"messages": PROMPT, limit_name: limit, "stream": True}
            )
            assert len(events(s.content)) == limit + 2  # role chunk, one per token, [DONE]


async def test_stop_sequence_cuts_the_reply(local_server: RunningServer) -> None:
    async with client(local_server, "http1") as c:
        full = (await c.post("/chat/completions", json={"messages": PROMPT})).json()["choices"][0]["message"]
        cut_at = full["content"].index("```")
        r = await c.post("/chat/completions", json={"messages": PROMPT, "stop": ["```", "never appears"]})
        stream = await c.post("/chat/completions", json={"messages": PROMPT, "stop": "```", "stream": True})
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == full["content"][:cut_at]
    assert choice["finish_reason"] == "stop"
    assert content_of(events(stream.content)) == full["content"][:cut_at]


async def test_generation_parameters_are_accepted_and_echoed(local_server: RunningServer) -> None:
    params = {
        "temperature": 0.2,
        "top_p": 0.9,
        "seed": 3,
        "max_tokens": 5,
        "stop": ["zzz"],
        "n": 1,
        "user": "u1",
    }
    async with client(local_server, "http1") as c:
        r = await c.post("/chat/completions", json={"messages": PROMPT, **params, "presence_penalty": 0.5})
        s = await c.post("/chat/completions", json={"messages": PROMPT, **params, "stream": True})
    assert r.status_code == 200
    assert r.json()["request_params"] == params
    assert events(s.content)[-2]["request_params"] == params


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 0}, "n"),
        ({"n": 129}, "n"),
        ({"temperature": 3}, "temperature"),
        ({"top_p": -0.1}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "ten"}, "max_tokens"),
        ({"stream": "yes"}, "stream"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"seed": 1.5}, "seed"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": "hello"}, "messages"),
        ({"messages": []}, "messages"),
    ],
)
async def test_bad_generation_parameters_get_400_naming_the_param(
    local_server: RunningServer, extra: dict[str, Any], param: str
) -> None:
    async with client(local_server, "http1") as c:
        r = await c.post("/chat/completions", json={"messages": PROMPT, **extra})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"] and "\n" not in error["message"]


async def test_many_concurrent_streams_on_one_h2c_connection(local_server: RunningServer) -> None:
    import asyncio

    async with client(local_server, "h2c") as c:

        async def one(seed: int) -> str:
            r = await c.post("/chat/completions", json={"messages": PROMPT, "stream": True, "seed": seed})
            assert r.http_version == "HTTP/2"
            return content_of(events(r.content))

        texts = await asyncio.wait_for(asyncio.gather(*(one(i % 4) for i in range(40))), 30)
    assert len(set(texts)) == 4
    assert all(texts[i] == texts[i % 4] for i in range(40))


async def test_models_and_health(local_server: RunningServer) -> None:
    async with client(local_server, "http1") as c:
        models = (await c.get("/models")).json()
        one = await c.get("/models/llmchat-local-large")
        missing = await c.get("/models/nope")
        health = await c.get(local_server.url + "/health")
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["llmchat-local", "llmchat-local-large"]
    assert all(m["object"] == "model" and m["owned_by"] for m in models["data"])
    assert one.json()["id"] == "llmchat-local-large"
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert health.status_code == 200 and health.json() == {"status": "ok"}


async def test_self_signed_certificate_passes_strict_verification(tls_server: RunningServer) -> None:
    assert tls_server.scheme == "https" and tls_server.cert_path
    context = ssl.create_default_context(cafile=tls_server.cert_path)
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    async with httpx.AsyncClient(http2=True, verify=context, timeout=TIMEOUT) as c:
        for name in (
            "127.0.0.1",
            "localhost",
        ):  # connect to 127.0.0.1 either way; check the name it is valid for
            r = await c.get(tls_server.url + "/health", extensions={"sni_hostname": name})
            assert r.status_code == 200 and r.http_version == "HTTP/2"
    async with httpx.AsyncClient(timeout=TIMEOUT) as c:
        with pytest.raises(httpx.ConnectError):
            await c.get(tls_server.url + "/health")  # the system store does not trust it
