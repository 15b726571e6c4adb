"""What providers send and write that the engine must read as they mean it, end to end through the installed
`llmchat` against `llmchat serve`: a reply whose template opened <think> in the prompt (only `</think>`
arrives), refusals, and base_urls with a query string or userinfo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmchat.core.server import RunningServer

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
