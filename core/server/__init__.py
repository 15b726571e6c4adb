"""`llmchat serve`: a local OpenAI-compatible server, faithful enough to test and benchmark clients against.

It speaks HTTP/1.1 and h2c on plain http, and h2 by ALPN with TLS (hypercorn underneath). Replies are
deterministic Markdown that exercises every rendering path; latency and faults (cold starts, stalls, 429s,
5xx, cut connections, llama.cpp's close after a stream) come from a named profile and explicit settings.
Every reply carries ``server_timing`` stamps so clients on the same machine can measure their own overhead.

Ways to run it:

- ``await serve(settings)``: in the running event loop, until SIGINT/SIGTERM or a ``shutdown`` event.
- ``start_in_thread(settings)``: on its own loop in a daemon thread (tests, benchmarks).
- ``start_subprocess(["--profile", "instant"])``: ``python -m llmchat.core.server`` in a child process (the
  chat app's offline default, benchmarks).
- ``python -m llmchat.core.server [flags]`` or `llmchat serve [flags]` (``cli``).

The names that need hypercorn (``serve``, ``start_in_thread``, ``RunningServer``, the RTT proxy) load on
first use, so importing this package (for its profiles or its command line) costs no web server.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from llmchat.core.server import _cli as cli
from llmchat.core.server._profiles import PROFILE_SUMMARIES, PROFILES, resolve_settings, validate_settings
from llmchat.core.server._subprocess import SubprocessServer, start_subprocess

if TYPE_CHECKING:
    from llmchat.core.server._metrics import ServerMetrics
    from llmchat.core.server._proxy import DelayProxy, Target, run_proxy
    from llmchat.core.server._start import Listening, RunningServer, serve, start_in_thread

#: name -> the module that holds it, imported when the name is first asked for.
_LAZY = {
    "Listening": "llmchat.core.server._start",
    "RunningServer": "llmchat.core.server._start",
    "serve": "llmchat.core.server._start",
    "start_in_thread": "llmchat.core.server._start",
    "ServerMetrics": "llmchat.core.server._metrics",
    "DelayProxy": "llmchat.core.server._proxy",
    "Target": "llmchat.core.server._proxy",
    "run_proxy": "llmchat.core.server._proxy",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "PROFILES",
    "PROFILE_SUMMARIES",
    "DelayProxy",
    "Listening",
    "RunningServer",
    "ServerMetrics",
    "SubprocessServer",
    "Target",
    "cli",
    "resolve_settings",
    "run_proxy",
    "serve",
    "start_in_thread",
    "start_subprocess",
    "validate_settings",
]
