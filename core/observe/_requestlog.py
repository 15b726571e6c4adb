"""The request log: one JSON line per finished request, appended to ``log.requests_path``.

Each line is the record's ``summary()`` (figures, never a key: the record holds none), its ``attribution``
(``_attribution.attribute(record).to_dict()``: where its time went, part by part, with the flags of a
cold-start detector the log owns) plus, only with ``log.include_text = true``, the messages sent and the
answer received. The file is created with mode 0600
(prompts are private even when the figures are not) and only ever appended to, so several processes can
share one log: each line goes out in one ``write`` to a file opened with O_APPEND.

Nothing here blocks a request: the bus callback puts the finished record on a queue; a thread of its own
turns each into its line and appends them to the file. If the disk fails, one warning is logged and lines are
dropped, never raised into the request that finished.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from llmchat.core.config import LogSettings, Settings
from llmchat.core.errors import ConfigError
from llmchat.core.observe._attribution import attribute
from llmchat.core.observe._bus import Bus, RequestDone, RequestStarted
from llmchat.core.observe._coldstart import Baseline, ColdStartDetector
from llmchat.core.observe._timing import TimingRecord

log = logging.getLogger("llmchat.requestlog")

#: Lines waiting for the writer before new ones are dropped (a stuck disk must not grow memory forever).
_QUEUE_MAX = 10_000
#: How long ``close`` waits for the writer to write what is queued.
_CLOSE_S = 5.0
_STOP = object()


class RequestLog:
    """Writes a line per ``RequestDone`` of every bus it is subscribed to. ``close()`` flushes and stops.

    ``RequestLog(settings.log)`` opens (creates) the file at once, so a path that cannot be written is a
    ``ConfigError`` before any request, naming the file and the fix. With an empty ``requests_path`` it is
    a log that writes nothing.
    """

    def __init__(self, settings: LogSettings, *, baselines: Iterable[Baseline] = ()) -> None:
        """``baselines``: cold-start windows of earlier processes (``ServerSignals.baselines``) for the
        log's own detector, so its lines flag what ``llmchat ask --json`` flags."""
        self.settings = settings
        given = settings.requests_path
        self.path = os.path.abspath(os.path.expanduser(given)) if given else ""
        self.written = 0
        """Lines written so far."""
        self.dropped = 0
        """Lines lost: the queue was full or the disk refused them."""
        self._fd: int | None = _open(self.path) if self.path else None
        self._queue: queue.Queue[object] = queue.Queue(_QUEUE_MAX)
        self._messages: dict[str, list[dict[str, Any]]] = {}
        self._unsubscribe: list[Callable[[], None]] = []
        self._thread: threading.Thread | None = None
        self._starting = threading.Lock()
        self._closed = False
        self._warned = False
        # Used on the writer's thread only, which takes the records in the order they finished.
        self._detector = ColdStartDetector()
        self._detector.seed(baselines)

    @property
    def enabled(self) -> bool:
        return self._fd is not None

    def subscribe(self, bus: Bus) -> Callable[[], None]:
        """Log the requests ``bus`` reports from now on; returns a function that stops that."""
        if not self.enabled:
            return lambda: None
        subs = [bus.subscribe(RequestDone, self._on_done)]
        if self.settings.include_text:
            subs.append(bus.subscribe(RequestStarted, self._on_started))

        def unsubscribe() -> None:
            for sub in subs:
                sub()

        self._unsubscribe.append(unsubscribe)
        return unsubscribe

    def _on_started(self, event: RequestStarted) -> None:
        # Copied now: the caller's conversation list grows after the request, and the line is written later.
        self._messages[event.record.request_id] = [_message(m) for m in event.messages]

    def _on_done(self, event: RequestDone) -> None:
        # Only a reference goes on the queue: the summary and the JSON (a few hundred microseconds) are made
        # on the writer's thread. The record is final once RequestDone is published.
        record = event.record
        if self.settings.include_text:
            self._enqueue((record, self._messages.pop(record.request_id, []), event.text))
        else:
            self._enqueue((record, None, None))

    def put(self, line: str) -> None:
        """Queue one line (ending in a newline) for the writer; never blocks, drops when full or closed."""
        self._enqueue(line.encode("utf-8"))

    def _enqueue(self, item: object) -> None:
        if self._closed or self._fd is None:
            self.dropped += 1
            return
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            return
        if self._thread is None:
            with self._starting:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._write_loop, name="llmchat-requestlog",
                                                    daemon=True)
                    self._thread.start()

    def flush(self, timeout: float = _CLOSE_S) -> bool:
        """Wait until every line queued before the call is written (or dropped); False if ``timeout`` seconds
        pass first.

        Blocks: call it from a thread, or with ``await asyncio.to_thread(log.flush)`` from a loop.
        """
        thread = self._thread
        if thread is None or not thread.is_alive():
            return True
        marker = threading.Event()
        try:
            self._queue.put(marker, timeout=timeout)
        except queue.Full:
            return False
        return marker.wait(timeout)

    def _write_loop(self) -> None:
        stop = False
        while not stop:
            items = [self._queue.get()]
            while len(items) < 256:  # what else is queued goes out in the same write
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            batch: list[bytes] = []
            markers: list[threading.Event] = []
            for item in items:
                if item is _STOP:
                    stop = True
                elif isinstance(item, threading.Event):
                    markers.append(item)
                elif isinstance(item, bytes):
                    batch.append(item)
                else:
                    try:
                        batch.append(_line(*item, detector=self._detector))  # type: ignore[misc]
                    except Exception as exc:  # noqa: BLE001 - one odd record must never end the writer
                        self.dropped += 1
                        self._warn_once(f"a record could not be written ({exc.__class__.__name__}: {exc}); it is "
                                        "skipped")
            self._write(batch)
            for marker in markers:
                marker.set()
        fd, self._fd = self._fd, None  # the writer owns the file once it runs: it closes it last
        if fd is not None:
            os.close(fd)

    def _write(self, batch: list[bytes]) -> None:
        try:
            if self._fd is not None:
                data = b"".join(batch)
                while data:  # a regular file takes it all at once; the loop only covers a short write
                    data = data[os.write(self._fd, data):]
                self.written += len(batch)
        except OSError as exc:
            self.dropped += len(batch)
            self._warn_once(f"cannot write ({exc.strerror or exc}); lines are dropped")

    def _warn_once(self, what: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("request log %s: %s", self.path, what)

    def close(self, timeout: float = _CLOSE_S) -> None:
        """Unsubscribe, write what is queued (waiting at most ``timeout`` s) and close the file. Safe twice.

        Blocks for as long as the queued lines take: from an event loop, ``await log.aclose()``.
        """
        if self._closed:
            return
        self._closed = True
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe.clear()
        thread = self._thread
        if thread is not None:
            deadline = time.monotonic() + timeout
            try:
                self._queue.put(_STOP, timeout=timeout)
            except queue.Full:  # the disk is stuck: give up on what is queued, leave the thread to it
                pass
            thread.join(max(0.0, deadline - time.monotonic()))
        if thread is None and self._fd is not None:
            os.close(self._fd)
            self._fd = None

    async def aclose(self) -> None:
        """``close`` off the event loop."""
        await asyncio.get_running_loop().run_in_executor(None, self.close)


def _open(path: str) -> int:
    try:
        folder = os.path.dirname(path)
        if folder:
            os.makedirs(folder, mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o600)
    except OSError as exc:
        raise ConfigError(
            f"log.requests_path: cannot open {path} for appending ({exc.strerror or exc}); point it at a "
            "writable file or leave it empty"
        ) from None
    try:
        if os.fstat(fd).st_mode & 0o077:  # a file made by someone else, readable by others: ours now
            os.fchmod(fd, 0o600)
    except OSError:
        pass
    return fd


def _line(
    record: TimingRecord, messages: list[dict[str, Any]] | None, text: str | None, *,
    detector: ColdStartDetector | None = None,
) -> bytes:
    entry = record.summary()
    # ~50 us a request, here on the writer's thread rather than in the bus callback on the event loop.
    entry["attribution"] = attribute(record, detector=detector).to_dict()
    if messages is not None:
        entry["messages"] = messages
        entry["reply"] = text
    try:
        line = json.dumps(entry, ensure_ascii=False, separators=(",", ":"), default=str)
    except (TypeError, ValueError):  # a message part JSON cannot hold: keep the figures
        entry.pop("messages", None)
        line = json.dumps(entry, ensure_ascii=False, separators=(",", ":"), default=str)
    # "replace": text that is not valid Unicode (a lone surrogate) is cleaned where it enters, and this is the
    # last line of defence, never the reason a line is lost.
    return (line + "\n").encode("utf-8", "replace")


def _message(message: Mapping[str, Any]) -> dict[str, Any]:
    # Only what the model read: the role and the content (and a name). Extra keys a caller hangs on a
    # message are not the log's business.
    return {k: message[k] for k in ("role", "name", "content") if k in message}


class Observers:
    """What ``attach_observers`` attached; ``close()`` (or ``await aclose()``) detaches and flushes it."""

    def __init__(self, request_log: RequestLog) -> None:
        self.request_log = request_log

    def __call__(self) -> None:
        self.close()

    def close(self) -> None:
        """Detach and write what is still queued (blocks briefly: from a loop, ``await aclose()``)."""
        self.request_log.close()

    async def aclose(self) -> None:
        await self.request_log.aclose()


def attach_observers(bus: Bus, settings: Settings, *, baselines: Iterable[Baseline] = ()) -> Observers:
    """Attach to a client's bus what ``settings`` asks for: the request log, if ``log.requests_path`` is set
    (its cold-start detector seeded with ``baselines``).

    Returns the handle that detaches them (``close()``, or ``await aclose()`` from an event loop). Raises
    ConfigError, one line, when the log file cannot be opened. Nothing else is attached: the Prometheus
    exporter is started apart, by whoever takes ``--metrics-port`` (``start_exporter``).
    """
    request_log = RequestLog(settings.log, baselines=baselines)
    request_log.subscribe(bus)
    return Observers(request_log)
