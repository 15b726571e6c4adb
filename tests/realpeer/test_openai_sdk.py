"""`llmchat serve` as OpenAI's official Python SDK sees it: every endpoint it offers, through the SDK's own
methods (auto-paging, ``parse``, the stream helper, base64 embeddings), every error status mapped by the SDK to
its typed error class, and every response held to the SDK's own pydantic types with no field outside them but
the few llmchat adds on purpose (``ALLOWED_EXTRAS``).

The SDK builds its response objects without validating them (``construct``), so ``conforms`` validates each
one again from its fields and then walks it for undeclared fields.

Run: ``.venv/bin/python -m pytest -q tests/realpeer/test_openai_sdk.py -m realpeer`` (``pip install -e
".[peers]"`` installs the SDK). Servers run in this process, on 127.0.0.1, with the ``instant`` profile.
"""

from __future__ import annotations

import array
import base64
import json
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal

import httpx
import openai  # the `peers` extra (scripts/realpeer installs it); missing, the tier fails at collection
import pydantic
import pytest
from openai.types import Batch, FileObject
from openai.types.chat import ChatCompletion

from llmchat.core.server import RunningServer, resolve_settings, start_in_thread

pytestmark = pytest.mark.realpeer

MODEL = "llmchat-local"
PROMPT: list[Any] = [{"role": "user", "content": "Tell me about connection pools, as JSON"}]
BOUND_S = 15.0
"""The longest any wait here may take (a batch to finish, a cancel to land)."""

ALLOWED_EXTRAS = {
    # llmchat serve's own stamps of when it received a request, started it, sent its first and last token:
    # what llmchat's attribution reads to split a reply's time into server and network.
    "server_timing",
    # llmchat serve echoes the generation parameters a request gave, so a client test can see what it sent.
    "request_params",
    # The reasoning field of vLLM and DeepSeek, which --reasoning-tokens serves; OpenAI's SDK does not
    # declare it (OpenAI's own reasoning models do not return their reasoning in chat completions).
    "reasoning_content",
}
PAGE_EXTRAS = {
    # OpenAI's list endpoints send these (the API reference's list objects have them); the SDK's generic
    # SyncCursorPage declares only data and has_more, and reads the cursor from the last item's id.
    "object",
    "first_id",
    "last_id",
}


def extras(obj: object, path: str, allowed: set[str]) -> list[str]:
    """Every field of ``obj`` (an SDK model, or lists and dicts of them) outside its type, as ``path.name``,
    but the ``allowed`` ones (whose own contents are not SDK types and are not walked)."""
    found: list[str] = []
    if isinstance(obj, pydantic.BaseModel):
        found += [f"{path}.{k}" for k in (obj.model_extra or {}) if k not in allowed]
        for name in type(obj).model_fields:
            found += extras(getattr(obj, name, None), f"{path}.{name}", allowed)
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            found += extras(item, f"{path}[{i}]", allowed)
    elif isinstance(obj, dict):
        for key, value in obj.items():
            found += extras(value, f"{path}[{key!r}]", allowed)
    return found


def conforms(obj: Any, allowed: set[str] = ALLOWED_EXTRAS) -> Any:
    """``obj`` validated again by its own SDK type (a field of the wrong type or a missing one fails) and with
    no undeclared field but ``allowed``; returns the validated copy."""
    assert isinstance(obj, pydantic.BaseModel), type(obj)
    raw = obj.model_dump(mode="json", by_alias=True, exclude_unset=True, warnings=False)
    validated = type(obj).model_validate(raw)
    unknown = extras(validated, type(obj).__name__, allowed)
    assert not unknown, f"fields outside the SDK's types: {unknown}"
    return validated


def page_conforms(page: Any) -> None:
    """A list page: its items conform, and the page has no field but OpenAI's list fields."""
    for item in page.data:
        conforms(item)
    unknown = [k for k in (page.model_extra or {}) if k not in PAGE_EXTRAS]
    assert not unknown, f"page fields outside the SDK's type and OpenAI's list object: {unknown}"


@pytest.fixture(scope="module")
def serve() -> Iterator[Callable[..., RunningServer]]:
    """``make(**settings) -> RunningServer``: `llmchat serve` in this process on 127.0.0.1, one per set of
    settings for the whole module, all closed at its end (as tests/conftest.py starts one)."""
    servers: dict[str, RunningServer] = {}

    def make(**overrides: Any) -> RunningServer:
        key = json.dumps(overrides, sort_keys=True)
        if key not in servers:
            settings = {"port": 0, "host": "127.0.0.1", "profile": "instant", **overrides}
            servers[key] = start_in_thread(resolve_settings(settings))
        return servers[key]

    yield make
    for server in servers.values():
        server.close()


@pytest.fixture
def sdk(serve: Callable[..., RunningServer]) -> Iterator[Callable[..., Any]]:
    """``make(server=None, api_key=...) -> openai.OpenAI`` on a server (default: the plain one), never
    retrying (each error must be seen as the server sent it), closed at teardown."""
    made: list[Any] = []

    def make(server: RunningServer | None = None, api_key: str = "sk-local-test") -> Any:
        server = server or serve()
        client = openai.OpenAI(base_url=server.base_url, api_key=api_key, max_retries=0, timeout=10.0)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def wait_until(check: Callable[[], Any], what: str) -> Any:
    """Poll ``check`` until it returns something true, within BOUND_S."""
    deadline = time.monotonic() + BOUND_S
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"{what} did not happen within {BOUND_S} s"
        time.sleep(0.02)


# -- chat -------------------------------------------------------------------------------------------------


def test_a_whole_chat_completion(sdk: Callable[..., Any]) -> None:
    completion = sdk().chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=20, seed=3)
    conforms(completion)
    assert isinstance(completion, ChatCompletion) and completion.object == "chat.completion"
    (choice,) = completion.choices
    assert choice.message.role == "assistant" and choice.message.content and choice.finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 20
    # _request_id is the SDK's x-request-id, public despite its underscore (the SDK's README says so).
    assert completion._request_id and completion._request_id.startswith("req_")


def test_a_streamed_chat_completion_says_what_the_whole_one_does(sdk: Callable[..., Any]) -> None:
    client = sdk()
    whole = client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=30)
    chunks = list(client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=30, stream=True))
    for chunk in chunks:
        conforms(chunk)
        assert chunk.object == "chat.completion.chunk" and chunk.usage is None
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stream_options_include_usage_ends_with_the_usage_chunk(sdk: Callable[..., Any]) -> None:
    client = sdk()
    whole = client.chat.completions.create(model=MODEL, messages=PROMPT)
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=PROMPT, stream=True, stream_options={"include_usage": True}))
    for chunk in chunks:
        conforms(chunk)
    assert all(c.usage is None and c.choices for c in chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_the_stream_helper_accumulates_the_reply(sdk: Callable[..., Any]) -> None:
    client = sdk()
    whole = client.chat.completions.create(model=MODEL, messages=PROMPT)
    with client.chat.completions.stream(model=MODEL, messages=PROMPT) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.content == whole.choices[0].message.content


class GetWeather(pydantic.BaseModel):
    location: str
    unit: Literal["celsius", "fahrenheit"]


def test_tool_calls_whole_streamed_and_parsed(sdk: Callable[..., Any], serve: Callable[..., RunningServer]) -> None:
    client = sdk(serve(tool_call=True))
    tools = [openai.pydantic_function_tool(GetWeather)]
    whole = client.chat.completions.create(model=MODEL, messages=PROMPT, tools=tools)
    conforms(whole)
    (call,) = whole.choices[0].message.tool_calls
    assert whole.choices[0].finish_reason == "tool_calls" and call.function.name == "GetWeather"
    chunks = list(client.chat.completions.create(model=MODEL, messages=PROMPT, tools=tools, stream=True))
    for chunk in chunks:
        conforms(chunk)
    pieces = [tc for c in chunks if c.choices and c.choices[0].delta.tool_calls for tc in c.choices[0].delta.tool_calls]
    assert pieces[0].id == call.id and "".join(p.function.arguments or "" for p in pieces) == call.function.arguments
    parsed = client.chat.completions.parse(model=MODEL, messages=PROMPT, tools=tools)
    arguments = parsed.choices[0].message.tool_calls[0].function.parsed_arguments
    assert isinstance(arguments, GetWeather) and arguments.unit == "celsius"


def test_reasoning_tokens_are_in_the_usage_details(
    sdk: Callable[..., Any], serve: Callable[..., RunningServer]
) -> None:
    client = sdk(serve(reasoning_tokens=6))
    whole = client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=10)
    conforms(whole)
    usage = whole.usage
    assert usage.completion_tokens == 16 and usage.completion_tokens_details.reasoning_tokens == 6
    assert usage.prompt_tokens_details.cached_tokens == 0
    assert whole.choices[0].message.model_extra["reasoning_content"]
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=PROMPT, max_tokens=10, stream=True, stream_options={"include_usage": True}))
    for chunk in chunks:
        conforms(chunk)
    assert chunks[-1].usage == usage


class Owner(pydantic.BaseModel):
    id: int
    tags: list[str]


class Pool(pydantic.BaseModel):
    name: str
    size: int = pydantic.Field(ge=1, le=64)
    ratio: float
    warm: bool
    mode: Literal["h1", "h2", "h2c"]
    owner: Owner | None
    peers: list[Owner]


def test_response_format_json_object_and_json_schema(sdk: Callable[..., Any]) -> None:
    client = sdk()
    as_object = client.chat.completions.create(
        model=MODEL, messages=PROMPT, response_format={"type": "json_object"})
    conforms(as_object)
    assert isinstance(json.loads(as_object.choices[0].message.content), dict)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
              "required": ["n", "ok"], "additionalProperties": False}
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    as_schema = client.chat.completions.create(model=MODEL, messages=PROMPT, response_format=fmt)
    value = json.loads(as_schema.choices[0].message.content)
    assert isinstance(value["n"], int) and isinstance(value["ok"], bool) and set(value) == {"n", "ok"}
    chunks = list(client.chat.completions.create(model=MODEL, messages=PROMPT, response_format=fmt, stream=True))
    assert json.loads("".join(c.choices[0].delta.content or "" for c in chunks)) == value


def test_parse_with_a_pydantic_model_whole_and_streamed(sdk: Callable[..., Any]) -> None:
    client = sdk()
    for seed in range(3):
        completion = client.chat.completions.parse(model=MODEL, messages=PROMPT, response_format=Pool, seed=seed)
        parsed = completion.choices[0].message.parsed
        assert isinstance(parsed, Pool) and 1 <= parsed.size <= 64
        with client.chat.completions.stream(
            model=MODEL, messages=PROMPT, response_format=Pool, seed=seed
        ) as stream:
            final = stream.get_final_completion()
        assert final.choices[0].message.parsed == parsed


def test_logprobs_whole_and_streamed(sdk: Callable[..., Any]) -> None:
    client = sdk()
    whole = client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=12, logprobs=True,
                                           top_logprobs=2)
    conforms(whole)
    content = whole.choices[0].logprobs.content
    assert "".join(t.token for t in content) == whole.choices[0].message.content
    assert all(len(t.top_logprobs) == 2 and t.bytes == list(t.token.encode()) for t in content)
    chunks = list(client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=12, logprobs=True,
                                                 top_logprobs=2, stream=True))
    for chunk in chunks:
        conforms(chunk)
    assert [t for c in chunks for t in c.choices[0].logprobs.content] == content


def test_n_choices_whole_and_streamed(sdk: Callable[..., Any]) -> None:
    client = sdk()
    # No max_tokens: the SDK's stream helper refuses to finish a choice cut by the length limit.
    whole = client.chat.completions.create(model=MODEL, messages=PROMPT, n=2, logprobs=True)
    conforms(whole)
    assert [c.index for c in whole.choices] == [0, 1]
    assert whole.usage.completion_tokens == sum(len(c.logprobs.content) for c in whole.choices)
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=PROMPT, n=2, stream=True, stream_options={"include_usage": True}))
    texts = ["", ""]
    for chunk in chunks:
        conforms(chunk)
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == [c.message.content for c in whole.choices] and chunks[-1].usage == whole.usage
    with client.chat.completions.stream(model=MODEL, messages=PROMPT, n=2) as stream:
        final = stream.get_final_completion()
    assert [c.message.content for c in final.choices] == texts


# -- embeddings and models -------------------------------------------------------------------------------


def test_embeddings_as_floats_and_as_base64(sdk: Callable[..., Any]) -> None:
    client = sdk()
    texts = ["connection pools", "streaming replies"]
    floats = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    conforms(floats)
    assert [d.index for d in floats.data] == [0, 1] and floats.usage.total_tokens > 0
    by_default = client.embeddings.create(model=MODEL, input=texts)  # the SDK asks for base64 and decodes it
    conforms(by_default)
    raw = client.embeddings.create(model=MODEL, input=texts, encoding_format="base64")
    for f, d, r in zip(floats.data, by_default.data, raw.data, strict=True):
        as_float32 = array.array("f", f.embedding).tolist()
        assert d.embedding == as_float32
        assert isinstance(r.embedding, str) and array.array("f", base64.b64decode(r.embedding)).tolist() == as_float32


def test_models_list_and_retrieve(sdk: Callable[..., Any]) -> None:
    client = sdk()
    page = client.models.list()
    page_conforms(page)
    assert [m.id for m in page] == ["llmchat-local", "llmchat-local-large"]
    model = client.models.retrieve("llmchat-local-large")
    conforms(model)
    assert model.id == "llmchat-local-large" and model.object == "model"


# -- files and batches -----------------------------------------------------------------------------------


def batch_input(n: int) -> bytes:
    lines = [{"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": MODEL, "messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 5}}
             for i in range(n)]
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def test_files_upload_retrieve_content_list_and_delete(
    sdk: Callable[..., Any], serve: Callable[..., RunningServer]
) -> None:
    client = sdk(serve(seed=101))  # a server of its own: the list holds exactly these files
    data = batch_input(2)
    uploaded = [client.files.create(file=(f"in{i}.jsonl", data), purpose="batch") for i in range(3)]
    for stored in uploaded:
        conforms(stored)
        assert isinstance(stored, FileObject) and stored.bytes == len(data) and stored.purpose == "batch"
    assert conforms(client.files.retrieve(uploaded[1].id)) == uploaded[1]
    assert client.files.content(uploaded[1].id).read() == data
    first = client.files.list(limit=2)
    page_conforms(first)
    assert first.has_more is True and first.has_next_page()
    assert first.model_extra["first_id"] == uploaded[2].id and first.model_extra["last_id"] == uploaded[1].id
    assert [f.id for f in client.files.list(limit=2)] == [f.id for f in reversed(uploaded)]  # auto-paging
    assert [f.id for f in client.files.list(order="asc")] == [f.id for f in uploaded]
    deleted = client.files.delete(uploaded[0].id)
    conforms(deleted)
    assert (deleted.id, deleted.object, deleted.deleted) == (uploaded[0].id, "file", True)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded[0].id)
    with pytest.raises(openai.NotFoundError):
        client.files.delete(uploaded[0].id)


def test_batches_create_retrieve_list_and_cancel(
    sdk: Callable[..., Any], serve: Callable[..., RunningServer]
) -> None:
    client = sdk(serve(seed=102))
    input_file = client.files.create(file=("in.jsonl", batch_input(3)), purpose="batch")
    batch = client.batches.create(input_file_id=input_file.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"run": "sdk"})
    conforms(batch)
    assert isinstance(batch, Batch) and batch.model == MODEL and batch.usage is not None
    done = wait_until(lambda: (b := client.batches.retrieve(batch.id)).status == "completed" and b, "the batch")
    conforms(done)
    assert done.request_counts.completed == 3 and done.output_file_id
    lines = [json.loads(line) for line in client.files.content(done.output_file_id).text.splitlines()]
    bodies = [conforms(ChatCompletion.model_validate(line["response"]["body"])) for line in lines]
    assert done.usage.input_tokens == sum(b.usage.prompt_tokens for b in bodies)
    assert done.usage.output_tokens == 15 and done.usage.total_tokens == done.usage.input_tokens + 15
    others = [client.batches.create(input_file_id=input_file.id, endpoint="/v1/chat/completions",
                                    completion_window="24h") for _ in range(2)]
    first = client.batches.list(limit=2)
    page_conforms(first)
    assert first.has_more is True
    assert [b.id for b in client.batches.list(limit=2)] == [others[1].id, others[0].id, batch.id]  # auto-paging
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)  # completed: too late


def test_a_batch_in_progress_is_cancelled(sdk: Callable[..., Any], serve: Callable[..., RunningServer]) -> None:
    client = sdk(serve(batch_turnaround_s=60.0, seed=103))
    input_file = client.files.create(file=("in.jsonl", batch_input(4)), purpose="batch")
    batch = client.batches.create(input_file_id=input_file.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    wait_until(lambda: client.batches.retrieve(batch.id).status == "in_progress", "the batch to start")
    cancelling = client.batches.cancel(batch.id)
    conforms(cancelling)
    assert cancelling.status in ("cancelling", "cancelled")
    cancelled = wait_until(lambda: (b := client.batches.retrieve(batch.id)).status == "cancelled" and b, "cancel")
    conforms(cancelled)
    assert cancelled.cancelled_at is not None and cancelled.request_counts.total == 4


# -- errors ----------------------------------------------------------------------------------------------


def test_every_error_status_is_the_sdks_typed_error(
    sdk: Callable[..., Any], serve: Callable[..., RunningServer]
) -> None:
    client = sdk()
    with pytest.raises(openai.AuthenticationError) as unauthorized:
        sdk(serve(api_key="sk-right"), api_key="sk-wrong").models.list()
    assert unauthorized.value.status_code == 401 and unauthorized.value.code == "invalid_api_key"
    assert "sk-wrong" not in str(unauthorized.value)  # a mistyped key is still a secret
    with pytest.raises(openai.NotFoundError) as no_model:
        client.chat.completions.create(model="no-such-model", messages=PROMPT)
    assert no_model.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError) as no_route:
        client.get("/no-such-route", cast_to=httpx.Response)
    assert no_route.value.code == "unknown_url"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL, messages=PROMPT, temperature=5)
    assert bad.value.param == "temperature" and bad.value.type == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as bad_format:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                       response_format={"type": "json_object"})
    assert bad_format.value.param == "messages"
    # 409 (cancelling a finished batch) is openai.ConflictError: test_batches_create_retrieve_list_and_cancel.
    with pytest.raises(openai.APIStatusError) as not_allowed:
        client.delete("/models", cast_to=httpx.Response)
    assert not_allowed.value.status_code == 405
    with pytest.raises(openai.APIStatusError) as too_large:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x" * (1 << 20)}])
    assert too_large.value.status_code == 413
    limited = sdk(serve(rate_limit=1, rate_limit_window_s=600.0))
    limited.chat.completions.create(model=MODEL, messages=PROMPT)  # the one request the window allows
    with pytest.raises(openai.RateLimitError) as throttled:
        limited.chat.completions.create(model=MODEL, messages=PROMPT)
    assert throttled.value.status_code == 429 and throttled.value.response.headers["retry-after"]
    with pytest.raises(openai.InternalServerError) as broken:
        sdk(serve(error_rate=1.0)).chat.completions.create(model=MODEL, messages=PROMPT)
    assert broken.value.status_code in (500, 502, 503) and broken.value.type == "server_error"
