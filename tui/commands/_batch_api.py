"""`llmchat batch --via batch-api` (and `--cancel`): the command line's side of the Batch API path.

The engine (``llmchat.core.load.run_batch_api``) uploads, creates, polls and writes OUT.jsonl; this module
shows its progress with the batch command's bar and says, one line each, what happened and what to run next.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Protocol, TextIO

from llmchat.core import ChatClient, Http2Mode, Settings
from llmchat.core.errors import UsageError
from llmchat.core.load import (
    BatchOutcome,
    BatchStatus,
    Job,
    JobSummary,
    pending_batch,
    run_batch_api,
    state_path,
)


class BatchProgress(Protocol):
    def show(self, done: int, failed: int, total: int, status: str) -> None: ...

    def close(self) -> None: ...


async def run(
    args: argparse.Namespace,
    settings: Settings,
    todo: list[Job],
    out: TextIO,
    out_path: Path,
    base_url: str | None,
    http2: Http2Mode | None,
    summary: JobSummary,
    progress: BatchProgress,
) -> BatchOutcome:
    """Run ``todo`` through the provider's Batch API (or pick up, or cancel, the batch recorded for OUT)."""

    def on_status(status: BatchStatus) -> None:
        progress.show(status.done, status.failed, status.total, status.status)

    async with ChatClient(
        settings,
        provider=args.provider,
        base_url=base_url,
        model=args.model,
        http2=http2,
        api_key_env=args.api_key_env,
    ) as client:
        try:
            return await run_batch_api(
                client,
                todo,
                out,
                out_path=out_path,
                settings=settings.batch,
                summary=summary,
                cancel=args.cancel,
                on_status=on_status,
                on_notice=_say,
            )
        finally:
            progress.close()


def _say(line: str) -> None:
    # Said before the progress bar is first drawn (the batch's id on creation or resume), so never inside it.
    print(f"llmchat: {line}", file=sys.stderr)


def check_direct(out_path: Path) -> None:
    """Refuse the direct path while a batch is recorded for OUT: its jobs would be sent (and paid) twice."""
    batch_id = pending_batch(out_path)
    if batch_id is not None:
        raise UsageError(
            f"batch {batch_id} is still recorded for {out_path} in {state_path(out_path).name}: add --via "
            "batch-api to collect its results (or --cancel), or delete that file to forget it"
        )


def interrupted_line(out_path: Path) -> str:
    """What Ctrl-C left behind, and the commands that carry on from there."""
    try:
        batch_id = pending_batch(out_path)
    except UsageError:
        batch_id = None
    if batch_id is None:
        return (
            "interrupted before a batch was created; nothing runs at the provider: run the same command again"
        )
    return (
        f"interrupted; batch {batch_id} keeps running at the provider: run the same command again to collect "
        "its results, or add --cancel to cancel it (what it finished is kept)"
    )


def status_code(outcome: BatchOutcome | None, summary: JobSummary, *, cancel: bool) -> int:
    """0 when every job sent has its answer (or a cancel asked for went through), else 1."""
    if outcome is None or outcome.batch is None:
        return 1 if summary.failed else 0
    state = outcome.batch.status
    if state == "failed" or state == "expired" or summary.failed:
        return 1
    if state == "cancelled":
        return 0 if cancel else 1
    return 1 if outcome.missing else 0


def report(outcome: BatchOutcome | None, out_path: Path) -> list[str]:
    """The lines said after the summary table."""
    if outcome is None or outcome.batch is None:
        return []
    lines = []
    if outcome.problem:
        lines.append(outcome.problem)
    if outcome.ignored:
        lines.append(
            f"{outcome.ignored} result{'s' if outcome.ignored != 1 else ''} of batch {outcome.batch.id} "
            f"{'were' if outcome.ignored != 1 else 'was'} for jobs {out_path.name} already holds or the "
            "input no longer has; not written"
        )
    return lines
