"""`llmchat doctor`: measure the whole chain to a provider with a small bounded battery, and prescribe.

Before anything is sent it prints what the battery will cost (requests, tokens, money when ``ui.prices``
knows the model) and asks y/N; ``--yes`` skips the question, and without a terminal to ask on it refuses in
one line. A progress bar runs on stderr; the report (or ``--json``) goes to stdout. ``--write-config`` shows
the diff of the config change and applies it, keeping a backup. Exit status: 0 healthy, 1 when a check
warned or failed, 2 for a usage error, 130 when interrupted (the partial report is printed).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import difflib
import json
import os
import shutil
import sys
from pathlib import Path

from llmchat.core import load_settings
from llmchat.core.config import config_path_in_use, mask_url, set_toml_keys
from llmchat.core.diagnose import (
    DEFAULT_BUDGET_REQUESTS,
    DEFAULT_BUDGET_S,
    Context,
    Report,
    estimate,
    run_battery,
)
from llmchat.core.errors import ConfigError, UsageError
from llmchat.tui.commands import _options
from llmchat.tui.commands._doctor_report import estimate_text, render, width
from llmchat.tui.commands._provider import offline_default
from llmchat.tui.commands.batch import Progress


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "doctor", help="measure the chain to a provider and prescribe config changes",
        description="Run a small bounded battery against a provider: the path (DNS, TCP, TLS, ALPN, h2c, "
        "proxies, clock), the connection's life (keep-alive, new vs reused, HTTP/2 vs an HTTP/1.1 pool), "
        "streaming (arrival pattern, TTFT/ITL/TPOT, stalls), the server (cold start, queueing, where the time "
        "went) and limits (rate-limit headroom, retries, errors); then say what to change in the config.")
    _options.add(p, "endpoint")
    p.add_argument("--budget-requests", type=_options.number(1, 1000, integer=True), metavar="N",
                   default=DEFAULT_BUDGET_REQUESTS,
                   help=f"send at most N requests (default {DEFAULT_BUDGET_REQUESTS}); steps that do not fit "
                   "are skipped and named")
    p.add_argument("--idle-s", type=_options.number(0, 600), metavar="S", default=0.0,
                   help="also wait S seconds idle and send one more request: is the model cold again?")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask before sending")
    p.add_argument("--json", action="store_true", help="print every measurement and finding as one JSON object")
    p.add_argument("--write-config", action="store_true",
                   help="apply the prescribed change to the config file (shows the diff; keeps a .bak copy)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    with offline_default(settings, args.provider, args.base_url) as (base_url, http2, model):
        if http2 is not None:  # the offline local server speaks h2c; the doctor looks at it as configured
            settings = dataclasses.replace(settings, http=dataclasses.replace(settings.http, http2=http2))
        ctx = Context(settings, provider=args.provider, base_url=base_url, model=args.model or model,
                      api_key_env=args.api_key_env, budget_requests=int(args.budget_requests),
                      budget_s=DEFAULT_BUDGET_S, idle_s=float(args.idle_s))
        target = mask_url(base_url or ctx.client().endpoint.base_url)
        print(estimate_text(estimate(ctx), target, cols=width()), file=sys.stderr)
        if not args.yes:
            if not sys.stdin.isatty():
                raise UsageError("doctor sends requests and stdin is not a terminal to ask on; pass --yes")
            answer = input("Send them? [y/N] ").strip().lower()
            if answer not in ("y", "yes"):
                print("llmchat: doctor: nothing sent", file=sys.stderr)
                return 0
        progress = Progress(max(1, estimate(ctx).requests), enabled=sys.stderr.isatty() and not args.json)
        # The step's name padded: the bar redraws in place, and a shorter name must cover a longer one.
        ctx.progress = lambda done, total, step: progress.show(done, 0, total, f"{step[:16]:<16}")
        try:
            report = asyncio.run(run_battery(ctx))
        finally:
            progress.close()
    path, _ = config_path_in_use(args.config, os.environ)
    if args.json:
        sys.stdout.write(json.dumps(report.to_dict(), ensure_ascii=False, default=str) + "\n")
    else:
        sys.stdout.write(render(report, config_path=str(path)))
    sys.stdout.flush()
    if args.write_config:
        write_config(report, path)
    if report.interrupted:
        return 130
    return 0 if report.worst() == "pass" else 1


def write_config(report: Report, path: Path) -> None:
    """Show the diff of the prescribed change to ``path`` on stderr, then write it, the old file kept as
    ``path.bak`` (``.bak.1``... when taken). Nothing to change says so. ConfigError, one line, when the file
    cannot be read, parsed or written."""
    changes = report.changes()
    if not changes:
        print("llmchat: doctor: nothing to write: no change prescribed", file=sys.stderr)
        return
    try:
        before = path.read_text(encoding="utf-8") if path.exists() else ""
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}; fix its permissions") from None
    try:
        after = set_toml_keys(before, changes)
    except ValueError:
        raise ConfigError(f"{path} spells a table this change touches inline ({{ ... }}); add the change "
                          "above by hand") from None
    if after == before:
        print(f"llmchat: doctor: {path} already holds the change", file=sys.stderr)
        return
    diff = difflib.unified_diff(before.splitlines(True), after.splitlines(True), str(path), f"{path} (new)")
    sys.stderr.write("".join(diff))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        backup = None
        if path.exists():
            backup = path.with_name(path.name + ".bak")
            n = 1
            while backup.exists():
                backup, n = path.with_name(f"{path.name}.bak.{n}"), n + 1
            shutil.copy2(path, backup)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(after, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}; fix its permissions") from None
    kept = f" (the old one is {backup})" if backup else ""
    print(f"llmchat: doctor: wrote {path}{kept}", file=sys.stderr)
