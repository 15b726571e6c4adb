"""`llmchat bench --dataset`: ShareGPT and JSONL prompts, multi-turn replay with this run's own replies, the
prompts counted by the server's tokenizer, ITL per token from per-chunk usage, and one line for a bad file.
Against the local server (or a scripted peer) on 127.0.0.1, a few requests of a few tokens each."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import peers as P
import pytest

from llmchat.core import percentile
from llmchat.core.http._openai import chat_body
from llmchat.core.load import _run
from llmchat.core.load._run import LoadRun, Scenario, Target
from llmchat.core.load._tokens import ReplyProbe
from llmchat.core.observe import TimingRecord
from llmchat.core.server import RunningServer
from llmchat.core.server._replies import count_prompt_tokens
from llmchat.tui.cli import main

SHAREGPT = [
    {"conversations": [{"from": "system", "value": "You are terse."},
                       {"from": "human", "value": "What is a socket?"},
                       {"from": "gpt", "value": "DATASET REPLY one"},
                       {"from": "human", "value": "And a port?"}]},
    {"conversations": [{"from": "human", "value": "Explain latency in one line."},
                       {"from": "gpt", "value": "DATASET REPLY two"},
                       {"from": "human", "value": "And jitter?"},
                       {"from": "gpt", "value": "x"},
                       {"from": "human", "value": "Thanks, and tail latency?"}]},
    {"conversations": []},  # ShareGPT dumps hold empty entries: skipped, counted
]


def run_json(capsys: pytest.CaptureFixture[str], tmp_path: Path, *argv: str) -> tuple[list[dict[str, Any]],
                                                                                         dict[str, Any], str]:
    path = tmp_path / "run.json"
    code = main(["bench", "--quiet", *argv, "--json", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [line for line in lines if line["type"] == "request"], lines[-1]["configs"][0], out


def test_a_jsonl_file_sends_its_prompts_counted_by_the_servers_tokenizer(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, local_server: RunningServer,
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    entries = ['"a bare string prompt here"', '{"prompt": "a prompt object with more words in it"}', "",
               '{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}']
    prompts.write_text("\n".join(entries) + "\n")
    reqs, stats, out = run_json(capsys, tmp_path, "--base-url", local_server.base_url, "--dataset", str(prompts),
                                "--users", "1", "--requests", "4", "--max-tokens", "3")
    sent: list[list[dict[str, object]]] = [[{"role": "user", "content": "a bare string prompt here"}],
            [{"role": "user", "content": "a prompt object with more words in it"}],
            [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]]
    # The server saw each entry's messages in file order (its own count of them), cycling past the end.
    assert [r["prompt_tokens"] for r in sorted(reqs, key=lambda r: r["index"])] == [
        count_prompt_tokens(sent[i % 3]) for i in range(4)]
    # Counted before the run with its tokenizer (POST /tokenize), the same as its usage says.
    assert all(r["prompt_tokens_counted"] == r["prompt_tokens"] and r["prompt_tokens_by"] == "server"
               for r in reqs)
    tokens = stats["tokens"]
    assert tokens["prompt_tokens"]["counted_by"] == tokens["output_tokens"]["counted_by"] == "server"
    assert tokens["prompt_tokens"]["max"] == max(r["prompt_tokens"] for r in reqs)
    # One token a chunk and usage only at the end: per token from the counts, the same as per chunk.
    assert tokens["itl_ms"]["per_token_source"] == "token counts"
    assert tokens["itl_ms"]["per_token"]["p50"] == pytest.approx(tokens["itl_ms"]["per_chunk"]["p50"], abs=1e-3)
    assert "prompts: prompts.jsonl (JSONL, 3 conversations, 3 human turns)" in out
    assert "server tokenizer" in out and "ITL per token ms p50 / p99" in out


def test_a_sharegpt_file_replayed_turn_by_turn_reports_ttft_by_turn(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, local_server: RunningServer,
) -> None:
    data = tmp_path / "sharegpt.json"
    data.write_text(json.dumps(SHAREGPT))
    reqs, stats, out = run_json(capsys, tmp_path, "--base-url", local_server.base_url, "--dataset", str(data),
                                "--turns", "all", "--users", "2", "--requests", "7", "--max-tokens", "4",
                                "--prefix-share", "0.5")
    assert len(reqs) == 7  # the budget counts requests, not conversations
    turns = sorted({r["turn"] for r in reqs})
    assert turns == [1, 2, 3]
    by_turn = stats["tokens"]["ttft_by_turn"]
    for t in turns:
        mine = [r["ttft_ms"] for r in reqs if r["turn"] == t]
        assert by_turn[str(t)]["n"] == len(mine)
        assert by_turn[str(t)]["p50"] == pytest.approx(percentile(mine, 50), abs=1e-3)
        assert by_turn[str(t)]["p95"] == pytest.approx(percentile(mine, 95), abs=1e-3)
    # History (the replies, by the server's usage) and the shared prefix are in the count, as the server saw.
    assert all(r["prompt_tokens_counted"] == r["prompt_tokens"] for r in reqs)
    assert "TTFT by turn, ms p50 / p95" in out and "turn 3" in out
    assert "ShareGPT, 2 conversations, 5 human turns, 1 without a human turn skipped" in out
    assert "shared system-prompt prefix: 50%" in out


@pytest.mark.parametrize("mode", ["stream", "batch"])
async def test_turn_two_carries_turn_ones_reply(local_server: RunningServer, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch, mode: _run.Mode) -> None:
    data = tmp_path / "sharegpt.json"
    data.write_text(json.dumps(SHAREGPT[:2]))
    sent: list[tuple[list[dict[str, str]], str]] = []
    real = _run.request_once

    async def recording(client: Any, messages: list[dict[str, str]], *, probe: ReplyProbe | None = None,
                        **kw: Any) -> TimingRecord:
        record = await real(client, messages, probe=probe, **kw)
        sent.append((messages, "" if probe is None else probe.text))
        return record

    monkeypatch.setattr(_run, "request_once", recording)
    target = Target(base_url=local_server.base_url, model="llmchat-local")
    scenario = Scenario(mode=mode, users=1, requests=5, max_tokens=6, dataset=str(data), turns="all")
    load = LoadRun(scenario, ["base"], target)
    async with asyncio.timeout(30):
        await load.run()
    assert len(sent) == 5
    (first, reply1), (second, reply2), (third, _) = sent[:3]
    assert first == [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is a socket?"}]
    # Turn 2 carries this run's reply to turn 1 (never the dataset's gpt turn), then the next human turn.
    assert reply1 and "DATASET" not in reply1
    assert second == [*first, {"role": "assistant", "content": reply1}, {"role": "user", "content": "And a port?"}]
    assert third == [{"role": "user", "content": "Explain latency in one line."}]  # the next conversation
    stats = load.tallies["base"].stats(load.walls_ns["base"])
    assert stats.ok == 5 and stats.tokens is not None
    if mode == "stream":  # batch replies have no TTFT
        assert {t: int(r["n"] or 0) for t, r in stats.tokens.ttft_by_turn.items()} == {1: 2, 2: 2, 3: 1}


def test_itl_per_token_comes_from_usage_on_every_chunk(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, peer: Callable[..., P.Peer],
) -> None:
    def content(text: str, tokens: int, finish: str | None = None) -> bytes:
        return P.event({**P.delta(text, finish_reason=finish), "usage": {"prompt_tokens": 5,
                        "completion_tokens": tokens, "total_tokens": 5 + tokens}})

    # vLLM's continuous usage stats: the completion tokens so far on each chunk, here 1, then 3, then 2 more.
    p = peer([P.SSE_HEAD, content("a", 1), P.Pause(0.06), content("bcd", 4), P.Pause(0.03),
              content("ef", 6, "stop"), P.event(P.usage_chunk(5, 6)), P.DONE, P.END], then="keep", chat_only=True)
    reqs, stats, out = run_json(capsys, tmp_path, "--base-url", p.base_url, "--model", "peer-model",
                                "--users", "1", "--requests", "1", "--chunk-usage", "--prefix-share", "0.5")
    (r,) = reqs
    g1, g2 = r["itl_ms"]
    per_token = [g1 / 3] * 3 + [g2 / 2] * 2
    itl = stats["tokens"]["itl_ms"]
    assert itl["per_token_source"] == r["itl_per_token_source"] == "chunk usage"
    for q in (50, 90, 99):
        assert itl["per_token"][f"p{q}"] == pytest.approx(percentile(per_token, q), abs=1e-3)
        assert itl["per_chunk"][f"p{q}"] == pytest.approx(percentile([g1, g2], q), abs=1e-3)
    assert "chunk usage" in out
    # A server without /tokenize (the peer answers it 404): the prompt is estimated, and says so.
    assert r["prompt_tokens_by"] == stats["tokens"]["prompt_tokens"]["counted_by"] == "estimated"
    assert stats["tokens"]["output_tokens"]["counted_by"] == "server"  # its usage
    # --chunk-usage asks for it beside include_usage.
    body = json.loads(chat_body("m", [], {"stream_options": {"continuous_usage_stats": True}}, stream=True))
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


@pytest.mark.parametrize(("name", "text", "said"), [
    ("bad.jsonl", '"fine"\n{"prompt": 3}\n', 'bad.jsonl: line 2: "prompt" must be text, got a number'),
    ("bad.jsonl", '"fine"\n\nnot json\n', "bad.jsonl: line 3 is not JSON"),
    ("bad.json", '[{"conversations": [{"from": "human", "value": "x"}]}, {"turns": []}]',
     'bad.json: entry 2 has neither "conversations" nor "messages"'),
    ("bad.json", '[{"conversations": [{"from": "robot", "value": "x"}]}]',
     'bad.json: entry 1, turn 1: "from" must be human, gpt or system'),
    ("bad.json", '[{"conversations": [', "bad.json: not valid JSON"),
    ("empty.json", '[{"conversations": []}]', "empty.json: no entry has a human turn"),
])
def test_a_bad_dataset_is_one_line_naming_the_file_and_the_fix(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, text: str, said: str,
) -> None:
    path = tmp_path / name
    path.write_text(text)
    assert main(["bench", "--dataset", str(path), "--requests", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and "\n" not in err and "Traceback" not in err
    assert "each line must be" in err or "each entry must be" in err or "a JSON dataset must be" in err
