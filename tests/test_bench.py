"""`llmchat bench` against the local server on 127.0.0.1: the loops, the figures, comparisons and files.

Every run is small (tens of requests, instant or near-instant server profiles): a second or two per test.
Figures are checked against the per-request records in the same run's --json, never hard-coded values.

``--json`` is JSON Lines (the run, one line per request as it finishes, the summary last); ``read_results``
checks that shape and gives the tests one dict as the file's schema 1 had it: the run's and the summary's keys
with ``requests`` the list of request lines.
"""

from __future__ import annotations

import asyncio
import gc
import io
import json
import random
import socket
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from llmchat.core import Settings, percentile
from llmchat.core.load._prompts import PromptPlan
from llmchat.core.load._run import LoadRun, Sample, Scenario, Target, interleave, parse_configs
from llmchat.core.load._stats import EXACT_LIMIT, RELATIVE_ERROR, Distribution
from llmchat.core.observe._attribution import PARTS
from llmchat.core.observe._timing import TimingRecord
from llmchat.core.server import RunningServer
from llmchat.tui.cli import main
from llmchat.tui.commands import bench as bench_cmd
from llmchat.tui.commands._bench_report import figures_table, fmt_ms

Factory = Callable[..., RunningServer]


def bench(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["bench", "--quiet", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def read_results(path: Path) -> dict[str, Any]:
    """The --json file as one dict: the first line's keys, the summary's, and ``requests``, every request line
    in the order written. Fails unless the file is a run line, request lines, and one summary line that counts
    them."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    head, *requests, tail = lines
    assert head["type"] == "bench" and head["schema"] == 2 and tail["type"] == "summary"
    assert all(r["type"] == "request" for r in requests) and tail["request_lines"] == len(requests)
    return {**head, **tail, "requests": requests}


def bench_json(capsys: pytest.CaptureFixture[str], tmp_path: Path, *argv: str) -> tuple[dict[str, Any], str]:
    path = tmp_path / "bench.json"
    code, out, err = bench(capsys, *argv, "--json", str(path))
    assert code == 0, err
    assert "\r" not in err  # no progress line when stderr is not a terminal
    return read_results(path), out


def by_config(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["config"]: c for c in data["configs"]}


def table_cell(out: str, label: str, quantile: str, column: int = 0) -> str:
    """The value in the figures table's row ``label quantile`` (the label is on the p50 row only)."""
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(label):
            for row in lines[i:i + 3]:
                cells = row.split()
                if quantile in cells:
                    return cells[cells.index(quantile) + 1 + column]
    raise AssertionError(f"no row {label} {quantile} in:\n{out}")


# -- the loops -----------------------------------------------------------------------------------------------

def test_closed_loop_sends_exactly_the_requests_asked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, local_server: RunningServer
) -> None:
    data, out = bench_json(capsys, tmp_path, "--base-url", local_server.base_url, "--users", "4",
                           "--requests", "23", "--max-tokens", "5")
    reqs = data["requests"]
    assert len(reqs) == 23
    assert sorted(r["index"] for r in reqs) == list(range(23))
    assert all(r["error"] is None and r["output_tokens"] == 5 for r in reqs)
    stats = data["configs"][0]
    assert (stats["config"], stats["requests"], stats["ok"], stats["output_tokens"]) == ("base", 23, 23, 115)
    labels = ("TTFB ms", "TTFT ms", "ITL ms", "TPOT ms", "end-to-end ms", "requests/s", "output tokens/s")
    assert all(label in out for label in labels)


def test_closed_loop_with_a_duration_keeps_sending_until_it_ends(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, local_server: RunningServer
) -> None:
    data, _ = bench_json(capsys, tmp_path, "--base-url", local_server.base_url, "--users", "3",
                         "--duration", "0.4", "--max-tokens", "3")
    stats = data["configs"][0]
    assert stats["requests"] > 3 and stats["failed"] == 0
    # Users start a new request while the deadline has not passed, so the slice lasts at least that long.
    assert stats["wall_s"] >= 0.4


def test_open_loop_sends_at_roughly_the_rate(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, local_server: RunningServer
) -> None:
    data, _ = bench_json(capsys, tmp_path, "--base-url", local_server.base_url, "--rate", "40",
                         "--duration", "1.0", "--max-tokens", "3")
    n = data["configs"][0]["requests"]
    # Poisson arrivals: mean 40 in 1 s, standard deviation about 6.3; the bounds are more than 3 sigma wide.
    assert 15 <= n <= 70
    assert all(r["lag_ms"] >= 0 for r in data["requests"])
    data, _ = bench_json(capsys, tmp_path, "--base-url", local_server.base_url, "--rate", "200",
                         "--requests", "12", "--max-tokens", "3")
    assert data["configs"][0]["requests"] == 12


async def test_open_loop_cap_delays_arrivals_and_counts_it(server_factory: Factory, tmp_path: Path) -> None:
    srv = server_factory(profile="instant", ttft_ms=80.0)
    scenario = Scenario(rate=400.0, requests=12, max_tokens=2, max_in_flight=3)
    samples: list[Sample] = []
    load = LoadRun(scenario, ["base"], Target(base_url=srv.base_url, http2="h2c"), on_sample=samples.append)
    async with asyncio.timeout(20):
        await load.run()
    assert len(samples) == 12
    assert load.cap_hits > 0
    # Requests held back by the cap went out late, and that is recorded.
    assert max(s.lag_ms for s in samples) > 0
    assert all(s.record.error is None for s in samples)


# -- the figures ---------------------------------------------------------------------------------------------

def test_percentile_table_agrees_with_the_request_records(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, server_factory: Factory
) -> None:
    srv = server_factory(profile="instant", ttft_ms=5.0, tokens_per_s=2000.0, jitter_ms=5.0)
    data, out = bench_json(capsys, tmp_path, "--base-url", srv.base_url, "--users", "5", "--requests", "30",
                           "--max-tokens", "8")
    stats = data["configs"][0]
    reqs = data["requests"]
    totals = [r["total_ms"] for r in reqs]
    ttfts = [r["ttft_ms"] for r in reqs]
    gaps = [g for r in reqs for g in r["itl_ms"]]
    lat = stats["latency_ms"]
    for q in (50, 90, 99):
        assert lat["e2e"][f"p{q}"] == pytest.approx(percentile(totals, q), abs=0.002)
        assert lat["ttft"][f"p{q}"] == pytest.approx(percentile(ttfts, q), abs=0.002)
        assert lat["itl"][f"p{q}"] == pytest.approx(percentile(gaps, q), abs=0.002)
    assert stats["requests_per_s"] == pytest.approx(stats["ok"] / stats["wall_s"], rel=1e-3)
    tokens = sum(r["output_tokens"] for r in reqs)
    assert stats["output_tokens_per_s"] == pytest.approx(tokens / stats["wall_s"], rel=1e-3)
    # The printed table shows the same numbers.
    assert table_cell(out, "end-to-end ms", "p50") == fmt_ms(lat["e2e"]["p50"])
    assert table_cell(out, "TTFT ms", "p99") == fmt_ms(lat["ttft"]["p99"])


def test_errors_are_counted_by_class(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, server_factory: Factory
) -> None:
    srv = server_factory(profile="instant", error_rate=0.5, seed=3)
    data, out = bench_json(capsys, tmp_path, "--base-url", srv.base_url, "--compare", "noretry",
                           "--users", "4", "--requests", "40", "--max-tokens", "3")
    stats = data["configs"][0]
    failed = [r for r in data["requests"] if r["error_kind"] is not None]
    assert stats["failed"] == len(failed) == sum(stats["errors"].values())
    assert set(stats["errors"]) <= {"http_500", "http_502", "http_503"}
    assert 0.2 < stats["error_rate"] < 0.8
    assert stats["retries"] == 0
    for kind, n in stats["errors"].items():
        assert stats["error_rates"][kind] == pytest.approx(n / 40)
        assert kind in out
    # Latencies cover the successful requests only.
    ok_totals = [r["total_ms"] for r in data["requests"] if r["error_kind"] is None]
    assert stats["latency_ms"]["e2e"]["p50"] == pytest.approx(percentile(ok_totals, 50), abs=0.002)


def test_goodput_counts_the_requests_that_meet_the_slo(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, server_factory: Factory
) -> None:
    # Time to first token uniform in [0, 200] ms: about half the requests miss a 100 ms objective.
    srv = server_factory(profile="instant", jitter_ms=200.0, seed=5)
    data, out = bench_json(capsys, tmp_path, "--base-url", srv.base_url, "--users", "10", "--requests", "30",
                           "--max-tokens", "2", "--slo-ttft-ms", "100")
    stats = data["configs"][0]
    met = sum(1 for r in data["requests"] if r["error"] is None and r["ttft_ms"] <= 100)
    assert stats["met_slo"] == met
    assert 0 < stats["goodput_requests_per_s"] < stats["requests_per_s"]
    assert stats["goodput_requests_per_s"] == pytest.approx(met / stats["wall_s"], rel=1e-3)
    assert "goodput" in out and "TTFT <= 100 ms" in out


def test_long_ratio_one_sends_prompts_over_a_thousand_tokens(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, local_server: RunningServer
) -> None:
    data, _ = bench_json(capsys, tmp_path, "--base-url", local_server.base_url, "--users", "2",
                         "--requests", "6", "--long-ratio", "1.0", "--max-tokens", "2")
    assert all(r["long_prompt"] and r["prompt_tokens"] > 1000 for r in data["requests"])
    assert data["configs"][0]["long_prompts"] == 6
    data, _ = bench_json(capsys, tmp_path, "--base-url", local_server.base_url, "--users", "2",
                         "--requests", "6", "--max-tokens", "2")
    assert all(not r["long_prompt"] and r["prompt_tokens"] < 100 for r in data["requests"])


def test_prompt_plan_is_the_same_under_every_configuration_and_mixes_as_asked() -> None:
    plan = PromptPlan(seed=7, long_ratio=0.25)
    picks = [plan.pick(s, i) for s in range(4) for i in range(200)]
    assert picks == [PromptPlan(seed=7, long_ratio=0.25).pick(s, i) for s in range(4) for i in range(200)]
    share = sum(long for _, long in picks) / len(picks)
    assert 0.18 < share < 0.32
    assert len({pid for pid, _ in picks}) == len(picks)  # no --prompts: every request a prompt of its own
    assert {pid for pid, _ in (PromptPlan(distinct=3).pick(0, i) for i in range(50))} == {0, 1, 2}


# -- comparisons ---------------------------------------------------------------------------------------------

def test_compare_shows_http_versions_reuse_and_a_new_connection_per_nopool_request(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, local_server: RunningServer
) -> None:
    data, out = bench_json(capsys, tmp_path, "--base-url", local_server.base_url, "--compare", "h1,h2,nopool",
                           "--users", "4", "--requests", "20", "--max-tokens", "3")
    stats = by_config(data)
    assert stats["h1"]["http_version"] == "HTTP/1.1" and stats["h1"]["connections_reused"] > 0
    assert stats["h2"]["http_version"] == "HTTP/2" and stats["h2"]["connections_reused"] > 0
    assert stats["nopool"]["http_version"] == "HTTP/1.1" and stats["nopool"]["connections_reused"] == 0
    # Each pool starts cold: the model lookup before the run does not leave the first one a warm connection.
    assert all(stats[c]["connections_reused"] < 20 for c in ("h1", "h2"))
    nopool = [r for r in data["requests"] if r["config"] == "nopool"]
    assert len(nopool) == 20 and stats["nopool"]["connections_opened"] == 20
    assert stats["nopool"]["connection_setup_ms_total"] == pytest.approx(
        sum(r["connect_ms"] for r in nopool), abs=0.02)
    assert all(not r["connection_reused"] and r["connect_ms"] is not None for r in nopool)
    # Interleaved: 5 slices of each, every slice of a configuration a block of its own in the run order.
    blocks = [(r["slice"], r["config"]) for r in data["requests"]]
    runs = [b for i, b in enumerate(blocks) if i == 0 or blocks[i - 1] != b]
    assert len(runs) == 15 and len(set(runs)) == 15
    rows = data["compare"]
    assert [r["config"] for r in rows] == ["h1", "h2", "nopool"]
    assert rows[0]["p99_e2e_change_pct"] == 0.0
    assert rows[1]["requests_per_s_change_pct"] == pytest.approx(
        (stats["h2"]["requests_per_s"] - stats["h1"]["requests_per_s"]) * 100 / stats["h1"]["requests_per_s"],
        abs=0.01)
    compare_lines = out.split("\n\n")[-1].splitlines()
    assert compare_lines[0].split()[:2] == ["config", "HTTP"]
    assert compare_lines[1].split()[:2] == ["h1", "HTTP/1.1"] and "(base)" in compare_lines[1]
    assert compare_lines[2].split()[:2] == ["h2", "HTTP/2"]


def test_max_connections_sizes_the_pool(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, server_factory: Factory
) -> None:
    srv = server_factory(profile="instant", ttft_ms=20.0)
    data, out = bench_json(capsys, tmp_path, "--base-url", srv.base_url, "--compare", "h1", "--users", "4",
                           "--requests", "12", "--max-tokens", "2", "--max-connections", "2", "--slices", "1")
    opened = [r for r in data["requests"] if not r["connection_reused"]]
    assert 1 <= len(opened) <= 2  # four users share two kept-alive connections
    assert max(r["pool_wait_ms"] for r in data["requests"]) > 0
    assert "pool: 2 connections" in out and "pool wait ms" in out


def _short_pool_timeout(tmp_path: Path) -> str:
    # A pool timeout far shorter than a request: a request that has to queue for a connection times out.
    config = tmp_path / "pool.toml"
    config.write_text("[http]\npool_timeout_s = 0.05\n", encoding="utf-8")
    return str(config)


def test_pools_are_sized_for_the_users(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, server_factory: Factory
) -> None:
    # 30 users against the default pool of 10 would queue 20 of them for longer than the pool timeout.
    srv = server_factory(profile="instant", ttft_ms=150.0)
    data, out = bench_json(capsys, tmp_path, "--config", _short_pool_timeout(tmp_path), "--base-url",
                           srv.base_url, "--compare", "h1,h2", "--users", "30", "--requests", "60",
                           "--max-tokens", "2", "--slices", "1")
    assert data["pools"] == {"h1": 30, "h2": 30}
    assert "pool: 30 connections (one per user)" in out
    stats = by_config(data)
    assert all(stats[c]["failed"] == 0 and stats[c]["retries"] == 0 for c in ("h1", "h2"))
    assert 10 < stats["h1"]["connections_opened"] <= 30  # more than the default pool, never more than users
    assert stats["h2"]["connections_opened"] == 1  # HTTP/2 multiplexes the 30 users on one connection
    assert "client errors" in out and "timeout_pool" not in out


def test_a_pool_too_small_warns_once_and_its_timeouts_are_the_clients(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, server_factory: Factory
) -> None:
    srv = server_factory(profile="instant", ttft_ms=150.0)
    data, out = bench_json(capsys, tmp_path, "--config", _short_pool_timeout(tmp_path), "--base-url",
                           srv.base_url, "--compare", "h1", "--users", "6", "--requests", "12",
                           "--max-tokens", "2", "--slices", "1", "--max-connections", "2")
    stats = by_config(data)["h1"]
    timed_out = [r for r in data["requests"] if r["error_kind"] == "timeout_pool"]
    assert timed_out and stats["client_errors"] == {"timeout_pool": len(timed_out)}
    assert stats["client_failed"] == stats["failed"] == len(timed_out)
    assert stats["server_errors"] == {} and stats["server_failed"] == 0 and stats["server_error_rate"] == 0
    assert stats["client_error_rate"] == pytest.approx(len(timed_out) / 12)
    # Not retried: each went out once, never reached the server, and counts in no retry.
    assert all(r["attempts"] == 1 and r["status"] is None for r in timed_out) and stats["retries"] == 0
    assert data["compare"][0]["server_error_rate"] == 0 and data["compare"][0]["client_error_rate"] > 0
    lines = out.splitlines()
    server_row = next(i for i, line in enumerate(lines) if line.startswith("server/net errors"))
    client_row = next(i for i, line in enumerate(lines) if line.startswith("client errors"))
    assert lines[server_row].split()[-2:] == ["0", "(0.0%)"]
    assert lines[client_row + 1].split()[0] == "timeout_pool"  # listed under the client's errors
    assert "never reached the server" in out


def test_the_pool_warning_is_said_once_before_the_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, local_server: RunningServer
) -> None:
    code, out, err = bench(capsys, "--base-url", local_server.base_url, "--compare", "h1,h2", "--users", "4",
                           "--requests", "8", "--max-tokens", "2", "--max-connections", "2")
    assert code == 0, err
    assert err.count("\n") == 1 and err.startswith("llmchat: --max-connections 2 is fewer than the 4 users")
    assert "pool wait" in err and "client's own" in err
    assert "pool: 2 connections (--max-connections)" in out
    # Enough connections, or nopool (no limit): nothing to say.
    nopool = ["--compare", "nopool", "--slices", "1", "--max-connections", "1"]
    for argv in (["--max-connections", "4"], nopool):
        code, out, err = bench(capsys, "--base-url", local_server.base_url, "--users", "4", "--requests", "4",
                               "--max-tokens", "2", *argv)
        assert code == 0 and err == "", (argv, err)


def test_compare_over_tls_negotiates_h2_by_alpn_and_counts_handshakes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tls_server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert tls_server.cert_path is not None
    monkeypatch.setenv("SSL_CERT_FILE", tls_server.cert_path)
    data, out = bench_json(capsys, tmp_path, "--base-url", tls_server.base_url, "--compare", "h2,h1,nopool",
                           "--users", "2", "--requests", "10", "--max-tokens", "2")
    stats = by_config(data)
    assert [stats[c]["http_version"] for c in ("h2", "h1", "nopool")] == ["HTTP/2", "HTTP/1.1", "HTTP/1.1"]
    nopool = [r for r in data["requests"] if r["config"] == "nopool"]
    assert all(r["tls_ms"] is not None and r["tls_ms"] > 0 for r in nopool)
    assert stats["nopool"]["connection_setup_ms_total"] == pytest.approx(
        sum(r["connect_ms"] + r["tls_ms"] for r in nopool), abs=0.02)
    assert stats["h2"]["connections_opened"] < stats["nopool"]["connections_opened"] == 10


def test_same_prompts_under_each_configuration(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, local_server: RunningServer
) -> None:
    data, _ = bench_json(capsys, tmp_path, "--base-url", local_server.base_url, "--compare", "h1,h2",
                         "--users", "3", "--requests", "15", "--long-ratio", "0.5", "--max-tokens", "2")
    seen: dict[tuple[int, int], list[tuple[bool, int]]] = {}
    for r in data["requests"]:
        seen.setdefault((r["slice"], r["index"]), []).append((r["long_prompt"], r["prompt_tokens"]))
    assert len(seen) == 15
    assert all(len(v) == 2 and v[0] == v[1] for v in seen.values())


def test_batch_mode_cache_hits_and_nocache(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, local_server: RunningServer
) -> None:
    data, out = bench_json(capsys, tmp_path, "--base-url", local_server.base_url, "--mode", "batch",
                           "--temperature", "0", "--prompts", "2", "--compare", "base,nocache",
                           "--users", "1", "--requests", "10", "--max-tokens", "3")
    stats = by_config(data)
    base = [r for r in data["requests"] if r["config"] == "base"]
    assert stats["base"]["cache_hits"] == sum(r["cache_hit"] for r in base) >= 8  # 2 prompts, 10 requests
    assert stats["nocache"]["cache_hits"] == 0
    assert stats["base"]["latency_ms"]["ttft"]["p50"] is None  # batch replies have no TTFT
    assert "TTFT ms" not in out and "TTFB ms" in out


def test_interleave_runs_each_configuration_once_per_round_in_a_seeded_order() -> None:
    order = interleave(["h2", "h1", "nopool"], 5, seed=0)
    rounds = [[c for s, c in order if s == r] for r in range(5)]
    assert all(sorted(r) == ["h1", "h2", "nopool"] for r in rounds)
    assert order == interleave(["h2", "h1", "nopool"], 5, seed=0)
    assert len({tuple(r) for r in rounds}) > 1
    assert parse_configs("h2, h1,nopool,h1+noretry") == ["h2", "h1", "nopool", "h1+noretry"]


# -- secrets and files ---------------------------------------------------------------------------------------

def test_json_and_output_hold_no_api_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, server_factory: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "sk-bench-SECRET-7f3a9c"
    srv = server_factory(profile="instant", api_key=key)
    monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", key)
    path = tmp_path / "b.json"
    code, out, err = bench(capsys, "--users", "2", "--requests", "6", "--max-tokens", "2",
                           "--json", str(path))
    assert code == 0, err
    data = read_results(path)
    assert data["configs"][0]["ok"] == 6  # the key went out: the server answers 401 without it
    assert key not in path.read_text() and key not in out + err
    # A wrong key: every request fails, and neither key shows anywhere.
    monkeypatch.setenv("OPENAI_API_KEY", key + "-wrong")
    code, out, err = bench(capsys, "--users", "2", "--requests", "4", "--max-tokens", "2")
    assert code == 1 and err.count("\n") == 1 and "401" in err and key not in out + err  # listing the models
    code, out, err = bench(capsys, "--users", "2", "--requests", "4", "--max-tokens", "2",
                           "--json", str(path), "--model", "llmchat-local")
    assert code == 1
    assert set(by_config(read_results(path))["base"]["errors"]) == {"http_401"}
    assert err.count("\n") == 1 and err.startswith("llmchat: every request failed")
    assert key not in path.read_text() + out + err


def _complete_lines(path: Path) -> list[dict[str, Any]]:
    """The lines of ``path`` written in full so far (the writer may be in the middle of the last one)."""
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.split("\n")[:-1]]


def test_json_holds_each_request_as_the_run_goes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, server_factory: Factory
) -> None:
    # About 80 ms a request, two users, 30 requests: a run of more than a second.
    srv = server_factory(profile="instant", ttft_ms=40.0, tokens_per_s=100.0)
    path = tmp_path / "live.jsonl"
    done: list[int] = []
    argv = ["bench", "--quiet", "--base-url", srv.base_url, "--users", "2", "--requests", "30",
            "--max-tokens", "4", "--json", str(path)]
    runner = threading.Thread(target=lambda: done.append(main(argv)))
    runner.start()
    try:
        deadline = time.monotonic() + 20
        while True:  # until some requests are on disk (the condition waited on, never a fixed sleep)
            seen = _complete_lines(path)
            if sum(line["type"] == "request" for line in seen) >= 3 or time.monotonic() > deadline:
                break
            time.sleep(0.01)
    finally:
        runner.join(30)
    assert done == [0]
    # Mid-run: the run line and finished requests, and no summary yet.
    assert seen[0]["type"] == "bench" and seen[0]["target"]["model"] == "llmchat-local"
    assert 3 <= len(seen) - 1 < 30 and all(line["type"] == "request" for line in seen[1:])
    data = read_results(path)
    assert len(data["requests"]) == data["configs"][0]["requests"] == 30
    assert data["requests"][:len(seen) - 1] == seen[1:]  # what was read mid-run is what the file kept
    assert all("attribution" in r and r["itl_ms"] for r in data["requests"])
    capsys.readouterr()


def test_json_path_that_cannot_be_written_fails_before_the_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, local_server: RunningServer
) -> None:
    code, out, err = bench(capsys, "--base-url", local_server.base_url, "--users", "1", "--requests", "2",
                           "--json", str(tmp_path / "no-such-folder" / "b.jsonl"))
    assert code == 2 and out == ""  # nothing was run, so nothing was lost
    assert err.count("\n") == 1 and err.startswith("llmchat: --json: cannot write") and "folder" in err


def test_plot_writes_an_svg_with_each_configuration(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, local_server: RunningServer
) -> None:
    svg = tmp_path / "out.svg"
    code, out, err = bench(capsys, "--base-url", local_server.base_url, "--compare", "h1,nopool", "--users",
                           "2", "--requests", "10", "--max-tokens", "2", "--plot", str(svg))
    assert code == 0, err
    root = ET.parse(svg).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert texts.count("h1") == 2 and texts.count("nopool") == 2  # one label per panel (TTFT, end-to-end)
    bars = list(root.iter("{http://www.w3.org/2000/svg}rect"))
    assert len(bars) == 3 + 2 * 2 * 3  # the legend, then 2 panels x 2 configurations x p50/p90/p99


def test_plot_draws_in_the_terminal(capsys: pytest.CaptureFixture[str], local_server: RunningServer) -> None:
    code, out, err = bench(capsys, "--base-url", local_server.base_url, "--compare", "h1,h2", "--users", "2",
                           "--requests", "10", "--max-tokens", "2", "--plot")
    assert code == 0, err
    chart = out.split("TTFT latency (ms)", 1)[1]
    assert "h1" in chart and "h2" in chart and "p99" in chart and "end-to-end latency (ms)" in chart
    assert "\x1b[" not in out  # no colour codes when stdout is not a terminal


# -- failures a user can meet --------------------------------------------------------------------------------

@pytest.mark.parametrize(("argv", "says"), [
    (["--users", "0"], "--users must be at least 1"),
    (["--compare", "h2,h3"], "unknown configuration 'h3'"),
    (["--compare", "h2,h2"], "names a configuration twice"),
    (["--mode", "batch", "--slo-ttft-ms", "100"], "--slo-ttft-ms needs --mode stream"),
    (["--requests", "3", "--slices", "5"], "fewer than --slices"),
    (["--rate", "0"], "--rate must be a positive number"),
    (["--long-ratio", "1.5"], "--long-ratio must be between 0 and 1"),
    (["--max-connections", "0"], "--max-connections must be at least 1"),
])
def test_bad_flags_are_one_line_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    code, out, err = bench(capsys, "--base-url", "http://127.0.0.1:9/v1", *argv)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("llmchat: ") and says in err


def test_users_and_rate_are_exclusive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--users", "2", "--rate", "3"])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_nothing_listening(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    code, out, err = bench(capsys, "--base-url", url, "--users", "1", "--requests", "3")
    assert code == 1 and err.count("\n") == 1 and "connection refused" in err  # listing the models
    code, out, err = bench(capsys, "--base-url", url, "--model", "m", "--compare", "noretry", "--users", "1",
                           "--requests", "5")
    assert code == 1
    assert "llmchat: every request failed" in err and "connection refused" in err
    assert "connect 5 (100.0%)" in " ".join(out.split())


# -- the progress line ---------------------------------------------------------------------------------------

def _sample(config: str, total_ms: float | None, error_kind: str | None = None) -> Sample:
    rec = TimingRecord(t0_ns=0)
    rec.end_ns = None if total_ms is None else int(total_ms * 1e6)
    rec.error_kind = error_kind
    return Sample(config, 0, 0, False, rec)


def test_progress_line_shows_live_percentiles_and_errors() -> None:
    stream = io.StringIO()
    progress = bench_cmd.Progress(Scenario(requests=10, slices=2), ["h2", "h1"], enabled=True, stream=stream)
    progress.slice(1, "h1")
    for v in (10.0, 20.0, 30.0):
        progress.sample(_sample("h1", v))
    progress.sample(_sample("h2", 500.0))
    progress.sample(_sample("h1", 1.0, "http_503"))
    line = progress.line()
    assert "5/20" in line and "h1 slice 2/2" in line
    assert f"p50 {fmt_ms(20.0)} ms" in line and f"p99 {fmt_ms(percentile([10.0, 20.0, 30.0], 99))} ms" in line
    assert "errors 1" in line
    progress.close()
    assert stream.getvalue().startswith("\r") and stream.getvalue().endswith("\n")


def test_settings_are_left_alone_by_a_comparison(local_server: RunningServer, tmp_path: Path) -> None:
    # The configurations change their own copies: the caller's settings and pools stay as they were.
    settings = Settings()
    samples: list[Sample] = []
    load = LoadRun(Scenario(requests=2, users=1, max_tokens=2), ["nopool", "h1+noretry"],
                   Target(settings=settings, base_url=local_server.base_url), on_sample=samples.append)
    asyncio.run(load.run())
    assert settings == Settings()
    assert {s.config for s in samples} == {"nopool", "h1+noretry"}


# -- where the time went -------------------------------------------------------------------------------------

def attribution_rows(out: str) -> dict[str, list[str]]:
    """The printed "where the time went" section: part key -> its cells (p50, p90, p99 per configuration)."""
    lines = out.split("where the time went, ms", 1)[1].splitlines()[2:]
    rows = {}
    for line in lines:
        cells = line.split()
        if not cells or cells[0] not in PARTS:
            break
        rows[cells[0]] = cells[1:]
    return rows


def shown_as(cell: str, ms: float) -> bool:
    """Whether a printed cell is ``ms`` to the precision ``fmt_ms`` prints (the JSON's value is rounded to
    the microsecond, the table's is not, so the last printed digit may differ by one)."""
    step = 0.01 if abs(ms) < 10 else 0.1 if abs(ms) < 1000 else 1.0
    return abs(float(cell) - ms) <= step * 0.51 + 0.001


def test_per_part_percentiles_agree_with_each_requests_attribution(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, server_factory: Factory
) -> None:
    # Some requests fail (they are left out of the percentiles), the rest get the server's own stamps.
    srv = server_factory(profile="instant", ttft_ms=5.0, tokens_per_s=2000.0, jitter_ms=5.0, error_rate=0.2,
                         seed=11)
    data, out = bench_json(capsys, tmp_path, "--base-url", srv.base_url, "--compare", "h2+noretry,h1+noretry",
                           "--users", "3", "--requests", "20", "--max-tokens", "6", "--slices", "2")
    printed = attribution_rows(out)
    for column, stats in enumerate(data["configs"]):
        reqs = [r for r in data["requests"] if r["config"] == stats["config"]]
        ok = [r for r in reqs if r["error_kind"] is None]
        assert 0 < len(ok) < len(reqs) == 20
        for r in reqs:
            a = r["attribution"]
            # Every request carries its own split, and its parts add up to its total.
            assert a["total_ms"] == pytest.approx(r["total_ms"], abs=0.002)
            rounding = 0.002 * len(a["parts"])
            assert sum(p["ms"] for p in a["parts"]) == pytest.approx(a["total_ms"], abs=rounding)
        samples: dict[str, list[float]] = {}
        for r in ok:
            for p in r["attribution"]["parts"]:
                samples.setdefault(p["key"], []).append(p["ms"])
        table = stats["attribution"]
        assert list(table) == [k for k in PARTS if k in samples]  # every part present, in PARTS order
        assert table["server_prefill"]["n"] == table["decode"]["n"] == len(ok)
        for key, values in samples.items():
            assert table[key]["n"] == len(values)
            for q in (50, 90, 99):
                # The request lines round each part to the microsecond; the percentiles are of the raw values.
                want = table[key][f"p{q}"]
                assert want == pytest.approx(percentile(values, q), abs=0.002), (key, q)
                assert shown_as(printed[key][column * 3 + (50, 90, 99).index(q)], want), (key, q)
        shares = stats["attribution_shares"]
        assert sum(shares.values()) == pytest.approx(1.0, abs=1e-3) and shares["server"] > 0
        assert f"{stats['config']}  " in out.split("where the time went", 1)[1]


def test_cache_hits_are_all_client_time(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, local_server: RunningServer
) -> None:
    data, out = bench_json(capsys, tmp_path, "--base-url", local_server.base_url, "--mode", "batch",
                           "--temperature", "0", "--prompts", "1", "--users", "1", "--requests", "6",
                           "--max-tokens", "3")
    hits = [r for r in data["requests"] if r["cache_hit"]]
    assert len(hits) == 5
    assert all([p["key"] for p in r["attribution"]["parts"]] == ["cache", "unexplained"] for r in hits)
    stats = data["configs"][0]
    assert stats["attribution"]["cache"]["n"] == 5
    assert stats["attribution"]["server_generation"]["n"] == 1  # the one reply from the server
    assert "cache" in attribution_rows(out)


def test_bench_writes_the_request_log(
    server_factory: Factory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json as _json

    from llmchat.tui.cli import main as _main

    server = server_factory()
    log = tmp_path / "requests.jsonl"
    config = tmp_path / "config.toml"
    config.write_text(f'[log]\nrequests_path = "{log}"\n', encoding="utf-8")
    status = _main(["--config", str(config), "bench", "--base-url", server.base_url, "--model", "llmchat-local",
                    "--requests", "6", "--users", "2", "--quiet"])
    assert status == 0
    lines = [_json.loads(x) for x in log.read_text().splitlines()]
    assert len(lines) == 6 and all(line["status"] == 200 for line in lines)


# -- memory: nothing of a finished request is kept ----------------------------------------------------------

def _alive(kind: type) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is kind)


async def test_a_load_run_keeps_only_its_tallies(local_server: RunningServer) -> None:
    # 250 requests of 64 tokens: 15,750 chunk gaps, past the exact limit; everything else under it.
    seen = 0

    def count(sample: Sample) -> None:
        nonlocal seen
        seen += 1

    before = _alive(TimingRecord), _alive(Sample)
    target = Target(base_url=local_server.base_url, http2="h2c", model="llmchat-local")
    load = LoadRun(Scenario(users=10, requests=250, max_tokens=64), ["base"], target, on_sample=count)
    async with asyncio.timeout(60):
        await load.run()
    assert seen == load.done == 250
    # No record, sample or attribution of a finished request survives it.
    assert (_alive(TimingRecord), _alive(Sample)) == before
    tally = load.tallies["base"]
    itl = tally.latency["itl"]
    assert itl.count == 250 * 63 > EXACT_LIMIT and not itl.exact
    assert itl.nbytes() < 8 * EXACT_LIMIT  # a few decades of log buckets, whatever the count
    # What is kept is the compact rows: 8 bytes per value (plus the arrays' growth room) below the limit.
    kept = [d for d in [*tally.latency.values(), *tally.parts.values()] if d.exact]
    values = sum(d.count for d in kept)
    assert values > 10 * 250  # five latency figures and the parts of each request
    assert sum(d.nbytes() for d in kept) <= 8 * values * 1.25 + 100 * len(kept)
    stats = tally.stats(load.walls_ns["base"])
    assert stats.approximate == ("itl",) and stats.approximate_parts == ()
    assert "percentiles of ITL from a log-bucketed histogram, each within 0.1%" in figures_table([stats],
                                                                                              mode="stream")
    assert stats.requests == stats.ok == 250


def test_a_distribution_is_exact_until_its_limit_then_within_its_error() -> None:
    rng = random.Random(7)
    draws: dict[str, Callable[[], float]] = {
        "lognormal": lambda: rng.lognormvariate(3.0, 1.0),
        "straddling zero": lambda: rng.uniform(-5.0, 50.0),
        "with zeros": lambda: rng.choice([0.0, rng.expovariate(0.2)]),
        "negative": lambda: -rng.expovariate(1.0),
    }
    for name, draw in draws.items():
        values = [draw() for _ in range(20_000)]
        d = Distribution(limit=500)
        d.extend(values[:500])
        assert d.exact and all(d.percentile(q) == percentile(values[:500], q) for q in (0, 50, 99, 100))
        d.extend(values[500:])
        assert not d.exact and d.count == len(values)
        assert d.mean == pytest.approx(sum(values) / len(values))
        ordered = sorted(values)
        for q in (0, 1, 10, 50, 90, 99, 99.9, 100):
            pos = (len(values) - 1) * q / 100
            lo, hi = ordered[int(pos)], ordered[min(int(pos) + 1, len(values) - 1)]
            # Each of the two ranks it interpolates between is within the relative error of the exact one.
            bound = RELATIVE_ERROR * max(abs(lo), abs(hi)) + 1e-12
            assert abs(d.percentile(q) - percentile(values, q)) <= bound, (name, q)


def test_a_distributions_memory_stops_growing_past_its_limit() -> None:
    rng = random.Random(3)
    d = Distribution(limit=1_000)
    d.extend([rng.uniform(1.0, 1_000.0) for _ in range(50_000)])
    size = d.nbytes()
    d.extend([rng.uniform(1.0, 1_000.0) for _ in range(100_000)])
    # Flat: the buckets of three decades (about 3,500 counts at 0.1 %), a fraction of the values seen.
    assert d.nbytes() == size < 8 * 50_000 / 10
