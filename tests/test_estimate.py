"""The latency-SLA cost model: ``estimate`` on known jobs, prices and limits, and ``llmchat batch --estimate``
end to end against the local server (with and without a sample), then a real run showing actual beside it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from llmchat.core.load import DEFAULT_WINDOW_S, Duration, Estimate, SampleStats, estimate, read_jobs
from llmchat.core.observe import Price
from llmchat.core.policy import ProviderLimiter
from llmchat.core.server import RunningServer
from llmchat.tui.cli import main

Factory = Callable[..., RunningServer]
PRICES = {"m": Price(1.0, 4.0), "big": Price(10.0, 40.0)}


def _jobs(n: int, **params: object) -> list:  # type: ignore[type-arg]
    lines = [json.dumps({"id": i, "prompt": "x" * 40, **params}) for i in range(n)]
    jobs, bad = read_jobs(lines)
    assert not bad
    return jobs


def test_tokens_cost_and_the_batch_discount_per_path() -> None:
    jobs = _jobs(100, max_tokens=50)
    est = estimate(jobs, model="m", prices=PRICES, batch_discount=0.5, concurrency=10)
    # 40 characters is 10 tokens, plus 4 for the message and 3 for the request.
    assert est.tokens_in == 100 * 17 and est.tokens_out == 100 * 50
    cost = (1700 * 1.0 + 5000 * 4.0) / 1e6
    assert est.path("stream").cost == pytest.approx(cost) and est.path("batch").cost == pytest.approx(cost)
    assert est.path("batch-api").cost == pytest.approx(cost / 2)
    assert "at most" in est.out_basis
    assert est.path("stream").duration == Duration(None, "unknown",
                                                   "no sample and no rate limit known: add --sample N")
    window = est.path("batch-api").duration
    assert window.seconds == DEFAULT_WINDOW_S and "24 h assumed" in window.basis
    assert estimate(jobs, model="m", prices=PRICES, batch_discount=0.5, concurrency=10,
                    completion_window_s=3600).path("batch-api").duration.seconds == 3600


def test_a_job_of_another_model_is_priced_at_its_own_price_and_an_unpriced_one_is_said() -> None:
    jobs = _jobs(2, max_tokens=10) + _jobs(1, max_tokens=10, model="big")[:1]
    est = estimate(jobs, model="m", prices=PRICES, batch_discount=0.5, concurrency=1)
    assert est.path("batch").cost == pytest.approx((2 * (17 + 40) + (170 + 400)) / 1e6)
    none = estimate(jobs, model="unknown-model", prices={}, batch_discount=0.5, concurrency=1)
    assert none.path("batch").cost is None and none.path("batch-api").cost is None
    assert any("no price for" in n and "ui.prices" in n for n in none.notes)


def test_rate_limits_bound_the_direct_paths_and_a_sample_sets_their_pace() -> None:
    jobs = _jobs(300, max_tokens=50)
    limiter = ProviderLimiter("p", rpm=120)  # a burst of 120, then 2 a second
    bound = estimate(jobs, model="m", prices=PRICES, batch_discount=0.5, concurrency=10, limiter=limiter)
    d = bound.path("batch").duration
    assert d.bound == "at least" and d.seconds == pytest.approx(90.0) and "rate limit 120 requests" in d.basis
    assert d.meets(60) is False and d.meets(120) is None
    sample = SampleStats(n=2, stream_ms=[900.0, 1100.0], batch_ms=[800.0, 800.0], prompt_tokens=[34, 34],
                         output_tokens=[20, 30], estimated_prompt=[17, 17])
    est = estimate(jobs, model="m", prices=PRICES, batch_discount=0.5, concurrency=10, limiter=limiter,
                   sample=sample)
    assert est.tokens_in == 300 * 34 and est.tokens_out == 300 * 25  # calibrated by the sample
    stream = est.path("stream").duration
    assert stream.bound == "about" and stream.seconds == pytest.approx(90.0 + 1.0)  # the limit, one request
    fast = estimate(jobs[:50], model="m", prices=PRICES, batch_discount=0.5, concurrency=10, limiter=limiter,
                    sample=sample).path("batch").duration
    assert fast.seconds == pytest.approx(5 * 0.8) and "10 in flight at 800 ms" in fast.basis
    assert fast.meets(5) is True and Duration(86400.0, "up to", "").meets(600) is False
    assert Estimate.from_dict(est.to_dict()) == est


def test_estimate_prints_three_paths_then_a_real_run_shows_actual_beside_it(
    server_factory: Factory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = server_factory(profile="instant", rate_limit=600, rate_limit_tokens=100_000)
    config = tmp_path / "config.toml"
    config.write_text('[ui]\nprices = { "llmchat-local" = { input_per_mtok = 0.15, output_per_mtok = 0.6 } }\n',
                      encoding="utf-8")
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "prompt": f"item {i}", "max_tokens": 8}) + "\n"
                           for i in range(12)), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    common = [str(inp), "-o", str(out), "--base-url", server.base_url, "--config", str(config),
              "--model", "llmchat-local"]
    assert main(["batch", *common, "--estimate", "--sla-s", "30"]) == 0
    printed = capsys.readouterr().out
    assert "(no requests sent)" in printed and not out.exists()
    for name in ("direct streaming", "direct whole replies", "Batch API"):
        assert name in printed
    # The Batch API row is bounded by the configured completion window (batch.completion_window, 24h default).
    assert "meets 30.0 s" in printed and "the completion window (batch.completion_window)" in printed
    assert main(["batch", *common, "--estimate", "--sample", "2", "--sla-s", "30"]) == 0
    printed = capsys.readouterr().out
    assert "sample of 2" in printed and "the sample's mean reply" in printed
    rows = {line.split("  ")[0]: line for line in printed.splitlines()}
    assert " yes " in rows["direct whole replies"] and " no " in rows["Batch API"]
    assert (tmp_path / "out.jsonl.estimate.json").exists() and not out.exists()
    assert main(["batch", *common, "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "actual vs estimate (direct whole replies): cost $" in err and "duration " in err
    assert main(["batch", *common, "--sample", "2"]) == 2
    assert "--sample and --sla-s go with --estimate" in capsys.readouterr().err
