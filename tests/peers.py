"""Misbehaving HTTP/1.1 peers for the client's error tests: tiny raw asyncio servers on 127.0.0.1, port 0.

A ``Peer`` answers every request with the same script: byte strings written as they are and ``Pause``s
slept in between, then it closes the connection, keeps it for the next request, or holds it open without a
word (``then="hang"``). It runs on its own event loop in a daemon thread, so the same peer serves an async
test's client and the CLI's ``asyncio.run`` alike. Everything is bounded: a hang lasts until the peer is
closed (or ``HANG_CAP_S``), and ``close`` cuts every connection and joins the thread with a timeout.

The builders below write what real peers send: an nginx 502 page, chunked SSE bodies with OpenAI-shaped
chunks, llama.cpp's bare ``error:`` line, and whole JSON replies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

HANG_CAP_S = 20.0
"""The longest a peer holds a silent connection: past every timeout a test sets, short of a stuck suite."""
_IO_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class Pause:
    """A deliberate gap between two writes, in seconds."""

    seconds: float


Step = bytes | Pause


class Peer:
    """A raw HTTP/1.1 server on 127.0.0.1 that answers each request with ``steps``.

    ``then``: ``"close"`` closes the connection after the script, ``"keep"`` waits for the next request on
    it, ``"hang"`` holds it open and silent, ``"reset"`` aborts it with a TCP reset (as a TLS server does to
    plain http, or a crashed process). ``requests`` counts the requests read so far.
    """

    def __init__(
        self,
        steps: Sequence[Step],
        *,
        then: Literal["close", "keep", "hang", "reset"] = "close",
        later: Sequence[Step] | None = None,
        chat_only: bool = False,
    ) -> None:
        self.steps = list(steps)
        self.chat_only = chat_only
        """Script only chat completions: any other request (the app's GET /models for the context window, its
        POST /tokenize) gets a 404 and is not counted in ``requests``."""
        self.later = None if later is None else list(later)
        """The script for every request after the first (a 429, then the answer); None: ``steps`` again."""
        self.then = then
        self.requests = 0
        self.request_lines: list[str] = []
        """Every request's first line as it arrived (``POST /v1/chat/completions?x=1 HTTP/1.1``), unscripted
        ones too."""
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="test-peer", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> Peer:
        """Start listening; returns once the port is bound. Raises RuntimeError if that takes over 5 s."""
        self._thread.start()
        if not self._ready.wait(_IO_TIMEOUT_S):
            raise RuntimeError("test peer did not start listening within 5 s")
        if self._error is not None:
            raise RuntimeError(f"test peer failed to start: {self._error!r}")
        return self

    def close(self) -> None:
        """Cut every connection, stop the loop and join the thread (bounded). Safe to call twice."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop already stopped
                loop.call_soon_threadsafe(stop.set)
        self._thread.join(_IO_TIMEOUT_S)

    def __enter__(self) -> Peer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to start(); a peer must never take the test runner down
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            tasks.add(task)
            try:
                await self._connection(reader, writer)
            except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
                pass  # the client went away or sent nothing: nothing to answer
            finally:
                tasks.discard(task)
                writer.close()

        server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()
            server.close()
            for task in list(tasks):
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=_IO_TIMEOUT_S)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._stop is not None
        while True:
            request = await asyncio.wait_for(_read_request(reader), _IO_TIMEOUT_S)
            self.request_lines.append(request.split(b"\r\n", 1)[0].decode("latin-1"))
            if self.chat_only and b"/chat/completions " not in request.split(b"\r\n", 1)[0]:
                writer.write(json_response(404, {"error": {"message": "not scripted"}}))
                await writer.drain()
                continue
            self.requests += 1
            script = self.steps if self.requests == 1 or self.later is None else self.later
            for step in script:
                if isinstance(step, Pause):
                    await asyncio.sleep(step.seconds)
                else:
                    writer.write(step)
                    await writer.drain()
            if self.then == "hang":
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), HANG_CAP_S)
                return
            if self.then == "close":
                return
            if self.then == "reset":
                # SO_LINGER with a zero timeout makes close() send RST instead of FIN.
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's head and Content-Length body. Raises IncompleteReadError when the client closes."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    body = await reader.readexactly(length) if length else b""
    return head + body


# -- what peers send -----------------------------------------------------------------------------------------
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 413: "Request Entity Too Large",
            429: "Too Many Requests", 500: "Internal Server Error",
            502: "Bad Gateway", 503: "Service Unavailable"}


def response(status: int, body: bytes, *, content_type: str, headers: dict[str, str] | None = None) -> bytes:
    """A whole HTTP/1.1 response with a Content-Length."""
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}", f"Content-Type: {content_type}",
             f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def json_response(status: int, obj: Any, *, headers: dict[str, str] | None = None) -> bytes:
    return response(status, json.dumps(obj).encode(), content_type="application/json", headers=headers)


NGINX_502_TITLE = "502 Bad Gateway"
NGINX_502 = response(
    502,
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx/1.25.3</center>\r\n"
    b"</body>\r\n</html>\r\n",
    content_type="text/html",
)
"""What nginx answers when the upstream behind it is down."""

SSE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
"""The head of a chunked event stream: each ``chunk`` after it is one write, ``END`` ends the body cleanly."""
END = b"0\r\n\r\n"


def chunk(payload: bytes) -> bytes:
    """One chunk of a chunked body."""
    return f"{len(payload):x}\r\n".encode() + payload + b"\r\n"


def event(obj: Any) -> bytes:
    """One SSE event, ``data: <json>``, as its own chunk."""
    return chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")


def raw_line(text: str) -> bytes:
    """Any line, as its own chunk: a ``data:`` that is not JSON, llama.cpp's ``error: {...}`` ..."""
    return chunk(text.encode() + b"\n\n")


DONE = chunk(b"data: [DONE]\n\n")


def delta(
    content: str | None = None,
    *,
    role: str | None = None,
    reasoning_content: str | None = None,
    reasoning: str | None = None,
    finish_reason: str | None = None,
) -> dict[str, Any]:
    """A ``chat.completion.chunk`` with one choice; only the fields given appear in its delta."""
    d: dict[str, Any] = {}
    if role is not None:
        d["role"] = role
    if content is not None:
        d["content"] = content
    if reasoning_content is not None:
        d["reasoning_content"] = reasoning_content
    if reasoning is not None:
        d["reasoning"] = reasoning
    return {"id": "chatcmpl-peer", "object": "chat.completion.chunk", "created": 0, "model": "peer-model",
            "choices": [{"index": 0, "delta": d, "finish_reason": finish_reason}]}


def usage_chunk(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """The final chunk ``stream_options.include_usage`` asks for: no choices, only usage."""
    return {"id": "chatcmpl-peer", "object": "chat.completion.chunk", "created": 0, "model": "peer-model",
            "choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                     "total_tokens": prompt_tokens + completion_tokens}}


def completion(text: str, *, finish_reason: str = "stop") -> dict[str, Any]:
    """A whole ``chat.completion`` object, as a server that ignores ``stream: true`` sends it."""
    return {"id": "chatcmpl-peer", "object": "chat.completion", "created": 0, "model": "peer-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}


# -- an HTTP/2 peer (h2c, prior knowledge), on the h2 library ------------------------------------------------
class H2Peer(Peer):
    """A scripted h2c server on 127.0.0.1, on the ``h2`` library, in a thread of its own like ``Peer``.

    ``mode``:
    - ``"stream"``: every POST gets a 200 event stream of ``chunks`` chunks, one each ``interval_s``, then
      [DONE]; GET /models lists ``peer-model``.
    - ``"refuse"``: a POST gets ``refuse_status`` with a JSON error as soon as its HEADERS arrive, then
      RST_STREAM (``reset_code``; NO_ERROR is nginx's "stop sending"), while the body is still coming: the
      initial window is 16 KiB and no WINDOW_UPDATE is ever sent, so a larger body cannot all go out.
      ``refuse_after_ack``: the answer waits until the client has acknowledged the peer's SETTINGS, so the
      client has seen its stream's window shrink below what it already sent (negative, RFC 9113 6.9.2).
    - ``"http11"``: answers the h2c preface with an HTTP/1.1 400 at once and keeps the connection open, as
      llama-server does.
    - ``"goaway-cut"``: as ``"stream"``, but after two chunks sends a GOAWAY naming the stream as its last,
      and closes the connection mid-reply.

    ``resets`` records each RST_STREAM received as ``(stream_id, error_code)``; ``ended`` the stream ids whose
    reply the peer sent to its end; ``requests`` counts the requests seen; ``protocol_errors`` what h2 found
    wrong in what the client sent (the peer then ends the connection with h2's GOAWAY, as a server does).
    All bounded like ``Peer``'s.

    Its SETTINGS (a 16 KiB initial window) bind from the client's ACK on, as RFC 9113 6.9.2 has it: until then
    the client may send on the default 65,535 bytes, and the peer takes that, as nginx does.
    """

    def __init__(self, mode: Literal["stream", "refuse", "http11", "goaway-cut"] = "stream", *,
                 chunks: int = 200, interval_s: float = 0.01, refuse_status: int = 413, reset_code: int = 0,
                 refuse_after_ack: bool = False) -> None:
        super().__init__([])
        self.mode = mode
        self.chunks = chunks
        self.interval_s = interval_s
        self.refuse_status = refuse_status
        self.reset_code = reset_code
        self.refuse_after_ack = refuse_after_ack
        self.protocol_errors: list[str] = []
        self.resets: list[tuple[int, int]] = []
        self.ended: list[int] = []

    def __enter__(self) -> H2Peer:
        self.start()
        return self

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._stop is not None
        if self.mode == "http11":
            await asyncio.wait_for(reader.read(64), _IO_TIMEOUT_S)
            writer.write(response(400, b"Bad Request", content_type="text/plain"))
            await writer.drain()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), HANG_CAP_S)
            return
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        window = h2.settings.SettingCodes.INITIAL_WINDOW_SIZE
        streams = h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS
        conn.local_settings = h2.settings.Settings(client=False, initial_values={window: 16384, streams: 100})
        conn.initiate_connection()  # the SETTINGS frame says 16 KiB ...
        writer.write(conn.data_to_send())
        # ... which binds once the client ACKs it: until then a stream's window is the default 65,535, and a
        # client that sent that much before it read the SETTINGS broke no rule (h2 would take the values given
        # to Settings() as in force at once, and fail the connection with FLOW_CONTROL_ERROR).
        conn.local_settings = h2.settings.Settings(client=False, initial_values={streams: 100})
        conn.local_settings[window] = 16384
        # With refuse_after_ack, the POSTs waiting for the client's SETTINGS ACK (None once it came).
        unanswered: list[int] | None = [] if self.refuse_after_ack else None
        streaming: dict[int, asyncio.Task[None]] = {}
        paths: dict[int, tuple[str, str]] = {}
        bodies: dict[int, bytes] = {}

        def flush() -> None:
            data = conn.data_to_send()
            if data:
                writer.write(data)

        async def stream_reply(sid: int) -> None:
            conn.send_headers(sid, [(":status", "200"), ("content-type", "text/event-stream")])
            flush()
            try:
                for i in range(self.chunks):
                    await asyncio.sleep(self.interval_s)
                    conn.send_data(sid, b"data: " + json.dumps(delta(f"t{i} ")).encode() + b"\n\n")
                    flush()
                    if self.mode == "goaway-cut" and i == 1:
                        # nginx retiring the connection (GOAWAY naming this stream), then gone mid-reply.
                        conn.close_connection(last_stream_id=sid)
                        flush()
                        await writer.drain()
                        writer.close()
                        return
                conn.send_data(sid, b"data: [DONE]\n\n", end_stream=True)
                flush()
            except h2.exceptions.StreamClosedError:
                return  # the client reset it
            self.ended.append(sid)

        def refuse(sid: int) -> None:
            body = json.dumps({"error": {"message": "Request Entity Too Large"}}).encode()
            conn.send_headers(sid, [(":status", str(self.refuse_status)), ("content-type", "application/json"),
                                    ("content-length", str(len(body)))])
            conn.send_data(sid, body)
            conn.reset_stream(sid, self.reset_code)

        while not self._stop.is_set():
            data = await asyncio.wait_for(reader.read(65536), HANG_CAP_S)
            if not data:
                return
            try:
                events = conn.receive_data(data)
            except h2.exceptions.ProtocolError as exc:
                # h2 has queued its GOAWAY with the error's code: sent, and the connection ends.
                self.protocol_errors.append(f"{type(exc).__name__}: {exc}")
                flush()
                await writer.drain()
                return
            for ev in events:
                if isinstance(ev, h2.events.RequestReceived):
                    self.requests += 1
                    headers: dict[Any, Any] = dict(ev.headers or [])
                    paths[ev.stream_id] = (headers[":method"], headers[":path"])
                    method, path = paths[ev.stream_id]
                    if method == "GET":
                        body = json.dumps({"object": "list", "data": [{"id": "peer-model"}]}).encode()
                        conn.send_headers(ev.stream_id, [(":status", "200"), ("content-type", "application/json"),
                                                         ("content-length", str(len(body)))])
                        conn.send_data(ev.stream_id, body, end_stream=True)
                    elif self.mode == "refuse":
                        if unanswered is not None:
                            unanswered.append(ev.stream_id)
                        else:
                            refuse(ev.stream_id)
                    elif ev.stream_ended is not None:
                        streaming[ev.stream_id] = asyncio.create_task(stream_reply(ev.stream_id))
                elif isinstance(ev, h2.events.DataReceived):
                    bodies[ev.stream_id] = bodies.get(ev.stream_id, b"") + ev.data
                elif isinstance(ev, h2.events.StreamEnded) and self.mode in ("stream", "goaway-cut"):
                    if ev.stream_id not in streaming and paths.get(ev.stream_id, ("", ""))[0] == "POST":
                        if json.loads(bodies.get(ev.stream_id, b"{}")).get("stream"):
                            streaming[ev.stream_id] = asyncio.create_task(stream_reply(ev.stream_id))
                        else:
                            body = json.dumps(completion("whole")).encode()
                            conn.send_headers(ev.stream_id, [(":status", "200"),
                                                             ("content-type", "application/json")])
                            conn.send_data(ev.stream_id, body, end_stream=True)
                            self.ended.append(ev.stream_id)
                elif isinstance(ev, h2.events.SettingsAcknowledged) and unanswered is not None:
                    for sid in unanswered:
                        refuse(sid)
                    unanswered = None
                elif isinstance(ev, h2.events.StreamReset):
                    self.resets.append((ev.stream_id, int(ev.error_code)))
                    task = streaming.pop(ev.stream_id, None)
                    if task is not None:
                        task.cancel()
            flush()
            await writer.drain()
