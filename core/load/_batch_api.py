"""`llmchat batch --via batch-api`: bulk jobs through a provider's Batch API (/v1/files and /v1/batches).

The jobs go up as one JSONL file in the provider's batch format (``custom_id``, ``method``, ``url``,
``body``), a batch is created on it with the configured completion window, and its status is polled until it
ends; then the output and error files come down and become OUT.jsonl lines of the same shape as the direct
path's (reply, finish_reason, usage, error per job, in input order), so resume and the summary work unchanged.

The batch's id is kept beside OUT.jsonl (``OUT.jsonl.batch.json``) from the moment it exists until its results
are written: a run stopped while it polls (Ctrl-C, a lost network) leaves the batch running, and the next run
picks it up instead of sending the jobs again. Every request goes over the client's pooled transport with its
retry policy.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import llmchat.core.errors as errors
import llmchat.core.http._openai as wire
from llmchat.core.config import BatchSettings, mask_url
from llmchat.core.load._jobs import Job, JobSummary, refused_line, write_atomic
from llmchat.core.observe import Phases
from llmchat.core.policy import call_with_retries

if TYPE_CHECKING:
    from llmchat.core.client._client import ChatClient

ENDPOINT = "/v1/chat/completions"
"""The endpoint every line of the batch calls."""
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
"""The statuses a batch never leaves."""


@dataclass(frozen=True, slots=True)
class BatchStatus:
    """What the provider says about a batch (``GET /v1/batches/{id}``)."""

    id: str
    status: str
    total: int = 0
    completed: int = 0
    failed: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: tuple[Mapping[str, Any], ...] = ()
    created_at: int | None = None
    ended_at: int | None = None
    """When it reached its terminal status (wall-clock seconds), if it has."""
    completion_window: str = ""

    @property
    def done(self) -> int:
        return self.completed + self.failed

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any], *, where: str) -> BatchStatus:
        """Read a batch object; ProtocolError when it is not one."""
        if (
            not isinstance(obj, Mapping)
            or not isinstance(obj.get("id"), str)
            or not isinstance(obj.get("status"), str)
        ):
            raise errors.ProtocolError(
                f"{where} answered with something that is not a batch object; check that "
                "base_url is an OpenAI-compatible API with the Batch API"
            )
        raw_counts = obj.get("request_counts")
        counts: Mapping[str, Any] = raw_counts if isinstance(raw_counts, Mapping) else {}
        listed = obj.get("errors")
        data = listed.get("data") if isinstance(listed, Mapping) else None
        status = obj["status"]
        return cls(
            id=obj["id"],
            status=status,
            total=_int(counts.get("total")),
            completed=_int(counts.get("completed")),
            failed=_int(counts.get("failed")),
            output_file_id=obj.get("output_file_id") or None,
            error_file_id=obj.get("error_file_id") or None,
            errors=tuple(e for e in data if isinstance(e, Mapping)) if isinstance(data, list) else (),
            created_at=obj.get("created_at") if isinstance(obj.get("created_at"), int) else None,
            ended_at=obj.get(f"{status}_at") if isinstance(obj.get(f"{status}_at"), int) else None,
            completion_window=str(obj.get("completion_window") or ""),
        )


@dataclass(slots=True)
class BatchOutcome:
    """How a run through the Batch API ended: the batch's last status, the lines written and what is left."""

    batch: BatchStatus | None
    """None when there was nothing to send."""
    resumed: bool = False
    written: int = 0
    missing: list[str] = field(default_factory=list)
    """Ids the batch was sent that came back in neither file (a cancel stopped them, or the provider lost
    them): they have no line, so the next run sends them."""
    ignored: int = 0
    """Results for ids not among the jobs left to do (already answered, or no longer in the input)."""
    problem: str | None = None
    """One line for a batch that did not complete (failed, expired, cancelled) or left jobs unanswered."""


def state_path(out_path: Path) -> Path:
    """Where the running batch's id is kept for ``out_path``: ``OUT.jsonl.batch.json`` beside it."""
    return out_path.with_name(out_path.name + ".batch.json")


def pending_batch(out_path: Path) -> str | None:
    """The id of the batch a run started for ``out_path`` and has not finished collecting, else None.

    Raises UsageError with one line when the state file is there but unreadable."""
    state = _read_state(state_path(out_path))
    return None if state is None else str(state["batch_id"])


def _read_state(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise errors.UsageError(
            f"cannot read {path} ({exc.strerror}); fix its permissions or delete it"
        ) from None
    try:
        state = json.loads(text)
    except ValueError:
        state = None
    if (
        not isinstance(state, dict)
        or not isinstance(state.get("batch_id"), str)
        or not isinstance(state.get("ids"), list)
    ):
        raise errors.UsageError(
            f"{path} is not a batch record llmchat wrote; delete it to send a new batch (a "
            "batch it named keeps running at the provider)"
        )
    return state


def batch_input(jobs: Sequence[Job], model: str) -> bytes:
    """The provider's batch input file for ``jobs``: one line each, ``custom_id`` being the job's id and the
    body exactly what the direct path sends (``model`` for jobs that name none)."""
    lines = []
    for job in jobs:
        params = dict(job.params)
        body = wire.chat_body(params.pop("model", None) or model, job.messages, params, stream=False)
        head = json.dumps({"custom_id": job.id, "method": "POST", "url": ENDPOINT}, ensure_ascii=False)
        lines.append(head[:-1].encode() + b',"body":' + body + b"}\n")
    return b"".join(lines)


class BatchAPI:
    """Files and batches at the client's provider, over its pooled transport and with its retry policy.

    Every failure is an ``APIError`` whose message is one line: what was refused, and the fix.
    """

    def __init__(self, client: ChatClient) -> None:
        self.client = client
        self.where = client.endpoint.hostport

    async def upload(self, data: bytes, filename: str) -> str:
        """Upload a batch input file (``purpose`` batch); returns its file id."""
        boundary = os.urandom(16).hex()
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
            "Content-Type: application/jsonl\r\n\r\n"
        ).encode()
        body = head + data + f"\r\n--{boundary}--\r\n".encode()
        obj = await self._call(
            "POST",
            "files",
            body,
            what="the batch input file",
            content_type=f"multipart/form-data; boundary={boundary}",
        )
        if not isinstance(obj.get("id"), str):
            raise errors.ProtocolError(
                f"{self.where} accepted the batch input file but sent back no file id; "
                "check that base_url is an OpenAI-compatible API"
            )
        return str(obj["id"])

    async def create(
        self, file_id: str, window: str, metadata: Mapping[str, str] | None = None
    ) -> BatchStatus:
        body: dict[str, Any] = {"input_file_id": file_id, "endpoint": ENDPOINT, "completion_window": window}
        if metadata:
            body["metadata"] = dict(metadata)
        obj = await self._call(
            "POST",
            "batches",
            json.dumps(body).encode(),
            what="the batch",
            fix="check batch.completion_window (OpenAI accepts only 24h)",
        )
        return BatchStatus.from_obj(obj, where=self.where)

    async def retrieve(self, batch_id: str) -> BatchStatus:
        obj = await self._call("GET", f"batches/{batch_id}", None, what=f"batch {batch_id}")
        return BatchStatus.from_obj(obj, where=self.where)

    async def cancel(self, batch_id: str) -> BatchStatus:
        obj = await self._call(
            "POST", f"batches/{batch_id}/cancel", None, what=f"cancelling batch {batch_id}"
        )
        return BatchStatus.from_obj(obj, where=self.where)

    async def content(self, file_id: str) -> bytes:
        """A file's bytes (``GET /v1/files/{id}/content``)."""
        return await self._send("GET", f"files/{file_id}/content", None, what=f"file {file_id}")

    async def _call(
        self,
        method: str,
        path: str,
        body: bytes | None,
        *,
        what: str,
        fix: str = "",
        content_type: str | None = None,
    ) -> dict[str, Any]:
        data = await self._send(method, path, body, what=what, fix=fix, content_type=content_type)
        try:
            obj = json.loads(data)
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            raise errors.ProtocolError(
                f"{self.where} answered {method} /{path} with something that is not a JSON "
                "object; check that base_url is an OpenAI-compatible API"
            )
        return obj

    async def _send(
        self,
        method: str,
        path: str,
        body: bytes | None,
        *,
        what: str,
        fix: str = "",
        content_type: str | None = None,
    ) -> bytes:
        headers = {"Content-Type": content_type} if content_type else None
        transport = self.client.transport

        async def attempt(_n: int) -> bytes:
            async with transport.request(
                method, path, body=body, phases=Phases(), extra_headers=headers
            ) as resp:
                data = await resp.aread()
            if resp.status >= 400:
                raise self._status_error(resp.status, data, resp.headers, method, path, what, fix)
            return data

        return await call_with_retries(attempt, self.client.retry)

    def _status_error(
        self,
        status: int,
        data: bytes,
        headers: Mapping[str, str],
        method: str,
        path: str,
        what: str,
        fix: str,
    ) -> errors.APIError:
        where = self.where
        if status == 404 and path in ("files", "batches"):
            return errors.NotFoundError(
                f"{where} has no Batch API (HTTP 404 on {method} /v1/{path}); send these "
                "jobs with --via direct",
                status=404,
                headers=headers,
            )
        if status == 404:
            return errors.NotFoundError(
                f"{where} knows no {what} (HTTP 404: {_detail(data)}); it may belong to "
                "another provider or server",
                status=404,
                headers=headers,
            )
        if status in (400, 409, 413, 422):
            advice = fix or ("split IN.jsonl into smaller files" if status == 413 else "check the jobs")
            return errors.HTTPStatusError(
                f"{where} refused {what} (HTTP {status}: {_detail(data)}); {advice}",
                status=status,
                headers=headers,
            )
        endpoint = self.client.endpoint
        return wire.status_error(
            status,
            data,
            content_type=headers.get("content-type", ""),
            headers=headers,
            where=where,
            key_source=endpoint.api_key_source,
            key_hint=None if endpoint.api_key else endpoint.api_key_hint,
            model=self.client.model,
        )


def _detail(data: bytes) -> str:
    try:
        return wire.error_text(json.loads(data))
    except (ValueError, AttributeError, TypeError):
        text = " ".join(data.decode("utf-8", "replace").split())
        return text[:80] or "no detail"


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


async def run_batch_api(
    client: ChatClient,
    jobs: Sequence[Job],
    out: TextIO,
    *,
    out_path: Path,
    settings: BatchSettings | None = None,
    summary: JobSummary | None = None,
    cancel: bool = False,
    on_status: Callable[[BatchStatus], None] | None = None,
    on_notice: Callable[[str], None] | None = None,
) -> BatchOutcome:
    """Run ``jobs`` (those OUT.jsonl does not hold yet) as one batch and write a line per result to ``out``.

    With a batch already recorded beside ``out_path`` it is picked up instead (``jobs`` then only decide which
    results are written, in their order); with ``cancel`` that batch is cancelled first, and whatever it
    finished is written. ``on_status`` sees every status polled, ``on_notice`` the lines worth saying (the
    batch's id when created or resumed). Raises UsageError for ``cancel`` with no batch recorded, and the
    ``APIError`` family, each one line, when a request fails for good; a batch created before that keeps
    running and stays recorded, so the next run resumes it. ``summary`` counts the lines written.
    """
    settings = settings or client.settings.batch
    summary = summary if summary is not None else JobSummary()
    api = BatchAPI(client)
    notice = on_notice or (lambda _line: None)
    path = state_path(out_path)
    state = _read_state(path)
    if state is None:
        if cancel:
            raise errors.UsageError(
                f"no batch is running for {out_path} (there is no {path.name}); nothing to cancel"
            )
        if not jobs:
            return BatchOutcome(None)
        model = client.model or await _first_model(client)
        data = batch_input(jobs, model)
        # The name is shown in the provider's dashboard; kept to characters a multipart header carries as is.
        stem = re.sub(r"[^A-Za-z0-9._-]", "_", out_path.stem)[:100]
        file_id = await api.upload(data, f"{stem}.batch-input.jsonl")
        status = await api.create(
            file_id, settings.completion_window, {"llmchat_output": out_path.name[:500]}
        )
        state = {
            "batch_id": status.id,
            "input_file_id": file_id,
            "base_url": mask_url(client.endpoint.base_url),
            "created_at": status.created_at,
            "ids": [j.id for j in jobs],
        }
        write_atomic(path, json.dumps(state, ensure_ascii=False) + "\n")
        notice(
            f"batch {status.id} created at {api.where} with {len(jobs)} job{'s' if len(jobs) != 1 else ''} "
            f"(completion window {settings.completion_window}); Ctrl-C leaves it running"
        )
        resumed = False
    else:
        status = await _resume_call(api.retrieve(state["batch_id"]), state["batch_id"], path)
        notice(f"resuming batch {status.id} ({status.status}, {status.done} of {status.total} done)")
        resumed = True
        if cancel and not status.finished:
            status = await _resume_call(api.cancel(status.id), status.id, path)
            notice(f"cancelling batch {status.id}; what it finished is kept")
    if on_status is not None:
        on_status(status)
    while not status.finished:
        await asyncio.sleep(settings.poll_interval_s)
        status = await _resume_call(api.retrieve(status.id), status.id, path)
        if on_status is not None:
            on_status(status)

    sent = [str(i) for i in state["ids"]]
    outcome = BatchOutcome(status, resumed=resumed)
    results: dict[str, dict[str, Any]] = {}
    for result_file in (status.output_file_id, status.error_file_id):
        if result_file:
            data = await _resume_call(api.content(result_file), status.id, path, downloading=True)
            results.update(_results(data, status.id, api.where))
    wanted = {j.id for j in jobs}
    written: set[str] = set()
    for job in jobs:
        line = results.pop(job.id, None)
        if line is None:
            continue
        out.write(json.dumps(line, ensure_ascii=False) + "\n")
        out.flush()
        written.add(job.id)
        if line["error"] is None:
            summary.ok += 1
        else:
            summary.failed += 1
            summary.refused += line.get("finish_reason") == "refusal"
    outcome.written = len(written)
    outcome.ignored = len(results)
    outcome.missing = [i for i in sent if i in wanted and i not in written]
    # Only now that every result is in OUT: a crash before this line downloads them again on the next run.
    path.unlink(missing_ok=True)
    outcome.problem = _problem(status, outcome, out_path, sent)
    return outcome


async def _first_model(client: ChatClient) -> str:
    offered = await client.models()
    if not offered:
        raise errors.UsageError(
            f"no model chosen for provider {client.endpoint.name!r} and its /models lists none; "
            f"pass --model or set providers.{client.endpoint.name}.model"
        )
    client.model = offered[0]
    return offered[0]


async def _resume_call(call: Any, batch_id: str, path: Path, *, downloading: bool = False) -> Any:
    """Await ``call``; a failure says the batch is still recorded and how to carry on (or let it go)."""
    try:
        return await call
    except errors.NotFoundError as exc:
        raise errors.NotFoundError(
            f"{exc}: delete {path} to send these jobs in a new batch", status=404
        ) from None
    except errors.APIError as exc:
        step = "download its results" if downloading else "resume polling"
        raise errors.APIError(
            f"{exc}; batch {batch_id} is kept in {path.name}: run the same command again to "
            f"{step} (or add --cancel)",
            status=exc.status,
        ) from None


def _results(data: bytes, batch_id: str, where: str) -> dict[str, dict[str, Any]]:
    """OUT.jsonl lines by custom_id, from an output or error file."""
    lines: dict[str, dict[str, Any]] = {}
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError:
            continue  # a line cut or garbled by the provider: its job gets no line and runs again
        if not isinstance(obj, dict) or not isinstance(obj.get("custom_id"), str):
            continue
        job_id = obj["custom_id"]
        lines[job_id] = _result_line(job_id, obj, batch_id, where)
    return lines


def _result_line(job_id: str, obj: Mapping[str, Any], batch_id: str, where: str) -> dict[str, Any]:
    """One OUT.jsonl line, shaped as the direct path writes it, from one line of a batch's output."""
    response = obj.get("response") if isinstance(obj.get("response"), Mapping) else None
    meta: dict[str, Any] = {"id": batch_id}
    if response is not None and isinstance(response.get("request_id"), str):
        meta["request_id"] = response["request_id"]
    line: dict[str, Any] = {"id": job_id}
    status = _int(response.get("status_code")) if response is not None else 0
    body = response.get("body") if response is not None else None
    if response is not None and 200 <= status < 300:
        try:
            reply = wire.parse_reply(
                json.dumps(body, ensure_ascii=False).encode(),
                status=status,
                content_type="application/json",
                where=where,
            )
        except errors.APIError as exc:
            line.update({"reply": None, "error": str(exc)})
        else:
            line.update(refused_line(reply.refusal, reply.usage) if reply.refusal else {
                "reply": reply.content,
                "finish_reason": reply.finish_reason,
                "usage": reply.usage,
                "error": None,
            })
    elif response is not None and status:
        data = json.dumps(body, ensure_ascii=False).encode() if not isinstance(body, str) else body.encode()
        error = wire.status_error(
            status,
            data,
            content_type="application/json",
            headers={},
            where=where,
            key_source="the batch",
            model=str((body or {}).get("model", "")) if isinstance(body, dict) else "",
        )
        line.update({"reply": None, "error": str(error)})
    else:
        raw_err = obj.get("error")
        err: Mapping[str, Any] = raw_err if isinstance(raw_err, Mapping) else {}
        code = str(err.get("code") or "error")
        message = " ".join(str(err.get("message") or "no detail").split())
        if code == "batch_expired":
            cause = f"batch {batch_id} expired before this job ran (batch_expired)"
        else:
            cause = f"{where} could not run this job in batch {batch_id} ({code}: {message})"
        text = f"{cause}; add --retry-failed to send it again"
        line.update({"reply": None, "error": text})
    line["batch"] = meta
    return line


def _problem(status: BatchStatus, outcome: BatchOutcome, out_path: Path, sent: list[str]) -> str | None:
    bid, n = status.id, len(sent)
    if status.status == "failed":
        first = status.errors[0] if status.errors else {}
        where = ""
        lineno = first.get("line")
        if isinstance(lineno, int) and 1 <= lineno <= n:
            where = f" (job {sent[lineno - 1]!r})"
        more = len(status.errors) - 1
        also = f" and {more} more problem{'s' if more != 1 else ''}" if more > 0 else ""
        detail = " ".join(str(first.get("message") or "no reason given").split())
        return (
            f"batch {bid} failed before any job ran: {detail}{where}{also}; fix the job, or send the jobs "
            "with --via direct"
        )
    if status.status == "expired":
        window = status.completion_window or "?"
        return (
            f"batch {bid} expired (completion window {window}) with {status.completed} of {n} jobs "
            f"answered; every result is in {out_path.name}: add --retry-failed to send the others again"
        )
    if status.status == "cancelled":
        return (
            f"batch {bid} cancelled with {outcome.written} of {n} jobs done, kept in {out_path.name}; run "
            f"the same command again to send the other {len(outcome.missing)}"
        )
    if outcome.missing:
        shown = ", ".join(repr(i) for i in outcome.missing[:3]) + (" ..." if len(outcome.missing) > 3 else "")
        return (
            f"batch {bid} {status.status} without a result for {len(outcome.missing)} job"
            f"{'s' if len(outcome.missing) != 1 else ''} ({shown}); run the same command again to send them"
        )
    return None


def elapsed_s(status: BatchStatus) -> float | None:
    """How long the batch took, creation to its end, by the provider's clock; None until it has ended."""
    if status.created_at is None or status.ended_at is None:
        return None
    return float(max(0, status.ended_at - status.created_at))
