"""`llmchat bench`: a load test through the engine, one or several client configurations side by side.

Closed loop (``--users N``) or open loop (``--rate R``, Poisson arrivals), for ``--requests`` or
``--duration`` per configuration. ``--compare h2,h1,nopool`` runs the same scenario under each configuration
in interleaved slices and prints a before/after table against the first. Figures go to stdout, the live
progress line to stderr (on a terminal only). ``--json PATH`` is written as the run goes (JSON Lines: the
run, then one line per request as it finishes, then the summary; see ``ResultFile``), so nothing of a request
stays in memory for it. Exit status 0 when the run finished (failed requests are figures, not failures), 1
when every request failed, 2 for a bad flag, 130 on Ctrl-C (after printing what was measured).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import sys
import time
from collections import deque
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TextIO, TypeVar

from llmchat.core import BaselineStore, Bus, ColdStartDetector, __version__, load_settings, mask_url
from llmchat.core.client import summarize_snapshots
from llmchat.core.config import LogSettings
from llmchat.core.errors import UsageError
from llmchat.core.load import (
    CLIENT_ERRORS,
    CONFIGS,
    MAX_IN_FLIGHT,
    MAX_LEVELS,
    SLO,
    ConfigStats,
    Level,
    LoadRun,
    Sample,
    Scenario,
    Sweep,
    SweepResult,
    Target,
    choose_workers,
    compare_rows,
    make_run,
    parse_configs,
    run_sweep,
    workers_runner,
)
from llmchat.core.observe import RequestLog, attach_observers, percentile, start_exporter
from llmchat.core.policy import RateLimits
from llmchat.tui.commands import _bench_dataset as dataset_report
from llmchat.tui.commands import _bench_report as report
from llmchat.tui.commands import _bench_sweep as sweep_report
from llmchat.tui.commands import _options
from llmchat.tui.commands._bench_files import ReportFiles
from llmchat.tui.commands._provider import offline_default

T = TypeVar("T")

_EPILOG = "configurations for --compare (join with + to combine, e.g. h1+noretry):\n" + "\n".join(
    f"  {name:<8} {text}" for name, text in CONFIGS.items()
) + (
    "\n\nMetrics follow the engine's definitions (README: What the numbers mean): latency percentiles cover"
    "\nsuccessful requests; ITL pools every chunk gap (vLLM); requests/s and output tokens/s count successful"
    "\nrequests over the wall time; goodput counts those that met every --slo-* given (vLLM's goodput)."
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "bench",
        help="load-test a provider: latency percentiles, errors, throughput; compare client setups",
        description="Send a synthetic load through llmchat's engine and report TTFB, TTFT, ITL, TPOT and "
        "end-to-end percentiles, errors by class, requests/s, output tokens/s and goodput.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    a = p.add_argument
    loop = p.add_mutually_exclusive_group()
    loop.add_argument("--users", type=int, metavar="N",
                      help="closed loop: N users, each sending a request as soon as its last one ends "
                      "(default 10)")
    loop.add_argument("--rate", type=float, metavar="R", help="open loop: Poisson arrivals at R requests/s")
    a("--requests", type=int, metavar="N", help="requests per configuration (default 100 without --duration)")
    a("--duration", type=float, metavar="S", help="seconds per configuration in which requests start")
    a("--ramp-s", type=float, default=0.0, metavar="S", help="closed loop: spread the users' starts over S s")
    a("--mode", choices=("stream", "batch"), default="stream", help="stream replies (default) or whole ones")
    a("--max-tokens", type=int, default=64, metavar="N", help="max_tokens of every request (default 64)")
    a("--long-ratio", type=float, default=0.0, metavar="P",
      help="share of prompts over 1,000 tokens (default 0)")
    a("--prompts", type=int, default=0, metavar="N",
      help="draw prompts from N distinct ones, so some repeat (default: a new one per request)")
    a("--dataset", metavar="FILE", help="send the prompts of FILE: ShareGPT JSON (a list of {\"conversations\": "
      "[{\"from\": \"human\", \"value\": ...}]} or {\"messages\": [...]}) or JSON Lines (a string, "
      "{\"prompt\": ...} or {\"messages\": [...]} a line)")
    a("--turns", choices=("first", "all"), default="first", help="with --dataset: each conversation's first "
      "human turn (default), or all of them in order with this run's replies as history (TTFT by turn)")
    a("--prefix-share", type=_options.number(0, 1), default=0.0, metavar="P",
      help="put a shared system-prompt prefix of P x each prompt's words before every prompt (0 to 1)")
    a("--chunk-usage", action="store_true", help="ask for usage on every chunk (vLLM's continuous_usage_stats) "
      "so ITL per token uses the server's tokens per chunk; off by default, as strict servers refuse it")
    a("--temperature", type=_options.number(0, 2), help="sent with every request, 0 to 2 (0 makes batch replies "
      "cacheable)")
    a("--seed", type=int, default=0, help="seed of the prompts, the arrivals and the slice order (default 0)")
    a("--compare", metavar="LIST", help="configurations to run side by side, e.g. h2,h1,nopool (see below)")
    a("--slices", type=int, metavar="N",
      help="interleaved slices per configuration (default 5 with --compare)")
    a("--sweep", metavar="SPEC", help="run each level of load in turn: users:1,2,4,8 or rate:5,10,20, or "
      "users:auto / rate:auto (doubling from --users / --rate until the knee, the SLO missed, 5%% server "
      "errors or --sweep-max levels); prints a row per level, the knee and the highest level meeting --slo-*")
    a("--sweep-max", type=int, default=MAX_LEVELS, metavar="N",
      help=f"most levels of an automatic sweep (default {MAX_LEVELS})")
    a("--slo-ttft-ms", type=float, metavar="MS", help="goodput counts requests with TTFT at most this")
    a("--slo-e2e-ms", type=float, metavar="MS", help="goodput counts requests with end-to-end at most this")
    a("--json", metavar="PATH", help="write every request's timing record to PATH as it finishes, and every "
      "figure at the end (JSON Lines: the run, the requests, the summary last)")
    a("--report", metavar="HTML", help="write the run as one self-contained HTML page: configuration, tables, "
      "sweep curve, where the time went, and TTFT, end-to-end and requests in flight over the run")
    a("--csv", metavar="PATH", help="write one row per request as it finishes (CSV with a header row)")
    a("--plot", nargs="?", const="-", metavar="SVG",
      help="draw p50/p90/p99 per configuration in the terminal, or write them to SVG")
    a("--max-in-flight", type=int, metavar="N",
      help=f"open loop: at most N requests in flight, later arrivals wait (default {MAX_IN_FLIGHT})")
    a("--max-connections", type=int, metavar="N",
      help="pool size of every configuration (default: one connection per user, or the open loop's in-flight "
      "cap); nopool has no limit")
    a("--rate-limit-client", action="store_true",
      help="hold requests back in the client before the provider's rate limit (providers.NAME.rate_limit_rpm, "
      "_tpm, and the x-ratelimit-* headers), as llmchat batch and the app do; off by default, since a load "
      "test may want to hit the limit")
    a("--workers", type=int, metavar="N",
      help="split the load over N processes, each with its own pool, merging every request into one result "
      "(default: the cores, capped by the load; 1 is one process)")
    a("--quiet", action="store_true", help="no progress line")
    _options.add(p, "endpoint", "metrics", help={"--metrics-port": "serve the run's Prometheus metrics at "
                 "http://127.0.0.1:PORT/metrics while it runs; 0 takes a free port (needs the metrics extra)"})
    p.set_defaults(func=run)


def scenario_from_args(args: argparse.Namespace) -> Scenario:
    """The Scenario the flags describe, validated (UsageError naming the flag)."""
    requests = args.requests
    if requests is None and args.duration is None:
        requests = 100
    slices = args.slices if args.slices is not None else (5 if args.compare else 1)
    scenario = Scenario(
        mode=args.mode, users=10 if args.users is None else args.users, rate=args.rate or 0.0,
        requests=requests, duration_s=args.duration, ramp_s=args.ramp_s, long_ratio=args.long_ratio,
        distinct_prompts=args.prompts, max_tokens=args.max_tokens, temperature=args.temperature,
        seed=args.seed, model=args.model, slices=slices,
        max_in_flight=MAX_IN_FLIGHT if args.max_in_flight is None else args.max_in_flight,
        dataset=args.dataset, turns=args.turns, prefix_share=args.prefix_share, chunk_usage=args.chunk_usage,
    )
    if args.rate is not None and not args.rate > 0:
        raise UsageError(f"--rate must be a positive number of requests per second, got {args.rate:g}")
    scenario.validate()
    return scenario


def sweep_from_args(args: argparse.Namespace) -> Sweep | None:
    """The sweep ``--sweep`` describes, or None; UsageError for a bad one or one beside --compare."""
    if not args.sweep:
        return None
    if args.compare:
        raise UsageError("--sweep varies the load under one configuration; drop --compare (or run a sweep "
                         "per configuration)")
    return Sweep.parse(args.sweep, users=args.users, rate=args.rate, max_levels=args.sweep_max)


def _report_sweep(args: argparse.Namespace, result: SweepResult, interrupted: bool) -> int:
    """Print a sweep's figures, its plot when asked, and its warnings; the exit status."""
    s = result.sweep
    axis = "closed loop, users" if s.axis == "users" else "open loop, Poisson arrivals at requests/s"
    levels = f"doubling from {s.start:g}" if s.auto else ", ".join(f"{v:g}" for v in s.levels)
    title = f"llmchat bench --sweep: {axis} {levels}, {result.mode} mode, max_tokens {args.max_tokens}"
    print(title + ("  (interrupted: partial figures)" if interrupted else ""))
    print()
    if result.levels:
        print(sweep_report.sweep_table(result))
        print()
    for line in sweep_report.sweep_summary(result):
        print(line)
    if result.levels and args.plot == "-":
        print()
        print(sweep_report.terminal_curve(result, width=shutil.get_terminal_size().columns,
                                          colour=sys.stdout.isatty()))
    elif result.levels and args.plot:
        _write(args.plot, sweep_report.svg_curve(result, title=title), "--plot")
    sys.stdout.flush()
    warning = sweep_report.saturation_warning(result)
    if warning:
        print(warning, file=sys.stderr)
    lagging = report.schedule_warning([lv.stats for lv in result.levels], cap=args.max_in_flight or
                                      MAX_IN_FLIGHT, cap_hits=0)
    if lagging:
        print(lagging, file=sys.stderr)
    done = sum(lv.stats.requests for lv in result.levels)
    if interrupted:
        print(f"llmchat: interrupted after {len(result.levels)} complete levels; the figures above cover "
              "those", file=sys.stderr)
        return 130
    if done and all(lv.stats.ok == 0 for lv in result.levels):
        print("llmchat: every request failed at every level", file=sys.stderr)
        return 1
    return 0


def slo_from_args(args: argparse.Namespace) -> SLO:
    """The SLOs given; UsageError for a non-positive one or a TTFT objective in batch mode (no TTFT there)."""
    for flag, v in (("--slo-ttft-ms", args.slo_ttft_ms), ("--slo-e2e-ms", args.slo_e2e_ms)):
        if v is not None and not v > 0:
            raise UsageError(f"{flag} must be a positive number of milliseconds, got {v:g}")
    if args.slo_ttft_ms is not None and args.mode != "stream":
        raise UsageError("--slo-ttft-ms needs --mode stream: batch replies have no time to first token; "
                         "use --slo-e2e-ms")
    return SLO(ttft_ms=args.slo_ttft_ms, e2e_ms=args.slo_e2e_ms)


def run(args: argparse.Namespace) -> int:
    scenario = scenario_from_args(args)
    slo = slo_from_args(args)
    if args.max_connections is not None and args.max_connections < 1:
        raise UsageError(f"--max-connections must be at least 1, got {args.max_connections}")
    configs = parse_configs(args.compare) if args.compare else ["base"]
    sweep = sweep_from_args(args)
    workers = 1 if sweep else choose_workers(scenario, args.workers, rate_limited=args.rate_limit_client)
    if sweep and args.workers is not None:  # refused once, not at a level
        choose_workers(scenario, args.workers, fit=True, rate_limited=args.rate_limit_client)
    settings = load_settings(args.config)
    progress = Progress(scenario, configs, enabled=not args.quiet and sys.stderr.isatty(),
                        levels=0 if sweep is None else sweep.count)
    interrupted = False
    # Cold-start baselines of earlier runs, read before the run and saved after it (never on the loop).
    store = BaselineStore()
    baselines = store.load()
    detector = ColdStartDetector()
    detector.seed(baselines)
    # One bus for every configuration when something watches: the exporter, the request log, or both.
    bus = Bus() if args.metrics_port is not None or settings.log.requests_path else None
    with contextlib.ExitStack() as stack:
        # Opened (emptied) before anything else: a path that cannot be written is one line, not a lost run.
        results = stack.enter_context(contextlib.closing(ResultFile(args.json))) if args.json else None
        files = (stack.enter_context(contextlib.closing(ReportFiles(args.report, args.csv, seed=args.seed)))
                 if args.report or args.csv else None)
        if bus is not None:
            stack.enter_context(contextlib.closing(attach_observers(bus, settings, baselines=baselines)))
        if bus is not None and args.metrics_port is not None:
            exporter = stack.enter_context(start_exporter(bus, args.metrics_port))
            exporter.metrics.detector.seed(baselines)
            print(f"llmchat: metrics on {exporter.url}", file=sys.stderr)
        url, http2, model = stack.enter_context(
            offline_default(settings, args.provider, args.base_url, quiet=args.quiet))
        target = Target(settings=settings, provider=args.provider, base_url=url, http2=http2,
                        model=args.model or model, max_connections=args.max_connections, bus=bus,
                        api_key_env=args.api_key_env,
                        limits=RateLimits.from_settings(settings.providers) if args.rate_limit_client else None)
        warning = pool_warning(scenario, configs, args.max_connections)
        if warning:
            print(warning, file=sys.stderr)

        def on_sample(sample: Sample) -> None:
            progress.sample(sample)
            if results is not None:
                results.request(sample)
            if files is not None:
                files.request(sample)

        def on_start(run: LoadRun) -> None:
            if results is not None:
                results.start(run)
            if files is not None:
                files.start(run)

        if sweep is not None:
            levels: list[Level] = []
            result = SweepResult(sweep, scenario.mode, levels)

            def on_level(level: float, run: LoadRun) -> None:
                progress.slice(0, sweep.label(level))
                on_start(run)

            try:
                result = asyncio.run(_drive(run_sweep(scenario, sweep, target, slo=slo, detector=detector,
                                                      on_sample=on_sample, on_level=on_level, levels=levels,
                                                      runner=workers_runner(args.workers)),
                                            progress))
            except KeyboardInterrupt:
                interrupted = True
            store.save(detector.baselines())
            if results is not None:
                results.finish_sweep(result, interrupted)
            if files is not None:
                files.finish_sweep(result, interrupted)
        else:
            load = make_run(scenario, configs, target, workers=workers, slo=slo, detector=detector,
                            on_sample=on_sample, on_slice=progress.slice, on_start=on_start)
            try:
                asyncio.run(_drive(load.run(), progress))
            except KeyboardInterrupt:
                interrupted = True
            store.save(detector.baselines())
            stats = [load.tallies[name].stats(load.walls_ns[name]) for name in configs]
            if results is not None:
                results.finish(load, stats, interrupted)
            if files is not None:
                files.finish(load, stats, interrupted)
    if sweep is not None:
        return _report_sweep(args, result, interrupted)
    print(header(load, scenario, interrupted))
    prompts = dataset_report.prompts_line(scenario)
    if prompts:
        print(prompts)
    print()
    print(report.figures_table(stats, mode=scenario.mode))
    for table in (dataset_report.tokens_table(stats, mode=scenario.mode), dataset_report.turns_table(stats)):
        if table:
            print()
            print(table)
    where = report.attribution_table(stats)
    if where:
        print()
        print(where)
    scheduled = report.schedule_table(stats)
    if scheduled:
        print()
        print(scheduled)
    if load.metrics_url:
        print()
        url = mask_url(load.metrics_url)
        print(report.server_table(load.server_snapshots, url, load.metrics_interval_s))
    if len(stats) > 1:
        print()
        print(report.compare_table(stats))
    if args.plot == "-":
        print()
        print(report.terminal_chart(stats, mode=scenario.mode, width=shutil.get_terminal_size().columns,
                                    colour=sys.stdout.isatty()))
    elif args.plot:
        _write(args.plot, report.svg_chart(stats, mode=scenario.mode, title=_title(load, scenario)), "--plot")
    sys.stdout.flush()
    if results is not None and results.dropped:
        print(f"llmchat: --json: {results.dropped} lines could not be written to {args.json}; the file is "
              "incomplete", file=sys.stderr)
    lagging = report.schedule_warning(stats, cap=scenario.max_in_flight, cap_hits=load.cap_hits)
    if lagging:
        print(lagging, file=sys.stderr)
    elif load.cap_hits:
        print(f"llmchat: the open loop reached its cap of {scenario.max_in_flight} requests in flight "
              f"{load.cap_hits} times, so those arrivals went out late (lag_ms in --json); lower --rate",
              file=sys.stderr)
    if interrupted:
        print(f"llmchat: interrupted after {load.done} requests; the figures above cover those",
              file=sys.stderr)
        return 130
    if load.done and load.failed == load.done:
        print(f"llmchat: every request failed; the first: {load.first_error}", file=sys.stderr)
        return 1
    return 0


def pool_warning(scenario: Scenario, configs: list[str], max_connections: int | None) -> str | None:
    """The line said before the run when ``--max-connections`` leaves a pool smaller than the load, so that
    requests will queue in the client; None when it does not (or only nopool runs, which has no limit)."""
    if max_connections is None or max_connections >= scenario.concurrency:
        return None
    if all("nopool" in name.split("+") for name in configs):
        return None
    load = (f"open loop's cap of {scenario.max_in_flight} requests in flight" if scenario.open_loop
            else f"{scenario.users} users")
    return (f"llmchat: --max-connections {max_connections} is fewer than the {load}: requests will queue "
            "for a free connection (HTTP/1.1; HTTP/2 multiplexes on one), and that pool wait, and any "
            "timeout_pool, is the client's own, not the server's; leave --max-connections out to size the "
            "pool for the load")


async def _drive(work: Awaitable[T], progress: Progress) -> T:
    ticker = asyncio.create_task(progress.tick()) if progress.enabled else None
    try:
        return await work
    finally:
        if ticker is not None:
            ticker.cancel()
        progress.close()


def _title(load: LoadRun, scenario: Scenario) -> str:
    loop = f"{scenario.rate:g} req/s open loop" if scenario.open_loop else f"{scenario.users} users"
    return f"llmchat bench: {loop}, {scenario.mode}, {load.model} at {mask_url(load.base_url)}"


def header(load: LoadRun, scenario: Scenario, interrupted: bool) -> str:
    """Two lines: the scenario and the target."""
    if scenario.open_loop:
        loop = f"open loop, Poisson arrivals at {scenario.rate:g} requests/s"
    else:
        ramp = f" ramped over {scenario.ramp_s:g} s" if scenario.ramp_s else ""
        loop = f"closed loop, {scenario.users} users{ramp}"
    budget = " or ".join(x for x in (
        f"{scenario.requests} requests" if scenario.requests is not None else "",
        f"{scenario.duration_s:g} s" if scenario.duration_s is not None else "",
    ) if x)
    n = len(load.configs)
    slices = f"; {n} configurations in {scenario.slices} interleaved slices" if n > 1 else ""
    long = f", {scenario.long_ratio:.0%} long prompts" if scenario.long_ratio else ""
    line1 = (f"llmchat bench: {loop}, {budget} per configuration, {scenario.mode} mode, "
             f"max_tokens {scenario.max_tokens}{long}{slices}")
    line2 = f"target: {mask_url(load.base_url)}  model: {load.model}"
    pools = sorted({n for name, n in load.pool_sizes.items() if "nopool" not in name.split("+")})
    if pools:
        why = ("--max-connections" if load.target.max_connections is not None
               else "the in-flight cap" if scenario.open_loop else "one per user")
        line2 += f"  pool: {'/'.join(map(str, pools))} connections ({why})"
    workers = getattr(load, "workers", 1)
    if workers > 1:
        line2 += f"  workers: {workers} processes"
    if interrupted:
        line2 += "  (interrupted: partial figures)"
    return line1 + "\n" + line2


class ResultFile:
    """``--json PATH``, written as the run goes, in JSON Lines: each line one object whose ``type`` says what
    it is. First ``bench`` (the tool, the schema, the scenario, the target, each configuration's pool), then
    one ``request`` per request as it finishes (its record's summary, chunk gaps and attribution: no prompt or
    reply text, no key, no headers), and last ``summary`` (each configuration's figures, the before/after
    rows, ``request_lines``: how many request lines came before it). A file without a summary line is a run
    that did not end. Lines go out on RequestLog's writer thread, never blocking the event loop.

    Opening empties the file, or raises UsageError naming the flag when it cannot be written.
    """

    SCHEMA = 2
    """1: one JSON object, written at the end; 2: JSON Lines, written as the run goes."""
    CLOSE_S = 60.0
    """How long closing waits for the writer to catch up (it keeps up as the run goes: only a stuck disk
    makes it wait)."""

    def __init__(self, path: str) -> None:
        self.path = str(Path(path).expanduser())
        try:
            Path(self.path).write_bytes(b"")
        except OSError as exc:
            raise UsageError(f"--json: cannot write {path} ({exc.strerror or exc}); check the folder exists "
                             "and is writable") from None
        self._log = RequestLog(LogSettings(requests_path=self.path))
        self.started = False
        self.request_lines = 0

    def _put(self, data: dict[str, Any]) -> None:
        # ASCII: a string the server sent that is not valid Unicode can never break a line.
        self._log.put(json.dumps(data) + "\n")

    def start(self, load: LoadRun) -> None:
        """The first line: what was run, against what (written once ``load`` knows its target and model)."""
        if self.started:
            return
        self.started = True
        self._put({
            "type": "bench",
            "schema": self.SCHEMA,
            "tool": "llmchat bench",
            "version": __version__,
            "scenario": load.scenario.to_json(),
            "target": {"base_url": mask_url(load.base_url), "model": load.model},
            "pools": dict(load.pool_sizes),
            "workers": getattr(load, "workers", 1),
        })

    def request(self, sample: Sample) -> None:
        self._put(sample.to_json())
        self.request_lines += 1

    def finish_sweep(self, result: SweepResult, interrupted: bool) -> None:
        """A sweep's last line: each level's figures in ``configs`` (named for the level) and ``sweep``."""
        self._put({
            "type": "summary",
            "request_lines": self.request_lines,
            "configs": [lv.stats.to_json() for lv in result.levels],
            "sweep": result.to_json(),
            "interrupted": interrupted,
        })

    def finish(self, load: LoadRun, stats: list[ConfigStats], interrupted: bool) -> None:
        """The last line: every figure (a run stopped before it started still gets its first line)."""
        self.start(load)
        self._put({
            "type": "summary",
            "request_lines": self.request_lines,
            "configs": [{**s.to_json(), "server_metrics": _server_figures(load, s.name)} for s in stats],
            "server_metrics": {"url": mask_url(load.metrics_url), "interval_s": load.metrics_interval_s}
            if load.metrics_url else None,
            "compare": compare_rows(stats),
            "open_loop_cap_hits": load.cap_hits,
            "interrupted": interrupted,
        })

    @property
    def dropped(self) -> int:
        """Lines the writer could not write (the disk refused them)."""
        return self._log.dropped

    def close(self) -> None:
        """Write what is queued and close the file (blocks until then: call it after the loop ended)."""
        self._log.flush(self.CLOSE_S)
        self._log.close()


def _server_figures(load: LoadRun, config: str) -> dict[str, Any] | None:
    """The provider's /metrics over the configuration's slices; None when no metrics_url is set."""
    if not load.metrics_url:
        return None
    return summarize_snapshots(load.server_snapshots.get(config, [])).to_json()


def _write(path: str, text: str, flag: str) -> None:
    try:
        Path(path).expanduser().write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{flag}: cannot write {path} ({exc.strerror or exc}); check the folder exists and "
                         "is writable") from None


class Progress:
    """The live line on stderr: requests done, the running slice, p50/p99 end-to-end of the running
    configuration's recent requests, and errors. Redrawn by ``tick`` at most 10 times a second."""

    WINDOW = 500

    def __init__(self, scenario: Scenario, configs: list[str], *, enabled: bool,
                 stream: TextIO | None = None, levels: int = 0) -> None:
        self.enabled = enabled
        self.stream = stream or sys.stderr
        runs = levels or len(configs)  # a sweep runs each level once, under one configuration
        self.total = None if scenario.requests is None else scenario.requests * runs
        self.seconds = None if scenario.duration_s is None else scenario.duration_s * runs
        self.slices = scenario.slices
        self.done = 0
        self.errors = 0
        self.client_errors = 0
        self.config = ""
        self.slice_no = 0
        self.recent: dict[str, deque[float]] = {c: deque(maxlen=self.WINDOW) for c in configs}
        self.t0 = time.perf_counter_ns()

    def slice(self, slice_no: int, config: str) -> None:
        self.slice_no, self.config = slice_no, config

    def sample(self, sample: Sample) -> None:
        self.done += 1
        record = sample.record
        if record.error_kind in CLIENT_ERRORS:
            self.client_errors += 1
        elif record.error_kind is not None:
            self.errors += 1
        elif record.total_ms is not None:
            recent = self.recent.get(sample.config)
            if recent is None:  # a sweep's level, named as it starts
                recent = self.recent[sample.config] = deque(maxlen=self.WINDOW)
            recent.append(record.total_ms)

    def line(self) -> str:
        """The progress line as it would be drawn now."""
        elapsed = (time.perf_counter_ns() - self.t0) / 1e9
        if self.total:
            width = 20
            filled = int(width * min(self.done, self.total) / self.total)
            head = f"[{'#' * filled}{'-' * (width - filled)}] {self.done}/{self.total}"
        else:
            head = f"{self.done} requests, {elapsed:.0f}/{self.seconds or 0:.0f} s"
        values = list(self.recent.get(self.config, ()))
        where = f"{self.config} slice {self.slice_no + 1}/{self.slices}" if self.config else "starting"
        client = f" + {self.client_errors} client" if self.client_errors else ""
        return (f"{head}  {where}  p50 {report.fmt_ms(percentile(values, 50))} ms  "
                f"p99 {report.fmt_ms(percentile(values, 99))} ms  errors {self.errors}{client}  "
                f"{elapsed:.1f} s")

    async def tick(self) -> None:
        while True:
            self.stream.write("\r" + self.line() + "\x1b[K")
            self.stream.flush()
            await asyncio.sleep(0.1)

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + self.line() + "\x1b[K\n")
            self.stream.flush()
