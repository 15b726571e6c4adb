"""What every step of the battery shares: whom it talks to, with which client settings, and what is left of
its budget in requests and time."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from llmchat.core.client import ChatClient
from llmchat.core.config import Http2Mode, HttpSettings, RetrySettings, Settings

#: The doctor's own retry policy: a retry shows what the server does, but a long Retry-After must never hold
#: the battery; the waits stay short and few.
DOCTOR_RETRY = RetrySettings(max_attempts=2, base_delay_s=0.2, max_delay_s=2.0, total_budget_s=3.0)
PROMPT = "Reply with a short greeting."
#: Prompt tokens per chat request, for the estimate: the prompt above and the chat template around it.
PROMPT_TOKENS = 20

Progress = Callable[[int, int, str], None]
"""``progress(requests_done, requests_planned, step)``."""


class OutOfBudget(Exception):
    """A step needs more requests or time than the battery has left: it is skipped, and the report says so."""


@dataclasses.dataclass
class Context:
    """The target and the budget. ``client(http2=...)`` makes a ChatClient for it: no reply cache, the
    doctor's short retries, the user's [http] settings unless overridden."""

    settings: Settings
    provider: str | None = None
    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    max_tokens: int = 16
    budget_requests: int = 30
    budget_s: float = 120.0
    idle_s: float = 0.0
    progress: Progress | None = None
    planned: int = 0
    sent: int = 0
    started: float = dataclasses.field(default_factory=time.monotonic)
    scheme: str = "http"
    resolved_url: str = ""
    http2_setting: Http2Mode = True
    target_http: HttpSettings | None = None
    """The [http] settings in force for the target (a provider's own overrides included), from ``describe``."""

    def client(self, *, http2: Http2Mode | None = None, **http: Any) -> ChatClient:
        settings = self.settings
        if http:
            settings = dataclasses.replace(settings, http=dataclasses.replace(settings.http, **http))
        client = ChatClient(settings, provider=self.provider, base_url=self.base_url, model=self.model,
                            api_key_env=self.api_key_env, http2=http2, retry=DOCTOR_RETRY, use_cache=False)
        if http and not self.base_url:
            # A provider's own [providers.NAME.http] overrides win over [http]: the override asked for here wins.
            client.endpoint = dataclasses.replace(
                client.endpoint, http=dataclasses.replace(client.endpoint.http, **http))
        return client

    def describe(self, client: ChatClient) -> None:
        """Learn the target from a first client: its URL, scheme and the HTTP/2 setting in force."""
        self.resolved_url = client.endpoint.base_url
        self.scheme = urlsplit(self.resolved_url).scheme or "http"
        self.http2_setting = client.endpoint.http.http2
        self.target_http = client.endpoint.http

    @property
    def host(self) -> str:
        return urlsplit(self.resolved_url).hostname or ""

    @property
    def port(self) -> int:
        parts = urlsplit(self.resolved_url)
        return parts.port or (443 if parts.scheme == "https" else 80)

    def remaining_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def take(self, requests: int, step: str) -> None:
        """Spend ``requests`` of the budget on ``step``; OutOfBudget when they or the time are not there."""
        if self.sent + requests > self.budget_requests:
            raise OutOfBudget(f"{step}: needs {requests} more requests than --budget-requests allows")
        if self.remaining_s() <= 0:
            raise OutOfBudget(f"{step}: the battery's {self.budget_s:g} s were spent")
        self.sent += requests

    def tick(self, step: str) -> None:
        if self.progress is not None:
            self.progress(self.sent, max(self.planned, self.sent), step)
