"""`llmchat locust ARGS...`: Locust with the locustfile that ships in the package (``llmchat.core.load.locustfile``).

Every argument goes to Locust as it is (``--headless -u 50``, ``--master``, ``--worker --master-host IP``), so
an install needs no checkout to load-test through the engine, on one machine or with Locust's master and
workers. ``--path`` prints the file's path instead, for ``locust -f "$(llmchat locust --path)"``. Locust runs in a
child process: its import patches the standard library for gevent, which must never happen to this one.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys

from llmchat.core.errors import UsageError

MODULE = "llmchat.core.load.locustfile"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # No help option of its own: `llmchat locust --help` is Locust's help, and every option is Locust's.
    p = sub.add_parser("locust", add_help=False, allow_abbrev=False,
                       help="run Locust with llmchat's shipped locustfile (every argument goes to Locust)",
                       description="Run Locust with llmchat's locustfile; every argument goes to Locust.")
    p.add_argument("--path", action="store_true", help="print the locustfile's path and exit")
    p.set_defaults(func=run, _passes_unknown=True)


def locustfile_path() -> str:
    """Where the shipped locustfile is, without importing it (its import would import Locust)."""
    spec = importlib.util.find_spec(MODULE)
    if spec is None or spec.origin is None:  # pragma: no cover - only a broken install lacks it
        raise UsageError(f"{MODULE} is missing from this install; reinstall llmchat")
    return spec.origin


def run(args: argparse.Namespace) -> int:
    path = locustfile_path()
    if args.path:
        print(path)
        return 0
    if importlib.util.find_spec("locust") is None:
        raise UsageError('Locust is not installed here; pip install "llmchat[locust]"')
    command = [sys.executable, "-m", "locust", "-f", path, *args.passthrough]
    child = subprocess.Popen(command)
    while True:
        try:
            return child.wait()
        except KeyboardInterrupt:
            # Ctrl-C reached Locust too (same process group); let it stop and print its summary.
            continue
