"""Context that fits: counting a conversation's tokens (the server's tokenizer, else the estimate), learning
the window (config, else /models metadata), leaving the oldest turns out, and the local server's /tokenize,
window and image checks that let all of it run offline. Also attachments, read and shaped for the wire.

Against the project's own server over real sockets on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmchat.core import ChatClient, HTTPStatusError, ProviderSettings, Settings
from llmchat.core.client import ContextBudget, ContextOverflowError, estimate_tokens
from llmchat.core.client._fit import parse_windows, tokenize_url
from llmchat.core.http import (
    AttachmentError,
    message_content,
    message_text,
    read_attachment,
    split_file_lines,
)
from llmchat.core.server import RunningServer

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 40


def _client(server: RunningServer, **kw: Any) -> ChatClient:
    return ChatClient(base_url=server.base_url, http2="h2c", **kw)


def _root(server: RunningServer) -> str:
    return server.base_url.removesuffix("/v1")


def _conversation(turns: int, words: int = 40) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are terse."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"question {i}: " + " ".join(["word"] * words)})
        messages.append({"role": "assistant", "content": f"answer {i}: " + " ".join(["reply"] * words)})
    messages.append({"role": "user", "content": "and the last question?"})
    return messages


# -- the local server ------------------------------------------------------------------------------------
def test_the_server_tokenizes_in_llama_cpp_and_vllm_shapes_and_states_its_window(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(profile="instant", context_window=2048)
    llama = httpx.post(_root(server) + "/tokenize", json={"content": "hello there, world"}).json()
    vllm = httpx.post(_root(server) + "/tokenize", json={"prompt": "hello there, world", "model": "x"}).json()
    assert set(llama) == {"tokens"} and len(llama["tokens"]) == 4  # hello, " there", ",", " world"
    assert vllm["count"] == len(llama["tokens"]) and vllm["max_model_len"] == 2048
    model = httpx.get(server.base_url + "/models").json()["data"][0]
    assert model["max_model_len"] == 2048 and model["meta"]["n_ctx_train"] == 2048
    assert parse_windows(json.dumps({"data": [model]}).encode()) == {model["id"]: 2048}


def test_the_windows_of_vllm_llama_cpp_and_openrouter_model_lists() -> None:
    body = {"data": [{"id": "v", "max_model_len": 32768}, {"id": "l", "meta": {"n_ctx_train": 131072}},
                     {"id": "o", "context_length": 8000}, {"id": "none"}, {"id": "bad", "max_model_len": True}]}
    assert parse_windows(json.dumps(body).encode()) == {"v": 32768, "l": 131072, "o": 8000}
    assert parse_windows(b"<html>") == {}
    assert tokenize_url("http://h:8080/v1") == "http://h:8080/tokenize"
    assert tokenize_url("https://h/proxy/v1/") == "https://h/proxy/tokenize"


async def test_the_server_refuses_a_prompt_past_its_window_as_vllm_does(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(profile="instant", context_window=300)
    async with _client(server) as client:
        with pytest.raises(HTTPStatusError, match="maximum context length is 300 tokens"):
            await client.complete(_conversation(4), max_tokens=50)


# -- counting --------------------------------------------------------------------------------------------
async def test_the_servers_tokenizer_counts_what_it_then_reports_as_prompt_tokens(
    local_server: RunningServer,
) -> None:
    messages = _conversation(3)
    async with _client(local_server) as client:
        budget = ContextBudget(client)
        fit = await budget.fit(messages)
        reply = await client.complete(messages)
    assert fit.counted_by == "server" and fit.window is None and fit.left_out == 0
    assert fit.prompt_tokens == reply.record.prompt_tokens
    assert fit.prompt_tokens != sum(estimate_tokens(m["content"]) + 4 for m in messages) + 3


async def test_counts_are_remembered_so_a_new_turn_costs_one_tokenizer_request(
    local_server: RunningServer,
) -> None:
    messages = _conversation(5)
    async with _client(local_server) as client:
        budget = ContextBudget(client)
        first, _ = await budget.count(messages)
        before = len(budget._counts)
        again, by = await budget.count([*messages, {"role": "assistant", "content": "a new reply"}])
    assert len(budget._counts) == before + 1 and again[:-1] == first and by == "server"


async def test_without_a_tokenizer_the_count_is_the_documented_estimate(
    local_server: RunningServer,
) -> None:
    # /api/tokenize is not a route of the local server: a 404, as from a server without a tokenizer.
    base = local_server.base_url.removesuffix("/v1") + "/api/v1"
    settings = Settings(providers={"p": ProviderSettings(name="p", base_url=base, context_window=4096,
                                                         http={"http2": "h2c"})})
    messages = [{"role": "user", "content": "héllo wörld, 24 bytes."}]
    async with ChatClient(settings, provider="p", model="m") as client:
        budget = ContextBudget(client)
        fit = await budget.fit(messages)
        assert budget._tokenizer is False
    assert fit.counted_by == "estimate" and fit.window == 4096 and fit.window_source == "config"
    assert fit.prompt_tokens == 3 + 4 + 6  # 24 UTF-8 bytes / 4


# -- fitting ---------------------------------------------------------------------------------------------
async def test_the_oldest_turns_are_left_out_so_the_request_fits_and_the_server_takes_it(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(profile="instant", context_window=400)
    messages = _conversation(6)
    async with _client(server) as client:
        budget = ContextBudget(client)
        fit = await budget.fit(messages, max_tokens=64)
        reply = await client.complete(fit.messages, max_tokens=64)
        # One turn fewer left out would not have fitted.
        back = fit.left_out - 2
        costs, _ = await budget.count(messages[:1] + messages[1 + back:])
    assert fit.window == 400 and fit.window_source == "server" and fit.reserve == 64
    assert fit.turns_left_out >= 1 and fit.left_out == 2 * fit.turns_left_out
    assert fit.messages[0] == messages[0] and fit.messages[-1] == messages[-1]
    assert fit.messages[1]["role"] == "user"  # whole turns go, never half of one
    assert reply.record.prompt_tokens is not None
    assert fit.prompt_tokens == reply.record.prompt_tokens <= 400 - 64
    assert sum(costs) + 3 > 400 - 64


async def test_a_config_window_wins_over_the_servers(server_factory: Callable[..., RunningServer]) -> None:
    server = server_factory(profile="instant", context_window=100_000)
    settings = Settings(providers={"p": ProviderSettings(name="p", base_url=server.base_url, context_window=300,
                                                         http={"http2": "h2c"})})
    async with ChatClient(settings, provider="p") as client:
        fit = await ContextBudget(client).fit(_conversation(6))
    assert fit.window == 300 and fit.window_source == "config" and fit.reserve == 75 and fit.left_out > 0


async def test_a_message_too_long_alone_is_one_line_before_anything_is_sent(
    server_factory: Callable[..., RunningServer],
) -> None:
    server = server_factory(profile="instant", context_window=200)
    messages = [{"role": "system", "content": "terse"}, {"role": "user", "content": " ".join(["w"] * 300)}]
    async with _client(server) as client:
        with pytest.raises(ContextOverflowError) as caught:
            await ContextBudget(client).fit(messages, max_tokens=20)
    message = str(caught.value)
    assert "\n" not in message and "200-token context window" in message and "20 kept for the reply" in message
    assert "shorten it" in message and caught.value.prompt_tokens > 180


# -- attachments -----------------------------------------------------------------------------------------
def test_a_text_file_goes_in_as_a_fenced_block_under_its_name(tmp_path: Path) -> None:
    path = tmp_path / "notes.md"
    path.write_text("# Notes\n```py\nprint(1)\n```\n", encoding="utf-8")
    att = read_attachment(path, max_bytes=1000, name="notes.md")
    text = message_text("summarize", [att])
    assert text.startswith("summarize\n\n`notes.md`:\n````md\n# Notes\n")
    assert text.endswith("```\n````")
    assert message_content("summarize", [att]) == text


def test_an_image_goes_in_as_a_data_uri_part(tmp_path: Path) -> None:
    path = tmp_path / "cat.bin"  # told by its bytes, not its name
    path.write_bytes(PNG)
    att = read_attachment(path, max_bytes=1000)
    content = message_content("what is this?", [att])
    assert isinstance(content, list) and content[0] == {"type": "text", "text": "what is this?"}
    assert content[1]["image_url"]["url"].startswith("data:image/png;base64,iVBORw0KGgo")
    assert message_text("what is this?", [att]).endswith(f"[image: {path}, 48 bytes]")


@pytest.mark.parametrize(("make", "why"), [
    (lambda p: p.write_bytes(b"\x7fELF\x00\x01binary"), "binary file"),
    (lambda p: p.write_bytes(b"\xff\xfe\xfa not utf-8"), "binary file"),
    (lambda p: p.write_text("x" * 2000), "over the 1,000 bytes limit"),
    (lambda p: None, "no such file"),
    (lambda p: p.mkdir(), "it is a folder"),
])
def test_a_file_that_cannot_go_is_one_line_naming_it_and_why(tmp_path: Path, make: Any, why: str) -> None:
    path = tmp_path / "f"
    make(path)
    with pytest.raises(AttachmentError) as caught:
        read_attachment(path, max_bytes=1000)
    assert why in str(caught.value) and str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_an_unreadable_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "secret.txt"
    path.write_text("x")
    path.chmod(0)
    if os.access(path, os.R_OK):  # root reads anything: nothing to test then
        pytest.skip("running as root")
    with pytest.raises(AttachmentError, match="permission denied"):
        read_attachment(path, max_bytes=1000)


def test_file_lines_are_taken_out_of_the_prompt() -> None:
    assert split_file_lines("/file a.txt\nwhat is in it?\n/file  ~/b c.md  ") == ("what is in it?",
                                                                                  ["a.txt", "~/b c.md"])
    assert split_file_lines("no files, not /file here") == ("no files, not /file here", [])


async def test_an_image_to_a_server_without_vision_is_refused_and_taken_with_it(
    server_factory: Callable[..., RunningServer], tmp_path: Path,
) -> None:
    (tmp_path / "x.png").write_bytes(PNG)
    content = message_content("what is this?", [read_attachment(tmp_path / "x.png", max_bytes=1000)])
    messages = [{"role": "user", "content": content}]
    async with _client(server_factory(profile="instant")) as client:
        with pytest.raises(HTTPStatusError, match="image input is not supported"):
            await client.complete(messages)
    async with _client(server_factory(profile="instant", vision=True)) as client:
        reply = await client.complete(messages)
        fit = await ContextBudget(client).fit(messages)
    assert reply.text and reply.record.prompt_tokens == fit.prompt_tokens


# -- llmchat ask -f -------------------------------------------------------------------------------------------
def test_ask_attaches_files_and_a_bad_one_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], local_server: RunningServer, tmp_path: Path,
) -> None:
    from llmchat.tui.cli import main

    notes = tmp_path / "notes.txt"
    notes.write_text(" ".join(["alpha"] * 50), encoding="utf-8")
    base = ["ask", "what is in it?", "--base-url", local_server.base_url, "--json", "--max-tokens", "4"]
    assert main([*base]) == 0
    bare = json.loads(capsys.readouterr().out)["prompt_tokens"]
    assert main([*base, "-f", str(notes)]) == 0
    attached = json.loads(capsys.readouterr().out)["prompt_tokens"]
    assert attached >= bare + 50  # the file's 50 words went with the prompt
    assert main([*base, "-f", str(tmp_path / "missing.txt")]) == 2
    err = capsys.readouterr().err
    assert err == f"llmchat: cannot attach {tmp_path / 'missing.txt'}: no such file; check the path\n"


async def test_a_longer_prompt_costs_the_local_server_prefill_time_it_reports(
    server_factory: Callable[..., RunningServer],
) -> None:
    from llmchat.core import attribute

    server = server_factory(profile="instant", prefill_tokens_per_s=5000)
    long = [{"role": "user", "content": " ".join(["word"] * 1000)}]
    async with _client(server) as client:
        chat = client.stream(long, max_tokens=4)
        async for _ in chat:
            pass
        fit = await ContextBudget(client).fit(long)
    # (1000 words + 7 framing) / 5000 tokens/s: the first token waits at least 201 ms, reported as prefill.
    prefill = attribute(chat.record).ms("server_prefill")
    assert fit.prompt_tokens == 1007 and prefill >= 201 and chat.record.ttft_ms is not None
    assert chat.record.ttft_ms >= prefill
