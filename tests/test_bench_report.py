"""`llmchat bench --report out.html` and `--csv out.csv`: each file checked against the same run's --json.

The HTML is parsed with the standard library's html.parser: its tables must hold the summary's numbers, its
charts must be inline SVG, nothing may load from the network, and a key given in the config never shows. The
CSV, read with csv.DictReader, must have one row per request line of the JSON, with its values. One run of a
few requests against the local server per test (instant profile), and one Ctrl-C in a child process.
"""

from __future__ import annotations

import csv
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from llmchat.core.load import RECORD_FIELDS
from llmchat.core.server import RunningServer, resolve_settings, start_in_thread
from llmchat.tui.cli import main

KEY = "sk-report-SECRET-4b1e8d2a"
QUANTILES = ("p50", "p90", "p99")
LABELS = {"TTFB ms": "ttfb", "TTFT ms": "ttft", "ITL ms": "itl", "TPOT ms": "tpot", "end-to-end ms": "e2e"}


class Page(HTMLParser):
    """The tables (by class: rows of cell texts), every tag's attributes, and the SVG elements by tag."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.attrs: list[tuple[str, str, str]] = []
        self.svg: dict[str, int] = {}
        self._table: list[list[str]] | None = None
        self._cell: list[str] | None = None
        self._in_svg = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.attrs.extend((tag, k, v or "") for k, v in attrs)
        if tag == "svg":
            self._in_svg += 1
        if self._in_svg:
            self.svg[tag] = self.svg.get(tag, 0) + 1
        if tag == "table":
            self._table = self.tables.setdefault(a.get("class") or "", [])
        elif tag == "tr" and self._table is not None:
            self._table.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._in_svg -= 1
        elif tag == "table":
            self._table = None
        elif tag in ("td", "th") and self._cell is not None and self._table is not None:
            self._table[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    return page


def shows(cell: str, value: float | None) -> bool:
    """Whether a table cell shows ``value`` at the cell's own precision ("-" for none)."""
    if value is None:
        return cell == "-"
    decimals = len(cell.split(".")[1]) if "." in cell else 0
    return abs(float(cell) - value) <= 0.5 * 10.0**-decimals + 0.0011


def json_lines(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[-1]["type"] == "summary"
    return [r for r in lines if r["type"] == "request"], lines[-1]


def check_figures(page: Page, configs: list[dict[str, Any]]) -> None:
    """The figures table: a column per configuration, each latency cell the summary's percentile, and the
    requests, requests/s and errors of the summary."""
    rows = page.tables["figures"]
    names = rows[0][2:]
    assert names == [c["config"] for c in configs]
    checked = 0
    metric = ""
    for row in rows[1:]:
        if row[0] in LABELS:
            metric = LABELS[row[0]]
        elif row[0]:
            metric = ""
        if metric and row[1] in QUANTILES:
            for cell, c in zip(row[2:], configs, strict=True):
                assert shows(cell, c["latency_ms"][metric][row[1]]), (metric, row[1], cell, c["latency_ms"])
                checked += 1
        if row[0] == "requests":
            assert row[2:] == [str(c["requests"]) for c in configs]
        if row[0] == "requests/s":
            # The summary's own rate: ok / wall_s from a wall time rounded to 1 us is off by more than a cell's
            # precision when a run takes a few milliseconds.
            assert all(shows(cell, c["requests_per_s"]) for cell, c in zip(row[2:], configs, strict=True)), (
                row, [c["requests_per_s"] for c in configs])
        if row[0] == "server/net errors":
            assert [cell.split()[0] for cell in row[2:]] == [str(c["server_failed"]) for c in configs]
    assert checked >= 5 * 3 * len(configs)  # TTFB, TTFT, ITL, TPOT, end-to-end: p50, p90, p99 each


def check_self_contained(page: Page, text: str) -> None:
    assert page.svg.get("svg", 0) >= 3
    linked = [(tag, k, v) for tag, k, v in page.attrs if k in ("src", "href", "xlink:href")]
    assert not [x for x in linked if re.match(r"\s*(https?:)?//", x[2])], linked
    assert not any(tag in ("script", "link", "img", "iframe") for tag, _, _ in page.attrs)
    assert "<script" not in text.lower()


@pytest.fixture(scope="module")
def keyed_server() -> Iterator[RunningServer]:
    with start_in_thread(resolve_settings({"port": 0, "profile": "instant", "api_key": KEY})) as server:
        yield server


def test_report_and_csv_hold_the_runs_figures_and_never_the_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, keyed_server: RunningServer
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'[providers.local]\nbase_url = "{keyed_server.base_url}"\napi_key = "{KEY}"\n',
                      encoding="utf-8")
    html, table, results = tmp_path / "r.html", tmp_path / "r.csv", tmp_path / "r.json"
    code = main(["bench", "--quiet", "--config", str(config), "--provider", "local", "--compare", "h2,h1",
                 "--users", "2", "--requests", "6", "--slices", "2", "--max-tokens", "4",
                 "--report", str(html), "--csv", str(table), "--json", str(results)])
    out, err = capsys.readouterr()
    assert code == 0, err
    requests, summary = json_lines(results)
    assert summary["configs"][0]["ok"] == 6  # the key went out: the server answers 401 without it
    text = html.read_text(encoding="utf-8")
    page = parse(html)
    check_figures(page, summary["configs"])
    check_self_contained(page, text)
    # The charts: the percentile bars, the attribution shares, the time series (a mark per request).
    assert page.svg.get("rect", 0) >= 12 and page.svg.get("polyline", 0) >= 1
    assert {"figures", "attribution", "compare", "settings"} <= set(page.tables)
    assert len(re.findall(r"M[\d.]+ [\d.]+h0", text)) >= 2 * len(requests)  # TTFT and end-to-end each
    settings = dict(row for row in page.tables["settings"][1:])
    assert settings["target"] == keyed_server.base_url and "config" in settings["API key"]
    # The CSV: one row per request, in the JSON's order, with its values.
    with table.open(newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == RECORD_FIELDS
        rows = list(reader)
    assert [r["request_id"] for r in rows] == [r["request_id"] for r in requests] and len(rows) == 12
    for row, req in zip(rows, requests, strict=True):
        assert (row["config"], int(row["slice"]), int(row["index"])) == (req["config"], req["slice"], req["index"])
        for column, key in (("ttfb_ms", "ttfb_ms"), ("ttft_ms", "ttft_ms"), ("e2e_ms", "total_ms"),
                            ("tpot_ms", "tpot_ms"), ("itl_ms_p50", "itl_ms_p50"), ("pool_wait_ms", "pool_wait_ms")):
            assert (None if row[column] == "" else float(row[column])) == req[key], column
        assert int(row["output_tokens"]) == req["output_tokens"] and int(row["status"]) == req["status"] == 200
        assert row["error_kind"] == "" and int(row["retries"]) == req["retries"]
        assert row["cache_hit"] == str(req["cache_hit"]) and row["http_version"] == req["http_version"]
        gaps = req["itl_ms"]
        assert abs(float(row["itl_mean_ms"]) - sum(gaps) / len(gaps)) < 0.002 if gaps else row["itl_mean_ms"] == ""
        assert float(row["start_s"]) >= 0 and row["scheduled_s"] == ""  # a closed loop has no schedule
    for where in (text, table.read_text(), results.read_text(), out, err):
        assert KEY not in where


def test_a_sweeps_report_has_the_curve_with_its_slo_level_and_a_table_per_level(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, local_server: RunningServer
) -> None:
    html, results = tmp_path / "s.html", tmp_path / "s.json"
    code = main(["bench", "--quiet", "--base-url", local_server.base_url, "--sweep", "users:1,2",
                 "--requests", "4", "--max-tokens", "2", "--slo-e2e-ms", "10000", "--report", str(html),
                 "--json", str(results)])
    _, err = capsys.readouterr()
    assert code == 0, err
    _, summary = json_lines(results)
    page = parse(html)
    check_figures(page, summary["configs"])
    check_self_contained(page, html.read_text(encoding="utf-8"))
    levels = page.tables["sweep"][1:]
    assert [r[0].split(" knee")[0].rstrip(" *") for r in levels] == ["1 users", "2 users"]
    best = summary["sweep"]["highest_meeting_slo"]
    assert best == 2 and levels[1][0].endswith("*")  # every request met a 10 s objective
    text = html.read_text(encoding="utf-8")
    assert text.count('class="curve"') == 2 and text.count('class="level"') == 4
    assert 'class="slo"' in text and "SLO met up to 2 users" in text


def test_ctrl_c_writes_both_files_with_what_was_measured(
    tmp_path: Path, server_factory: Any, sigint_inheritable: None
) -> None:
    slow = server_factory(profile="instant", ttft_ms=10.0, tokens_per_s=100.0)  # ~50 ms a request
    html, table, results = tmp_path / "i.html", tmp_path / "i.csv", tmp_path / "i.json"
    child = subprocess.Popen(
        [sys.executable, "-m", "llmchat.tui", "bench", "--quiet", "--base-url", slow.base_url, "--users", "2",
         "--requests", "1000", "--max-tokens", "4", "--report", str(html), "--csv", str(table),
         "--json", str(results)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not (table.exists() and table.read_bytes().count(b"\n") >= 3):  # the header and 2 requests
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "no CSV rows in time"
            time.sleep(0.02)
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 130, stderr
    assert "Traceback" not in stderr
    requests, summary = json_lines(results)
    assert summary["interrupted"] and 2 <= len(requests) < 1000
    with table.open(newline="") as f:
        assert [r["request_id"] for r in csv.DictReader(f)] == [r["request_id"] for r in requests]
    page = parse(html)
    assert "interrupted" in html.read_text(encoding="utf-8")
    check_figures(page, summary["configs"])
