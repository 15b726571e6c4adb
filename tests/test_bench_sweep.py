"""`llmchat bench --sweep`: each level of load in turn, the knee, the highest level meeting the SLO, the
saturation warning and the latency-against-throughput plot. One sweep against `llmchat serve --max-concurrency 8
--profile chat` on 127.0.0.1 (a few seconds); the rest is the rules on figures made here."""

from __future__ import annotations

import dataclasses
import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from llmchat.core.errors import UsageError
from llmchat.core.load._stats import SLO, summarize
from llmchat.core.load._sweep import (
    KNEE_GAIN,
    QUEUE_MS,
    SLO_SHARE,
    Level,
    Sweep,
    highest_meeting_slo,
    knee,
    should_stop,
)
from llmchat.core.server import RunningServer
from llmchat.tui.cli import main

Factory = Callable[..., RunningServer]
SVG = "{http://www.w3.org/2000/svg}"


def sweep_json(capsys: pytest.CaptureFixture[str], path: Path, *argv: str) -> tuple[dict[str, Any], str, str]:
    code = main(["bench", "--quiet", *argv, "--json", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["type"] == "bench" and lines[-1]["type"] == "summary"
    return lines[-1], out, err


def test_a_sweep_finds_the_knee_and_the_highest_rate_meeting_a_ttft_slo(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    server_factory: Factory,
) -> None:
    # 8 slots of ~300 ms each: about 26 requests/s at most, so 64/s queues whatever the machine's noise.
    srv = server_factory(profile="chat", max_concurrency=8)
    svg = tmp_path / "sweep.svg"
    summary, out, err = sweep_json(capsys, tmp_path / "sweep.json", "--base-url", srv.base_url,
                                   "--sweep", "rate:8,16,32,64", "--duration", "1", "--max-tokens", "2",
                                   "--slo-ttft-ms", "500", "--plot", str(svg))
    sweep = summary["sweep"]
    levels = sweep["levels"]
    assert [lv["level"] for lv in levels] == [8, 16, 32, 64]
    assert [c["config"] for c in summary["configs"]] == ["8/s", "16/s", "32/s", "64/s"]
    # The knee, recomputed from the levels' own figures: the step where requests/s stopped following the load
    # while TTFT p50 climbed. It exists (64/s is far past capacity) and is not the last level.
    rps = [lv["figures"]["requests_per_s"] for lv in levels]
    ttft = [lv["figures"]["latency_ms"]["ttft"]["p50"] for lv in levels]
    loads = [lv["level"] for lv in levels]
    steps = [i for i in range(1, 4) if (rps[i] / rps[i - 1] - 1) / (loads[i] / loads[i - 1] - 1) < KNEE_GAIN
             and ttft[i] >= 1.2 * ttft[i - 1]]
    assert steps, rps
    assert sweep["knee"] == loads[steps[0] - 1] < 64
    # Past the knee the server queues: its reported queue time says so, and the warning names the first level.
    assert levels[-1]["server_queue_p90_ms"] >= QUEUE_MS and levels[-1]["saturated"]
    first = next(lv for lv in levels if lv["saturated"])
    assert sweep["saturated_at"] == first["level"]
    assert f"the server saturated from {first['level']:g}/s" in err
    # The highest rate meeting the SLO: every level up to it has 95% of requests within 500 ms TTFT, the next
    # does not; 64/s, queueing for over a second, misses it.
    shares = [lv["slo_share"] for lv in levels]
    assert shares[-1] < SLO_SHARE
    best = sweep["highest_meeting_slo"]
    assert best is not None, shares
    i = loads.index(best)
    assert all(s >= SLO_SHARE for s in shares[:i + 1]) and shares[i + 1] < SLO_SHARE
    assert f"highest level meeting it {best:g}/s" in out and f"knee: {sweep['knee']:g}/s" in out
    # The plot: one point per level on each curve, the knee marked, the highest level meeting the SLO ringed.
    root = ET.fromstring(svg.read_text())
    assert len(root.findall(f"{SVG}polyline")) == 2
    circles = root.findall(f"{SVG}circle")
    assert len([c for c in circles if c.get("class") == "level"]) == 8
    assert [c.findtext(f"{SVG}title") for c in circles if c.get("class") == "slo"] == [
        f"highest level meeting the SLO: {best:g}/s"]
    assert any(t.text == f"knee {sweep['knee']:g}/s" for t in root.iter(f"{SVG}text"))


def test_an_automatic_sweep_doubles_the_users(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    local_server: RunningServer,
) -> None:
    summary, out, _ = sweep_json(capsys, tmp_path / "auto.json", "--base-url", local_server.base_url,
                                 "--sweep", "users:auto", "--users", "2", "--sweep-max", "3",
                                 "--requests", "6", "--max-tokens", "2")
    levels = summary["sweep"]["levels"]
    assert [lv["level"] for lv in levels] == [2, 4, 8][:len(levels)]
    assert all(lv["figures"]["requests"] == 6 for lv in levels)
    assert "2 users" in out


def _level(level: float, rps: float, ttft_p50: float, *, good: int = 10, requests: int = 10) -> Level:
    stats = summarize("base", [], 1_000_000_000, slo=SLO(ttft_ms=500.0))
    latency = {**stats.latency, "ttft": {**stats.latency["ttft"], "p50": ttft_p50}}
    stats = dataclasses.replace(stats, ok=requests, requests=requests, good=good, wall_s=requests / rps,
                                latency=latency)
    return Level(level, stats)


def test_the_knee_is_the_last_level_before_throughput_stops_following_the_load() -> None:
    levels = [_level(1, 1.0, 100), _level(2, 2.0, 105), _level(4, 3.9, 110), _level(8, 4.4, 300),
              _level(16, 4.5, 900)]
    assert knee(levels, "stream") == 2
    # Flat throughput with flat latency is no knee (the load only reached the server's own pace).
    assert knee([_level(1, 1.0, 100), _level(2, 1.1, 101)], "stream") is None
    assert knee(levels[:3], "stream") is None


def test_the_slo_level_is_the_highest_before_the_first_miss() -> None:
    levels = [_level(1, 1, 100, good=10), _level(2, 2, 100, good=10), _level(4, 4, 100, good=9),
              _level(8, 8, 100, good=10)]
    assert highest_meeting_slo(levels) == 1  # 90% at 4 misses 95%; 8 after a miss does not count
    assert highest_meeting_slo([_level(1, 1, 100, good=5)]) is None


def test_an_automatic_sweep_stops_past_the_knee_or_at_a_missed_slo() -> None:
    climbing = [_level(1, 1.0, 100), _level(2, 2.0, 100)]
    assert should_stop(climbing, "stream") is None
    assert should_stop([*climbing, _level(4, 2.1, 400)], "stream") == "throughput stopped growing (the knee)"
    assert should_stop([*climbing, _level(4, 4.0, 100, good=1)], "stream") == "the SLO was missed"


@pytest.mark.parametrize(("text", "says"), [
    ("load:1,2", "--sweep must be users:LIST"),
    ("users:1", "at least two levels"),
    ("rate:5,x", "not a comma-separated list"),
    ("rate:10,5", "positive and rising"),
    ("users:1,2.5", "whole numbers"),
])
def test_bad_sweeps_are_one_line_usage_errors(text: str, says: str) -> None:
    with pytest.raises(UsageError, match=says):
        Sweep.parse(text, users=None, rate=None)


def test_sweep_flags_that_conflict_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--sweep", "rate:1,2", "--users", "3"]) == 2
    assert "drop --users" in capsys.readouterr().err
    assert main(["bench", "--sweep", "users:1,2", "--compare", "h1,h2"]) == 2
    assert "drop --compare" in capsys.readouterr().err
