"""`llmchat batch IN.jsonl -o OUT.jsonl`: bulk replies through the micro-batcher, resumable and cache-aware."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import TextIO

from llmchat.core import ChatClient, Http2Mode, Pools, Settings, load_settings
from llmchat.core import text as _text
from llmchat.core.errors import UsageError
from llmchat.core.load import (
    Actuals,
    Job,
    JobSummary,
    OutputLock,
    check_output,
    drop_failed,
    open_output,
    read_done,
    read_jobs,
    run_jobs,
    split_lines,
)
from llmchat.core.observe import TimingRecord, attach_observers, prices_from_settings
from llmchat.core.policy import RateLimits
from llmchat.tui.commands import _batch_api, _options
from llmchat.tui.commands._estimate_report import beside_actual, run_estimate, saved_estimate
from llmchat.tui.commands._provider import offline_default


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("batch", help="bulk jobs: JSONL prompts in, JSONL replies with timing records out",
                       description="Run every line of IN.jsonl ({\"id\", \"messages\" or \"prompt\", params...}) "
                       "and append one result line per job to OUT.jsonl. Ids already in OUT are skipped, so "
                       "an interrupted run resumes.")
    p.add_argument("input", help="the JSONL file of jobs (- for stdin)")
    p.add_argument("-o", "--output", required=True, help="the JSONL file results are appended to")
    _options.add(p, "endpoint", help={"--model": "the model for jobs that name none"})
    p.add_argument("--concurrency", type=_options.number(1, integer=True),
                   help="requests in flight at once (batch.concurrency)")
    p.add_argument("--retry-failed", action="store_true",
                   help="run again the jobs whose line in OUT is an error (their old lines are replaced)")
    p.add_argument("--via", choices=("direct", "batch-api"), default="direct",
                   help="direct: one request per job (default); batch-api: one batch through the provider's "
                   "Batch API (/v1/files, /v1/batches), slower and about half the price, polled every "
                   "batch.poll_interval_s; its id is kept in OUT.batch.json so a rerun collects it")
    p.add_argument("--cancel", action="store_true",
                   help="cancel the batch recorded for OUT (--via batch-api) and keep what it finished")
    p.add_argument("--estimate", action="store_true",
                   help="send nothing: print tokens in and out, cost and expected duration per path (direct "
                   "streaming, direct whole replies, Batch API), and keep it beside OUT for the real run")
    p.add_argument("--sample", type=_options.number(1, integer=True), metavar="N",
                   help="with --estimate: measure latency and reply length on the first N jobs first (sent "
                   "streamed and whole: 2N requests)")
    p.add_argument("--sla-s", type=_options.number(0), metavar="S",
                   help="with --estimate: which paths finish every job within S seconds")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    overrides = {"batch.concurrency": args.concurrency} if args.concurrency else None
    settings = load_settings(args.config, overrides=overrides)
    source = "stdin" if args.input == "-" else args.input
    text = _read_input(args.input)
    jobs, bad = read_jobs(split_lines(text), source=Path(source).name)
    for line in bad:
        print(f"llmchat: {line}", file=sys.stderr)
    out_path = Path(args.output)
    # Everything that can be wrong with -o is said before the first request goes out.
    check_output(out_path)
    if (args.sample or args.sla_s is not None) and not args.estimate:
        raise UsageError("--sample and --sla-s go with --estimate; add --estimate, or drop them to run the jobs")
    if args.estimate:
        with offline_default(settings, args.provider, args.base_url, quiet=True) as (base_url, http2, model):
            args.model = args.model or model
            return run_estimate(args, settings, jobs, out_path, base_url, http2)
    estimated = saved_estimate(out_path)
    actual = Actuals(prices_from_settings(settings.ui.prices))
    with OutputLock(out_path):
        done = read_done(out_path)
        if args.retry_failed:
            drop_failed(out_path, done.failed)
        todo = [j for j in jobs if j.id not in done.ok and (args.retry_failed or j.id not in done.failed)]
        via_batch_api = args.via == "batch-api" or args.cancel
        if not via_batch_api:
            _batch_api.check_direct(out_path)
        out = open_output(out_path)
        summary = JobSummary()
        interrupted = False
        outcome = None
        with offline_default(settings, args.provider, args.base_url, quiet=args.quiet) as (base_url, http2, model):
            args.model = args.model or model
            try:
                if via_batch_api:
                    progress = Progress(len(todo), enabled=not args.quiet and sys.stderr.isatty())
                    outcome = asyncio.run(_batch_api.run(args, settings, todo, out, out_path, base_url, http2,
                                                         summary, progress))
                else:
                    asyncio.run(_run(args, settings, todo, out, base_url, http2, summary, actual))
            except KeyboardInterrupt:
                # asyncio.run cancelled the run: the jobs in flight were cancelled and wrote nothing.
                interrupted = True
            finally:
                out.close()
    summary.total = len(todo)
    summary.skipped = len(jobs) - len(todo)
    summary.bad_lines = bad
    actual.stop()
    print(summary_table(summary), file=sys.stderr)
    if estimated is not None and estimated.jobs == len(jobs) and not summary.skipped and not interrupted:
        compared = "batch-api" if args.via == "batch-api" else "batch"  # the direct path sends whole replies
        print(beside_actual(estimated, actual, path=compared), file=sys.stderr)
    earlier = len(done.failed & {j.id for j in jobs})
    if earlier and not args.retry_failed:
        print(f"llmchat: {earlier} job{'s' if earlier != 1 else ''} failed in an earlier run and "
              f"{'were' if earlier != 1 else 'was'} skipped; add --retry-failed to run them again", file=sys.stderr)
    if interrupted and via_batch_api:
        print(f"llmchat: {_batch_api.interrupted_line(out_path)}", file=sys.stderr)
        return 130
    if via_batch_api:
        for line in _batch_api.report(outcome, out_path):
            print(f"llmchat: {line}", file=sys.stderr)
        return _batch_api.status_code(outcome, summary, cancel=args.cancel)
    if interrupted:
        written = summary.ok + summary.failed
        print(f"llmchat: interrupted after {written} of {len(todo)} jobs; results so far are in {out_path}: "
              "run the same command again to resume", file=sys.stderr)
        return 130
    return 1 if summary.failed else 0


def _read_input(name: str) -> str:
    """The input as text: one line naming the problem for a path that cannot be read; bytes that are not
    UTF-8 become U+FFFD, said once."""
    source = "stdin" if name == "-" else name
    if name != "-" and Path(name).is_dir():
        raise UsageError(f"{name} is a folder; name the JSONL file of jobs")
    try:
        if name != "-":
            data = Path(name).read_bytes()
        else:
            stdin = sys.stdin
            data = stdin.buffer.read() if hasattr(stdin, "buffer") else stdin.read().encode("utf-8", "replace")
    except OSError as exc:
        raise UsageError(f"cannot read {source} ({exc.strerror}); check the path") from None
    text, replaced = _text.decode(data)
    if replaced:
        print(f"llmchat: {source} had {replaced} byte{'s' if replaced != 1 else ''} that are not UTF-8; read as "
              "U+FFFD", file=sys.stderr)
    return text


async def _run(args: argparse.Namespace, settings: Settings, todo: list[Job], out: TextIO,
               base_url: str | None, http2: Http2Mode | None, summary: JobSummary,
               actual: Actuals | None = None) -> JobSummary:
    progress = Progress(len(todo), enabled=not args.quiet and sys.stderr.isatty())
    async with Pools() as pools, ChatClient(settings, provider=args.provider, base_url=base_url, model=args.model,
                          http2=http2, api_key_env=args.api_key_env,
                          pools=pools, limits=RateLimits.from_settings(settings.providers)) as client:
        observers = attach_observers(client.bus, settings)
        try:
            def on_result(job: Job, record: TimingRecord | None, error: str | None) -> None:
                progress.update(job, record, error)
                if actual is not None:
                    actual.add(record)

            return await run_jobs(client, todo, out, on_result=on_result, summary=summary)
        finally:
            progress.close()
            await observers.aclose()


class Progress:
    """A one-line progress bar on stderr: done/total, rate and ETA. Redrawn at most 10 times a second."""

    def __init__(self, total: int, *, enabled: bool) -> None:
        self.total, self.done, self.failed = total, 0, 0
        self.enabled = enabled
        self.t0 = time.monotonic()
        self._last = 0.0
        self.status = ""
        self._first: tuple[int, float] | None = None

    def update(self, _job: Job, _record: TimingRecord | None, error: str | None) -> None:
        self.done += 1
        self.failed += error is not None
        self._draw()

    def show(self, done: int, failed: int, total: int, status: str) -> None:
        """The Batch API path: the provider's request counts and the batch's status, as polled. The rate counts
        from the first poll this run saw (a resumed batch may be half done already)."""
        if self._first is None:
            self._first = (done, time.monotonic())
        self.done, self.failed, self.total, self.status = done, failed, total or self.total, status
        self._draw(force=True)

    def _draw(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if self.enabled and (force or now - self._last >= 0.1 or self.done == self.total):
            self._last = now
            base, t0 = self._first or (0, self.t0)
            rate = (self.done - base) / max(now - t0, 1e-9)
            eta = f"{(self.total - self.done) / rate:.0f}s" if rate else "?"
            width = 30
            filled = int(width * self.done / max(self.total, 1))
            bar = "#" * filled + "-" * (width - filled)
            status = f" {self.status}" if self.status else ""
            sys.stderr.write(f"\r[{bar}] {self.done}/{self.total} {rate:.1f}/s ETA {eta} "
                             f"failed {self.failed}{status}   ")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def summary_table(s: JobSummary) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f} ms"

    rows = [
        ("ok", str(s.ok)),
        ("failed", str(s.failed)),
        ("refused (of failed)", str(s.refused)),
        ("skipped (already done)", str(s.skipped)),
        ("bad input lines", str(len(s.bad_lines))),
        ("cache hits", str(s.cache_hits)),
        ("retries", str(s.retries)),
        ("latency p50", ms(s.p50_ms)),
        ("latency p99", ms(s.p99_ms)),
    ]
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)
