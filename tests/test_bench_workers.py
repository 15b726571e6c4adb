"""`llmchat bench --workers`: a load split over processes and merged into one result. One 2-worker run against
the local server (a second or so: two interpreters start), the rest is the split and the rules, made here."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from llmchat.core import percentile
from llmchat.core.errors import UsageError
from llmchat.core.load._run import Scenario, Target
from llmchat.core.load._workers import (
    MIN_REQUESTS,
    RATE_PER_WORKER,
    _ShareRun,
    _Spec,
    choose_workers,
    default_workers,
    split,
)
from llmchat.core.server import RunningServer
from llmchat.tui.cli import main


def test_two_workers_merge_every_request_into_one_result(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, local_server: RunningServer
) -> None:
    path = tmp_path / "bench.json"
    code = main(["bench", "--quiet", "--base-url", local_server.base_url, "--users", "4", "--requests", "30",
                 "--max-tokens", "3", "--workers", "2", "--json", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    head, *requests, tail = [json.loads(line) for line in path.read_text().splitlines()]
    assert head["workers"] == 2 and head["pools"] == {"base": 4}  # two pools of 2: one connection a user
    assert "workers: 2 processes" in out
    # Every request of both workers, once each: the numbers one process would have given them.
    assert len(requests) == tail["request_lines"] == 30
    assert sorted(r["index"] for r in requests) == list(range(30))
    figures = tail["configs"][0]
    assert figures["requests"] == figures["ok"] == 30
    # The percentiles are over all 30 records, not an average of each worker's.
    totals = [r["total_ms"] for r in requests]
    for q in (50, 90, 99):
        assert figures["latency_ms"]["e2e"][f"p{q}"] == pytest.approx(percentile(totals, q), abs=1e-3)


def test_an_open_loop_splits_its_rate_cap_and_budget_and_each_worker_has_its_own_arrivals() -> None:
    scenario = Scenario(rate=300.0, requests=1001, max_in_flight=9, seed=4)
    shares = split(scenario, 3)
    assert [s.rate for s in shares] == [100.0] * 3  # merged Poisson processes at R/N: Poisson at R
    assert [s.requests for s in shares] == [334, 334, 333]
    assert [s.max_in_flight for s in shares] == [3, 3, 3]
    gaps = [_ShareRun(_Spec(share=s, configs=("base",), target=Target(), worker=i, workers=3, prompt_seed=4),
                      None)._arrivals(0).expovariate(100.0) for i, s in enumerate(shares)]  # type: ignore[arg-type]
    assert len(set(gaps)) == 3  # three independent streams, not one stream three times
    # The default: one worker per started RATE_PER_WORKER requests/s, no more than the cores.
    long = dataclasses.replace(scenario, requests=100 * MIN_REQUESTS)
    assert default_workers(dataclasses.replace(long, rate=RATE_PER_WORKER / 2), available=8) == 1
    assert default_workers(dataclasses.replace(long, rate=RATE_PER_WORKER * 2.5), available=8) == 3
    assert default_workers(dataclasses.replace(long, rate=RATE_PER_WORKER * 50), available=2) == 2
    assert default_workers(Scenario(users=3, requests=100 * MIN_REQUESTS), available=8) == 3
    assert default_workers(Scenario(users=50, requests=10), available=8) == 1  # too small a run to split


def test_a_bad_worker_count_is_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--quiet", "--base-url", "http://127.0.0.1:9/v1", "--workers", "0"])
    _, err = capsys.readouterr()
    assert code == 2 and err.strip() == "llmchat: --workers must be at least 1, got 0"
    with pytest.raises(UsageError, match="--workers 3 is more than --users 2"):
        choose_workers(Scenario(users=2, requests=10), 3)
    with pytest.raises(UsageError, match="--rate-limit-client"):
        choose_workers(Scenario(users=2, requests=10), 2, rate_limited=True)


def test_datasets_shared_prefixes_and_multi_turn_replays_stay_in_one_process(tmp_path: Path) -> None:
    # Their prompts are counted before the run for the requests one process sends.
    data = tmp_path / "prompts.jsonl"
    data.write_text('"one"\n"two"\n', encoding="utf-8")
    for scenario, flag in [(Scenario(users=4, requests=400, dataset=str(data)), "--dataset"),
                           (Scenario(users=4, requests=400, prefix_share=0.5), "--prefix-share"),
                           (Scenario(users=4, requests=400, dataset=str(data), turns="all"), "--dataset")]:
        assert choose_workers(scenario, None) == 1
        with pytest.raises(UsageError, match=f"^{flag} runs in one process"):
            choose_workers(scenario, 2)
    assert choose_workers(Scenario(users=4, requests=400), 2) == 2
