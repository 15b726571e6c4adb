"""Retiring a connection after so many requests, as nginx does (``keepalive_requests``, 1,000 by default).

HTTP/1.1: hypercorn's ``keep_alive_max_requests`` does what nginx does. The response to the last request says
``Connection: close`` and the connection closes after it.

HTTP/2: hypercorn sends its GOAWAY on the request after the last, through h2, whose state machine then refuses
to send anything more (python-hyper/h2#1181). Every reply still in flight on the connection is lost, even the
ones the GOAWAY promised to finish. nginx sends GOAWAY (NO_ERROR, last stream id = the last request's) as that
request arrives, finishes the streams up to it, ignores the ones the client opened after it (the client sends
them again on a new connection: they were never processed), and closes the connection after the last reply.
``RetiringH2Protocol`` does the same. It replaces hypercorn's protocol class for the connections of
``llmchat serve`` only, and behaves like hypercorn's own for any other server in the process, except that
frames for a stream it has already answered are dropped instead of ending the connection (``_Streams``).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import hypercorn.protocol
from hypercorn.events import Closed, RawData
from hypercorn.protocol.events import Event as StreamEvent
from hypercorn.protocol.events import StreamClosed
from hypercorn.protocol.h2 import H2Protocol
from hyperframe.frame import GoAwayFrame

NO_LIMIT = 1_000_000_000
"""hypercorn's keep_alive_max_requests for "never": it has no zero."""
LINGER_S = 5.0
"""How long a retired HTTP/2 connection stays open after its last reply for the client to close it (nginx's
lingering_timeout)."""


class _Ignored:
    """Stands for a stream opened after the GOAWAY: its frames are read and dropped, it is never answered."""

    idle = True

    async def handle(self, event: object) -> None:
        return None


_IGNORED = _Ignored()


class _Streams(dict[int, Any]):
    """hypercorn's streams by id, where a stream it no longer holds reads as ``_IGNORED``.

    hypercorn drops a stream once it has answered it, and an answer can come before the request's body has
    all arrived (a 404, a 413): the body's frames that follow then looked up a missing stream, and the
    ``KeyError`` ended the connection with every other stream on it (pgjones/hypercorn#329, not fixed in a
    release). Their data is still acknowledged to h2 for flow control, and then dropped."""

    def __missing__(self, stream_id: int) -> _Ignored:
        return _IGNORED


class RetiringH2Protocol(H2Protocol):
    """hypercorn's HTTP/2 protocol, retiring a connection after ``config.retire_after`` requests (0 never)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.streams = _Streams(self.streams)
        self._limit: int = getattr(self.config, "retire_after", 0)
        self._served = 0
        self._last_stream_id: int | None = None
        self._retired = False
        self._gone = asyncio.Event()  # the connection closed (the client went first, as a rule)

    async def _create_stream(self, request: Any) -> None:
        if self._limit <= 0:
            await super()._create_stream(request)
            return
        if self._last_stream_id is not None and request.stream_id > self._last_stream_id:
            self.streams[request.stream_id] = _IGNORED  # type: ignore[assignment]
            return
        await super()._create_stream(request)
        # hypercorn's own count would send its GOAWAY (the one that loses the replies in flight) at its limit.
        self.keep_alive_requests = 0
        self._served += 1
        if self._served == self._limit:
            self._last_stream_id = request.stream_id
            await (
                self._flush()
            )  # what h2 has queued goes first: the GOAWAY is written around h2, not through it
            goaway = GoAwayFrame(stream_id=0, last_stream_id=request.stream_id, error_code=0)
            await self.send(RawData(data=goaway.serialize()))

    async def stream_send(self, event: StreamEvent) -> None:
        await super().stream_send(event)
        if isinstance(event, StreamClosed):
            await self._close_if_drained()

    async def _send_data(self, stream_id: int) -> None:
        await super()._send_data(stream_id)
        if self._last_stream_id is not None:
            await self._close_if_drained()

    async def _close_if_drained(self) -> None:
        # A stream's buffer goes once its last frame is written: the reply is out only then.
        if self._last_stream_id is None or self._retired or self.stream_buffers:
            return
        streams: dict[int, object] = self.streams  # type: ignore[assignment]  # _IGNORED among them
        if any(stream is not _IGNORED for stream in streams.values()):
            return
        self._retired = True
        # nginx's lingering close: a socket closed with the client's last frames unread (its acknowledgements
        # of the final replies) answers them with a reset, which can cost the client replies it has not read
        # yet. The client closes first as a rule; this only ends a connection it left open.
        self.task_group.spawn(self._close_after_linger)

    async def _close_after_linger(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._gone.wait(), LINGER_S)
        if not self.closed:
            await self.send(Closed())

    async def handle(self, event: Any) -> None:
        await super().handle(event)
        if isinstance(event, Closed):
            self._gone.set()


def install() -> None:
    """Make hypercorn build ``RetiringH2Protocol`` for its HTTP/2 connections (idempotent).

    hypercorn names the class through its ``hypercorn.protocol`` module when a connection starts (ALPN h2,
    h2c prior knowledge or upgrade); tests/test_server_keepalive.py pins that."""
    hypercorn.protocol.H2Protocol = RetiringH2Protocol  # type: ignore[attr-defined]
