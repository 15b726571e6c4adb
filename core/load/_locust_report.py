"""What one finished request looks like to Locust: its request events. Kept apart from ``locust_user`` so it
can be used and tested without importing Locust (whose import monkey-patches the standard library)."""

from __future__ import annotations

from typing import Any

from llmchat.core.errors import APIError
from llmchat.core.observe import TimingRecord

REQUEST_TYPE = "LLM"
"""The ``Type`` column of Locust's table for llmchat's events."""


def report(request_event: Any, record: TimingRecord, context: dict[str, Any] | None = None) -> None:
    """Fire Locust request events for one finished request: ``ttfb``, ``ttft`` (stream mode, once a token
    arrived) and ``e2e``. A failed request fires ``e2e`` alone, with its error, so it counts once and its
    partial times stay out of the latency rows.

    Times are the engine's (milliseconds from the request's start); the length is output tokens. Never raises
    for a record that lacks a figure: that event is left out.
    """
    ctx = {
        **(context or {}),
        "request_id": record.request_id,
        "http_version": record.http_version,
        "connection_reused": record.connection_reused,
        "retries": len(record.retries),
    }
    failed = record.error_kind is not None and not record.cancelled

    def fire(name: str, ms: float | None, exception: BaseException | None = None) -> None:
        if ms is None:
            return
        request_event.fire(request_type=REQUEST_TYPE, name=name, response_time=ms,
                           response_length=record.output_tokens, exception=exception, context=ctx)

    if not failed:
        fire("ttfb", record.ttfb_ms)
        if record.mode == "stream":
            fire("ttft", record.ttft_ms)
    error = APIError(record.error or record.error_kind or "failed") if failed else None
    fire("e2e", record.total_ms, error)
