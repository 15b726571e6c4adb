"""What providers send and write that the engine must read as they mean it, end to end through the installed
`llmchat` against `llmchat serve`: a reply whose template opened <think> in the prompt (only `</think>`
arrives), refusals, and base_urls with a query string or userinfo."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import peers as P
import pytest

from llmchat.core import ChatClient
from llmchat.core.client._fit import tokenize_url
from llmchat.core.errors import UsageError
from llmchat.core.http import Endpoint
from llmchat.core.http._openai import parse_chunk, parse_reply
from llmchat.core.http._transport import Transport
from llmchat.core.http._urls import join_url
from llmchat.core.observe import Phases
from llmchat.core.server import RunningServer
from llmchat.core.server._thinking import REFUSAL

LLMCHAT = str(Path(sys.executable).parent / "llmchat")
MODEL = "llmchat-local"
BOUND_S = 60.0

Factory = Callable[..., RunningServer]


def llmchat(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LLMCHAT, *argv], input="", capture_output=True, text=True, timeout=BOUND_S,
                          env={**os.environ, "LLMCHAT_RETRY__MAX_ATTEMPTS": "1", **(env or {})})


def ask_json(server: RunningServer, *extra: str) -> tuple[dict[str, Any], str]:
    run = llmchat("ask", "why is the sky blue", "--base-url", server.base_url, "--model", MODEL, "--json", *extra)
    assert "Traceback" not in run.stderr, run.stderr
    return json.loads(run.stdout), run.stderr


def test_ask_json_splits_a_reply_whose_template_opened_think_in_the_prompt(server_factory: Factory) -> None:
    server = server_factory(ttft_ms=5, tokens_per_s=2000, reasoning_tokens=20, reasoning_open_in_prompt=True)
    for extra in ((), ("--batch",)):
        obj, err = ask_json(server, "--max-tokens", "8", *extra)
        assert obj["error"] is None, err
        assert obj["reasoning"].strip() and "think>" not in obj["reasoning"]
        assert "think>" not in obj["reply"] and obj["reply"].startswith("## "), obj["reply"]
        if not extra:  # streamed: the thinking is timed as thinking, TTFT is the answer's
            assert obj["reasoning_chunks"] >= 15 and obj["thinking_ms"] is not None
            assert obj["ttft_ms"] > obj["first_reasoning_ms"]


def test_ask_streams_the_thinking_then_says_where_the_answer_starts(server_factory: Factory) -> None:
    server = server_factory(ttft_ms=5, tokens_per_s=0, reasoning_tokens=12, reasoning_open_in_prompt=True)
    run = llmchat("ask", "why is the sky blue", "--base-url", server.base_url, "--model", MODEL, "--max-tokens", "8")
    assert run.returncode == 0, run.stderr
    assert "think>" not in run.stdout and "## " in run.stdout
    assert run.stderr.splitlines()[-1].startswith("llmchat: the text above was the model's thinking")


# -- base_url as providers write it --------------------------------------------------------------------------
QUERY = "api-version=2024-06-01"


def test_a_query_in_base_url_stays_after_the_path_on_every_request(peer: Callable[..., P.Peer]) -> None:
    models = P.json_response(200, {"object": "list", "data": [{"id": "gpt-4o", "object": "model"}]})
    p = peer([models], then="keep", later=[P.json_response(200, P.completion("Fine."))])
    run = llmchat("ask", "hello", "--base-url", f"{p.base_url}?{QUERY}", "--batch", "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["reply"] == "Fine."
    paths = [line.split(" ")[1] for line in p.request_lines]
    assert paths[:2] == [f"/v1/models?{QUERY}", f"/v1/chat/completions?{QUERY}"], p.request_lines


@pytest.mark.parametrize(("base", "path", "url"), [
    ("https://h/openai/deployments/d?api-version=1", "chat/completions",
     "https://h/openai/deployments/d/chat/completions?api-version=1"),
    ("https://h/v1/?api-version=1", "/models", "https://h/v1/models?api-version=1"),
    ("https://h/v1?api-version=1", "files/f-1/content?limit=2", "https://h/v1/files/f-1/content?api-version=1&limit=2"),
    ("http://127.0.0.1:8000/v1", "embeddings", "http://127.0.0.1:8000/v1/embeddings"),
    ("http://h/v1?a=1#frag", "batches", "http://h/v1/batches?a=1"),
    ("http://h/v1?a=1", "http://h/metrics", "http://h/metrics"),  # a probe's own URL is left alone
])
def test_join_url_puts_the_path_before_the_query(base: str, path: str, url: str) -> None:
    assert join_url(base, path) == url


def test_tokenize_keeps_the_query_of_base_url() -> None:
    assert tokenize_url(f"https://h/v1?{QUERY}") == f"https://h/tokenize?{QUERY}"


async def test_embeddings_and_batches_keep_the_query(peer: Callable[..., P.Peer]) -> None:
    vectors = P.json_response(200, {"object": "list", "data": [{"index": 0, "embedding": [0.5, 0.25]}]})
    p = peer([vectors], then="keep")
    async with ChatClient(base_url=f"{p.base_url}?{QUERY}", model="e", use_cache=False) as client:
        assert await client.embed(["x"]) == [[0.5, 0.25]]
        async with client.transport.request("GET", "batches/b-1", phases=Phases()) as resp:
            await resp.aread()
    assert [line.split(" ")[1] for line in p.request_lines] == [f"/v1/embeddings?{QUERY}", f"/v1/batches/b-1?{QUERY}"]


def test_userinfo_in_base_url_is_refused_before_anything_is_sent(peer: Callable[..., P.Peer]) -> None:
    p = peer([P.json_response(200, P.completion("never"))])
    url = p.base_url.replace("http://", "http://alice:hunter2@")
    run = llmchat("ask", "hello", "--base-url", url, "--model", MODEL)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    [line] = run.stderr.splitlines()
    assert "user:password@" in line and "api_key or api_key_env" in line and "alice:***@" in line, line
    assert "hunter2" not in run.stderr and p.request_lines == []


def test_config_check_reports_userinfo_in_a_providers_base_url(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[providers.azure]\nbase_url = "https://bob:s3cret-pw@example.invalid/openai?api-version=1"\n')
    run = llmchat("config", "check", "--config", str(config))
    assert run.returncode == 2 and "Traceback" not in run.stderr
    [line] = run.stderr.splitlines()
    assert "providers.azure.base_url" in line and "without user:password@" in line and "api_key_env" in line, line
    assert "s3cret-pw" not in run.stderr and "bob:***@" in line


def test_a_transport_refuses_an_endpoint_with_userinfo() -> None:
    with pytest.raises(UsageError, match=r"user:password@.*api_key or api_key_env") as caught:
        Transport(Endpoint(name="x", base_url="http://u:secret-pass@127.0.0.1:1/v1"))
    assert "secret-pass" not in str(caught.value)


# -- refusals ------------------------------------------------------------------------------------------------
def test_ask_json_keeps_a_refusal_apart_streamed_and_whole(server_factory: Factory) -> None:
    server = server_factory(ttft_ms=0, tokens_per_s=0, refuse=True)
    for extra in ((), ("--batch",)):
        run = llmchat("ask", "hello", "--base-url", server.base_url, "--model", MODEL, "--json", *extra)
        assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
        obj = json.loads(run.stdout)
        assert obj["refusal"] == REFUSAL and obj["reply"] == "" and obj["finish_reason"] == "refusal", (extra, obj)
        assert obj["error"] is None
        assert run.stderr.splitlines()[-1].startswith("llmchat: the model refused to answer")


def test_ask_prints_a_refusal_marked_as_one(server_factory: Factory) -> None:
    server = server_factory(ttft_ms=0, tokens_per_s=0, refuse=True)
    run = llmchat("ask", "hello", "--base-url", server.base_url, "--model", MODEL)
    assert run.returncode == 1 and run.stdout == f"[refused: {REFUSAL}]\n", run.stdout
    [line] = run.stderr.splitlines()
    assert line == "llmchat: the model refused to answer (finish_reason refusal); rephrase the prompt or ask " \
        "another model"


def test_a_refusal_delta_and_message_are_read_apart_from_the_content() -> None:
    d = parse_chunk('{"choices":[{"index":0,"delta":{"content":null,"refusal":"I\'m sorry"}}]}')
    assert (d.content, d.refusal) == ("", "I'm sorry")
    assert parse_chunk('{"choices":[{"index":0,"delta":{"content":"Hi","refusal":null}}]}').refusal == ""
    body = json.dumps({"choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": None, "refusal": "No."}}]})
    reply = parse_reply(body.encode(), status=200, content_type="application/json", where="h")
    assert (reply.content, reply.refusal, reply.finish_reason) == ("", "No.", "stop")


def _jobs(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"j{i}", "prompt": f"job {i}", "max_tokens": 4}) + "\n"
                            for i in range(n)), encoding="utf-8")
    return path


def _results(path: Path) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in (json.loads(line) for line in path.read_text(encoding="utf-8").splitlines())}


@pytest.mark.parametrize("via", ["direct", "batch-api"])
def test_batch_lines_the_model_refused_are_counted_and_sent_again_by_retry_failed(
    via: str, tmp_path: Path, server_factory: Factory
) -> None:
    refusing, good = server_factory(refuse=True, profile="instant"), server_factory(profile="instant")
    jobs, out = _jobs(tmp_path / "in.jsonl", 3), tmp_path / "out.jsonl"
    run = llmchat("batch", str(jobs), "-o", str(out), "--base-url", refusing.base_url, "--model", MODEL,
                  "--via", via)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert re.search(r"^refused \(of failed\)\s+3$", run.stderr, re.M), run.stderr
    lines = _results(out)
    assert sorted(lines) == ["j0", "j1", "j2"]
    for line in lines.values():
        assert line["refusal"] == REFUSAL and line["finish_reason"] == "refusal" and line["reply"] == ""
        assert line["error"].startswith("the model refused: ") and "--retry-failed" in line["error"]
    retried = llmchat("batch", str(jobs), "-o", str(out), "--base-url", good.base_url, "--model", MODEL,
                      "--via", via, "--retry-failed", "--quiet")
    assert retried.returncode == 0, retried.stderr
    assert all(r["error"] is None and r["reply"] and not r.get("refusal") for r in _results(out).values())
