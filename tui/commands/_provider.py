"""The offline default shared by every command that talks to a provider.

With no provider configured and no OPENAI_API_KEY / OPENAI_BASE_URL set, llmchat starts its own local server
on a free port (speaking h2c), uses it, says so on stderr, and stops it on exit.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from llmchat.core import Http2Mode, ServerSettings, Settings, resolve_provider

LOCAL_NOTICE = "no provider configured: answers come from the local server (offline demo)"


@contextmanager
def offline_default(
    settings: Settings, provider: str | None, base_url: str | None, *, quiet: bool = False
) -> Iterator[tuple[str | None, Http2Mode | None, str | None]]:
    """Yield ``(base_url, http2, model)`` to pass to ChatClient: ``(base_url, None, None)`` when a provider or
    URL is given, else a local server's URL, ``"h2c"`` and its default model, for the duration."""
    if base_url or resolve_provider(settings, provider) is not None:
        yield base_url, None, None
        return
    from llmchat.core.server import start_subprocess

    if not quiet:
        print(f"llmchat: {LOCAL_NOTICE}", file=sys.stderr)
    with start_subprocess(["--profile", "chat"]) as server:
        yield server.base_url, "h2c", ServerSettings().models[0]
