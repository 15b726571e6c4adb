"""Test-only: clean up a child process a test started by hand (to read its ready line and stderr itself)."""

from __future__ import annotations

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
