"""`llmchat serve`: a local OpenAI-compatible server, faithful enough to test and benchmark clients against.

It speaks HTTP/1.1 and h2c on plain http, and h2 by ALPN with TLS (hypercorn underneath). Replies are
deterministic Markdown that exercises every rendering path; latency and faults (cold starts, stalls, 429s,
5xx, cut connections, llama.cpp's close after a stream) come from a named profile and explicit settings.
Every reply carries ``server_timing`` stamps so clients on the same machine can measure their own overhead.

Three ways to run it:

- ``await serve(settings)``: in the running event loop, until SIGINT/SIGTERM or a ``shutdown`` event.
- ``start_in_thread(settings)``: on its own loop in a daemon thread (tests, the chat app's offline default).
- ``start_subprocess(["--profile", "instant"])``: `llmchat serve` in a child process (benchmarks).
"""

from __future__ import annotations

from llmchat.core.server._profiles import PROFILE_SUMMARIES, PROFILES, resolve_settings, validate_settings
from llmchat.core.server._run import Listening, RunningServer, serve, start_in_thread
from llmchat.core.server._subprocess import SubprocessServer, start_subprocess

__all__ = [
    "PROFILES",
    "PROFILE_SUMMARIES",
    "Listening",
    "RunningServer",
    "SubprocessServer",
    "resolve_settings",
    "serve",
    "start_in_thread",
    "start_subprocess",
    "validate_settings",
]
