"""`llmchat bench`: a load test through the engine, one or several client configurations side by side.

Closed loop (``--users N``) or open loop (``--rate R``, Poisson arrivals), for ``--requests`` or
``--duration`` per configuration. ``--compare h2,h1,nopool`` runs the same scenario under each configuration
in interleaved slices and prints a before/after table against the first. Figures go to stdout, the live
progress line to stderr (on a terminal only). Exit status 0 when the run finished (failed requests are
figures, not failures), 1 when every request failed, 2 for a bad flag, 130 on Ctrl-C (after printing what was
measured).
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
from pathlib import Path
from typing import Any, TextIO

from llmchat.core import BaselineStore, Bus, ColdStartDetector, __version__, load_settings, mask_url
from llmchat.core._attribution import Attribution, attribute
from llmchat.core._errors import UsageError
from llmchat.core._load import CONFIGS, LoadRun, Sample, Scenario, Target, parse_configs
from llmchat.core._load_stats import SLO, ConfigStats, compare_rows, summarize
from llmchat.core._metrics_poller import summarize_snapshots
from llmchat.core._prometheus import start_exporter
from llmchat.core._requestlog import attach_observers
from llmchat.core._timing import percentile
from llmchat.tui.commands import _bench_report as report
from llmchat.tui.commands import _options
from llmchat.tui.commands._provider import offline_default

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
    a("--temperature", type=_options.number(0, 2), help="sent with every request, 0 to 2 (0 makes batch replies "
      "cacheable)")
    a("--seed", type=int, default=0, help="seed of the prompts, the arrivals and the slice order (default 0)")
    a("--compare", metavar="LIST", help="configurations to run side by side, e.g. h2,h1,nopool (see below)")
    a("--slices", type=int, metavar="N",
      help="interleaved slices per configuration (default 5 with --compare)")
    a("--slo-ttft-ms", type=float, metavar="MS", help="goodput counts requests with TTFT at most this")
    a("--slo-e2e-ms", type=float, metavar="MS", help="goodput counts requests with end-to-end at most this")
    a("--json", metavar="PATH", help="write every figure and every request's timing record to PATH")
    a("--plot", nargs="?", const="-", metavar="SVG",
      help="draw p50/p90/p99 per configuration in the terminal, or write them to SVG")
    a("--max-connections", type=int, metavar="N",
      help="pool size of every configuration (default: http.max_connections); nopool has no limit")
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
    )
    if args.rate is not None and not args.rate > 0:
        raise UsageError(f"--rate must be a positive number of requests per second, got {args.rate:g}")
    scenario.validate()
    return scenario


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
    settings = load_settings(args.config)
    progress = Progress(scenario, configs, enabled=not args.quiet and sys.stderr.isatty())
    interrupted = False
    # Cold-start baselines of earlier runs, read before the run and saved after it (never on the loop).
    store = BaselineStore()
    baselines = store.load()
    detector = ColdStartDetector()
    detector.seed(baselines)
    # One bus for every configuration when something watches: the exporter, the request log, or both.
    bus = Bus() if args.metrics_port is not None or settings.log.requests_path else None
    with contextlib.ExitStack() as stack:
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
                        api_key_env=args.api_key_env)
        load = LoadRun(scenario, configs, target, on_sample=progress.sample, on_slice=progress.slice)
        try:
            asyncio.run(_drive(load, progress))
        except KeyboardInterrupt:
            interrupted = True
    # Once per request, in the order they finished: the per-part percentiles and the per-request JSON are the
    # same attributions.
    attributions = [attribute(s.record, detector=detector) for s in load.samples]
    store.save(detector.baselines())
    paired = list(zip(load.samples, attributions, strict=True))
    stats = [
        summarize(name, load.records(name), load.walls_ns[name], slo=slo,
                  long_prompts=sum(1 for s in load.samples if s.config == name and s.long),
                  attributions=[a for s, a in paired if s.config == name])
        for name in configs
    ]
    print(header(load, scenario, interrupted))
    print()
    print(report.figures_table(stats, mode=scenario.mode))
    where = report.attribution_table(stats)
    if where:
        print()
        print(where)
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
    if args.json:
        data = bench_json(load, scenario, stats, interrupted, attributions)
        _write(args.json, json.dumps(data, ensure_ascii=False) + "\n", "--json")
    sys.stdout.flush()
    if load.cap_hits:
        print(f"llmchat: the open loop reached its cap of {scenario.max_in_flight} requests in flight "
              f"{load.cap_hits} times, so those arrivals went out late (lag_ms in --json); lower --rate",
              file=sys.stderr)
    if interrupted:
        print(f"llmchat: interrupted after {len(load.samples)} requests; the figures above cover those",
              file=sys.stderr)
        return 130
    failed = [s for s in load.samples if s.record.error_kind is not None]
    if load.samples and len(failed) == len(load.samples):
        print(f"llmchat: every request failed; the first: {failed[0].record.error}", file=sys.stderr)
        return 1
    return 0


async def _drive(load: LoadRun, progress: Progress) -> None:
    ticker = asyncio.create_task(progress.tick()) if progress.enabled else None
    try:
        await load.run()
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
        line2 += f"  pool: {'/'.join(map(str, pools))} connections (--max-connections)"
    if interrupted:
        line2 += "  (interrupted: partial figures)"
    return line1 + "\n" + line2


def bench_json(
    load: LoadRun, scenario: Scenario, stats: list[ConfigStats], interrupted: bool,
    attributions: list[Attribution] | None = None,
) -> dict[str, Any]:
    """Everything measured: the scenario, each configuration's figures, the before/after rows, and every
    request's timing record (summaries: no prompt or reply text, no key, no headers) with its attribution
    (``attributions`` pairs with ``load.samples``; made here when not given)."""
    if attributions is None:
        attributions = [attribute(s.record) for s in load.samples]
    return {
        "tool": "llmchat bench",
        "version": __version__,
        "scenario": scenario.to_json(),
        "target": {"base_url": mask_url(load.base_url), "model": load.model},
        "configs": [{**s.to_json(), "server_metrics": _server_figures(load, s.name)} for s in stats],
        "server_metrics": {"url": mask_url(load.metrics_url), "interval_s": load.metrics_interval_s}
        if load.metrics_url else None,
        "compare": compare_rows(stats),
        "open_loop_cap_hits": load.cap_hits,
        "interrupted": interrupted,
        "requests": [{**s.to_json(), "attribution": a.to_dict()}
                     for s, a in zip(load.samples, attributions, strict=True)],
    }


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
                 stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.total = None if scenario.requests is None else scenario.requests * len(configs)
        self.seconds = None if scenario.duration_s is None else scenario.duration_s * len(configs)
        self.slices = scenario.slices
        self.done = 0
        self.errors = 0
        self.config = ""
        self.slice_no = 0
        self.recent: dict[str, deque[float]] = {c: deque(maxlen=self.WINDOW) for c in configs}
        self.t0 = time.perf_counter_ns()

    def slice(self, slice_no: int, config: str) -> None:
        self.slice_no, self.config = slice_no, config

    def sample(self, sample: Sample) -> None:
        self.done += 1
        record = sample.record
        if record.error_kind is not None:
            self.errors += 1
        elif record.total_ms is not None:
            self.recent[sample.config].append(record.total_ms)

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
        return (f"{head}  {where}  p50 {report.fmt_ms(percentile(values, 50))} ms  "
                f"p99 {report.fmt_ms(percentile(values, 99))} ms  errors {self.errors}  {elapsed:.1f} s")

    async def tick(self) -> None:
        while True:
            self.stream.write("\r" + self.line() + "\x1b[K")
            self.stream.flush()
            await asyncio.sleep(0.1)

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + self.line() + "\x1b[K\n")
            self.stream.flush()
