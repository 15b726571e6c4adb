"""`llmchat serve` in a child process: its own interpreter and core, for benchmarks and the chat app.

The child prints one ready line; we read it (bounded by a timeout) to learn the URL and, with TLS, the
certificate to trust. Its stdout and stderr are drained by daemon threads so it never blocks on a full pipe;
stderr is kept (the last 64 KiB) for error messages and for tests that check it stayed clean.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from types import TracebackType
from typing import IO

from llmchat.core.errors import LLMChatError

_READY = re.compile(
    r"^llmchat server listening on (?P<url>https?://\S+) \([^)]*\)(?: certificate (?P<cert>.+))?$"
)
_STDERR_KEEP = 64 * 1024


class SubprocessServer:
    """A running `llmchat serve` child. Use as a context manager, or call ``terminate``."""

    def __init__(self, process: subprocess.Popen[str], url: str, cert_path: str | None) -> None:
        self.process = process
        self.url = url
        """The server's root, e.g. ``http://127.0.0.1:PORT``."""
        self.base_url = url + "/v1"
        """The API root a client is given."""
        self.cert_path = cert_path
        """The PEM file to pass as ``verify=`` when the child serves TLS; else None."""
        self._stderr: list[str] = []
        self._pumps: list[threading.Thread] = []

    @property
    def stderr(self) -> str:
        """What the child wrote on stderr so far (the last 64 KiB)."""
        return "".join(self._stderr)[-_STDERR_KEEP:]

    def terminate(self, timeout: float = 10.0) -> int:
        """SIGTERM, wait up to ``timeout`` s, then SIGKILL if it is still running. Returns the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)
        _close_pipes(self.process, self._pumps, timeout)
        return self.process.returncode

    def __enter__(self) -> SubprocessServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.terminate()


def start_subprocess(args: list[str], *, timeout: float = 30.0) -> SubprocessServer:
    """Spawn ``python -m llmchat.core.server --port 0 *args`` and return once it prints its ready line.

    ``args`` are further `llmchat serve` flags (a later ``--port`` wins). Raises LLMChatError with the child's
    last stderr line if it exits or stays silent for ``timeout`` seconds (then it is killed).
    """
    # The engine's own entry point: the engine never starts the face (llmchat.tui).
    command = [sys.executable, "-m", "llmchat.core.server", "--port", "0", *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
        errors="replace",
        env=env,
    )
    assert process.stdout is not None and process.stderr is not None
    lines: queue.Queue[str | None] = queue.Queue()
    stderr: list[str] = []
    pumps = [
        threading.Thread(target=_pump_lines, args=(process.stdout, lines), daemon=True),
        threading.Thread(target=_keep, args=(process.stderr, stderr), daemon=True),
    ]
    for pump in pumps:
        pump.start()
    deadline = time.monotonic() + timeout
    try:
        while True:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            if line is None:
                break
            found = _READY.match(line.strip())
            if found:
                server = SubprocessServer(process, found["url"], found["cert"])
                server._stderr, server._pumps = stderr, pumps
                return server
    except queue.Empty:
        pass
    if process.poll() is None:
        process.kill()
    process.wait(timeout)
    _close_pipes(process, pumps, timeout)
    last = ("".join(stderr).strip().splitlines() or ["(nothing on stderr)"])[-1]
    raise LLMChatError(f"llmchat serve did not start (exit status {process.returncode}): {last}")


def _close_pipes(process: subprocess.Popen[str], pumps: list[threading.Thread], timeout: float) -> None:
    # The pumps end at EOF, which comes when the child exits; then the pipes can close.
    for pump in pumps:
        pump.join(timeout)
    for stream in (process.stdout, process.stderr):
        if stream is not None and not any(p.is_alive() for p in pumps):
            stream.close()


def _pump_lines(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def _keep(stream: IO[str], sink: list[str]) -> None:
    size = 0
    for line in stream:
        sink.append(line)
        size += len(line)
        while size > _STDERR_KEEP and len(sink) > 1:
            size -= len(sink.pop(0))
