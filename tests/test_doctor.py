"""`llmchat doctor` against `llmchat serve` playing each known fault: each is named, with its numbers and its
config change; a healthy server gets no warning. In-process servers on real sockets, small budgets."""

from __future__ import annotations

import asyncio
import json
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from llmchat.core.config import Settings, load_settings, set_toml_keys
from llmchat.core.diagnose import Context, Finding, Report, estimate, run_battery
from llmchat.core.diagnose._prescribe import prescribe
from llmchat.core.diagnose._streaming import LoopWatch, summarize, watching
from llmchat.core.observe import TimingRecord
from llmchat.core.server import RunningServer
from llmchat.tui.cli import main
from llmchat.tui.commands._doctor_report import render

Factory = Callable[..., RunningServer]


def _doctor(server: RunningServer, settings: Settings | None = None, **kw: Any) -> Report:
    ctx = Context(settings or Settings(), base_url=server.base_url, **kw)
    return asyncio.run(asyncio.wait_for(run_battery(ctx), 60))


def _finding(report: Report, check: str) -> Finding:
    found = [f for f in report.findings if f.check == check]
    assert found, f"no {check} finding: {[f.check for f in report.findings]}"
    return found[0]


def _alarms(report: Report) -> list[str]:
    return [f"{f.check}: {f.title} ({f.evidence})" for f in report.findings if f.mark in ("warn", "fail")]


def test_a_healthy_server_gets_no_false_alarm(server_factory: Factory) -> None:
    report = _doctor(server_factory(profile="instant", tokens_per_s=300.0))
    assert _alarms(report) == []
    assert report.worst() == "pass" and report.changes() == {}
    assert not report.skipped and report.requests_sent <= 30
    text = render(report, cols=80)
    assert "Summary: healthy" in text and all(len(line) <= 80 for line in text.splitlines())


def test_close_after_stream_is_named_once_with_what_the_transport_learnt(server_factory: Factory) -> None:
    # The transport learns the host's habit on the first stream that finds its connection closed (one retry),
    # and opens a fresh connection for every request after: the doctor says that, once, and prescribes
    # nothing (max_requests_per_connection = 1 would only save the one retry per pool).
    report = _doctor(server_factory(profile="instant", close_after_stream=True))
    f = _finding(report, "connection.keepalive")  # one finding for keep-alive, one verdict
    assert f.mark == "warn" and "3 of 3 streams" in f.evidence
    assert "learnt it at stream 2" in f.evidence and f.advice.startswith("nothing to change")
    assert f.changes == {} and report.changes() == {}
    assert report.measurements["connection"]["closes_after_response"] == {"learnt": 1, "stale_retries": 1}
    assert report.measurements["limits"]["retries_and_errors"]["retry_reasons"] == {"stale connection": 1}
    # Said once: the retry it cost is not a second warning, and no other finding names the close.
    retries = _finding(report, "limits.retries")
    assert retries.mark == "info" and "1 retry on a connection the server had closed" in retries.title
    assert [a for a in _alarms(report) if "closes" in a] == [_alarms(report)[0]]
    assert report.worst() == "warn" and report.contradictions == []


def test_the_keepalive_finding_reads_what_the_transport_learnt() -> None:
    # Pure: the measurements in, the finding out. Too few streams to see the close (a small budget), but a
    # record of the battery says the transport learnt it: the finding says so, from that alone.
    report = Report(target="http://h/v1", provider="custom", model="m")
    report.measurements["connection"].update(
        keepalive_between_requests=True, new_ms=[30.0], reused_ms=[5.0], reused=[True],
        after_streams={"streams": 1, "http_version": "HTTP/1.1", "reused_after_stream": [],
                       "closed_after_stream": False, "stale_retries": 0, "learnt_at_stream": None},
        closes_after_response={"learnt": 1, "stale_retries": 1})
    findings = prescribe(report, Settings(), scheme="http", http2_setting=True)
    (f,) = [f for f in findings if f.check == "connection.keepalive"]
    assert f.mark == "warn" and "closes the connection after each response" in f.title
    assert "1 retried on a dead one" in f.evidence and f.changes == {}
    assert f.figures["closes_after_response"] == 1.0
    # Without the transport's word, the same measurements are keep-alive honoured.
    report.measurements["connection"]["closes_after_response"] = {"learnt": 0, "stale_retries": 0}
    (f,) = [f for f in prescribe(report, Settings(), scheme="http", http2_setting=True)
            if f.check == "connection.keepalive"]
    assert f.mark == "pass"


def test_retries_the_transport_did_not_explain_still_prescribe_a_fresh_connection() -> None:
    # Every stream paid a retry on a dead connection and the transport never learnt why (a transport that
    # does not remember): then one request per connection is the fix.
    report = Report(target="http://h/v1", provider="custom", model="m")
    report.measurements["connection"].update(
        after_streams={"streams": 4, "http_version": "HTTP/1.1", "reused_after_stream": [False] * 3,
                       "closed_after_stream": True, "stale_retries": 3, "learnt_at_stream": None},
        closes_after_response={"learnt": 0, "stale_retries": 3})
    report.measurements["limits"]["retries_and_errors"] = {
        "requests": 4, "retries": 3, "retry_reasons": {"stale connection": 3}, "errors": {}, "error_examples": {}}
    findings = {f.check: f for f in prescribe(report, Settings(), scheme="http", http2_setting=True)}
    assert findings["connection.keepalive"].mark == "fail"
    assert findings["connection.keepalive"].changes == {("http",): {"max_requests_per_connection": 1}}
    assert findings["limits.retries"].mark == "warn"


def test_a_round_trip_makes_new_connections_costly_and_http2_judged_on_the_burst(server_factory: Factory) -> None:
    report = _doctor(server_factory(profile="instant", rtt_ms=60.0))
    cost = _finding(report, "connection.new_cost")
    assert cost.mark == "warn" and cost.effect_ms is not None and 40 <= cost.effect_ms <= 200
    assert cost.changes == {("http",): {"keepalive_ping_s": 15.0}}  # warmup = true is the default already
    h2 = _finding(report, "connection.http2")
    burst = report.measurements["connection"]["burst"]
    assert burst["http1"]["connections_opened"] == 4 and burst["http2"]["connections_opened"] == 1
    # Recommended only when the same burst, measured, finished sooner over HTTP/2 (it need not, here).
    faster = round(burst["http1"]["wall_ms"]) - round(burst["http2"]["wall_ms"]) >= 10
    assert (h2.mark, h2.changes) == (("warn", {("http",): {"http2": "h2c"}}) if faster else ("info", {}))
    assert report.contradictions == []
    assert report.measurements["connection"]["rtt_estimate_ms"] >= 60
    assert _finding(report, "streaming.buffered").mark != "fail"  # a late reply in one write is not buffering


def test_cold_start_is_named_with_the_model_load(server_factory: Factory) -> None:
    report = _doctor(server_factory(profile="instant", cold_start_ms=500.0))
    f = _finding(report, "server.cold_start")
    assert f.mark == "warn" and f.effect_ms is not None and 450 <= f.effect_ms <= 1500
    assert "model load of 500 ms" in f.evidence
    assert f.changes == {} and "warmup = true is already in force" in f.advice  # the default: nothing to change


def test_cold_again_after_idle(server_factory: Factory) -> None:
    report = _doctor(server_factory(profile="instant", cold_start_ms=400.0, idle_unload_s=0.5), idle_s=1.0)
    f = _finding(report, "server.idle")
    assert f.mark == "warn" and f.changes == {("http",): {"keepalive_ping_s": 1.0}}


def test_a_rate_limit_near_exhaustion(server_factory: Factory) -> None:
    report = _doctor(server_factory(profile="instant", rate_limit=10))
    f = _finding(report, "limits.requests")
    assert f.mark == "warn" and "1 of 10 requests left" in f.title
    assert f.changes[("batch",)] == {"concurrency": 1} and "Batch API" in f.advice


def test_a_buffering_proxy_is_told_from_the_arrival_pattern(server_factory: Factory) -> None:
    report = _doctor(server_factory(profile="instant", tokens_per_s=150.0, buffer_stream=True))
    f = _finding(report, "streaming.buffered")
    assert f.mark == "fail" and f.changes == {("ui",): {"stream": False}}
    assert f.effect_ms is not None and f.effect_ms >= 50  # the first token waited for the whole reply


def test_a_stalling_stream(server_factory: Factory) -> None:
    report = _doctor(server_factory(profile="instant", tokens_per_s=300.0, stall_ms=700.0))
    f = _finding(report, "streaming.stall")
    assert f.mark == "warn" and f.effect_ms is not None and 650 <= f.effect_ms <= 2000
    assert f.changes == {("ui",): {"stall_s": 0.5}}  # the HUD's 3 s badge would miss it


def test_the_loop_watch_sees_the_process_not_running() -> None:
    async def go() -> tuple[int, int, LoopWatch]:
        async with watching() as watch:
            await asyncio.sleep(0.05)
            a = time.perf_counter_ns()
            time.sleep(0.3)  # the event loop blocked, as a busy machine or a slow callback would
            b = time.perf_counter_ns()
            await asyncio.sleep(0.05)  # the watch's late wake lands after the block
        return a, b, watch

    a, b, watch = asyncio.run(go())
    assert watch.own_ns(a, b) >= 0.8 * (b - a)
    assert watch.own_ns(b + 40_000_000, b + 50_000_000) == 0  # after the block it ran on time


def test_a_gap_the_machine_caused_is_not_a_server_stall() -> None:
    ms = 1_000_000
    record = TimingRecord(mode="stream", model="m", t0_ns=0)
    record.first_token_ns, record.chunk_ns = 10 * ms, [10 * ms, 15 * ms, 20 * ms, 720 * ms, 725 * ms, 730 * ms]
    record.last_token_ns, record.end_ns, record.output_tokens = 730 * ms, 731 * ms, 6
    assert summarize([record])["stalled_streams"] == 1  # without the watch, a 700 ms gap is a stall
    watch = LoopWatch()
    watch.late.append((40 * ms, 700 * ms))  # the process did not run for 660 ms of it
    m = summarize([record], watch)
    assert m["stalled_streams"] == 0 and m["longest_own_gap_ms"] == 700.0 and m["longest_gap_ms"] == 5.0
    report = Report(target="http://127.0.0.1:1/v1", provider="custom", model="m")
    report.measurements["streaming"] = m
    stall = next(f for f in prescribe(report, Settings(), scheme="http", http2_setting=False)
                 if f.check == "streaming.stall")
    assert stall.mark == "pass" and "700 ms was this machine's own" in stall.evidence


def test_a_saturated_server_queues_the_parallel_burst(server_factory: Factory) -> None:
    report = _doctor(server_factory(profile="instant", tokens_per_s=150.0, max_concurrency=1))
    f = _finding(report, "server.saturation")
    assert f.mark == "warn" and f.changes == {("batch",): {"concurrency": 1}}
    assert report.measurements["server"]["burst"]["saturated_requests"] >= 2 and "Batch API" in f.advice


def test_the_budget_bounds_the_battery(server_factory: Factory) -> None:
    server = server_factory(profile="instant")
    ctx = Context(Settings(), base_url=server.base_url, budget_requests=12)
    planned = estimate(ctx)
    assert planned.requests <= 12
    report = asyncio.run(run_battery(ctx))
    assert report.requests_sent == planned.requests and report.skipped


def test_cli_json_needs_yes_without_a_terminal(server_factory: Factory, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    server = server_factory(profile="instant", close_after_stream=True)
    monkeypatch.setattr("sys.stdin.isatty", lambda: False, raising=False)
    assert main(["doctor", "--base-url", server.base_url]) == 2
    err = capsys.readouterr().err
    refusal = err.strip().splitlines()[-1]  # after the estimate: one line, naming the cause and the fix
    assert refusal.startswith("llmchat:") and "not a terminal" in refusal and "pass --yes" in refusal
    assert main(["doctor", "--base-url", server.base_url, "--yes", "--json", "--budget-requests", "20"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "warn" and data["requests_sent"] <= 20
    assert any(f["check"] == "connection.keepalive" and f["mark"] == "warn" for f in data["findings"])


def test_write_config_shows_the_diff_and_keeps_a_backup(server_factory: Factory, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    server = server_factory(profile="instant", rtt_ms=60.0)
    config = tmp_path / "config.toml"
    config.write_text("# mine\n[http]\nmax_connections = 8\n\n[ui]\ntheme = \"textual-dark\"\n", encoding="utf-8")
    code = main(["doctor", "--config", str(config), "--base-url", server.base_url, "--yes", "--write-config"])
    assert code == 1
    err = capsys.readouterr().err
    assert "+keepalive_ping_s = 15.0" in err and "+warmup" not in err and "wrote" in err
    assert (tmp_path / "config.toml.bak").read_text(encoding="utf-8").startswith("# mine")
    text = config.read_text(encoding="utf-8")
    assert text.startswith("# mine\n[http]\nmax_connections = 8\n") and 'theme = "textual-dark"' in text
    assert load_settings(str(config)).http.keepalive_ping_s == 15.0


def test_set_toml_keys_edits_in_place() -> None:
    text = "a = 1\n[http]\n# why\nhttp2 = true\n\n[providers.x.http]\nwarmup = false\n"
    out = set_toml_keys(text, {("http",): {"http2": "h2c", "warmup": True}, ("providers", "x", "http"):
                               {"warmup": True}, ("retry",): {"max_delay_s": 90.0}})
    doc = tomllib.loads(out)
    assert doc["http"] == {"http2": "h2c", "warmup": True} and doc["providers"]["x"]["http"]["warmup"] is True
    assert doc["retry"] == {"max_delay_s": 90.0} and "# why" in out
    with pytest.raises(ValueError):
        set_toml_keys("[providers.x]\nhttp = { warmup = false }\n", {("providers", "x", "http"): {"warmup": True}})
