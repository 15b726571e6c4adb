"""A reasoning model's shapes for the local server: a thinking phase before the answer, and tool-call replies.

With ``reasoning_tokens`` N the reply starts with N tokens of deterministic thinking, streamed as
``reasoning_content`` deltas (vLLM's and DeepSeek's shape) or, with ``reasoning_inline``, inside the content as
a ``<think>...</think>`` block (llama.cpp without a reasoning format, R1 distills on a plain server). The
tokeniser cuts the tags into pieces (``<``, ``think``, ``>``), so a client meets tags split across chunks.

With ``tool_call`` the answer is a call to the request's first tool (``get_weather`` when it names none), its
arguments, a JSON object, streamed in pieces under the same ``index`` as OpenAI does; ``finish_reason`` is
``tool_calls``. Each event is built once per request as bytes; ``_chat`` paces them like tokens.

With ``reasoning_open_in_prompt`` the block has no opening tag (an R1-style template opens ``<think>`` in
the prompt): the stream starts with the thinking and carries only ``</think>``.

With ``refuse`` the reply is a refusal as OpenAI sends one: ``delta.refusal`` pieces with ``content`` null
(``message.refusal`` whole), finish_reason ``stop``.

The same plan carries a request's ``logprobs`` (on its content tokens; reasoning and tool-call deltas have
none, as a reasoning model's have none) and one choice of ``n`` (``Events`` writes any choice ``index``);
``_choices`` interleaves the choices of one stream.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llmchat.core.server._encode import dumps
from llmchat.core.server._logprobs import chunk_logprobs, token_logprobs
from llmchat.core.server._replies import Reply, tokenize

DEFAULT_TOOL = "get_weather"
_THOUGHTS = (
    "the user asks", "about", "so I should", "first check", "what they mean", "then answer", "briefly",
    "with an example", "and a table", "wait", "let me reconsider", "the edge cases", "okay", "that works",
)


def thinking_tokens(n: int, seed_text: str) -> list[str]:
    """``n`` tokens of deterministic thinking for a request identified by ``seed_text``."""
    rng = random.Random(int.from_bytes(hashlib.sha256(seed_text.encode()).digest()[:8], "big"))
    tokens: list[str] = []
    while len(tokens) < n:
        sentence = " ".join(rng.choice(_THOUGHTS) for _ in range(rng.randint(4, 9))).capitalize() + ". "
        tokens.extend(tokenize(sentence))
    return tokens[:n]


def tool_arguments(last_user_text: str) -> str:
    """The call's arguments: a JSON object naming what the user asked about."""
    subject = " ".join(last_user_text.split())[:60] or "here"
    return json.dumps({"location": subject, "unit": "celsius"}, ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class Plan:
    """The events of one reply but its last: ``events[k]`` is token k's bytes (reasoning, content or a piece
    of a tool call); ``reasoning`` counts the reasoning tokens among them; the last token and the finish
    reason go in the final chunk, built with the usage and server_timing when the reply ends."""

    events: list[bytes]
    last_content: bytes
    finish_reason: str
    completion_tokens: int
    reasoning: str
    content: str
    tool_call: dict[str, Any] | None
    reasoning_tokens: int = 0
    logprobs: list[dict[str, Any]] | None = None
    """The content tokens' ``logprobs.content`` entries, when the request asked for them."""
    last_logprobs: bytes | None = None
    """The final chunk's ``logprobs`` object, when asked for and the reply ends in a content token."""
    refusal: str = ""


#: What ``refuse`` answers, as OpenAI's models word a refusal.
REFUSAL = "I'm sorry, but I can't help with that request."


class Events:
    """Byte templates for the delta shapes of one choice (``index``), on the head of a request's
    ``ChunkTemplate``. For index 0 without logprobs they are byte for byte what ``ChunkTemplate`` writes."""

    def __init__(self, head: bytes, include_usage: bool, index: int = 0) -> None:
        self._open = b"data: " + head + b'"choices":[{"index":' + str(index).encode() + b',"delta":'
        self._usage = b',"usage":null' if include_usage else b""
        self._close = b',"logprobs":null,"finish_reason":null}]' + self._usage + b"}\n\n"

    def _chunk(self, delta: bytes) -> bytes:
        return self._open + delta + self._close

    def role(self, logprobs: bool) -> bytes:
        """The choice's first event: the assistant role, no token (an empty ``logprobs.content`` when asked,
        as OpenAI sends it)."""
        lp = b'{"content":[],"refusal":null}' if logprobs else b"null"
        return (self._open + b'{"role":"assistant","content":"","refusal":null},"logprobs":' + lp
                + b',"finish_reason":null}]' + self._usage + b"}\n\n")

    def reasoning(self, escaped: bytes) -> bytes:
        return self._chunk(b'{"reasoning_content":"' + escaped + b'"}')

    def tool_call(self, call: dict[str, Any]) -> bytes:
        return self._chunk(dumps({"tool_calls": [call]}))

    def refusal(self, escaped: bytes) -> bytes:
        return self._chunk(b'{"content":null,"refusal":"' + escaped + b'"}')

    def content(self, escaped: bytes, logprobs: bytes | None = None) -> bytes:
        """A content token, already JSON-escaped; ``logprobs`` is its chunk's ``logprobs`` object."""
        if logprobs is None:
            return self._chunk(b'{"content":"' + escaped + b'"}')
        return (self._open + b'{"content":"' + escaped + b'"},"logprobs":' + logprobs
                + b',"finish_reason":null}]' + self._usage + b"}\n\n")

    def finish(self, escaped: bytes, finish_reason: str, logprobs: bytes | None,
               extra: dict[str, Any] | None) -> bytes:
        """The choice's last event: its last token with ``finish_reason``, and ``extra`` if given."""
        body = (self._open + b'{"content":"' + escaped + b'"},"logprobs":' + (logprobs or b"null")
                + b',"finish_reason":"' + finish_reason.encode() + b'"}]' + self._usage)
        if extra:
            body += b"," + dumps(extra)[1:-1]
        return body + b"}\n\n"


def plan(
    reply: Reply, *, reasoning_tokens: int, inline: bool, tool_call: bool, tools: Sequence[str],
    seed_text: str, last_user_text: str, events: Events, top_logprobs: int | None = None,
    open_in_prompt: bool = False, refuse: bool = False,
) -> Plan:
    """The events of one choice with a thinking phase, a tool call, a refusal and/or logprobs (``top_logprobs``
    None: none asked for; else the alternatives per token) for its content tokens. ``open_in_prompt`` sends
    the thinking inline without its opening tag."""
    inline = inline or open_in_prompt
    thoughts = thinking_tokens(reasoning_tokens, seed_text)
    out: list[bytes] = []
    answer: list[str] = []
    if thoughts and inline:
        opening = [] if open_in_prompt else tokenize("<think>\n")
        answer = [*opening, *thoughts, *tokenize("\n</think>\n\n")]
    elif thoughts:
        out = [events.reasoning(_escape(t)) for t in thoughts]
    call = None
    if tool_call:
        name = tools[0] if tools else DEFAULT_TOOL
        arguments = tool_arguments(last_user_text)
        call = {"id": "call_" + hashlib.sha256(seed_text.encode()).hexdigest()[:24], "type": "function",
                "function": {"name": name, "arguments": arguments}}
        entries = _entries(answer, top_logprobs, seed_text)
        out += _contents(events, answer, entries)  # an inline block before the call
        out.append(events.tool_call({"index": 0, "id": call["id"], "type": "function",
                                     "function": {"name": name, "arguments": ""}}))
        pieces = [arguments[i:i + 8] for i in range(0, len(arguments), 8)]
        out += [events.tool_call({"index": 0, "function": {"arguments": p}}) for p in pieces]
        text = "".join(answer)
        return Plan(out, b"", "tool_calls", len(thoughts) + 1 + len(pieces), "" if inline else "".join(thoughts),
                    text, call, len(thoughts), entries)
    if refuse:
        out += [events.content(_escape(t)) for t in answer]  # thinking before the refusal, as o1 may
        pieces = tokenize(REFUSAL)
        out += [events.refusal(_escape(t)) for t in pieces]
        return Plan(out, b"", "stop", len(thoughts) + len(pieces), "" if inline else "".join(thoughts),
                    "".join(answer), None, len(thoughts), refusal=REFUSAL)
    answer += reply.tokens
    entries = _entries(answer, top_logprobs, seed_text)
    out += _contents(events, answer[:-1], entries)
    last = _escape(answer[-1]) if answer else b""
    last_lp = chunk_logprobs(entries[-1]) if entries else None
    return Plan(out, last, reply.finish_reason, len(thoughts) + len(reply.tokens),
                "" if inline else "".join(thoughts), "".join(answer), None, len(thoughts), entries, last_lp)


def _entries(tokens: Sequence[str], top: int | None, seed_text: str) -> list[dict[str, Any]] | None:
    return None if top is None else token_logprobs(tokens, top, seed_text)


def _contents(events: Events, tokens: Sequence[str], entries: list[dict[str, Any]] | None) -> list[bytes]:
    if entries is None:
        return [events.content(_escape(t)) for t in tokens]
    return [events.content(_escape(t), chunk_logprobs(e)) for t, e in zip(tokens, entries, strict=False)]


def whole_message(p: Plan) -> dict[str, Any]:
    """The ``message`` of a whole (non-streamed) reply with the same thinking and call."""
    msg: dict[str, Any] = {"role": "assistant",
                           "content": p.content or (None if p.tool_call or p.refusal else ""),
                           "refusal": p.refusal or None, "annotations": []}
    if p.reasoning:
        msg["reasoning_content"] = p.reasoning
    if p.tool_call is not None:
        msg["tool_calls"] = [p.tool_call]
    return msg


def _escape(token: str) -> bytes:
    return json.dumps(token, ensure_ascii=False)[1:-1].encode()
