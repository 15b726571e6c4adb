"""The server's side, told truly, end to end: cold starts on a new process's first request (the server's own
model-load report, and baselines kept in the XDG state folder between processes), and the provider's
``/metrics`` scraped beside the requests into records, the HUD's model, Prometheus and the saturation flag.

Everything runs against ``llmchat serve`` (in a thread, or its subprocess) or a scripted raw peer, over real
sockets; ``llmchat ask`` runs as the real command, in a child process where "a new process" is the point.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import peers as P
import pytest

from llmchat.core import (
    CacheSettings,
    ChatClient,
    ColdStartDetector,
    ProviderSettings,
    Settings,
    TimingRecord,
    attribute,
)
from llmchat.core.client._signals import ServerSignals
from llmchat.core.observe._baselines import BaselineStore
from llmchat.core.observe._prometheus import ClientMetrics
from llmchat.core.observe._window import Metrics
from llmchat.core.server import RunningServer
from llmchat.tui.cli import main

MODEL = "llmchat-local"
MSG = [{"role": "user", "content": "is the server busy"}]
WAIT_S = 10.0
"""The bound on any one wait here: far past what each needs, so a bug fails instead of hanging."""
ASK_TIMEOUT_S = 60.0
LOAD_MS = 600
LATE_MS = 25.0
"""A reported model load is the server's planned delay: its own timer only ever fires late, never early."""

Factory = Callable[..., RunningServer]


def _ask(*argv: str, env: dict[str, str] | None = None) -> tuple[dict[str, Any], str]:
    """``llmchat ask --json ARGV`` in a child process: its JSON object and its stderr."""
    done = subprocess.run([sys.executable, "-m", "llmchat.tui", "ask", "hi", "--json", "--stats", *argv],
                          capture_output=True, text=True, timeout=ASK_TIMEOUT_S, env=env or dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return json.loads(done.stdout), done.stderr


def _parts(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["key"]: p for p in obj["attribution"]["parts"]}


# -- item 4: cold starts on the first request ----------------------------------------------------------------
def _keep_warm(base_url: str, stop: threading.Event) -> None:
    """Ask for one token every 0.1 s until ``stop``: the model stays loaded while a child process starts."""
    body = json.dumps({"model": MODEL, "messages": MSG, "max_tokens": 1}).encode()
    while not stop.wait(0.1):
        request = urllib.request.Request(base_url + "/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=WAIT_S) as reply:
            reply.read()


def test_a_new_process_sees_the_cold_start_of_its_first_request(server_factory: Factory) -> None:
    srv = server_factory(cold_start_ms=LOAD_MS, idle_unload_s=1.0, ttft_ms=30)
    args = ("--base-url", srv.base_url, "--model", MODEL, "--max-tokens", "3")
    first, first_err = _ask(*args)  # the server's first request for the model: it loads it
    stop = threading.Event()
    warmer = threading.Thread(target=_keep_warm, args=(srv.base_url, stop), daemon=True)
    warmer.start()
    try:
        warm, _ = _ask(*args)  # another process while the model is kept loaded (however slow it starts)
    finally:
        stop.set()
        warmer.join(WAIT_S)
    time.sleep(1.2)  # deliberate idle, past the server's idle_unload_s: it unloads the model
    again, again_err = _ask(*args)
    for obj, err in ((first, first_err), (again, again_err)):
        attribution = obj["attribution"]
        assert attribution["flags"] == ["cold_start"]
        load = _parts(obj)["server_model_load"]
        assert (load["name"], load["group"], load["source"]) == ("server model load", "server", "reported")
        assert LOAD_MS <= load["ms"] <= LOAD_MS + LATE_MS
        assert _parts(obj)["server_prefill"]["ms"] < 30 + LATE_MS  # the load is not filed as prefill
        assert any("reported 600 ms of model load" in n for n in attribution["notes"])
        split = err.strip().splitlines()[-2]
        assert split.endswith("[cold_start: server model load 600 ms]"), err
    assert warm["attribution"]["flags"] == [] and "server_model_load" not in _parts(warm)


def _sse_reply(pause_s: float) -> list[P.Step]:
    return [P.SSE_HEAD, P.event(P.delta("", role="assistant")), P.Pause(pause_s), P.event(P.delta("Hi")),
            P.event(P.delta("!", finish_reason="stop")), P.DONE, P.END]


async def _one_process(base_url: str, store: BaselineStore, tmp_path: Path, n: int) -> list[list[str]]:
    """What one process does: a ChatClient of provider "peer" and ServerSignals (a fresh detector, seeded
    from ``store``, that never waits for idle), ``n`` streamed requests; the flags of each."""
    settings = Settings(cache=CacheSettings(path=str(tmp_path / "cache")))
    signals = await ServerSignals(settings, detector=ColdStartDetector(idle_s=0.0), store=store).open()
    flags = []
    async with ChatClient(settings, provider="peer", base_url=base_url, model="m", http2=False) as client:
        for _ in range(n):
            stream = client.stream(MSG)
            async with asyncio.timeout(WAIT_S):
                async for _piece in stream:
                    pass
            flags.append((await signals.attribute(stream.record)).flags)
    await signals.aclose()
    return flags


async def test_the_baseline_file_lets_a_new_process_flag_what_no_server_reports(
    peer: Callable[..., P.Peer], tmp_path: Path
) -> None:
    # One provider, model and server that says nothing about itself: only a baseline can tell.
    server = peer(_sse_reply(0.01), then="keep")
    shared = BaselineStore(tmp_path / "state" / "coldstart.json")
    assert await _one_process(server.base_url, shared, tmp_path, 3) == [[], [], []]
    [track] = json.loads(shared.path.read_text())["tracks"]
    assert (track["provider"], track["model"], track["host"]) == ("peer", "m", f"127.0.0.1:{server.port}")
    server.steps = _sse_reply(0.4)  # the server's first token now takes 40 times as long (its model unloaded)
    # A new process: seeded from the file, its first request is flagged...
    assert await _one_process(server.base_url, shared, tmp_path, 1) == [["cold_start"]]
    # ...without the file it could not be (nothing to compare with): the file is what tells...
    elsewhere = BaselineStore(tmp_path / "other" / "coldstart.json")
    assert await _one_process(server.base_url, elsewhere, tmp_path, 1) == [[]]
    # ...and a baseline from one server says nothing about another under the same provider name.
    other = peer(_sse_reply(0.4), then="keep")
    assert await _one_process(other.base_url, shared, tmp_path, 1) == [[]]


def test_a_corrupt_baseline_file_is_harmless(local_server: RunningServer) -> None:
    path = Path(os.environ["XDG_STATE_HOME"]) / "llmchat" / "coldstart.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"version": 1, "tracks": [{"provider": ')
    obj, err = _ask("--base-url", local_server.base_url, "--model", MODEL, "--max-tokens", "3")
    assert obj["reply"] and obj["error"] is None
    warnings = [line for line in err.splitlines() if "cold-start baselines" in line]
    assert len(warnings) == 1 and str(path) in warnings[0] and "written anew at exit" in warnings[0]
    assert json.loads(path.read_text())["tracks"][0]["provider"] == "custom"  # healed by the save at exit


# -- item 8: server metrics, wired ---------------------------------------------------------------------------
def _metrics_settings(srv: RunningServer, tmp_path: Path, **provider: Any) -> Settings:
    root = srv.base_url.removesuffix("/v1")
    local = ProviderSettings(name="local", base_url=srv.base_url, model=MODEL, http={"http2": False},
                             metrics_url=root + "/metrics", metrics_interval_s=0.05, **provider)
    return Settings(providers={"local": local}, cache=CacheSettings(path=str(tmp_path / "cache")))


async def _drain(client: ChatClient) -> TimingRecord:
    stream = client.stream(MSG, max_tokens=3)
    async with asyncio.timeout(WAIT_S):
        async for _piece in stream:
            pass
    return stream.record


async def test_a_busy_servers_metrics_reach_the_records_the_hud_and_prometheus(
    server_factory: Factory, tmp_path: Path
) -> None:
    srv = server_factory(ttft_ms=300, max_concurrency=1)
    settings = _metrics_settings(srv, tmp_path)
    async with ChatClient(settings, provider="local", use_cache=False) as client:
        hud, exported = Metrics(), ClientMetrics()
        hud.subscribe(client.bus)
        exported.subscribe(client.bus)
        signals = await ServerSignals(settings, store=BaselineStore(tmp_path / "cs.json")).open()
        poller = signals.follow(client)
        assert poller is not None and poller.url.endswith("/metrics")
        busy = await asyncio.gather(_drain(client), _drain(client))  # one runs, the other waits its turn
        alone = [await _drain(client) for _ in range(2)]
        await signals.aclose()
    for record in busy:
        assert record.server_metrics is not None and record.server_metrics["requests_waiting"] >= 1
        flagged = attribute(record)
        assert "saturation" in flagged.flags and any("waiting" in n for n in flagged.notes)
    # Both were in flight while a request waited; the one that ran first had no queue of its own to show.
    first = min(busy, key=lambda r: (r.server_timing or {}).get("started_ns", 0))
    assert (first.server_timing or {}).get("started_ns") == (first.server_timing or {}).get("received_ns")
    for record in alone:
        assert record.server_metrics is not None and record.server_metrics["requests_waiting"] == 0
        assert "saturation" not in attribute(record).flags
    # The scrapes went over a connection of their own: the client's pool was the requests' alone.
    assert all(r.connection_reused for r in alone)
    # The HUD's model and the Prometheus gauges hold the last scrape.
    last = poller.latest
    assert last is not None and poller.scrapes >= 3 and set(last) == {"requests_waiting", "requests_running"}
    state = hud.server_state("local")
    assert state is not None and state.metrics == last and state.error is None
    sample = exported.registry.get_sample_value
    assert sample("llmchat_provider_metrics_up", {"provider": "local"}) == 1.0
    for key in ("requests_waiting", "requests_running"):
        assert sample(f"llmchat_provider_{key}", {"provider": "local"}) == last[key]


async def test_ask_takes_one_snapshot_beside_its_request(
    server_factory: Factory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    srv = server_factory(ttft_ms=800, max_concurrency=1)
    config = tmp_path / "config.toml"
    root = srv.base_url.removesuffix("/v1")
    config.write_text(f'[providers.local]\nbase_url = "{srv.base_url}"\nmodel = "{MODEL}"\n'
                      f'metrics_url = "{root}/metrics"\n', encoding="utf-8")
    settings = _metrics_settings(srv, tmp_path)
    async with ChatClient(settings, provider="local", use_cache=False) as client:
        background = [asyncio.create_task(_drain(client)) for _ in range(2)]
        watcher = await ServerSignals(settings, store=BaselineStore(tmp_path / "cs.json")).open()
        poller = watcher.follow(client)
        assert poller is not None
        deadline = time.monotonic() + WAIT_S
        while (poller.latest or {}).get("requests_waiting", 0) < 1:  # one running, one queued
            assert time.monotonic() < deadline, "the server never showed a queued request"
            await asyncio.sleep(0.01)
        await watcher.aclose()
        status = await asyncio.to_thread(main, ["--config", str(config), "ask", "hi", "--json",
                                                "--max-tokens", "3"])
        await asyncio.gather(*background)
    assert status == 0
    obj = json.loads(capsys.readouterr().out)
    metrics = obj["attribution"]["server_metrics"]
    assert metrics is not None and metrics["requests_waiting"] >= 1 and metrics["requests_running"] == 1
    assert "saturation" in obj["attribution"]["flags"]


async def test_a_metrics_url_that_fails_is_one_warning_and_never_a_failed_request(
    server_factory: Factory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    srv = server_factory()
    settings = _metrics_settings(srv, tmp_path)
    wrong = ProviderSettings(name="local", base_url=srv.base_url, model=MODEL, http={"http2": False},
                             metrics_url=srv.base_url + "/metrics", metrics_interval_s=0.02)
    settings = Settings(providers={"local": wrong}, cache=settings.cache)
    with caplog.at_level(logging.WARNING, logger="llmchat.metrics"):
        async with ChatClient(settings, provider="local", use_cache=False) as client:
            hud = Metrics()
            hud.subscribe(client.bus)
            signals = await ServerSignals(settings, store=BaselineStore(tmp_path / "cs.json")).open()
            poller = signals.follow(client)
            assert poller is not None
            records = [await _drain(client) for _ in range(3)]
            deadline = time.monotonic() + WAIT_S
            while poller.failures < 3:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            await signals.aclose()
    assert all(r.error is None and r.server_metrics is None for r in records)
    assert len(caplog.records) == 1 and "HTTP 404 for the metrics" in caplog.records[0].getMessage()
    state = hud.server_state("local")
    assert state is not None and state.metrics is None and "HTTP 404" in (state.error or "")


def test_bench_scrapes_the_metrics_url_into_its_table_its_json_and_each_request(
    server_factory: Factory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    srv = server_factory(ttft_ms=100, max_concurrency=1)
    root = srv.base_url.removesuffix("/v1")
    config = tmp_path / "config.toml"
    config.write_text(f'[providers.local]\nbase_url = "{srv.base_url}"\nmodel = "{MODEL}"\n'
                      f'metrics_url = "{root}/metrics"\nmetrics_interval_s = 0.05\n', encoding="utf-8")
    out_json = tmp_path / "bench.json"
    status = main(["--config", str(config), "bench", "--users", "3", "--requests", "6", "--max-tokens", "2",
                   "--quiet", "--json", str(out_json)])
    out = capsys.readouterr().out
    assert status == 0
    assert "server metrics, every 0.05 s" in out and "requests waiting" in out and f"{root}/metrics" in out
    # --json is JSON Lines: the run, a line per request, the summary last.
    *lines, data = [json.loads(line) for line in out_json.read_text().splitlines()]
    data["requests"] = [line for line in lines if line["type"] == "request"]
    assert data["server_metrics"] == {"url": f"{root}/metrics", "interval_s": 0.05}
    figures = data["configs"][0]["server_metrics"]
    assert figures["snapshots"] >= 1 and figures["requests_waiting"]["max"] >= 1
    assert figures["requests_running"]["max"] == 1
    carried = [r["attribution"] for r in data["requests"]]
    assert all(a["server_metrics"] is not None for a in carried)
    assert any("saturation" in a["flags"] and a["server_metrics"]["requests_waiting"] >= 1 for a in carried)


async def test_a_reported_model_load_reaches_prometheus(server_factory: Factory, tmp_path: Path) -> None:
    srv = server_factory(cold_start_ms=300, ttft_ms=10)
    settings = Settings(cache=CacheSettings(path=str(tmp_path / "cache")))
    client = ChatClient(settings, base_url=srv.base_url, model=MODEL, http2="h2c", use_cache=False)
    async with client:
        exported = ClientMetrics()
        exported.subscribe(client.bus)
        for _ in range(2):
            await _drain(client)
    sample = exported.registry.get_sample_value
    labels = {"provider": "custom", "model": MODEL, "mode": "stream"}
    assert sample("llmchat_request_flags_total", {"flag": "cold_start", **labels}) == 1.0
    part = {"part": "server_model_load", "group": "server", **labels}
    assert sample("llmchat_request_part_seconds_count", part) == 1.0
    assert 0.3 <= (sample("llmchat_request_part_seconds_sum", part) or 0.0) <= 0.3 + LATE_MS / 1000


def test_bench_shows_the_model_load_as_a_part_of_its_own(
    server_factory: Factory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    srv = server_factory(cold_start_ms=300, ttft_ms=10)
    out_json = tmp_path / "bench.json"
    status = main(["bench", "--base-url", srv.base_url, "--model", MODEL, "--users", "1", "--requests", "3",
                   "--max-tokens", "2", "--quiet", "--json", str(out_json)])
    out = capsys.readouterr().out
    assert status == 0
    # A row of the per-part table (p50/p90/p99 over the successful requests: the one that loaded is among
    # them), and the table's footnote says the server reported it.
    assert any(line.split()[:1] == ["server_model_load"] for line in out.splitlines())
    footnote = next(line for line in out.splitlines() if line.startswith("parts: "))
    assert "server_model_load" in footnote.split("(reported by the server)")[0]
    lines = [json.loads(line) for line in out_json.read_text().splitlines()]  # JSON Lines (README)
    first, *rest = [line for line in lines if line["type"] == "request"]
    parts = {p["key"]: p for p in first["attribution"]["parts"]}
    assert first["attribution"]["flags"] == ["cold_start"] and 300 <= parts["server_model_load"]["ms"]
    assert all(r["attribution"]["flags"] == [] for r in rest)
