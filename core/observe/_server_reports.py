"""What a server said about its own time, read off a timing record and checked before anyone believes it.

Three reporters are understood, best first:

- ``llmchat serve``'s ``server_timing``: ``time.monotonic_ns()`` stamps of the server's process (received,
  started after any queueing, first token sent, last token sent). Only differences between them are used, so
  they hold across machines whose clocks disagree. After a cold start it adds ``model_load_ns``, a duration:
  the wait for the model to load, which is cut out of the prefill.
- llama.cpp's ``timings`` object on the final chunk: ``prompt_ms`` (prefill) and ``predicted_ms`` (decode).
- OpenAI's ``openai-processing-ms`` header: the server's time up to the response headers.

A report that is malformed (a string, a negative or non-finite number, a missing key, the first token after
the last) is ignored with a note, never an exception: a server's self-report must not break a request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from llmchat.core.observe._timing import TimingRecord

_NS_PER_MS = 1_000_000
# A self-reported span longer than a day is a garbage stamp, not a slow server.
_MAX_SPAN_NS = 86_400 * 1_000_000_000

LLMCHAT = "llmchat serve"
LLAMA_CPP = "llama.cpp"
OPENAI = "openai-processing-ms"


@dataclass(frozen=True, slots=True)
class ServerReport:
    """The checked durations a server reported, in nanoseconds; None for what it did not say.

    ``reporter`` is ``"llmchat serve"``, ``"llama.cpp"``, ``"openai-processing-ms"`` or ``""`` (nothing
    usable). ``notes`` say what was ignored and why.
    """

    reporter: str = ""
    queue_ns: int | None = None
    """Waiting for a slot before generation began (llmchat serve's ``started_ns - received_ns``)."""
    load_ns: int | None = None
    """Waiting for the model to load (a cold start) after any queueing and before the prefill; None when the
    server said nothing about it (a warm model, or a server that never says)."""
    prefill_ns: int | None = None
    """From the start of generation (after any model load) to the first token (prompt processing)."""
    generation_ns: int | None = None
    """From the first token to the last (decode)."""
    processing_ns: int | None = None
    """The server's time up to its response headers, with no split (OpenAI's header)."""
    notes: tuple[str, ...] = ()

    @property
    def ttft_ns(self) -> int | None:
        """The server's own time to first token: queue, model load and prefill; None when it did not report a
        prefill."""
        if self.prefill_ns is None:
            return None
        return (self.queue_ns or 0) + (self.load_ns or 0) + self.prefill_ns


def read_server_report(record: TimingRecord) -> ServerReport:
    """The best valid report in ``record`` (llmchat serve, then llama.cpp, then OpenAI's header).

    Never raises: every malformed report becomes a note, and a record with none usable gives
    ``ServerReport(reporter="")``.
    """
    notes: list[str] = []
    if record.server_timing is not None:
        report = _from_server_timing(record.server_timing, notes)
        if report is not None:
            return report
    if record.server_reported is not None:
        report = _from_llama_timings(record.server_reported, notes)
        if report is not None:
            return _with_notes(report, notes)
    if record.server_processing_ms is not None:
        ms = _duration_ms(record.server_processing_ms)
        if ms is None:
            notes.append(f"openai-processing-ms ignored: {record.server_processing_ms!r} is not a duration")
        else:
            return ServerReport(reporter=OPENAI, processing_ns=_ns(ms), notes=tuple(notes))
    return ServerReport(notes=tuple(notes))


def _with_notes(report: ServerReport, notes: list[str]) -> ServerReport:
    if not notes:
        return report
    return ServerReport(
        reporter=report.reporter,
        queue_ns=report.queue_ns,
        load_ns=report.load_ns,
        prefill_ns=report.prefill_ns,
        generation_ns=report.generation_ns,
        processing_ns=report.processing_ns,
        notes=tuple(notes),
    )


def _stamp(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _from_server_timing(raw: object, notes: list[str]) -> ServerReport | None:
    if not isinstance(raw, dict):
        notes.append("server_timing ignored: it is not an object")
        return None
    stamps: dict[str, int] = {}
    for key in ("received_ns", "first_token_ns", "last_token_ns"):
        value = _stamp(raw.get(key))
        if value is None:
            what = "missing" if key not in raw else f"not a non-negative integer ({raw.get(key)!r})"
            notes.append(f"server_timing ignored: {key} is {what}")
            return None
        stamps[key] = value
    received, first, last = stamps["received_ns"], stamps["first_token_ns"], stamps["last_token_ns"]
    started = _stamp(raw.get("started_ns")) if "started_ns" in raw else received
    if started is None:
        notes.append(f"server_timing.started_ns ignored: {raw.get('started_ns')!r} is not a stamp")
        started = received
    if not received <= first <= last:
        notes.append("server_timing ignored: its stamps are out of order (received, first token, last token)")
        return None
    if not received <= started <= first:
        notes.append("server_timing.started_ns ignored: it is not between received and the first token")
        started = received
    if last - received > _MAX_SPAN_NS:
        notes.append("server_timing ignored: it spans more than a day")
        return None
    load = _model_load(raw, first - started, notes)
    return ServerReport(
        reporter=LLMCHAT,
        queue_ns=started - received,
        load_ns=load,
        prefill_ns=first - started - (load or 0),
        generation_ns=last - first,
        notes=tuple(notes),
    )


def _model_load(raw: dict[Any, Any], room_ns: int, notes: list[str]) -> int | None:
    """``model_load_ns`` when it is a duration that fits between the start of work and the first token."""
    if "model_load_ns" not in raw:
        return None
    value = _stamp(raw.get("model_load_ns"))
    if value is None:
        notes.append(f"server_timing.model_load_ns ignored: {raw.get('model_load_ns')!r} is not a duration")
        return None
    if value > room_ns:
        notes.append("server_timing.model_load_ns ignored: it is longer than the time from the start of work "
                     "to the first token")
        return None
    return value or None


def _duration_ms(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    if not math.isfinite(number) or number < 0 or number * _NS_PER_MS > _MAX_SPAN_NS:
        return None
    return number


def _ns(ms: float) -> int:
    return round(ms * _NS_PER_MS)


def _from_llama_timings(raw: object, notes: list[str]) -> ServerReport | None:
    if not isinstance(raw, dict):
        notes.append("llama.cpp timings ignored: not an object")
        return None
    prompt = _duration_ms(raw.get("prompt_ms"))
    predicted = _duration_ms(raw.get("predicted_ms"))
    for key, value in (("prompt_ms", prompt), ("predicted_ms", predicted)):
        if value is None and key in raw:
            notes.append(f"llama.cpp timings.{key} ignored: {raw.get(key)!r} is not a duration")
    if prompt is None and predicted is None:
        if not any(k in raw for k in ("prompt_ms", "predicted_ms")):
            notes.append("llama.cpp timings ignored: neither prompt_ms nor predicted_ms is given")
        return None
    return ServerReport(
        reporter=LLAMA_CPP,
        prefill_ns=None if prompt is None else _ns(prompt),
        generation_ns=None if predicted is None else _ns(predicted),
    )
