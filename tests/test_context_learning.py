"""Context fitting from the server's real window and its real counts (issue 21): llama.cpp's ``/props``, the
chat template's framing learnt from each reply's ``usage.prompt_tokens``, a refusal for length learnt from
once, and a prompt the server counted far shorter than sent (a context shift) flagged.

The arithmetic is tested as functions; the rest against ``llmchat serve --context-window 512
--template-overhead 10`` (a server whose template costs 10 tokens a message more than llmchat's 4, as
llama.cpp's does) and scripted peers that answer as llama.cpp does, all on 127.0.0.1.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import peers as P
import pytest

from llmchat.core import ChatClient, HTTPStatusError, TimingRecord, record_notes
from llmchat.core.client import MESSAGE_TOKENS, ContextBudget
from llmchat.core.client._fit import context_refusal, learned_framing, parse_props, root_url
from llmchat.core.server import RunningServer
from llmchat.tui.cli import main

MODEL = "llmchat-local"
Factory = Callable[..., RunningServer]
LLAMA_OLD_REFUSAL = "the request exceeds the available context size, try increasing it"


# -- the arithmetic --------------------------------------------------------------------------------------
def test_the_framing_a_reply_shows_is_shared_over_the_messages_and_never_below_the_default() -> None:
    # The figures: 411 counted by the server, 364 by llmchat, 16 messages: 47 more, 3 a message.
    assert learned_framing(411, 364, 16) == MESSAGE_TOKENS + 3
    assert learned_framing(364 + 160, 364, 16) == MESSAGE_TOKENS + 10
    # Fewer counted than sent (llama.cpp's context shift cut it) teaches nothing; nor does no message.
    assert learned_framing(397, 880, 10) == MESSAGE_TOKENS
    assert learned_framing(500, 100, 0) == MESSAGE_TOKENS


def test_refusals_for_length_in_llama_cpps_and_vllms_words_and_the_windows_they_state() -> None:
    vllm = ("HTTP 400: This model's maximum context length is 4,096 tokens. However, you requested 5000 "
            "tokens")
    assert context_refusal(400, vllm) == (True, 4096)
    assert context_refusal(400, f"127.0.0.1:8080 (HTTP 400: {LLAMA_OLD_REFUSAL})") == (True, None)
    new = "request (4476 tokens) exceeds the available context size (4096 tokens)"
    assert context_refusal(400, new) == (True, 4096)
    assert context_refusal(500, vllm) == (False, None)
    assert context_refusal(400, "HTTP 400: 'messages' must be a list") == (False, None)


def test_props_in_the_shapes_of_recent_and_older_llama_cpp() -> None:
    assert parse_props(json.dumps({"default_generation_settings": {"n_ctx": 512}, "n_ctx": 2048}).encode()) == 512
    assert parse_props(json.dumps({"n_ctx": 2048, "total_slots": 1}).encode()) == 2048
    assert parse_props(b'{"default_generation_settings": {"n_ctx": true}}') is None
    assert parse_props(b"<html>") is None and parse_props(b"[]") is None
    assert root_url("http://127.0.0.1:8080/v1", "/props") == "http://127.0.0.1:8080/props"


# -- llmchat serve's window and template -----------------------------------------------------------------
def test_serve_states_its_window_at_props_and_counts_its_template_overhead(server_factory: Factory) -> None:
    server = server_factory(profile="instant", context_window=512, template_overhead=10)
    root = server.base_url.removesuffix("/v1")
    props = httpx.get(root + "/props").json()
    assert props["default_generation_settings"]["n_ctx"] == 512
    msgs = [{"role": "user", "content": "hello there"}]
    reply = httpx.post(server.base_url + "/chat/completions", json={"model": MODEL, "messages": msgs,
                                                                    "max_tokens": 4}).json()
    # 3 for the reply + (4 + 10) for the message + 2 tokens of text.
    assert reply["usage"]["prompt_tokens"] == 3 + 14 + 2
    assert httpx.get(server_factory(profile="instant").base_url.removesuffix("/v1") + "/props").status_code == 404


async def _turns(client: ChatClient, budget: ContextBudget, n: int, max_tokens: int) -> list[Any]:
    """``n`` short turns, each fitted by ``budget`` and streamed; the fits."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    fits = []
    for i in range(n):
        history.append({"role": "user", "content": f"short question number {i}?"})
        fit = await budget.fit(history, max_tokens=max_tokens)
        fits.append(fit)
        stream = client.stream(fit.messages, max_tokens=max_tokens)
        async with stream:
            _ = [p async for p in stream]
        history.append({"role": "assistant", "content": stream.text})
    return fits


async def test_many_short_turns_on_a_512_window_are_never_refused(server_factory: Factory) -> None:
    # llmchat counts 4 tokens a message; this server's template counts 14, as llama.cpp's does. Fitted by
    # llmchat's own count alone, turn 8 or so goes past 512 and every later one is refused with a 400.
    server = server_factory(profile="instant", context_window=512, template_overhead=10)
    async with ChatClient(base_url=server.base_url, model=MODEL, http2="h2c", use_cache=False) as client:
        budget = ContextBudget(client)
        fits = await _turns(client, budget, 14, max_tokens=24)
    assert fits[0].window == 512 and fits[0].window_source == "server"
    assert budget.framing(MODEL) == MESSAGE_TOKENS + 10 and fits[-1].framing == MESSAGE_TOKENS + 10
    assert fits[-1].turns_left_out > 0  # it did reach the window, and left turns out instead of failing
    assert all(f.note == "" for f in fits)


async def test_a_refusal_for_length_is_learnt_from_and_the_next_fit_says_so_once(
    peer: Callable[..., P.Peer],
) -> None:
    # An old llama.cpp, which names no window, behind a proxy that hides /props and /models.
    refusal = P.json_response(400, {"error": {"code": 400, "message": LLAMA_OLD_REFUSAL,
                                              "type": "exceed_context_size_error"}})
    srv = peer([refusal], then="keep", chat_only=True)
    long = [{"role": "user", "content": "word " * 400}]
    async with ChatClient(base_url=srv.base_url, model="m", use_cache=False) as client:
        budget = ContextBudget(client)
        first = await budget.fit(long)
        with pytest.raises(HTTPStatusError, match="exceeds the available context size"):
            await client.complete(first.messages)
        refit = await budget.fit([*long[:0], {"role": "user", "content": "word " * 100}])
        again = await budget.fit([{"role": "user", "content": "word " * 100}])
    assert first.window is None and first.note == ""
    # What was refused (as counted here) is taken for the window; said once, with the cause.
    assert refit.window == first.prompt_tokens and refit.window_source == "refusal"
    assert "refused the last request" in refit.note and "context window" in refit.note
    assert again.note == "" and again.window == refit.window


async def test_a_refusal_that_states_the_window_teaches_that_window(server_factory: Factory) -> None:
    server = server_factory(profile="instant", context_window=300)
    async with ChatClient(base_url=server.base_url, model=MODEL, http2="h2c", use_cache=False) as client:
        budget = ContextBudget(client)
        budget._props, budget._windows = None, {MODEL: 4096}  # as a /models that states the training window
        long = [{"role": "user", "content": "word " * 320}]
        with pytest.raises(HTTPStatusError):
            await client.complete(long, max_tokens=10)
        fit = await budget.fit([{"role": "user", "content": "hello"}], max_tokens=10)
    assert fit.window == 300 and fit.window_source == "refusal" and "300-token" in fit.note


# -- a prompt the server cut -----------------------------------------------------------------------------
def _sse_with_usage(prompt_tokens: int) -> list[P.Step]:
    return [P.SSE_HEAD, P.event(P.delta("", role="assistant")), P.event(P.delta("ok", finish_reason="stop")),
            P.event(P.usage_chunk(prompt_tokens, 1)), P.DONE, P.END]


def test_ask_stats_says_when_the_server_counted_far_fewer_prompt_tokens_than_were_sent(
    peer: Callable[..., P.Peer], capsys: pytest.CaptureFixture[str],
) -> None:
    # llama.cpp's context shift: about 880 tokens sent, 397 counted, and not a word about it.
    srv = peer(_sse_with_usage(397), then="keep", chat_only=True)
    prompt = "tell me more about it " * 160  # 3,520 bytes: about 880 tokens
    status = main(["ask", prompt, "--json", "--stats", "--base-url", srv.base_url, "--model", "m"])
    captured = capsys.readouterr()
    assert status == 0
    obj = json.loads(captured.out)
    assert obj["prompt_tokens"] == 397 and obj["prompt_truncated"] is True
    assert obj["prompt_sent_tokens"] == pytest.approx(880, abs=10)
    assert any("counted 397 prompt tokens" in n for n in obj["attribution"]["notes"])
    assert "dropped the start of the conversation" in captured.err


def test_a_prompt_counted_about_as_sent_is_not_flagged() -> None:
    r = TimingRecord(mode="stream")
    r.prompt_sent_tokens, r.prompt_tokens = 364, 411
    assert not r.prompt_truncated and record_notes(r) == []
    r.prompt_tokens = 300  # fewer, but within the margin a template's worth of difference makes
    assert not r.prompt_truncated
    r.prompt_sent_tokens, r.prompt_tokens = 40, 10  # far fewer, but a short prompt
    assert not r.prompt_truncated
