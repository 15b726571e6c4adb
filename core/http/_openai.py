"""OpenAI wire shapes: request bodies in, chunk and reply objects out, error responses to typed errors.

Pure: bytes and dicts in, objects out; no I/O, no httpx. What real servers send is handled here: a role-only
first delta or none, empty deltas, ``reasoning_content`` / ``reasoning`` deltas, ``refusal`` deltas (OpenAI's
structured refusal: ``content`` null, the words in ``refusal``), ``finish_reason``, a usage
chunk, an error object inside the stream (llama.cpp), llama.cpp's ``timings`` and our server's
``server_timing``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import llmchat.core.errors as errors
from llmchat.core.http._reasoning import split_inline
from llmchat.core.http._toolcalls import ToolCall, tool_calls_from
from llmchat.core.text import clean, may_need_cleaning

try:
    import orjson as _orjson
except ImportError:  # optional: the stdlib decodes the same JSON, only slower
    _orjson = None  # type: ignore[assignment]

#: Parameters that shape the transport, not the reply: a stream and a batch request differ only in these.
TRANSPORT_PARAMS = frozenset({"stream", "stream_options"})


def loads(data: str | bytes) -> Any:
    """Decode JSON with orjson when it is installed (faster: benchmarks/attribution.py), else the stdlib.

    What orjson refuses and the stdlib accepts (NaN and Infinity, lone surrogate escapes) is handed to the
    stdlib, so no reply fails on the fast path that the stdlib would decode. One difference remains: orjson
    reads an integer past 64 bits as a float (no chat field holds one). Raises ValueError for invalid JSON."""
    return _loads(data)[0]


def _loads(data: str | bytes) -> tuple[Any, bool]:
    """``loads``, and whether its strings may hold lone surrogates (only the stdlib lets them through).
    Bytes that are not UTF-8 become U+FFFD rather than making the whole document invalid."""
    if _orjson is not None:
        try:
            return _orjson.loads(data), False
        except _orjson.JSONDecodeError:
            pass
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    return json.loads(data), True


def chat_body(model: str, messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any], *, stream: bool) -> bytes:
    """The JSON body of POST /chat/completions. In stream mode usage is asked for with stream_options (and
    whatever else ``params["stream_options"]`` asks, such as vLLM's ``continuous_usage_stats``)."""
    body: dict[str, Any] = {"model": model, "messages": list(messages)}
    body.update({k: v for k, v in params.items() if v is not None and k not in TRANSPORT_PARAMS})
    body["stream"] = stream
    if stream:
        extra = params.get("stream_options")
        body["stream_options"] = {"include_usage": True, **(extra if isinstance(extra, Mapping) else {})}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


@dataclass(slots=True)
class Delta:
    """What one stream chunk contributes."""

    content: str = ""
    reasoning: str = ""
    refusal: str = ""
    """``delta.refusal``: the model refused, in these words (kept apart from the answer, as reasoning is)."""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    server_timing: dict[str, int] | None = None
    timings: dict[str, float] | None = None  # llama.cpp's self-report on the final chunk
    tool_calls: list[Any] | None = None
    """``delta.tool_calls`` as sent: pieces of calls, assembled by ``ToolCallAssembler``."""
    suspect: bool = False
    """content or reasoning may hold lone surrogates (a pair split across chunks): feed them through a
    ``_text.SurrogateJoiner`` before keeping them."""


class StreamError(Exception):
    """An error object inside a stream, or a chunk that is not JSON. Carries the one-line message."""


def parse_chunk(data: str) -> Delta:
    """Decode one SSE ``data`` payload (not ``[DONE]``). Raises ``StreamError`` for errors and non-JSON."""
    try:
        obj, suspect = _loads(data)
    except ValueError:
        raise StreamError(f"the server sent a stream chunk that is not JSON: {_snippet(data)}") from None
    if not isinstance(obj, dict):
        raise StreamError(f"the server sent a stream chunk that is not a JSON object: {_snippet(data)}")
    if "error" in obj and not obj.get("choices"):
        raise StreamError(f"the server reported an error mid-stream: {error_text(obj)}")
    d = Delta()
    choices = obj.get("choices")
    if choices and isinstance(choices, list):
        choice = choices[0] if isinstance(choices[0], dict) else {}
        delta = choice.get("delta") or {}
        if isinstance(delta, dict):
            c = delta.get("content")
            if isinstance(c, str):
                d.content = c
            r = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(r, str):
                d.reasoning = r
            calls = delta.get("tool_calls")
            if isinstance(calls, list) and calls:
                d.tool_calls = calls
            refusal = delta.get("refusal")  # the one lookup a chunk without a refusal pays
            if refusal and isinstance(refusal, str):
                d.refusal = clean(refusal)[0] if suspect else refusal
            d.suspect = suspect and (may_need_cleaning(d.content) or may_need_cleaning(d.reasoning))
        d.finish_reason = choice.get("finish_reason")
    usage = obj.get("usage")
    if isinstance(usage, dict):
        d.usage = usage
    st = obj.get("server_timing")
    if isinstance(st, dict):
        d.server_timing = {k: v for k, v in st.items() if isinstance(v, int)}
    d.timings = _timings(obj.get("timings"))
    return d


def _timings(raw: object) -> dict[str, float] | None:
    """llama.cpp's ``timings`` (prompt_ms, predicted_ms, prompt_n, predicted_n ...): numbers only, or None."""
    if not isinstance(raw, dict):
        return None
    out = {k: float(v) for k, v in raw.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    return out or None


@dataclass(slots=True)
class Reply:
    """A whole (non-streamed) reply."""

    content: str
    reasoning: str
    finish_reason: str | None
    usage: dict[str, Any] | None
    model: str | None
    server_timing: dict[str, int] | None
    timings: dict[str, float] | None = None
    replaced: int = 0
    """Characters of content and reasoning that were not valid Unicode, now U+FFFD."""
    tool_calls: list[ToolCall] | None = None
    """The calls the model asked for (``message.tool_calls``), None when it asked for none."""
    refusal: str = ""
    """``message.refusal``: the model refused, in these words; "" when it did not."""


def parse_reply(body: bytes, *, status: int, content_type: str, where: str) -> Reply:
    """Decode a ``chat.completion`` object. Raises ``ProtocolError`` for HTML or non-JSON bodies. Text that is
    not valid Unicode (lone surrogates, bytes that are not UTF-8) comes back as U+FFFD, counted in
    ``replaced``."""
    obj = _json_object(body, status=status, content_type=content_type, where=where)
    choices = obj.get("choices") or [{}]
    msg = (choices[0] or {}).get("message") or {}
    st = obj.get("server_timing")
    content, bad_content = clean(str(msg.get("content") or ""))
    reasoning, bad_reasoning = clean(str(msg.get("reasoning_content") or msg.get("reasoning") or ""))
    if not reasoning and ("<think>" in content[:64] or "</think>" in content):
        content, reasoning = split_inline(content)
    calls = tool_calls_from(msg) if isinstance(msg, dict) else []
    raw_refusal = msg.get("refusal") if isinstance(msg, dict) else None
    refusal = clean(raw_refusal)[0] if isinstance(raw_refusal, str) else ""
    return Reply(
        refusal=refusal,
        content=content,
        reasoning=reasoning,
        replaced=bad_content + bad_reasoning,
        finish_reason=(choices[0] or {}).get("finish_reason"),
        usage=obj.get("usage") if isinstance(obj.get("usage"), dict) else None,
        model=obj.get("model"),
        server_timing={k: v for k, v in st.items() if isinstance(v, int)} if isinstance(st, dict) else None,
        timings=_timings(obj.get("timings")),
        tool_calls=calls or None,
    )


def parse_embeddings(body: bytes, *, status: int, content_type: str, where: str) -> list[list[float]]:
    obj = _json_object(body, status=status, content_type=content_type, where=where)
    data = obj.get("data")
    if not isinstance(data, list):
        raise errors.ProtocolError(f"{where} sent an embeddings reply without a data list; is base_url right?")
    ordered = sorted(data, key=lambda d: d.get("index", 0))
    return [list(map(float, d["embedding"])) for d in ordered]


def parse_models(body: bytes) -> list[str]:
    """Model ids from GET /models, in the server's order; [] when the body is not the expected shape (used in
    hints only)."""
    try:
        obj = json.loads(body)
        return [str(m["id"]) for m in obj.get("data", []) if isinstance(m, dict) and "id" in m]
    except (ValueError, AttributeError, TypeError, KeyError):
        return []


def _json_object(body: bytes, *, status: int, content_type: str, where: str) -> dict[str, Any]:
    if looks_html(body, content_type):
        raise errors.ProtocolError(
            f"{where} answered HTTP {status} with an HTML page ({_html_title(body)}) where JSON was expected; "
            "a proxy or gateway answered: check base_url and HTTPS_PROXY"
        )
    try:
        obj = loads(body)
    except ValueError:
        raise errors.ProtocolError(
            f"{where} answered HTTP {status} with a body that is not JSON "
            f"({_snippet(body.decode('utf-8', 'replace'))}); "
            "check base_url points at an OpenAI-compatible API (it usually ends in /v1)"
        ) from None
    if not isinstance(obj, dict):
        raise errors.ProtocolError(f"{where} answered with JSON that is not an object; check base_url")
    return obj


#: What to do about a proxy's refusal of a request too large for it (nginx: client_max_body_size,
#: large_client_header_buffers): the request, not the URL or the proxy settings, is what to change.
_TOO_LARGE = {
    413: "the request is larger than it accepts: send a shorter conversation or smaller attachments, or raise its "
         "limit (nginx: client_max_body_size)",
    431: "the request's headers are larger than it accepts: raise its limit (nginx: large_client_header_buffers)",
}


def looks_html(body: bytes, content_type: str) -> bool:
    head = body[:200].lstrip().lower()
    return "html" in content_type.lower() or head.startswith((b"<!doctype", b"<html", b"<head", b"<body"))


def _html_title(body: bytes) -> str:
    text = body[:4096].decode("utf-8", "replace")
    lo = text.lower()
    start = lo.find("<title>")
    if start >= 0:
        end = lo.find("</title>", start)
        title = text[start + 7 : end if end > 0 else start + 87]
        return f'"{" ".join(title.split())}"'
    for line in text.splitlines():
        stripped = line.strip()
        if stripped:
            return _snippet(stripped)
    return "empty"


def error_text(obj: Mapping[str, Any]) -> str:
    """The message of an OpenAI-shaped error object (``{"error": {...}}`` or ``{"error": "text"}``)."""
    err = obj.get("error", obj)
    if isinstance(err, dict):
        msg = err.get("message") or err.get("code") or err.get("type") or "unknown error"
        code = err.get("code")
        return f"{msg} ({code})" if code and code != msg else str(msg)
    return str(err)


def _snippet(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def status_error(
    status: int,
    body: bytes,
    *,
    content_type: str,
    headers: Mapping[str, str],
    where: str,
    key_source: str,
    model: str,
    models: Sequence[str] | None = None,
    key_hint: str | None = None,
) -> errors.HTTPStatusError | errors.ProtocolError:
    """Map an error status to a typed error with a one-line cause-and-fix message.

    ``key_source`` names where the API key came from (never the key); ``key_hint`` is given when no key was
    sent, and says which flag or config key would send one. ``models`` are the ids /models offers, listed for
    a 404 when known.
    """
    if looks_html(body, content_type):
        err = errors.ServerError if status >= 500 else errors.HTTPStatusError
        fix = _TOO_LARGE.get(status, "check base_url and HTTPS_PROXY, or try again if it is a 502/503")
        return err(
            f"{where} answered HTTP {status} with an HTML page ({_html_title(body)}) instead of JSON; a proxy or "
            f"gateway answered: {fix}",
            status=status,
            headers=headers,
        )
    try:
        detail = error_text(json.loads(body))
    except (ValueError, AttributeError):
        detail = _snippet(body.decode("utf-8", "replace")) if body else "no body"
    detail = _redact_keys(detail)
    if status in (401, 403) and key_hint is not None:
        return errors.AuthError(
            f"{where} {'wants an API key' if status == 401 else 'refused access'} (HTTP {status}: {detail}); "
            f"no key was sent: {key_hint or 'configure one for this provider'}",
            status=status,
            headers=headers,
        )
    if status in (401, 403):
        what = "rejected the API key" if status == 401 else "refused access"
        return errors.AuthError(
            f"{where} {what} (HTTP {status}: {detail}); the key came from {key_source}: "
            "set a valid key there",
            status=status,
            headers=headers,
        )
    if status == 404:
        hint = f"; available: {', '.join(models[:12])}" if models else "; check base_url ends in /v1"
        return errors.NotFoundError(
            f"{where} has no model {model!r} or no such endpoint (HTTP 404: {detail}); pick another with "
            f"--model{hint}",
            status=status,
            headers=headers,
        )
    if status == 429:
        return errors.RateLimitError(
            f"{where} is rate limiting (HTTP 429: {detail}); wait and try again, or lower the request rate",
            status=status,
            headers=headers,
        )
    if status >= 500:
        return errors.ServerError(
            f"{where} failed with HTTP {status} ({detail}); the server's fault: try again later",
            status=status,
            headers=headers,
        )
    return errors.HTTPStatusError(
        f"{where} refused the request (HTTP {status}: {detail}); check the model and parameters",
        status=status,
        headers=headers,
    )


def _redact_keys(text: str) -> str:
    # Providers echo a prefix of a bad key in their 401 message ("Incorrect API key provided: sk-abc***");
    # keep even that out of our messages and logs.
    out = []
    for word in text.split(" "):
        if word.startswith(("sk-", "sk_", "Bearer")) and len(word) > 8:
            out.append("[redacted]")
        else:
            out.append(word)
    return " ".join(out)
