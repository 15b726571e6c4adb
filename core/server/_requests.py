"""Request bodies of the local server, parsed and checked the way OpenAI checks them.

Every problem is an ``HTTPFailure`` with OpenAI's wording and fields (``param`` names the offending key), so a
client's error handling meets the same shapes it will meet in production.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from llmchat.core.server._http import HTTPFailure

MAX_COMPLETION_TOKENS = 100_000
MAX_EMBEDDING_INPUTS = 2048
MAX_CHOICES = 128
"""The largest ``n`` OpenAI takes."""
MAX_TOP_LOGPROBS = 20
"""The largest ``top_logprobs`` OpenAI takes."""
_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}
_ECHOED = ("temperature", "top_p", "seed", "max_tokens", "max_completion_tokens", "stop", "n", "user")


@dataclass(frozen=True)
class ResponseFormat:
    """A checked ``response_format``: ``json_object``, or ``json_schema`` with its ``schema`` (None: any
    object)."""

    type: str
    name: str | None = None
    schema: dict[str, Any] | None = None

    @property
    def key(self) -> str:
        """The format as a string (part of the reply's identity). Not key-sorted: the reply's properties come
        in the schema's order, as a model writes them."""
        return json.dumps([self.type, self.schema], separators=(",", ":"))


@dataclass(frozen=True)
class ChatRequest:
    """A checked ``POST /v1/chat/completions`` body."""

    model: str
    messages: list[dict[str, Any]]
    stream: bool
    include_usage: bool
    max_tokens: int | None
    seed: int | None
    stop: tuple[str, ...]
    params: dict[str, Any] = field(default_factory=dict)
    """The generation parameters the request gave, echoed back as ``request_params``."""
    tools: tuple[str, ...] = ()
    """The function names the request's ``tools`` offer, in order (what ``--tool-call`` calls)."""
    n: int = 1
    """How many choices to answer with."""
    response_format: ResponseFormat | None = None
    """A ``json_object`` or ``json_schema`` response format; None for plain text (none given, or ``text``)."""
    logprobs: bool = False
    top_logprobs: int = 0
    """Alternatives per token in ``logprobs.content[].top_logprobs`` (0 to 20; only with ``logprobs``)."""

    @property
    def plain(self) -> bool:
        """True when the reply is one choice without logprobs: the shape the fast paths of ``_chat`` send."""
        return self.n == 1 and not self.logprobs

    @property
    def messages_key(self) -> str:
        """A canonical string for the messages, the reply's identity."""
        return json.dumps(self.messages, sort_keys=True, ensure_ascii=False, separators=(",", ":"))

    @property
    def last_user_text(self) -> str:
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return _text_of(message.get("content"))
        return ""


@dataclass(frozen=True)
class EmbeddingsRequest:
    """A checked ``POST /v1/embeddings`` body."""

    model: str
    inputs: list[str | list[int]]
    base64: bool
    dimensions: int | None


def parse_json(body: bytes) -> dict[str, Any]:
    """The body as a JSON object; HTTPFailure 400 otherwise."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise HTTPFailure(
            400,
            "We could not parse the JSON body of your request. (HINT: This likely means you aren't using "
            "your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not "
            "valid JSON.)",
        ) from None
    if not isinstance(payload, dict):
        raise HTTPFailure(
            400,
            f"Invalid type for request body: expected an object, but got {_kind(payload)} instead.",
            code="invalid_type",
        )
    return payload


def parse_chat(payload: dict[str, Any], models: Sequence[str]) -> ChatRequest:
    """Check a chat completions body; HTTPFailure 400 for a bad field, 404 ``model_not_found`` for a model."""
    model = _model(payload, models)
    if "messages" not in payload or payload["messages"] is None:
        raise HTTPFailure.missing("messages")
    messages = payload["messages"]
    if not isinstance(messages, list):
        raise _invalid_type("messages", "an array", messages)
    if not messages:
        raise HTTPFailure(
            400,
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got "
            "an empty array instead.",
            code="empty_array",
            param="messages",
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _invalid_type(f"messages[{i}]", "an object", message)
        role = message.get("role")
        if role not in _ROLES:
            raise HTTPFailure(
                400,
                f"Invalid value: {_short(role)}. Supported values are: "
                + ", ".join(f"'{r}'" for r in sorted(_ROLES))
                + ".",
                code="invalid_value",
                param=f"messages[{i}].role",
            )
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise _invalid_type(f"messages[{i}].content", "a string or an array", content)
    stream = _optional(payload, "stream", bool, "a boolean") or False
    options = payload.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise HTTPFailure(
                400,
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                code="invalid_value",
                param="stream_options",
            )
        if not isinstance(options, dict):
            raise _invalid_type("stream_options", "an object", options)
        include_usage = _optional(options, "include_usage", bool, "a boolean", "stream_options.") or False
    max_tokens = None
    for name in ("max_tokens", "max_completion_tokens"):  # the newer name wins when both are given
        value = _optional(payload, name, int, "an integer")
        if value is not None:
            if not 1 <= value <= MAX_COMPLETION_TOKENS:
                raise HTTPFailure(
                    400,
                    f"Invalid '{name}': {value}. It must be from 1 to {MAX_COMPLETION_TOKENS}.",
                    code="invalid_value",
                    param=name,
                )
            max_tokens = value
    _number_in(payload, "temperature", 0.0, 2.0)
    _number_in(payload, "top_p", 0.0, 1.0)
    seed = _optional(payload, "seed", int, "an integer")
    n = _int_in(payload, "n", 1, MAX_CHOICES)
    _optional(payload, "user", str, "a string")
    stop = _stop(payload.get("stop"))
    logprobs = _optional(payload, "logprobs", bool, "a boolean") or False
    top_logprobs = _int_in(payload, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top_logprobs is not None and not logprobs:
        raise HTTPFailure(
            400,
            "Invalid 'top_logprobs': it is only allowed when 'logprobs' is true; send logprobs: true with it.",
            code="invalid_value",
            param="top_logprobs",
        )
    response_format = _response_format(payload.get("response_format"), messages)
    params = {name: payload[name] for name in _ECHOED if name in payload}
    return ChatRequest(model, messages, stream, include_usage, max_tokens, seed, stop, params,
                       _tool_names(payload.get("tools")), n or 1, response_format, logprobs,
                       top_logprobs or 0)


def parse_embeddings(payload: dict[str, Any], models: Sequence[str], max_dim: int) -> EmbeddingsRequest:
    """Check an embeddings body; HTTPFailure 400 for a bad field, 404 for a bad model."""
    model = _model(payload, models)
    if "input" not in payload or payload["input"] is None:
        raise HTTPFailure.missing("input")
    raw = payload["input"]
    inputs: list[str | list[int]]
    if isinstance(raw, str):
        inputs = [raw]
    elif isinstance(raw, list) and raw and all(_is_int(t) for t in raw):
        inputs = [list(raw)]  # one text given as token ids
    elif (
        isinstance(raw, list)
        and raw
        and all(isinstance(t, str) or (isinstance(t, list) and t and all(_is_int(x) for x in t)) for t in raw)
    ):
        inputs = list(raw)
    else:
        raise HTTPFailure(
            400,
            "'$.input' is invalid. Give a string, an array of strings, or token id arrays.",
            code="invalid_value",
            param="input",
        )
    if any(item == "" for item in inputs):
        raise HTTPFailure(
            400, "'$.input' is invalid: an input must not be empty.", code="invalid_value", param="input"
        )
    if len(inputs) > MAX_EMBEDDING_INPUTS:
        raise HTTPFailure(
            400,
            f"'$.input' is invalid: at most {MAX_EMBEDDING_INPUTS} inputs per request.",
            code="invalid_value",
            param="input",
        )
    encoding = payload.get("encoding_format")
    if encoding not in (None, "float", "base64"):
        raise HTTPFailure(
            400,
            f"Invalid value: {_short(encoding)}. Supported values are: 'float' and 'base64'.",
            code="invalid_value",
            param="encoding_format",
        )
    dimensions = _optional(payload, "dimensions", int, "an integer")
    if dimensions is not None and not 1 <= dimensions <= max_dim:
        raise HTTPFailure(
            400,
            f"Invalid 'dimensions': {dimensions}. This model gives 1 to {max_dim} dimensions.",
            code="invalid_value",
            param="dimensions",
        )
    return EmbeddingsRequest(model, inputs, encoding == "base64", dimensions)


def _model(payload: dict[str, Any], models: Sequence[str]) -> str:
    model = payload.get("model")
    if model is None:
        return models[0]  # lenient, as llama.cpp is: no model means the default one
    if not isinstance(model, str):
        raise _invalid_type("model", "a string", model)
    if model not in models:
        name = " ".join(model.split())[:100]
        raise HTTPFailure(
            404,
            f"The model `{name}` does not exist or you do not have access to it.",
            code="model_not_found",
            param="model",
        )
    return model


def _optional(payload: dict[str, Any], name: str, kind: type, described: str, prefix: str = "") -> Any:
    value = payload.get(name)
    if value is None:
        return None
    if kind is int and not _is_int(value) or kind is not int and not isinstance(value, kind):
        raise _invalid_type(prefix + name, described, value)
    return value


def _int_in(payload: dict[str, Any], name: str, low: int, high: int) -> int | None:
    """An optional integer field from ``low`` to ``high``, with OpenAI's wording when it is out of range."""
    value: int | None = _optional(payload, name, int, "an integer")
    if value is not None and value < low:
        raise HTTPFailure(
            400,
            f"Invalid '{name}': integer below minimum value. Expected a value >= {low}, but got {value} "
            "instead.",
            code="integer_below_min_value",
            param=name,
        )
    if value is not None and value > high:
        raise HTTPFailure(
            400,
            f"Invalid '{name}': integer above maximum value. Expected a value <= {high}, but got {value} "
            "instead.",
            code="integer_above_max_value",
            param=name,
        )
    return value


def _response_format(value: object, messages: list[dict[str, Any]]) -> ResponseFormat | None:
    """The checked ``response_format``; None for none or ``text``. HTTPFailure 400 as OpenAI words it."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _invalid_type("response_format", "an object", value)
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        # OpenAI refuses this unless the messages ask for JSON, so a model is never forced to write JSON blind.
        if not any("json" in _text_of(m.get("content")).lower() for m in messages):
            raise HTTPFailure(
                400,
                "'messages' must contain the word 'json' in some form, to use 'response_format' of type "
                "'json_object'.",
                code="invalid_value",
                param="messages",
            )
        return ResponseFormat("json_object")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise HTTPFailure.missing("response_format.json_schema")
        name = spec.get("name")
        if not isinstance(name, str) or not name:
            raise HTTPFailure.missing("response_format.json_schema.name")
        schema = spec.get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise _invalid_type("response_format.json_schema.schema", "an object", schema)
        return ResponseFormat("json_schema", name, schema)
    raise HTTPFailure(
        400,
        f"Invalid value: {_short(kind)}. Supported values are: 'text', 'json_object' and 'json_schema'.",
        code="invalid_value",
        param="response_format.type",
    )


def _number_in(payload: dict[str, Any], name: str, low: float, high: float) -> None:
    value = payload.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _invalid_type(name, "a number", value)
    if not low <= value <= high:
        raise HTTPFailure(
            400,
            f"Invalid '{name}': {value}. It must be from {low:g} to {high:g}.",
            code="invalid_value",
            param=name,
        )


def _stop(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and len(value) <= 4 and all(isinstance(s, str) for s in value):
        return tuple(value)
    raise HTTPFailure(
        400,
        "Invalid 'stop': give a string or an array of up to 4 strings.",
        code="invalid_value",
        param="stop",
    )


def _invalid_type(param: str, expected: str, value: object) -> HTTPFailure:
    return HTTPFailure(
        400,
        f"Invalid type for '{param}': expected {expected}, but got {_kind(value)} instead.",
        code="invalid_type",
        param=param,
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _short(value: object, limit: int = 40) -> str:
    """A user-sent value quoted for an error message, cut short (a message is one line)."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _tool_names(tools: object) -> tuple[str, ...]:
    """The function names of a ``tools`` list; malformed entries are skipped (the server only names one)."""
    if not isinstance(tools, list):
        return ()
    names = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]:
            names.append(fn["name"])
    return tuple(names)
