"""The local server's chat options that change a reply's shape, over real sockets: ``response_format``
(``json_object``, ``json_schema``), ``logprobs`` / ``top_logprobs``, ``n``, and the usage details of a reply
that thought. Each whole and streamed; the streamed reply says what the whole one says."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from llmchat.core.server import RunningServer

Factory = Callable[..., RunningServer]
JSON_PROMPT = [{"role": "user", "content": "Describe a connection pool as JSON"}]
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 3, "maxLength": 40},
        "size": {"type": "integer", "minimum": 2, "maximum": 9},
        "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "warm": {"type": "boolean"},
        "mode": {"enum": ["h1", "h2", "h2c"]},
        "nothing": {"type": "null"},
        "owner": {"anyOf": [{"$ref": "#/$defs/Owner"}, {"type": "null"}]},
        "peers": {"type": "array", "items": {"$ref": "#/$defs/Owner"}, "minItems": 2, "maxItems": 2},
        "when": {"type": "string", "format": "date-time"},
        "kind": {"const": "pool"},
        "note": {"type": ["string", "null"]},
    },
    "required": ["name", "size", "ratio", "warm", "mode", "nothing", "owner", "peers", "when", "kind", "note"],
    "additionalProperties": False,
    "$defs": {
        "Owner": {
            "type": "object",
            "properties": {"id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["id", "tags"],
            "additionalProperties": False,
        }
    },
}


def check_schema_value(value: Any) -> None:
    """``value`` is what SCHEMA describes, field by field (no schema validator is a test dependency)."""
    assert isinstance(value, dict) and set(value) == set(SCHEMA["required"])
    assert isinstance(value["name"], str) and 3 <= len(value["name"]) <= 40
    assert isinstance(value["size"], int) and not isinstance(value["size"], bool) and 2 <= value["size"] <= 9
    assert isinstance(value["ratio"], float) and 0 < value["ratio"] <= 1
    assert isinstance(value["warm"], bool)
    assert value["mode"] in ("h1", "h2", "h2c") and value["nothing"] is None and value["kind"] == "pool"
    assert value["note"] is None or isinstance(value["note"], str)
    assert value["when"][4] == "-" and value["when"].endswith("Z")
    owners = [value["owner"], *value["peers"]]
    assert len(value["peers"]) == 2
    for owner in owners:
        assert set(owner) == {"id", "tags"} and isinstance(owner["id"], int)
        assert isinstance(owner["tags"], list) and all(isinstance(t, str) for t in owner["tags"])


def chunks(resp: httpx.Response) -> list[dict[str, Any]]:
    """A stream's chunks (its data events but ``[DONE]``, which must end it)."""
    assert resp.status_code == 200, resp.text
    data = [block[len("data: ") :] for block in resp.text.split("\n\n") if block]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def streamed_content(events: list[dict[str, Any]], index: int = 0) -> str:
    return "".join(
        c["delta"].get("content") or "" for e in events for c in e["choices"] if c["index"] == index
    )


def test_json_object_is_a_json_object_whole_and_streamed(http: Callable[..., httpx.Client]) -> None:
    client = http()
    body = {"messages": JSON_PROMPT, "response_format": {"type": "json_object"}}
    whole = client.post("/chat/completions", json=body).json()
    content = whole["choices"][0]["message"]["content"]
    assert isinstance(json.loads(content), dict) and whole["choices"][0]["finish_reason"] == "stop"
    stream = chunks(client.post("/chat/completions", json={**body, "stream": True}))
    assert streamed_content(stream) == content
    assert len(stream) > 5  # in tokens, as any reply


def test_json_object_without_json_in_the_messages_is_refused_as_openai_does(
    http: Callable[..., httpx.Client],
) -> None:
    r = http().post("/chat/completions", json={
        "messages": [{"role": "user", "content": "hello"}], "response_format": {"type": "json_object"}})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "messages" and "'json'" in error["message"]


def test_json_schema_replies_with_a_value_of_the_schema_fixed_by_the_seed(
    http: Callable[..., httpx.Client],
) -> None:
    client = http()
    fmt = {"type": "json_schema", "json_schema": {"name": "pool", "schema": SCHEMA, "strict": True}}
    values = []
    for seed in range(4):
        body = {"messages": JSON_PROMPT, "response_format": fmt, "seed": seed}
        whole = client.post("/chat/completions", json=body).json()["choices"][0]["message"]["content"]
        stream = chunks(client.post("/chat/completions", json={**body, "stream": True}))
        again = client.post("/chat/completions", json=body).json()["choices"][0]["message"]["content"]
        assert streamed_content(stream) == whole == again
        value = json.loads(whole)
        check_schema_value(value)
        assert list(value) == list(SCHEMA["properties"])  # in the schema's order, as a model writes them
        values.append(whole)
    assert len(set(values)) > 1  # another seed, another value


def test_json_schema_cut_by_max_tokens_ends_with_length(http: Callable[..., httpx.Client]) -> None:
    client = http()
    body = {"messages": JSON_PROMPT, "response_format": {"type": "json_schema",
                                                         "json_schema": {"name": "pool", "schema": SCHEMA}}}
    whole = client.post("/chat/completions", json=body).json()["choices"][0]["message"]["content"]
    r = client.post("/chat/completions", json={**body, "max_tokens": 5})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length" and r.json()["usage"]["completion_tokens"] == 5
    assert whole.startswith(choice["message"]["content"]) and isinstance(json.loads(whole), dict)


@pytest.mark.parametrize(
    ("response_format", "param"),
    [
        ({"type": "yaml"}, "response_format.type"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"schema": {}}}, "response_format.json_schema.name"),
        ("json", "response_format"),
    ],
)
def test_a_bad_response_format_is_a_400_naming_the_param(
    http: Callable[..., httpx.Client], response_format: Any, param: str
) -> None:
    r = http().post("/chat/completions", json={"messages": JSON_PROMPT, "response_format": response_format})
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_a_schema_value_covers_every_type_nested() -> None:
    from llmchat.core.server._structured import json_text

    for seed in range(30):
        check_schema_value(json.loads(json_text(SCHEMA, random.Random(seed))))


_KEYWORDS = st.sampled_from([
    "type", "properties", "required", "items", "prefixItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
    "$defs", "minItems", "maxItems", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength",
    "maxLength", "format", "additionalProperties", "A",
])
_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**30), 10**30), st.floats(),
    st.sampled_from(["object", "array", "string", "integer", "number", "boolean", "null", "#", "#/$defs/A",
                     "date-time", "uuid"]),
)
_SCHEMAS = st.dictionaries(_KEYWORDS, st.recursive(
    _LEAVES, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYWORDS, inner, max_size=5),
    max_leaves=25), max_size=6)


@settings(max_examples=300, deadline=None)
@given(schema=_SCHEMAS, seed=st.integers(0, 3))
@example(schema={"allOf": [{"$ref": 5}]}, seed=0)
@example(schema={"allOf": [{"properties": "bad", "required": "a"}]}, seed=0)
@example(schema={"properties": {"a": {}}, "required": [["a"]]}, seed=0)
@example(schema={"type": "integer", "minimum": float("inf")}, seed=0)
@example(schema={"type": "number", "maximum": 10**400}, seed=0)
@example(schema={"$defs": {"A": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}},
                                 "required": ["a"]}}, "$ref": "#/$defs/A"}, seed=0)
def test_any_schema_at_all_gets_a_json_document_and_no_error(schema: dict[str, Any], seed: int) -> None:
    # A client's schema is the client's: a malformed or self-referencing one still gets a reply, not a 500.
    from llmchat.core.server._structured import json_text

    json.loads(json_text(schema, random.Random(seed)))


def check_logprobs(entries: list[dict[str, Any]], content: str, top: int) -> None:
    assert "".join(e["token"] for e in entries) == content
    for e in entries:
        assert e["bytes"] == list(e["token"].encode()) and e["logprob"] <= 0
        alternatives = e["top_logprobs"]
        assert len(alternatives) == top
        if top:
            assert alternatives[0] == {"token": e["token"], "logprob": e["logprob"], "bytes": e["bytes"]}
            assert len({a["token"] for a in alternatives}) == top
            assert all(a["logprob"] > b["logprob"] for a, b in zip(alternatives, alternatives[1:], strict=False))


def test_logprobs_cover_every_content_token_whole_and_streamed(http: Callable[..., httpx.Client]) -> None:
    client = http()
    body = {"messages": JSON_PROMPT, "logprobs": True, "top_logprobs": 3, "max_tokens": 40}
    whole = client.post("/chat/completions", json=body).json()
    choice = whole["choices"][0]
    check_logprobs(choice["logprobs"]["content"], choice["message"]["content"], 3)
    assert choice["logprobs"]["refusal"] is None and whole["usage"]["completion_tokens"] == 40
    plain = client.post("/chat/completions", json={"messages": JSON_PROMPT, "max_tokens": 40}).json()
    assert choice["message"] == plain["choices"][0]["message"]  # logprobs change no word
    events = chunks(client.post("/chat/completions", json={**body, "stream": True}))
    assert events[0]["choices"][0]["logprobs"] == {"content": [], "refusal": None}  # the role chunk
    for event in events[1:]:
        (c,) = event["choices"]
        assert c["logprobs"]["content"][0]["token"] == c["delta"]["content"]
    streamed = [e for ev in events[1:] for e in ev["choices"][0]["logprobs"]["content"]]
    assert streamed == choice["logprobs"]["content"]


def test_top_logprobs_without_logprobs_is_refused(http: Callable[..., httpx.Client]) -> None:
    r = http().post("/chat/completions", json={"messages": JSON_PROMPT, "top_logprobs": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"
    r = http().post("/chat/completions", json={"messages": JSON_PROMPT, "logprobs": True, "top_logprobs": 21})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"


def test_n_choices_whole_and_streamed_with_usage_counting_all(http: Callable[..., httpx.Client]) -> None:
    client = http()
    body = {"messages": JSON_PROMPT, "n": 3, "logprobs": True}
    whole = client.post("/chat/completions", json=body).json()
    assert [c["index"] for c in whole["choices"]] == [0, 1, 2]
    texts = [c["message"]["content"] for c in whole["choices"]]
    assert len(set(texts)) == 3  # sampled three times
    one = client.post("/chat/completions", json={"messages": JSON_PROMPT}).json()
    assert texts[0] == one["choices"][0]["message"]["content"]
    counted = sum(len(c["logprobs"]["content"]) for c in whole["choices"])
    assert whole["usage"]["completion_tokens"] == counted
    assert whole["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]  # the prompt is counted once
    stream = chunks(client.post("/chat/completions", json={
        **body, "stream": True, "stream_options": {"include_usage": True}}))
    assert [streamed_content(stream, i) for i in range(3)] == texts
    finishes = [c["index"] for e in stream for c in e["choices"] if c["finish_reason"]]
    assert sorted(finishes) == [0, 1, 2]
    roles = [c["index"] for e in stream for c in e["choices"] if c["delta"].get("role")]
    assert roles == [0, 1, 2]
    assert stream[-1]["choices"] == [] and stream[-1]["usage"] == whole["usage"]
    assert "server_timing" in stream[-1]


def test_reasoning_is_counted_in_the_usage_details(server_factory: Factory, http: Callable[..., httpx.Client]) -> None:
    client = http(server_factory(profile="instant", reasoning_tokens=7))
    body = {"messages": JSON_PROMPT, "max_tokens": 10}
    whole = client.post("/chat/completions", json=body).json()["usage"]
    assert whole["completion_tokens"] == 17
    assert whole["completion_tokens_details"]["reasoning_tokens"] == 7
    assert whole["prompt_tokens_details"]["cached_tokens"] == 0
    stream = chunks(client.post("/chat/completions", json={
        **body, "stream": True, "stream_options": {"include_usage": True}}))
    assert stream[-1]["usage"] == whole
    two = client.post("/chat/completions", json={**body, "n": 2}).json()["usage"]
    assert two["completion_tokens_details"]["reasoning_tokens"] == 14 and two["completion_tokens"] == 34
    plain = http().post("/chat/completions", json=body).json()["usage"]
    assert set(plain) == {"prompt_tokens", "completion_tokens", "total_tokens"}  # no thinking, no details
