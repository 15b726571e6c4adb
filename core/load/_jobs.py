"""Bulk jobs for `llmchat batch`: JSONL in, JSONL out, resumable, one result line per input line.

Input lines: ``{"id": ..., "messages": [...]}`` or ``{"id": ..., "prompt": "..."}`` plus optional generation
parameters (``model``, ``temperature``, ``max_tokens``, ``seed`` ...). Each result is written whole, with its
timing record, as soon as it completes; ids already in the output are skipped, so a stopped run resumes where
it stopped. A failed line is written with its error and never stops the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from llmchat.core.config import BatchSettings
from llmchat.core.errors import APIError, UsageError
from llmchat.core.observe import TimingRecord, percentile
from llmchat.core.policy import MicroBatcher

if TYPE_CHECKING:
    from llmchat.core.client._client import ChatClient

_RESERVED = {"id", "messages", "prompt", "system"}


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    messages: list[dict[str, Any]]
    params: dict[str, Any]
    lineno: int


@dataclass(slots=True)
class JobSummary:
    """What a run did. Latencies are of the requests this run made (cache hits included)."""

    total: int = 0
    skipped: int = 0
    ok: int = 0
    failed: int = 0
    refused: int = 0
    """Of ``failed``, the lines the model refused: written with the refusal and an error, so
    ``--retry-failed`` sends them again."""
    cache_hits: int = 0
    retries: int = 0
    bad_lines: list[str] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)

    @property
    def p50_ms(self) -> float | None:
        return percentile(self.latencies_ms, 50)

    @property
    def p99_ms(self) -> float | None:
        return percentile(self.latencies_ms, 99)


def refused_line(refusal: str, usage: Any) -> dict[str, Any]:
    """The fields of an OUT.jsonl line the model refused (direct and Batch API paths alike): no reply, the
    refusal in its words, ``finish_reason`` "refusal", and an error, so the line counts as failed and
    ``--retry-failed`` sends it again."""
    words = " ".join(refusal.split())
    shown = words if len(words) <= 80 else words[:77] + "..."
    return {"reply": "", "refusal": refusal, "finish_reason": "refusal", "usage": usage,
            "error": f"the model refused: {shown!r}; rephrase the prompt or ask another model, then --retry-failed"}


def read_jobs(lines: Iterable[str], *, source: str = "input") -> tuple[list[Job], list[str]]:
    """Parse input lines. Returns the jobs and one message per bad line (``input.jsonl:7: ...``)."""
    jobs: list[Job] = []
    bad: list[str] = []
    seen: set[str] = set()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line, parse_constant=_no_constant)
        except json.JSONDecodeError as exc:
            bad.append(f"{source}:{lineno}: not JSON ({exc.msg}); skipped")
            continue
        except ValueError as exc:  # NaN or Infinity: Python reads them, JSON has no such number
            bad.append(f"{source}:{lineno}: {exc}; skipped")
            continue
        if not isinstance(obj, dict):
            bad.append(f"{source}:{lineno}: not a JSON object; skipped")
            continue
        job_id = obj.get("id", lineno)
        job_id = str(job_id)
        messages = obj.get("messages")
        if messages is None and isinstance(obj.get("prompt"), str):
            messages = [{"role": "user", "content": obj["prompt"]}]
            if isinstance(obj.get("system"), str):
                messages.insert(0, {"role": "system", "content": obj["system"]})
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            bad.append(f"{source}:{lineno}: no messages (give \"messages\": [...] or \"prompt\": \"...\"); skipped")
            continue
        if job_id in seen:
            bad.append(f"{source}:{lineno}: duplicate id {job_id!r}; skipped")
            continue
        seen.add(job_id)
        params = {k: v for k, v in obj.items() if k not in _RESERVED}
        jobs.append(Job(job_id, messages, params, lineno))
    return jobs, bad


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def split_lines(text: str) -> list[str]:
    """JSONL lines: split at LF only. ``str.splitlines`` also splits at U+2028, U+2029 and U+0085, which a
    reply can hold raw inside a JSON string (json.dumps with ensure_ascii=False writes them as they are)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


@dataclass(frozen=True, slots=True)
class Done:
    """What an output file already holds: the ids answered, and those whose line is an error."""

    ok: frozenset[str] = frozenset()
    failed: frozenset[str] = frozenset()

    @property
    def ids(self) -> frozenset[str]:
        return self.ok | self.failed


def done_ids(out_path: Path) -> set[str]:
    """Ids already written to ``out_path`` (answered or failed). See ``read_done``."""
    return set(read_done(out_path).ids)


def read_done(out_path: Path) -> Done:
    """What ``out_path`` holds. A last line cut short by a crash is removed so it reruns; an id's last line
    decides (a failed line followed by an answer is answered)."""
    if not out_path.exists():
        return Done()
    data = out_path.read_bytes()
    if data and not data.endswith(b"\n"):
        # A crash (not Ctrl-C, which finishes lines) can leave a partial line: drop it so the file stays JSONL.
        cut = data.rfind(b"\n") + 1
        with out_path.open("r+b") as f:
            f.truncate(cut)
        data = data[:cut]
    state: dict[str, bool] = {}
    for line in split_lines(data.decode("utf-8", "replace")):
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and "id" in obj:
            state[str(obj["id"])] = obj.get("error") is None
    return Done(frozenset(i for i, ok in state.items() if ok), frozenset(i for i, ok in state.items() if not ok))


def drop_failed(out_path: Path, failed: frozenset[str]) -> None:
    """Rewrite ``out_path`` without the lines of ``failed`` ids (before they run again, so each id keeps one
    line). Atomic: a crash leaves the old file or the new one, never half of either."""
    if not failed:
        return
    data = out_path.read_bytes().decode("utf-8", "replace")
    kept = []
    for line in split_lines(data):
        try:
            obj = json.loads(line)
        except ValueError:
            obj = None
        if not (isinstance(obj, dict) and str(obj.get("id")) in failed and obj.get("error") is not None):
            kept.append(line + "\n")
    write_atomic(out_path, "".join(kept))


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` (created 0600): a crash leaves the old file or the new one, never half of
    either. Raises UsageError with one line when the folder cannot be written."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as exc:
        raise UsageError(f"cannot write {tmp} ({exc.strerror}); pick a writable -o") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


async def run_jobs(
    client: ChatClient,
    jobs: list[Job],
    out: TextIO,
    *,
    settings: BatchSettings | None = None,
    on_result: Callable[[Job, TimingRecord | None, str | None], None] | None = None,
    summary: JobSummary | None = None,
) -> JobSummary:
    """Run ``jobs`` through the micro-batcher and write one line each to ``out`` as it completes.

    A job that fails is written with its error and counted; nothing a job does stops the others. Cancelling
    the run (Ctrl-C) cancels the jobs in flight, which write nothing and so run again on resume; every line
    written is whole. Pass ``summary`` to keep the counts of a run that is cancelled (it is filled in place).
    """
    if summary is None:
        summary = JobSummary()
    summary.total = len(jobs)

    async def handle(job: Job) -> None:
        params = dict(job.params)
        model = params.pop("model", None)
        record: TimingRecord | None = None
        line: dict[str, Any] = {"id": job.id}
        error: str | None = None
        try:
            reply = await client.complete(job.messages, model=model, **params)
        except APIError as exc:
            error = str(exc)
            record = getattr(exc, "record", None)
            line.update({"reply": None, "error": error})
            summary.failed += 1
        except UsageError as exc:
            error = str(exc)
            line.update({"reply": None, "error": error})
            summary.failed += 1
        else:
            record = reply.record
            if reply.refusal:
                line.update(refused_line(reply.refusal, reply.usage))
                error = line["error"]
                summary.failed += 1
                summary.refused += 1
            else:
                line.update({"reply": reply.text, "finish_reason": reply.finish_reason, "usage": reply.usage,
                             "error": None})
                summary.ok += 1
        if record is not None:
            line["record"] = record.summary()
            summary.retries += len(record.retries)
            summary.cache_hits += int(record.cache_hit)
            if record.total_ms is not None and error is None:
                summary.latencies_ms.append(record.total_ms)
        # One write per line, from the event loop thread: a cancel (Ctrl-C) can't split it.
        out.write(json.dumps(line, ensure_ascii=False) + "\n")
        out.flush()
        if on_result is not None:
            on_result(job, record, error)

    async with MicroBatcher(handle, settings or client.settings.batch) as batcher:
        await asyncio.gather(*(batcher.submit(j) for j in jobs))
    return summary


def check_output(path: Path) -> None:
    """UsageError with one line when ``path`` cannot be a results file: a folder, or in a missing folder."""
    if path.is_dir():
        raise UsageError(f"-o {path} is a folder; name a file inside it, for example {path / 'out.jsonl'}")
    if not path.parent.is_dir():
        raise UsageError(f"-o {path}: the folder {path.parent} does not exist; create it or pick another path")


def open_output(path: Path) -> TextIO:
    """Open the results file for appending (created 0600: replies can be private). Raises UsageError with one
    line for a path that cannot be written (a folder, a missing folder, no permission): call it before the
    first request, so a bad -o costs nothing."""
    check_output(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError as exc:
        raise UsageError(f"cannot write -o {path} ({exc.strerror}); pick a writable path") from None
    return os.fdopen(fd, "a", encoding="utf-8")


class OutputLock:
    """Holds ``OUT.lock`` beside the results file (an exclusive ``flock``), so two runs never write one file
    and run every job twice. The kernel drops the lock when the process ends, however it ends; the file
    itself is removed on a clean exit. Raises UsageError naming the other run's pid when it is held."""

    def __init__(self, out_path: Path) -> None:
        self.path = out_path.with_name(out_path.name + ".lock")
        self._fd: int | None = None

    def __enter__(self) -> OutputLock:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise UsageError(f"cannot create the lock file {self.path} ({exc.strerror}); pick a writable -o") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.read(fd, 32).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            raise UsageError(
                f"another llmchat batch (pid {other}) is writing {self.path.with_suffix('').name}; wait for it to "
                "finish, or pick another -o"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            os.close(self._fd)
            self._fd = None
