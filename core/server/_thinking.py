"""A reasoning model's shapes for the local server: a thinking phase before the answer, and tool-call replies.

With ``reasoning_tokens`` N the reply starts with N tokens of deterministic thinking, streamed as
``reasoning_content`` deltas (vLLM's and DeepSeek's shape) or, with ``reasoning_inline``, inside the content as
a ``<think>...</think>`` block (llama.cpp without a reasoning format, R1 distills on a plain server). The
tokeniser cuts the tags into pieces (``<``, ``think``, ``>``), so a client meets tags split across chunks.

With ``reasoning_open_in_prompt`` the block has no opening tag (an R1-style template opens ``<think>`` in
the prompt): the stream starts with the thinking and carries only ``</think>``.

With ``refuse`` the reply is a refusal as OpenAI sends one: ``delta.refusal`` pieces with ``content`` null
(``message.refusal`` whole), finish_reason ``stop``.

With ``tool_call`` the answer is a call to the request's first tool (``get_weather`` when it names none), its
arguments, a JSON object, streamed in pieces under the same ``index`` as OpenAI does; ``finish_reason`` is
``tool_calls``. Each event is built once per request as bytes; ``_chat`` paces them like tokens.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llmchat.core.server._encode import dumps
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
    refusal: str = ""


#: What ``refuse`` answers, as OpenAI's models word a refusal.
REFUSAL = "I'm sorry, but I can't help with that request."


class Events:
    """Byte templates for the extra delta shapes, on the head of a request's ``ChunkTemplate``."""

    def __init__(self, head: bytes, include_usage: bool) -> None:
        self._head = head
        self._usage = b',"usage":null' if include_usage else b""

    def _chunk(self, delta: bytes) -> bytes:
        return (b"data: " + self._head + b'"choices":[{"index":0,"delta":' + delta
                + b',"logprobs":null,"finish_reason":null}]' + self._usage + b"}\n\n")

    def reasoning(self, escaped: bytes) -> bytes:
        return self._chunk(b'{"reasoning_content":"' + escaped + b'"}')

    def refusal(self, escaped: bytes) -> bytes:
        return self._chunk(b'{"content":null,"refusal":"' + escaped + b'"}')

    def tool_call(self, call: dict[str, Any]) -> bytes:
        return self._chunk(dumps({"tool_calls": [call]}))


def plan(
    reply: Reply, *, reasoning_tokens: int, inline: bool, tool_call: bool, tools: Sequence[str],
    seed_text: str, last_user_text: str, events: Events, content: Any, open_in_prompt: bool = False,
    refuse: bool = False,
) -> Plan:
    """The events of a reply with a thinking phase, a tool call or a refusal. ``content`` is the request's
    ``ChunkTemplate.content`` (escaped bytes to a content event). ``open_in_prompt`` sends the thinking inline
    without its opening tag."""
    thoughts = thinking_tokens(reasoning_tokens, seed_text)
    inline = inline or open_in_prompt
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
        out += [content(_escape(t)) for t in answer]  # an inline block before the call
        out.append(events.tool_call({"index": 0, "id": call["id"], "type": "function",
                                     "function": {"name": name, "arguments": ""}}))
        pieces = [arguments[i:i + 8] for i in range(0, len(arguments), 8)]
        out += [events.tool_call({"index": 0, "function": {"arguments": p}}) for p in pieces]
        text = "".join(answer)
        return Plan(out, b"", "tool_calls", len(thoughts) + 1 + len(pieces), "" if inline else "".join(thoughts),
                    text, call)
    if refuse:
        out += [content(_escape(t)) for t in answer]  # thinking before the refusal, as o1 may
        pieces = tokenize(REFUSAL)
        out += [events.refusal(_escape(t)) for t in pieces]
        return Plan(out, b"", "stop", len(thoughts) + len(pieces), "" if inline else "".join(thoughts),
                    "".join(answer), None, REFUSAL)
    answer += reply.tokens
    out += [content(_escape(t)) for t in answer[:-1]]
    last = _escape(answer[-1]) if answer else b""
    return Plan(out, last, reply.finish_reason, len(thoughts) + len(reply.tokens),
                "" if inline else "".join(thoughts), "".join(answer), None)


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
