"""`llmchat bench --report out.html` and `--csv out.csv`: the run's files beside ``--json``.

Both paths are opened (emptied) before the first request, so one that cannot be written is one line naming the
flag, not a lost run. ``--csv`` is written as the run goes, a row per request (``RECORD_FIELDS``) through the
request log's writer thread (as ``--json``), never on the event loop; ``--report`` is written once, at the end,
from the figures and the bounded ``Timeline``. Both are written on Ctrl-C too, with what was measured.
"""

from __future__ import annotations

import csv
import datetime
import io
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from llmchat.core import __version__, mask_url
from llmchat.core.client import endpoint_from_settings
from llmchat.core.config import HttpSettings, LogSettings
from llmchat.core.errors import LLMChatError, UsageError
from llmchat.core.load import (
    CONFIGS,
    RECORD_FIELDS,
    ConfigStats,
    LoadRun,
    Sample,
    SweepResult,
    Timeline,
    record_row,
)
from llmchat.core.observe import RequestLog
from llmchat.tui.commands import _bench_html as page
from llmchat.tui.commands import _bench_report as report
from llmchat.tui.commands import _bench_sweep as sweep_report


def _empty(path: str, flag: str) -> str:
    """``path`` expanded and emptied; UsageError naming ``flag`` when it cannot be written."""
    full = str(Path(path).expanduser())
    try:
        Path(full).write_bytes(b"")
    except OSError as exc:
        raise UsageError(f"{flag}: cannot write {path} ({exc.strerror or exc}); check the folder exists and is "
                         "writable") from None
    return full


class ReportFiles:
    """The run's ``--report`` and ``--csv`` (either may be None): ``start`` as each run's clients are ready
    (the first sets the time origin), ``request`` per finished request, ``finish`` or ``finish_sweep`` at the
    end (also after a Ctrl-C), ``close`` last."""

    CLOSE_S = 60.0
    """How long closing waits for the CSV writer to catch up (as ``ResultFile.CLOSE_S``)."""

    def __init__(self, report_path: str | None, csv_path: str | None, *, seed: int = 0) -> None:
        self.report_path = _empty(report_path, "--report") if report_path else None
        self.csv_path = _empty(csv_path, "--csv") if csv_path else None
        # The rows go out on the request log's writer thread, as --json's lines do.
        self._csv = RequestLog(LogSettings(requests_path=self.csv_path)) if self.csv_path else None
        self._buffer = io.StringIO()
        self._writer = csv.DictWriter(self._buffer, RECORD_FIELDS, lineterminator="\n")
        self.rows = 0
        self._row(dict(zip(RECORD_FIELDS, RECORD_FIELDS, strict=True)))  # the header
        self.origin_ns = time.perf_counter_ns()
        self.timeline = Timeline(self.origin_ns, seed=seed)
        self.run: LoadRun | None = None
        self.pools: list[int] = []

    def start(self, run: LoadRun) -> None:
        if self.run is None:
            self.run = run
            self.origin_ns = self.timeline.origin_ns = time.perf_counter_ns()
        self.pools.extend(n for name, n in run.pool_sizes.items() if "nopool" not in name.split("+"))

    def request(self, sample: Sample) -> None:
        if self.report_path:
            self.timeline.add(sample)
        if self._csv is not None:
            self._row(record_row(sample, self.origin_ns))
            self.rows += 1

    def _row(self, row: dict[str, object]) -> None:
        if self._csv is not None:
            self._writer.writerow(row)
            self._csv.put(self._buffer.getvalue())
            self._buffer.seek(0)
            self._buffer.truncate()

    def finish(self, load: LoadRun, stats: Sequence[ConfigStats], interrupted: bool) -> None:
        if not self.report_path:
            return
        server = None
        if load.metrics_url:
            server = (load.server_snapshots, mask_url(load.metrics_url), load.metrics_interval_s)
        warning = report.schedule_warning(stats, cap=load.scenario.max_in_flight, cap_hits=load.cap_hits)
        self._write(page.Page(title=self._title(load), settings=self.settings(load, None), stats=stats,
                              mode=load.scenario.mode, timeline=self.timeline, server=server,
                              warnings=[warning] if warning else [], made=self._made(),
                              interrupted=interrupted))

    def finish_sweep(self, result: SweepResult, interrupted: bool) -> None:
        if not self.report_path:
            return
        stats = [lv.stats for lv in result.levels]
        warnings = [w for w in (sweep_report.saturation_warning(result),) if w]
        load = self.run
        self._write(page.Page(title=self._title(load), settings=self.settings(load, result), stats=stats,
                              mode=result.mode, timeline=self.timeline, sweep=result, warnings=warnings,
                              made=self._made(), interrupted=interrupted))

    def _write(self, report_page: page.Page) -> None:
        assert self.report_path is not None
        try:
            Path(self.report_path).write_text(page.render(report_page), encoding="utf-8")
        except OSError as exc:  # writable when the run began: say so, and keep the figures the run printed
            print(f"llmchat: --report: cannot write {self.report_path} ({exc.strerror or exc}); the figures "
                  "are in the output above", file=sys.stderr)

    @staticmethod
    def _made() -> str:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"llmchat bench {__version__}, {now}"

    @staticmethod
    def _title(load: LoadRun | None) -> str:
        if load is None or not load.base_url:
            return "llmchat bench report"
        return f"llmchat bench: {load.model} at {mask_url(load.base_url)}"

    def settings(self, load: LoadRun | None, sweep: SweepResult | None) -> list[tuple[str, str]]:
        """The configuration rows: the target (masked), the scenario field by field, the sweep, the SLO, the
        configurations and the client settings that shape the figures. Named fields only: a key never."""
        if load is None:
            return [("target", "not reached: the run stopped before its clients were ready")]
        t = load.target
        rows = [("target", mask_url(load.base_url)), ("model", load.model)]
        try:
            endpoint, _ = endpoint_from_settings(t.settings, t.provider, base_url=t.base_url,
                                                 api_key_env=t.api_key_env, http2=t.http2)
            http: HttpSettings = endpoint.http
            rows.append(("API key", endpoint.api_key_source))
        except LLMChatError:
            http = t.settings.http
        rows += [(f"scenario.{k}", _value(v)) for k, v in load.scenario.to_json().items()
                 if not (sweep is not None and k in ("users", "rate"))]
        if sweep is not None:
            s = sweep.sweep
            rows.append(("sweep", f"{s.axis}: " + (f"auto, doubling from {s.start:g}, at most {s.max_levels} "
                                                  "levels" if s.auto else ", ".join(f"{v:g}" for v in s.levels))))
        slo = load.tallies[load.configs[0]].slo if load.configs else None
        rows.append(("SLO", slo.describe() if slo is not None and slo.given else "none given"))
        for name in load.configs:
            what = " + ".join(CONFIGS.get(part, part) for part in name.split("+"))
            rows.append((f"configuration {name}", what))
        pools = sorted(set(self.pools))
        rows.append(("pool size", "/".join(map(str, pools)) + " connections" +
                     (" (--max-connections)" if t.max_connections is not None else "") if pools else "-"))
        rows += [
            ("http.http2", _value(http.http2)),
            ("http timeouts s", f"connect {http.connect_timeout_s:g}, read {http.read_timeout_s:g}, write "
                                f"{http.write_timeout_s:g}, pool {http.pool_timeout_s:g}"),
            ("http.keepalive_expiry_s", _value(http.keepalive_expiry_s)),
            ("http.max_requests_per_connection", _value(http.max_requests_per_connection)),
            ("retry.max_attempts", _value(t.settings.retry.max_attempts)),
            ("cache.policy", _value(t.settings.cache.policy)),
            ("client rate limiter", "on (--rate-limit-client)" if t.limits is not None else "off"),
        ]
        if load.metrics_url:
            rows.append(("server metrics", f"{mask_url(load.metrics_url)} every {load.metrics_interval_s:g} s"))
        return rows

    def close(self) -> None:
        """Write the CSV rows still queued (blocks until then: call it after the loop ended)."""
        if self._csv is not None:
            self._csv.flush(self.CLOSE_S)
            self._csv.close()
            if self._csv.dropped:
                print(f"llmchat: --csv: {self._csv.dropped} rows could not be written to {self.csv_path}; the "
                      "file is incomplete", file=sys.stderr)


def _value(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)
