"""`llmchat bench`'s open loop, coordinated-omission-safe: latencies from each request's scheduled start, the
schedule lag's percentiles, and a lag that grows said to be the client's limit. Against the local server on
127.0.0.1, small runs; every figure checked against the same run's per-request lines."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from llmchat.core import percentile
from llmchat.core.load._schedule import GROWTH_MS, LagTrend
from llmchat.core.server import RunningServer
from llmchat.tui.cli import main

Factory = Callable[..., RunningServer]


def run_json(capsys: pytest.CaptureFixture[str], tmp_path: Path, *argv: str) -> tuple[list[dict[str, Any]],
                                                                                         dict[str, Any], str,
                                                                                         str]:
    path = tmp_path / "run.json"
    code = main(["bench", "--quiet", *argv, "--json", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    requests = [line for line in lines if line["type"] == "request"]
    return requests, lines[-1]["configs"][0], out, err


def test_an_open_loop_that_keeps_up_counts_latency_from_the_schedule(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    local_server: RunningServer,
) -> None:
    reqs, stats, out, err = run_json(capsys, tmp_path, "--base-url", local_server.base_url, "--rate", "50",
                                     "--requests", "25", "--max-tokens", "3")
    sched = stats["schedule"]
    for r in reqs:
        # Each request's latency from its scheduled start is its own plus its lag.
        assert r["scheduled_e2e_ms"] == pytest.approx(r["total_ms"] + r["lag_ms"], abs=0.01)
        assert r["scheduled_ttft_ms"] == pytest.approx(r["ttft_ms"] + r["lag_ms"], abs=0.01)
    lags = [r["lag_ms"] for r in reqs]
    for q in (50, 90, 99):
        assert sched["lag_ms"][f"p{q}"] == pytest.approx(percentile(lags, q), abs=0.01)
        assert sched["e2e_ms"][f"p{q}"] == pytest.approx(percentile([r["scheduled_e2e_ms"] for r in reqs], q),
                                                         abs=0.01)
    assert sched["lag_ms"]["max"] == pytest.approx(max(lags), abs=0.01)
    assert not sched["lag_growing"]
    assert "schedule lag ms" in out and "end-to-end ms, scheduled" in out
    assert "schedule lag grew" not in err


def test_a_run_past_the_clients_cap_reports_growing_lag(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    server_factory: Factory,
) -> None:
    # Two in flight at 40 ms each carry at most 50 requests/s: 200/s arrivals fall further behind each time.
    srv = server_factory(profile="instant", ttft_ms=40.0)
    reqs, stats, out, err = run_json(capsys, tmp_path, "--base-url", srv.base_url, "--rate", "200",
                                     "--requests", "24", "--max-tokens", "2", "--max-in-flight", "2")
    sched = stats["schedule"]
    assert sched["lag_growing"] and sched["lag_rise_ms"] >= GROWTH_MS
    late = [r["lag_ms"] for r in sorted(reqs, key=lambda r: r["index"])]
    assert sum(late[-6:]) > sum(late[:6])  # the lag really grew: the last arrivals waited longest
    # Counted from the scheduled start, the wait shows; from the actual start it hides.
    assert sched["e2e_ms"]["p99"] > stats["latency_ms"]["e2e"]["p99"] + GROWTH_MS
    assert "schedule lag grew" in err and "the client, not the server, was the limit" in err
    assert "--max-in-flight" in err


def test_a_closed_loop_has_no_schedule(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    local_server: RunningServer,
) -> None:
    reqs, stats, out, _ = run_json(capsys, tmp_path, "--base-url", local_server.base_url, "--users", "2",
                                   "--requests", "4", "--max-tokens", "2")
    assert stats["schedule"] is None
    assert all("scheduled_e2e_ms" not in r for r in reqs)
    assert "schedule lag" not in out


def test_the_lag_trend_is_a_least_squares_line() -> None:
    trend = LagTrend()
    for i in range(11):
        trend.add(i * 0.1, 5.0 + 30.0 * i * 0.1 + (1.0 if i % 2 else -1.0))
    assert trend.slope_ms_per_s == pytest.approx(30.0, abs=1.0)
    assert trend.rise_ms == pytest.approx(30.0, abs=1.0)
    assert trend.growing
    flat = LagTrend()
    for i in range(10):
        flat.add(i * 0.1, 2.0 if i % 2 else 0.5)
    assert abs(flat.rise_ms) < GROWTH_MS and not flat.growing
    # One burst of jitter late in a run rises the line but is no trend: its error is as wide as the rise.
    burst = LagTrend()
    for i in range(25):
        burst.add(i * 0.02, 60.0 if i in (22, 23) else 1.0)
    assert burst.rise_ms > GROWTH_MS and not burst.growing


def test_max_in_flight_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--rate", "5", "--max-in-flight", "0"]) == 2
    assert "--max-in-flight must be at least 1" in capsys.readouterr().err
