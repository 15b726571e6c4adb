"""Reasoning and tool calls in the engine: the inline <think> splitter, the tool-call assembler, and a client
against `llmchat serve --reasoning-tokens / --reasoning-inline / --tool-call` over real sockets."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from llmchat.core import ChatClient, attribute
from llmchat.core.http._openai import parse_chunk
from llmchat.core.http._reasoning import ThinkSplitter, split_inline
from llmchat.core.http._toolcalls import ToolCallAssembler
from llmchat.core.server import RunningServer
from llmchat.core.server._thinking import thinking_tokens

INLINE = "  <think>\nFirst, the sky.\nThen </thin the sea.</think>\n\nThe answer: <think> stays text."


def _feed(pieces: list[str]) -> tuple[str, str]:
    splitter = ThinkSplitter()
    answer, reasoning = [], []
    for piece in pieces:
        a, r = splitter.feed(piece)
        answer.append(a)
        reasoning.append(r)
    a, r = splitter.flush()
    return "".join(answer) + a, "".join(reasoning) + r


def test_an_inline_think_block_splits_the_same_wherever_the_chunks_are_cut() -> None:
    expected = ("The answer: <think> stays text.", "\nFirst, the sky.\nThen </thin the sea.")
    for cut in range(len(INLINE) + 1):
        for second in range(cut, len(INLINE) + 1, 7):  # and a second cut after it: <thi + nk> + ...
            assert _feed([INLINE[:cut], INLINE[cut:second], INLINE[second:]]) == expected, (cut, second)


def test_an_inline_think_block_split_into_single_characters() -> None:
    assert _feed(list(INLINE)) == _feed([INLINE]) == ("The answer: <think> stays text.",
                                                      "\nFirst, the sky.\nThen </thin the sea.")


@pytest.mark.parametrize(("pieces", "expected"), [
    (["<b>bold</b>"], ("<b>bold</b>", "")),  # a tag that is not <think>
    (["<thi", "s is text"], ("<this is text", "")),  # held, then released as answer
    (["<thi"], ("<thi", "")),  # a cut tag that never completed is text
    (["Hello <think>x</think>"], ("Hello <think>x</think>", "")),  # not at the start: the model's text
    (["<think>never closed"], ("", "never closed")),  # cut off while thinking: all of it is thinking
    (["\n\n", "  "], ("", "")),  # blank space only
])
def test_what_is_and_is_not_an_inline_think_block(pieces: list[str], expected: tuple[str, str]) -> None:
    assert _feed(pieces) == expected


def test_the_splitter_steps_aside_once_the_answer_has_begun() -> None:
    splitter = ThinkSplitter()
    assert splitter.feed("Hi") == ("Hi", "") and not splitter.answering  # watched for a bare </think>
    assert splitter.feed(" <think>") == (" <think>", "") and splitter.answering  # the model's text for good
    assert splitter.feed("</think>") == ("</think>", "") and not splitter.reclaimed
    assert split_inline("<think>a</think> b") == ("b", "a")


def _feed_reclaiming(pieces: list[str]) -> tuple[str, str, list[str]]:
    """As ``_feed``, moving the answer given out so far to the reasoning when the splitter reclaims it, as
    ChatStream does; also returns the answer pieces as the caller saw them (what it streamed)."""
    splitter = ThinkSplitter()
    answer: list[str] = []
    reasoning: list[str] = []
    seen: list[str] = []
    for piece in pieces:
        a, r = splitter.feed(piece)
        if splitter.reclaimed:
            splitter.reclaimed = False
            reasoning += answer
            answer = []
        answer.append(a)
        reasoning.append(r)
        seen.append(a)
    a, r = splitter.flush()
    return "".join(answer) + a, "".join(reasoning) + r, seen


OPENED_IN_PROMPT = "First, the sky.\nThen <thin the sea.\n</think>\n\nThe answer: </think> stays text."


def test_a_reply_that_starts_inside_its_thinking_splits_the_same_wherever_the_chunks_are_cut() -> None:
    expected = ("The answer: </think> stays text.", "First, the sky.\nThen <thin the sea.\n")
    text = OPENED_IN_PROMPT
    for cut in range(len(text) + 1):
        for second in range(cut, len(text) + 1, 5):  # and a second cut after it: </th + ink> + ...
            assert _feed_reclaiming([text[:cut], text[cut:second], text[second:]])[:2] == expected, (cut, second)
    assert _feed_reclaiming(list(text))[:2] == expected
    assert split_inline(text) == expected


def test_text_before_a_bare_close_tag_streams_as_it_comes_and_no_tag_is_ever_given_out() -> None:
    # Nothing is held back but a possible cut tag: the first pieces go out at once, as any answer's do.
    _, _, seen = _feed_reclaiming(["Okay, so ", "the user", " asks</th", "ink>\n", "\nSure."])
    assert seen == ["Okay, so ", "the user", " asks", "", "Sure."]
    assert not any("think" in s for s in seen)


@pytest.mark.parametrize(("pieces", "expected"), [
    (["Use <think>x</think> tags"], ("Use <think>x</think> tags", "")),  # an opening tag first: text
    (["Use <thi", "nk> then </think>"], ("Use <think> then </think>", "")),
    (["All done.", " </thi"], ("All done. </thi", "")),  # a cut close tag that never completed is text
    (["</think>Hi"], ("Hi", "")),  # empty thinking
    (["  thought</think>\n\n", "  \n", "answer"], ("answer", "  thought")),
])
def test_what_is_and_is_not_thinking_before_a_bare_close_tag(
    pieces: list[str], expected: tuple[str, str]
) -> None:
    assert _feed_reclaiming(pieces)[:2] == expected


def test_a_close_tag_past_the_watched_start_of_an_answer_is_text() -> None:
    from llmchat.core.http._reasoning import WATCH_CHARS

    long = "x" * WATCH_CHARS
    splitter = ThinkSplitter()
    assert splitter.feed(long) == (long, "") and splitter.answering
    assert _feed_reclaiming([long, "</think>", "y"])[:2] == (long + "</think>y", "")


def test_streamed_tool_calls_are_assembled_by_index() -> None:
    calls = ToolCallAssembler()
    for chunk in (
        [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": ""}}],
        [{"index": 1, "id": "call_b", "function": {"name": "get_time", "arguments": '{"tz"'}}],
        [{"index": 0, "function": {"arguments": '{"loc'}}],
        [{"index": 0, "function": {"arguments": 'ation": "Lisbon"}'}}],
        [{"index": 1, "function": {"arguments": ': "UTC"}'}}],
        ["not a call"],
    ):
        calls.feed(chunk)
    assert [(c.index, c.id, c.name, json.loads(c.arguments)) for c in calls.calls] == [
        (0, "call_a", "get_weather", {"location": "Lisbon"}), (1, "call_b", "get_time", {"tz": "UTC"})]
    whole = ToolCallAssembler()  # llama.cpp and Ollama: one delta, no index, arguments as an object
    whole.feed([{"id": "c", "function": {"name": "f", "arguments": {"x": 1}}}])
    assert [(c.index, c.name, json.loads(c.arguments)) for c in whole.calls] == [(0, "f", {"x": 1})]


def test_a_chunk_carries_its_tool_call_deltas() -> None:
    delta = parse_chunk('{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}')
    assert delta.tool_calls == [{"index": 0, "function": {"arguments": "{}"}}] and delta.content == ""


# -- against the local server ------------------------------------------------------------------------------
PROMPT = [{"role": "user", "content": "why is the sky blue"}]
TOKENS_PER_S = 200.0


async def _stream(server: RunningServer, **params: Any) -> tuple[Any, str, list[tuple[str, str]]]:
    """Streams a reply; returns the stream, its answer, and every delta in arrival order as (kind, text)."""
    order: list[tuple[str, str]] = []
    async with ChatClient(base_url=server.url + "/v1", model="llmchat-local") as client:
        stream = client.stream(PROMPT, **params)
        stream.on_reasoning = lambda text, _ns: order.append(("reasoning", text))
        async for piece in stream:
            order.append(("answer", piece))
        return stream, stream.text, order


@pytest.mark.parametrize("inline", [False, True], ids=["reasoning_content", "inline-think"])
async def test_a_reply_that_thinks_first_is_timed_apart_from_its_answer(
    server_factory: Callable[..., RunningServer], inline: bool
) -> None:
    server = server_factory(ttft_ms=40, tokens_per_s=TOKENS_PER_S, reasoning_tokens=30, reasoning_inline=inline)
    stream, answer, order = await _stream(server, max_tokens=20)
    record = stream.record
    thought = "".join(thinking_tokens(30, json.dumps(PROMPT, sort_keys=True, ensure_ascii=False,
                                                     separators=(",", ":"))))
    assert stream.reasoning.strip() == thought.strip()
    assert "<think>" not in answer and "think>" not in answer and thought.strip()[:20] not in answer
    assert answer.startswith("## ")  # the answer begins at its first visible character
    # Every reasoning delta came before the first answer delta, through the callback, as it arrived.
    kinds = [k for k, _ in order]
    assert kinds.index("answer") == kinds.count("reasoning") > 5
    # TTFT is the answer's; the thinking fills the time from the first reasoning token to it.
    assert record.first_reasoning_ns < record.first_token_ns
    assert record.ttft_ms == pytest.approx(record.first_reasoning_ms + record.thinking_ms, abs=0.01)
    assert record.thinking_ms >= 0.8 * 25 * 1000 / TOKENS_PER_S  # ~30 tokens at 200 tokens/s
    # The server's usage counts the reasoning tokens: TPOT runs from the first of them.
    assert record.tpot_ms == pytest.approx(1000 / TOKENS_PER_S, rel=0.35)
    summary = record.summary()
    assert summary["reasoning_chunks"] == record.reasoning_chunks >= 25
    assert summary["thinking_ms"] == pytest.approx(record.thinking_ms, abs=0.001)
    a = attribute(record)
    assert sum(p.ms for p in a.parts) == pytest.approx(a.total_ms, abs=0.01)
    assert a.ms("thinking") == pytest.approx(record.thinking_ms, abs=max(2.0, 0.1 * record.thinking_ms))
    thinking = a.part("thinking")
    assert thinking is not None and thinking.group == "server"
    note = next(n for n in a.notes if n.startswith("thinking "))
    assert note.endswith("to first token") and " of " in note


async def test_without_reasoning_nothing_changes(server_factory: Callable[..., RunningServer]) -> None:
    server = server_factory(ttft_ms=10, tokens_per_s=0)
    stream, answer, order = await _stream(server, max_tokens=20)
    assert stream.reasoning == "" and {k for k, _ in order} == {"answer"}
    assert stream.record.first_reasoning_ms is None and stream.record.thinking_ms is None
    assert attribute(stream.record).part("thinking") is None
    assert not any(n.startswith("thinking") for n in attribute(stream.record).notes)


async def test_a_tool_call_reply_is_assembled_streamed_and_whole(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(ttft_ms=10, tokens_per_s=TOKENS_PER_S, tool_call=True, reasoning_tokens=4)
    tools = [{"type": "function", "function": {"name": "lookup_sky", "parameters": {"type": "object"}}}]
    stream, answer, _ = await _stream(server, tools=tools)
    assert answer == "" and stream.finish_reason == "tool_calls" and stream.record.tool_calls == 1
    [call] = stream.tool_calls
    assert call.name == "lookup_sky" and call.id.startswith("call_")
    assert json.loads(call.arguments) == {"location": "why is the sky blue", "unit": "celsius"}
    assert stream.reasoning  # thinking before the call is kept too
    async with ChatClient(base_url=server.url + "/v1", model="llmchat-local") as client:
        whole = await client.complete(PROMPT, tools=tools)
    assert [c.to_dict() for c in whole.tool_calls] == [call.to_dict()]
    assert whole.record.summary()["tool_calls"] == 1 and whole.reasoning == stream.reasoning


async def test_a_whole_reply_with_an_inline_think_block_is_split(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(ttft_ms=0, tokens_per_s=0, reasoning_tokens=12, reasoning_inline=True)
    async with ChatClient(base_url=server.url + "/v1", model="llmchat-local") as client:
        reply = await client.complete(PROMPT, max_tokens=10)
    assert reply.reasoning.strip() and "<think>" not in reply.text and reply.text.startswith("## ")
