"""OpenAI's Batch API, emulated: ``/v1/files`` (upload, list, retrieve, content, delete) and ``/v1/batches``
(create, retrieve, cancel, list), the lists paged by ``limit`` and ``after`` as OpenAI pages them.

A batch's lines go through the server's own chat reply path (``ChatResponder``: the latency profile,
``error_rate`` and ``max_concurrency`` apply to them as to live requests), started evenly over
``batch_turnaround_s``. Its status moves validating -> in_progress -> finalizing -> completed, or to failed
(an input file that breaks the format: nothing runs), expired or cancelled (cancelling first). Answered lines
go to the output file, refused ones (a status of 400 or more) to the error file, each as OpenAI writes them.
``batch_fail_share`` of the lines (which ones: by the seed) fail with a 500; with ``batch_expire`` a batch
expires once half its lines are done, the rest in the error file as ``batch_expired``. A cancel stops lines
from starting; those never started are in neither file. Everything is in memory: a restart forgets it all.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from llmchat.core.config import ServerSettings
from llmchat.core.server._chat import ChatResponder
from llmchat.core.server._encode import dumps, error_body
from llmchat.core.server._http import MAX_DRAIN, Exchange, HTTPFailure, Message
from llmchat.core.server._requests import parse_chat, parse_json

Handler = Callable[[Exchange], Awaitable[None]]

FILE_MAX_BODY = MAX_DRAIN
"""The largest upload /v1/files takes (OpenAI's is 200 MB; a test server needs less)."""
MAX_FILES_PAGE = 10_000
"""The largest ``limit`` of a file list, and its default, as OpenAI's."""
MAX_LINES = 50_000
"""Lines per batch, as OpenAI allows."""
ENDPOINTS = ("/v1/chat/completions",)
"""What a batch's lines may call here."""
PARALLEL = 16
"""Lines of one batch in the reply path at once."""
_PURPOSES = ("batch", "assistants", "fine-tune", "vision", "user_data", "evals")
_TERMINAL = ("completed", "failed", "expired", "cancelled")
_WINDOW = re.compile(r"([1-9][0-9]{0,4})([hd])")
_EXPIRED = {
    "code": "batch_expired",
    "message": "This request could not be executed before the completion window expired.",
}


@dataclass(slots=True)
class StoredFile:
    id: str
    filename: str
    purpose: str
    data: bytes
    created_at: int

    def obj(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.data),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


@dataclass(slots=True)
class Batch:
    id: str
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None
    created_at: int
    expires_at: int
    status: str = "validating"
    total: int = 0
    completed: int = 0
    failed: int = 0
    errors: list[dict[str, Any]] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    stamps: dict[str, int] = field(default_factory=dict)
    """When each later status began (``in_progress_at``, ``completed_at`` ...), wall-clock seconds."""
    task: asyncio.Task[None] | None = None
    model: str | None = None
    """The model the batch's lines ask for (its first line's; None when that line says nothing readable)."""
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    def count(self, usage: object) -> None:
        """Add an answered line's ``usage`` (a chat completion's) to the batch's."""
        if not isinstance(usage, dict):
            return
        self.input_tokens += _tokens(usage, "prompt_tokens")
        self.output_tokens += _tokens(usage, "completion_tokens")
        self.cached_tokens += _tokens(usage.get("prompt_tokens_details"), "cached_tokens")
        self.reasoning_tokens += _tokens(usage.get("completion_tokens_details"), "reasoning_tokens")

    def enter(self, status: str) -> None:
        self.status = status
        self.stamps[f"{status}_at"] = int(time.time())

    def obj(self) -> dict[str, Any]:
        stamps = ("in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": None if self.errors is None else {"object": "list", "data": self.errors},
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            **{f"{s}_at": self.stamps.get(f"{s}_at") for s in stamps},
            "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed},
            "metadata": self.metadata,
            "model": self.model,
            # OpenAI's Batch usage: the answered lines' tokens so far, named as the Responses API names them.
            "usage": {
                "input_tokens": self.input_tokens,
                "input_tokens_details": {"cached_tokens": self.cached_tokens},
                "output_tokens": self.output_tokens,
                "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
                "total_tokens": self.input_tokens + self.output_tokens,
            },
        }


def _tokens(obj: object, name: str) -> int:
    value = obj.get(name) if isinstance(obj, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class BatchEmulator:
    """The files and batches of one server, and the tasks that run its batches."""

    def __init__(
        self,
        settings: ServerSettings,
        chat: ChatResponder,
        models: list[str],
        authorize: Callable[[Exchange], Any],
    ) -> None:
        self.settings = settings
        self.chat = chat
        self.models = models
        self._authorize = authorize
        self.files: dict[str, StoredFile] = {}
        self.batches: dict[str, Batch] = {}

    def routes(self, path: str) -> dict[str, Handler] | None:
        """The handlers, by method, for ``path`` (no trailing slash); None for a path that is not the Batch
        API's."""
        if path == "/v1/files":
            return {"POST": self._upload, "GET": self._list_files}
        if path == "/v1/batches":
            return {"POST": self._create, "GET": self._list}
        parts = path.split("/")[3:]  # "", "v1", "files" | "batches", then the id and maybe an action
        if path.startswith("/v1/files/") and len(parts) == 1:
            return {"GET": self._retrieve_file, "DELETE": self._delete_file}
        if path.startswith("/v1/files/") and len(parts) == 2 and parts[1] == "content":
            return {"GET": self._content}
        if path.startswith("/v1/batches/") and len(parts) == 1:
            return {"GET": self._retrieve}
        if path.startswith("/v1/batches/") and len(parts) == 2 and parts[1] == "cancel":
            return {"POST": self._cancel}
        return None

    async def aclose(self) -> None:
        """Stop every batch still running (the server is stopping; they are forgotten with it)."""
        tasks = [b.task for b in self.batches.values() if b.task is not None and not b.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- files -----------------------------------------------------------------------------------------------
    async def _upload(self, ex: Exchange) -> None:
        self._authorize(ex)
        fields = parse_multipart(ex.body, (ex.header(b"content-type") or b"").decode("latin-1"))
        purpose = fields.get("purpose")
        if purpose is None:
            raise HTTPFailure.missing("purpose")
        upload = fields.get("file")
        if upload is None or upload[0] is None:
            raise HTTPFailure.missing("file")
        kind = purpose[1].decode("utf-8", "replace")
        if kind not in _PURPOSES:
            raise _unsupported("purpose", kind, _PURPOSES)
        stored = self._store(upload[0], kind, upload[1])
        await ex.respond(200, dumps(stored.obj()))

    def _store(self, filename: str, purpose: str, data: bytes) -> StoredFile:
        stored = StoredFile("file-" + os.urandom(12).hex(), filename, purpose, data, int(time.time()))
        self.files[stored.id] = stored
        return stored

    def _file(self, ex: Exchange) -> StoredFile:
        file_id = ex.path.rstrip("/").split("/")[3]
        stored = self.files.get(file_id)
        if stored is None:
            raise HTTPFailure(404, f"No such File object: {file_id[:100]}", code="file_not_found", param="id")
        return stored

    async def _list_files(self, ex: Exchange) -> None:
        """OpenAI's file list: ``order`` by creation (``desc``, newest first, by default), ``purpose``,
        ``limit`` (1 to 10,000, default 10,000) and ``after`` (a file id: the page after it)."""
        self._authorize(ex)
        query = _query(ex)
        order = query.get("order", ["desc"])[0]
        if order not in ("asc", "desc"):
            raise _unsupported("order", order, ("asc", "desc"))
        files = list(self.files.values())  # stored in this order, and created_at has ties
        if order == "desc":
            files.reverse()
        purpose = query.get("purpose", [""])[0]
        if purpose:
            files = [f for f in files if f.purpose == purpose]
        await ex.respond(200, dumps(_page(files, query, MAX_FILES_PAGE)))

    async def _delete_file(self, ex: Exchange) -> None:
        self._authorize(ex)
        stored = self._file(ex)
        del self.files[stored.id]
        await ex.respond(200, dumps({"id": stored.id, "object": "file", "deleted": True}))

    async def _retrieve_file(self, ex: Exchange) -> None:
        self._authorize(ex)
        await ex.respond(200, dumps(self._file(ex).obj()))

    async def _content(self, ex: Exchange) -> None:
        self._authorize(ex)
        await ex.respond(200, self._file(ex).data, content_type=b"application/octet-stream")

    # -- batches ---------------------------------------------------------------------------------------------
    async def _create(self, ex: Exchange) -> None:
        self._authorize(ex)
        body = parse_json(ex.body)
        file_id = body.get("input_file_id")
        if not isinstance(file_id, str) or not file_id:
            raise HTTPFailure.missing("input_file_id")
        stored = self.files.get(file_id)
        if stored is None:
            raise HTTPFailure(
                404, f"No such File object: {file_id[:100]}", code="file_not_found", param="input_file_id"
            )
        if stored.purpose != "batch":
            raise HTTPFailure(
                400,
                f"File {file_id} has purpose {stored.purpose!r}; a batch's input file must be "
                "uploaded with purpose 'batch'.",
                code="invalid_value",
                param="input_file_id",
            )
        endpoint = body.get("endpoint")
        if endpoint not in ENDPOINTS:
            raise _unsupported("endpoint", endpoint, ENDPOINTS)
        window = body.get("completion_window")
        match = _WINDOW.fullmatch(window) if isinstance(window, str) else None
        if match is None:
            raise HTTPFailure(
                400,
                f"Invalid value for 'completion_window': {str(window)[:40]!r}. Expected a "
                "number of hours or days, such as '24h'.",
                code="invalid_value",
                param="completion_window",
            )
        metadata = body.get("metadata")
        if metadata is not None and not (
            isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
        ):
            raise HTTPFailure(
                400,
                "Invalid type for 'metadata': expected an object of strings.",
                code="invalid_type",
                param="metadata",
            )
        now = int(time.time())
        seconds = int(match[1]) * (3600 if match[2] == "h" else 86400)
        batch = Batch(
            "batch_" + os.urandom(12).hex(), file_id, str(endpoint), str(window), metadata, now, now + seconds,
            model=self._model_of(stored.data),
        )
        self.batches[batch.id] = batch
        batch.task = asyncio.get_running_loop().create_task(self._run(batch, stored.data))
        await ex.respond(200, dumps(batch.obj()))

    def _model_of(self, data: bytes) -> str | None:
        """The model the first line of an input file asks for (the default model when its body names none);
        None when that line is not a request. The batch's lines are checked one by one later."""
        first = next((line for line in data.split(b"\n") if line.strip()), b"")
        try:
            obj = json.loads(first)
        except ValueError:
            return None
        body = obj.get("body") if isinstance(obj, dict) else None
        if not isinstance(body, dict):
            return None
        model = body.get("model")
        if isinstance(model, str):
            return model
        return self.models[0] if model is None else None

    def _batch(self, ex: Exchange) -> Batch:
        batch_id = ex.path.rstrip("/").split("/")[3]
        batch = self.batches.get(batch_id)
        if batch is None:
            raise HTTPFailure(
                404, f"No batch found with id '{batch_id[:100]}'.", code="not_found", param="id"
            )
        return batch

    async def _retrieve(self, ex: Exchange) -> None:
        self._authorize(ex)
        await ex.respond(200, dumps(self._batch(ex).obj()))

    async def _cancel(self, ex: Exchange) -> None:
        self._authorize(ex)
        batch = self._batch(ex)
        if batch.status in ("completed", "failed", "expired"):
            raise HTTPFailure(409, f"Cannot cancel a batch with status '{batch.status}'.", code="conflict")
        if batch.status not in ("cancelling", "cancelled"):
            batch.enter("cancelling")
        await ex.respond(200, dumps(batch.obj()))

    async def _list(self, ex: Exchange) -> None:
        self._authorize(ex)
        newest = list(reversed(self.batches.values()))  # created in this order, and created_at has ties
        await ex.respond(200, dumps(_page(newest, _query(ex), 100, 20)))

    # -- running a batch -------------------------------------------------------------------------------------
    async def _run(self, batch: Batch, data: bytes) -> None:
        try:
            await self._process(batch, data)
        except Exception as exc:  # a bug here must fail the batch, not leave it in progress for good
            print(
                f"llmchat serve: internal error in {batch.id}: {exc.__class__.__name__}: {exc}",
                file=sys.stderr,
            )
            batch.errors = [
                {
                    "code": "server_error",
                    "message": "The server had an error while running the batch.",
                    "param": None,
                    "line": None,
                }
            ]
            batch.enter("failed")

    async def _process(self, batch: Batch, data: bytes) -> None:
        lines = self._validate(batch, data)
        await asyncio.sleep(0)  # validating is a status a poll can see, however briefly
        if lines is None:
            batch.enter("failed")
            return
        batch.total = len(lines)
        if batch.status == "cancelling":
            self._finish(batch, [], [], "cancelled")
            return
        batch.enter("in_progress")
        loop = asyncio.get_running_loop()
        start = loop.time()
        turnaround = self.settings.batch_turnaround_s
        n = len(lines)
        run_n = n // 2 if self.settings.batch_expire else n
        failing = set(
            random.Random(self.settings.seed).sample(range(n), round(self.settings.batch_fail_share * n))
        )
        outputs: list[tuple[int, dict[str, Any]]] = []
        errors: list[tuple[int, dict[str, Any]]] = []
        slots = asyncio.Semaphore(PARALLEL)

        async def one(i: int) -> None:
            try:
                status, result = await self._line(lines[i], 500 if i in failing else None)
                (outputs if status < 400 else errors).append((i, result))
                if status < 400:
                    batch.completed += 1
                    body = result["response"]["body"]
                    batch.count(body.get("usage") if isinstance(body, dict) else None)
                else:
                    batch.failed += 1
            finally:
                slots.release()

        running: list[asyncio.Task[None]] = []
        try:
            for i in range(run_n):
                due = start + turnaround * i / n
                while batch.status != "cancelling" and loop.time() < due:
                    await asyncio.sleep(min(0.05, due - loop.time()))
                if batch.status == "cancelling":
                    break
                await slots.acquire()
                running.append(loop.create_task(one(i)))
            await asyncio.gather(*running)
        except asyncio.CancelledError:
            for task in running:
                task.cancel()
            raise
        if batch.status == "cancelling":
            self._finish(batch, outputs, errors, "cancelled")
            return
        end = start + turnaround
        while batch.status != "cancelling" and loop.time() < end:
            await asyncio.sleep(min(0.05, end - loop.time()))
        if batch.status == "cancelling":
            self._finish(batch, outputs, errors, "cancelled")
            return
        if run_n < n:
            for i in range(run_n, n):
                errors.append(
                    (
                        i,
                        {
                            "id": _request_id(),
                            "custom_id": lines[i]["custom_id"],
                            "response": None,
                            "error": dict(_EXPIRED),
                        },
                    )
                )
            batch.failed += n - run_n
            self._finish(batch, outputs, errors, "expired")
            return
        batch.enter("finalizing")
        await asyncio.sleep(0)
        self._finish(batch, outputs, errors, "completed")

    def _finish(
        self,
        batch: Batch,
        outputs: list[tuple[int, dict[str, Any]]],
        errors: list[tuple[int, dict[str, Any]]],
        status: str,
    ) -> None:
        """Write the output and error files (lines in input order) and enter ``status``."""
        for results, attr, name in (
            (outputs, "output_file_id", "output"),
            (errors, "error_file_id", "error"),
        ):
            if results:
                text = b"".join(dumps(r) + b"\n" for _, r in sorted(results, key=lambda x: x[0]))
                stored = self._store(f"{batch.id}_{name}.jsonl", "batch_output", text)
                setattr(batch, attr, stored.id)
        batch.enter(status)

    def _validate(self, batch: Batch, data: bytes) -> list[dict[str, Any]] | None:
        """The input file's lines, checked; None, with ``batch.errors`` set (the first 10), if any is bad."""
        problems: list[dict[str, Any]] = []
        lines: list[dict[str, Any]] = []
        seen: set[str] = set()

        def problem(lineno: int | None, code: str, message: str, param: str | None = None) -> None:
            problems.append({"code": code, "message": message, "param": param, "line": lineno})

        text = data.decode("utf-8", "replace")
        for lineno, raw in enumerate(text.split("\n"), 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except ValueError:
                problem(lineno, "invalid_json_line", "This line is not parseable as valid JSON.")
                continue
            if not isinstance(obj, dict):
                problem(lineno, "invalid_json_line", "This line is not a JSON object.")
                continue
            custom_id = obj.get("custom_id")
            if not isinstance(custom_id, str) or not custom_id:
                problem(
                    lineno,
                    "missing_required_parameter",
                    "Missing required parameter: 'custom_id'.",
                    "custom_id",
                )
            elif custom_id in seen:
                problem(
                    lineno,
                    "duplicate_custom_id",
                    "The custom_id for this request is a duplicate of another request. The custom_id "
                    "parameter must be unique for each request in a batch.",
                    "custom_id",
                )
            else:
                seen.add(custom_id)
            if obj.get("method") != "POST":
                problem(
                    lineno, "invalid_value", "Invalid value for 'method': only 'POST' is supported.", "method"
                )
            if obj.get("url") != batch.endpoint:
                problem(
                    lineno,
                    "mismatched_endpoint",
                    f"The provided endpoint {str(obj.get('url'))[:60]!r} does not match the batch's endpoint "
                    f"{batch.endpoint!r}.",
                    "url",
                )
            if not isinstance(obj.get("body"), dict):
                problem(lineno, "invalid_type", "Invalid type for 'body': expected an object.", "body")
            lines.append(obj)
        if not lines and not problems:
            problem(None, "empty_file", "The batch input file is empty.")
        if len(lines) > MAX_LINES:
            problem(
                None,
                "too_many_requests",
                f"The batch input file has {len(lines)} requests; the limit is {MAX_LINES}.",
            )
        if problems:
            batch.errors = problems[:10]
            return None
        return lines

    async def _line(self, line: dict[str, Any], fail: int | None) -> tuple[int, dict[str, Any]]:
        """One line through the chat reply path: (its status, its line for the output or error file)."""
        loop = asyncio.get_running_loop()
        capture = _Capture()
        scope = {
            "type": "http",
            "method": "POST",
            "path": line["url"],
            "headers": [],
            "http_version": "1.1",
            "client": None,
            "query_string": b"",
        }
        ex = Exchange(scope, _never, capture.send, time.monotonic_ns(), loop.time())
        try:
            if fail is not None:
                raise HTTPFailure(
                    fail, "The server had an error while processing your request.", type_="server_error"
                )
            body = line["body"]
            if body.get("stream"):
                raise HTTPFailure(
                    400,
                    "Streaming is not supported in the Batch API; drop 'stream' from the body.",
                    code="invalid_value",
                    param="stream",
                )
            await self.chat.reply(ex, parse_chat(body, self.models))
        except HTTPFailure as failure:
            capture.status, capture.body = failure.status, bytearray(failure.body)
        except Exception as exc:  # a bug must not stop the batch: the line fails as a live request would
            print(
                f"llmchat serve: internal error on a batch line: {exc.__class__.__name__}: {exc}",
                file=sys.stderr,
            )
            capture.status = 500
            capture.body = bytearray(
                error_body("The server had an error while processing your request.", "server_error")
            )
        try:
            reply: Any = json.loads(capture.body)
        except ValueError:
            reply = capture.body.decode("utf-8", "replace")
        response = {"status_code": capture.status, "request_id": "req_" + os.urandom(8).hex(), "body": reply}
        return capture.status, {
            "id": _request_id(),
            "custom_id": line["custom_id"],
            "response": response,
            "error": None,
        }


class _Capture:
    """The ASGI ``send`` of a batch line: keeps the status and body its reply would have sent."""

    def __init__(self) -> None:
        self.status = 0
        self.body = bytearray()

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
        elif message["type"] == "http.response.body":
            self.body += message.get("body", b"")


async def _never() -> Message:
    # A batch line has no client to hear from: the reply path never reads from it.
    await asyncio.get_running_loop().create_future()
    raise AssertionError("unreachable")


def _unsupported(param: str, value: object, allowed: tuple[str, ...]) -> HTTPFailure:
    listed = ", ".join(f"'{v}'" for v in allowed)
    return HTTPFailure(
        400,
        f"Invalid value for '{param}': {str(value)[:60]!r}. Supported values are: {listed}.",
        code="invalid_value",
        param=param,
    )


def _query(ex: Exchange) -> dict[str, list[str]]:
    return parse_qs(bytes(ex.scope.get("query_string", b"")).decode("latin-1"))


def _page(
    items: Sequence[StoredFile] | Sequence[Batch], query: dict[str, list[str]], most: int, default: int | None = None
) -> dict[str, Any]:
    """One page of a cursor-paged list as OpenAI sends it (``object``, ``data``, ``first_id``, ``last_id``,
    ``has_more``): the ``limit`` items (1 to ``most``, default ``default`` or ``most``) after the one whose id
    is ``after``. HTTPFailure 400 for a bad limit."""
    raw = query.get("limit", [str(default or most)])[0]
    limit = int(raw) if raw.isdigit() else -1
    if not 1 <= limit <= most:
        raise HTTPFailure(
            400,
            f"Invalid value for 'limit': it must be a whole number from 1 to {most:,}.",
            code="invalid_value",
            param="limit",
        )
    after = query.get("after", [""])[0]
    if after:
        ids = [item.id for item in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    page = items[:limit]
    return {
        "object": "list",
        "data": [item.obj() for item in page],
        "first_id": page[0].id if page else None,
        "last_id": page[-1].id if page else None,
        "has_more": len(items) > limit,
    }


def _request_id() -> str:
    return "batch_req_" + os.urandom(12).hex()


_BOUNDARY = re.compile(r'boundary=(?:"([^"]+)"|([^\s;]+))', re.IGNORECASE)
_DISPOSITION_PARAM = re.compile(r'\b(name|filename)="((?:[^"\\]|\\.)*)"', re.IGNORECASE)


def parse_multipart(body: bytes, content_type: str) -> dict[str, tuple[str | None, bytes]]:
    """A ``multipart/form-data`` body as {field name: (filename or None, bytes)}; HTTPFailure 400 when it is
    not one (the wrong content type, no boundary, a part without a name)."""
    match = _BOUNDARY.search(content_type)
    if not content_type.lower().startswith("multipart/form-data") or match is None:
        raise HTTPFailure(
            400,
            "Uploads must be sent as multipart/form-data with a boundary (fields 'purpose' and 'file').",
            code="invalid_request",
        )
    delimiter = b"\r\n--" + (match[1] or match[2]).encode("latin-1")
    pieces = (b"\r\n" + body).split(delimiter)
    if len(pieces) < 3 or not pieces[-1].startswith(b"--"):
        raise HTTPFailure(
            400, "The multipart/form-data body is cut short or malformed.", code="invalid_request"
        )
    fields: dict[str, tuple[str | None, bytes]] = {}
    for piece in pieces[1:-1]:
        head, sep, content = piece.partition(b"\r\n\r\n")
        if not sep:
            raise HTTPFailure(
                400, "A part of the multipart/form-data body has no headers.", code="invalid_request"
            )
        params: dict[str, str] = {}
        for line in head.decode("utf-8", "replace").split("\r\n"):
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-disposition":
                params = {k.lower(): v.replace('\\"', '"') for k, v in _DISPOSITION_PARAM.findall(value)}
        if "name" not in params:
            raise HTTPFailure(
                400, "A part of the multipart/form-data body has no name.", code="invalid_request"
            )
        fields[params["name"]] = (params.get("filename"), content)
    return fields
