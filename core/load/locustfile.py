"""Load-test an OpenAI-compatible server with Locust, through llmchat's engine. It ships in the package;
`llmchat locust` runs Locust with it (``llmchat locust --path`` prints where it is, for ``locust -f``).

One machine::

    llmchat serve --profile chat --port 8000 &
    LLMCHAT_HTTP2=h2c llmchat locust --headless -u 50 -r 10 -t 1m --host http://127.0.0.1:8000/v1

Many machines (Locust's master and workers; every worker needs llmchat installed with the locust extra)::

    llmchat locust --master --host https://api.example/v1
    llmchat locust --worker --master-host MASTER_IP     # on each worker machine

Locust's table then shows three rows per user class: ``ttft`` (time to first token), ``ttfb`` (time to the
response headers) and ``e2e`` (end to end; failures are counted here, once each). Their times are the
engine's own records, with the definitions of `llmchat bench` (see README.md); lengths are output tokens.

The scenario is set by environment variables, so the same file serves every run:

- ``LLMCHAT_MODE``: stream (default) or batch;
- ``LLMCHAT_MODEL``: the model (default: the first the server lists);
- ``LLMCHAT_MAX_TOKENS``: reply length cap (default 200);
- ``LLMCHAT_LONG_RATIO``: share of prompts over 1,000 tokens (default 0);
- ``LLMCHAT_HTTP2``: h2c for `llmchat serve` over http://, else unset (HTTP/2 by ALPN over https);
- the API key from ``OPENAI_API_KEY`` (sent only to ``--host``).
"""

from __future__ import annotations

import os

from locust import between

from llmchat.core.load.locust_user import LLMChatUser


class ChatUser(LLMChatUser):
    """A person chatting: a prompt, the whole reply read, a pause to read it, the next prompt."""

    wait_time = between(0.0, 0.5)
    mode = os.environ.get("LLMCHAT_MODE", "stream")
    model = os.environ.get("LLMCHAT_MODEL") or None
    max_tokens = int(os.environ.get("LLMCHAT_MAX_TOKENS", "200"))
    long_ratio = float(os.environ.get("LLMCHAT_LONG_RATIO", "0"))
    http2 = "h2c" if os.environ.get("LLMCHAT_HTTP2") == "h2c" else None
