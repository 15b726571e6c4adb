"""Test-only: clean up a child process a test started by hand (to read its ready line and stderr itself)."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def reap(process: subprocess.Popen[Any], wait_s: float) -> None:
    """Kill the child if it is still running, wait for it (bounded), and close its pipes."""
    if process.poll() is None:
        process.kill()
        process.wait(wait_s)
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()


def stop(process: subprocess.Popen[Any], wait_s: float = 10.0) -> None:
    """End a server the test started: SIGTERM, so it shuts down as it would for a user; SIGKILL if it has not
    within ``wait_s``."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(wait_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def listening(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on ``host:port`` now."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def wait_started(
    process: subprocess.Popen[Any], ready: Callable[[], bool], name: str, last_line: Callable[[], str],
    within: float,
) -> str | None:
    """Wait until a server the test started is ``ready()``. None once it is; else one line saying why not: it
    exited (with ``last_line()``, the end of its log), or ``within`` seconds passed."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return f"{name} exited at start (status {process.returncode}): {last_line()}"
        if ready():
            return None
        time.sleep(0.05)
    return f"{name} was not ready within {within:.0f} s"


def last_line(path: Path) -> str:
    """The last line of a log file, "" when it is empty or missing."""
    text = path.read_text(errors="replace").strip() if path.exists() else ""
    return (text.splitlines() or [""])[-1]
