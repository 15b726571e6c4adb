"""POST /v1/embeddings on the local server: shapes, determinism, geometry, base64, usage and bad input."""

from __future__ import annotations

import base64
import math
import ssl
import struct
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from llmchat.core.server import RunningServer

UNUSED_TLS = (
    ssl.create_default_context()
)  # one TLS context for all clients: httpx builds one per client otherwise


@pytest.fixture
async def c(local_server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=local_server.base_url, timeout=10, verify=UNUSED_TLS) as client:
        yield client


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))  # both are unit vectors


async def vectors(c: httpx.AsyncClient, inputs: object, **extra: object) -> list[list[float]]:
    r = await c.post("/embeddings", json={"input": inputs, **extra})
    assert r.status_code == 200, r.text
    return [item["embedding"] for item in r.json()["data"]]


async def test_response_shape_and_usage(c: httpx.AsyncClient) -> None:
    r = await c.post("/embeddings", json={"model": "llmchat-local", "input": ["one two three", "four"]})
    body = r.json()
    assert body["object"] == "list" and body["model"] == "llmchat-local"
    assert [(d["object"], d["index"]) for d in body["data"]] == [("embedding", 0), ("embedding", 1)]
    assert all(len(d["embedding"]) == 256 for d in body["data"])
    assert body["usage"] == {"prompt_tokens": 4, "total_tokens": 4}
    timing = body["server_timing"]
    assert timing["received_ns"] <= timing["first_token_ns"] <= timing["last_token_ns"]


async def test_vectors_are_unit_length_and_deterministic(c: httpx.AsyncClient) -> None:
    texts = ["The quick brown fox", "日本語のテキスト 🚀", "x", "   "]
    first = await vectors(c, texts)
    assert first == await vectors(c, texts)
    assert first[0] == (await vectors(c, "The quick brown fox"))[0]  # a string is a list of one
    for v in first:
        assert math.sqrt(sum(x * x for x in v)) == pytest.approx(1.0)


async def test_shared_words_mean_closer_vectors(c: httpx.AsyncClient) -> None:
    base, near, far = await vectors(
        c,
        [
            "connection pooling keeps latency low",
            "connection pooling keeps latency predictable",
            "a recipe for lemon cake with icing",
        ],
    )
    assert cosine(base, near) > 0.5
    assert cosine(base, near) > cosine(base, far) + 0.3


async def test_models_disagree(c: httpx.AsyncClient) -> None:
    (a,) = await vectors(c, "same text", model="llmchat-local")
    (b,) = await vectors(c, "same text", model="llmchat-local-large")
    assert a != b


async def test_base64_encoding_holds_the_same_float32_vector(c: httpx.AsyncClient) -> None:
    (as_floats,) = await vectors(c, "hello world")
    r = await c.post("/embeddings", json={"input": "hello world", "encoding_format": "base64"})
    raw = base64.b64decode(r.json()["data"][0]["embedding"])
    decoded = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert decoded == pytest.approx(as_floats, abs=1e-6)


async def test_dimensions_and_token_id_inputs(c: httpx.AsyncClient) -> None:
    (short,) = await vectors(c, "hello", dimensions=8)
    assert len(short) == 8
    ids = await vectors(c, [[1, 2, 3], [1, 2, 3]])
    assert len(ids) == 2 and ids[0] == ids[1]
    r = await c.post("/embeddings", json={"input": [5, 6, 7, 8]})
    assert r.json()["usage"]["prompt_tokens"] == 4


async def test_embedding_dim_is_a_server_setting(server_factory: Callable[..., RunningServer]) -> None:
    server = server_factory(embedding_dim=32)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10, verify=UNUSED_TLS) as client:
        (v,) = await vectors(client, "hello")
        too_many = await client.post("/embeddings", json={"input": "hello", "dimensions": 33})
    assert len(v) == 32
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "dimensions"


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"input": None},
        {"input": ""},
        {"input": []},
        {"input": ["ok", ""]},
        {"input": [["not", "ids"]]},
        {"input": [1, "mixed"]},
        {"input": {"text": "x"}},
        {"input": "x", "encoding_format": "hex"},
        {"input": "x", "dimensions": 0},
        {"input": ["x"] * 2049},
    ],
)
async def test_bad_input_is_400(c: httpx.AsyncClient, body: dict[str, object]) -> None:
    r = await c.post("/embeddings", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] in (
        "input",
        "encoding_format",
        "dimensions",
    )


async def test_a_cold_model_reports_its_load_once(server_factory: Callable[..., RunningServer]) -> None:
    srv = server_factory(cold_start_ms=100)
    async with httpx.AsyncClient(base_url=srv.base_url, timeout=10, verify=UNUSED_TLS) as client:
        cold = (await client.post("/embeddings", json={"input": "x"})).json()["server_timing"]
        warm = (await client.post("/embeddings", json={"input": "x"})).json()["server_timing"]
    assert cold["model_load_ns"] == pytest.approx(100_000_000, abs=1_000)
    assert cold["first_token_ns"] - cold["received_ns"] >= cold["model_load_ns"]
    assert "model_load_ns" not in warm
