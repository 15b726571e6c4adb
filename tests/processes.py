"""Test-only: clean up a child process a test started by hand (to read its ready line and stderr itself)."""

from __future__ import annotations

import socket
import subprocess
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
