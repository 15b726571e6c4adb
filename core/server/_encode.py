"""OpenAI's JSON shapes as the local server writes them: errors, chat completions and stream chunks.

Stream chunks are built from byte templates made once per request, so a token costs two concatenations and no
``json.dumps`` (tokens arrive already escaped from ``_replies``). Non-ASCII text is written as UTF-8, not
``\\u`` escapes, as OpenAI does, so multi-byte characters reach the client as multi-byte sequences.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

DONE = b"data: [DONE]\n\n"
FINGERPRINT = "fp_llmchat_local"


def dumps(obj: object) -> bytes:
    """Compact UTF-8 JSON."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> bytes:
    """``{"error": {"message", "type", "param", "code"}}`` as OpenAI sends it."""
    return dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})


def usage(prompt_tokens: int, completion_tokens: int, reasoning_tokens: int | None = None) -> dict[str, Any]:
    """The ``usage`` object. With ``reasoning_tokens`` (a reasoning model's reply) it also has OpenAI's
    ``prompt_tokens_details`` and ``completion_tokens_details``, the reasoning counted among the completion
    tokens as OpenAI counts them; nothing here is ever cached (``cached_tokens`` 0)."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if reasoning_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": 0, "audio_tokens": 0}
        out["completion_tokens_details"] = {
            "reasoning_tokens": reasoning_tokens,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        }
    return out


def timing(
    received_ns: int, first_token_ns: int, last_token_ns: int, started_ns: int | None = None,
    model_load_ns: int = 0,
) -> dict[str, int]:
    """The ``server_timing`` object: ``time.monotonic_ns()`` stamps of this server's process. ``started_ns``
    (default: ``received_ns``) is when work began after queueing for a slot. ``model_load_ns``, a duration
    and only when above 0, is how long the request waited for its model to load (a cold start), between
    ``started_ns`` and the first token."""
    out = {
        "received_ns": received_ns,
        "started_ns": received_ns if started_ns is None else started_ns,
        "first_token_ns": first_token_ns,
        "last_token_ns": last_token_ns,
    }
    if model_load_ns > 0:
        out["model_load_ns"] = model_load_ns
    return out


def llama_timings(timing: dict[str, int], usage: dict[str, int]) -> dict[str, float]:
    """llama.cpp's ``timings`` object from a ``server_timing`` and the usage: the prefill (start of work,
    after any model load, to the first token) over the prompt tokens, the generation (first to last token)
    over the completion tokens, with llama.cpp's per-token and per-second figures; ``cache_n`` 0."""
    prompt_ms = max(0, timing["first_token_ns"] - timing["started_ns"] - timing.get("model_load_ns", 0)) / 1e6
    predicted_ms = max(0, timing["last_token_ns"] - timing["first_token_ns"]) / 1e6
    prompt_n, predicted_n = usage["prompt_tokens"], usage["completion_tokens"]

    def per(ms: float, n: int) -> tuple[float, float]:
        return (ms / n if n else 0.0), (n * 1000.0 / ms if ms > 0 else 0.0)

    prompt_per_token, prompt_per_s = per(prompt_ms, prompt_n)
    predicted_per_token, predicted_per_s = per(predicted_ms, predicted_n)
    return {"prompt_n": prompt_n, "prompt_ms": prompt_ms, "prompt_per_token_ms": prompt_per_token,
            "prompt_per_second": prompt_per_s, "predicted_n": predicted_n, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_per_token, "predicted_per_second": predicted_per_s,
            "cache_n": 0}


class ChunkTemplate:
    """The ``data: {chat.completion.chunk}\\n\\n`` events of one streamed reply.

    With ``include_usage`` every chunk carries ``"usage":null`` and a last chunk with empty ``choices``
    carries the usage, as OpenAI does. The chunk written just before ``[DONE]`` (the usage chunk, else the
    last content chunk) also carries ``server_timing`` and ``request_params``.
    """

    def __init__(self, completion_id: str, created: int, model: str, include_usage: bool) -> None:
        self.include_usage = include_usage
        model_json = json.dumps(model, ensure_ascii=False)
        self._head = (
            f'{{"id":"{completion_id}","object":"chat.completion.chunk","created":{created},'
            f'"model":{model_json},"system_fingerprint":"{FINGERPRINT}",'
        ).encode()
        self._prefix = b"data: " + self._head + b'"choices":[{"index":0,"delta":{"content":"'
        usage_null = b',"usage":null' if include_usage else b""
        self._tail = b'"},"logprobs":null,"finish_reason":null}]' + usage_null + b"}\n\n"

    @property
    def head(self) -> bytes:
        """The start of every chunk object: id, object, created, model, fingerprint (for other delta shapes)."""
        return self._head

    def role(self) -> bytes:
        """The first event: the assistant role with empty content, no token yet."""
        return (
            b"data: "
            + self._head
            + b'"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},'
            + b'"logprobs":null,"finish_reason":null}]'
            + (b',"usage":null' if self.include_usage else b"")
            + b"}\n\n"
        )

    def content(self, escaped: bytes) -> bytes:
        """One content token, already JSON-escaped."""
        return self._prefix + escaped + self._tail

    def contents(self, escaped: Sequence[bytes]) -> bytes:
        """Consecutive content events, one per token, built by a single join."""
        if not escaped:
            return b""
        return self._prefix + (self._tail + self._prefix).join(escaped) + self._tail

    def last(self, escaped: bytes, finish_reason: str, extra: dict[str, Any] | None) -> bytes:
        """The last content token with ``finish_reason``, and ``extra`` (server_timing, ...) if given."""
        body = (
            b'"choices":[{"index":0,"delta":{"content":"'
            + escaped
            + b'"},"logprobs":null,"finish_reason":"'
            + finish_reason.encode()
            + b'"}]'
        )
        if self.include_usage:
            body += b',"usage":null'
        if extra:
            body += b"," + dumps(extra)[1:-1]
        return b"data: " + self._head + body + b"}\n\n"

    def usage(self, usage_obj: dict[str, Any], extra: dict[str, Any]) -> bytes:
        """The usage chunk: no choices, the usage, and ``extra``."""
        return b"data: " + self._head + b'"choices":[],' + dumps({"usage": usage_obj, **extra})[1:] + b"\n\n"


def completion(
    completion_id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str,
    usage_obj: dict[str, Any],
    extra: dict[str, Any],
    choices: list[dict[str, Any]] | None = None,
) -> bytes:
    """A whole ``chat.completion`` object, ``extra`` (server_timing, ...) merged in; ``choices`` replaces the
    one plain text choice (reasoning, tool calls, logprobs, n choices)."""
    return dumps(
        {
            "id": completion_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "system_fingerprint": FINGERPRINT,
            "choices": choices or [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "refusal": None, "annotations": []},
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            ],
            "usage": usage_obj,
            **extra,
        }
    )
