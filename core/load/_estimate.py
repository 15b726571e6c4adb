"""The latency-SLA cost model behind ``llmchat batch --estimate``: what a JSONL of jobs costs and how long it
takes on each path (direct streaming, direct whole replies, the provider's Batch API), side by side, and which
paths meet a deadline.

- Tokens in: each job's messages at about four characters a token plus OpenAI's framing (4 a message, 3 a
  request), corrected by the ratio the sample measured when there is one (the server's own ``usage``).
- Tokens out: the sample's mean reply length; else the job's ``max_tokens`` (an upper bound); else
  ``ASSUMED_OUTPUT`` a job, said so.
- Cost: ``ui.prices`` of each job's model; the Batch API path takes ``providers.NAME.batch_discount`` off.
- Duration of a direct path: the larger of the time ``concurrency`` requests in flight take at the sample's
  mean latency, and the time the rate limits allow (each bucket's burst, then its refill: the limiter's
  capacity and rate, configured or learnt from the sample's headers), plus one request's latency. Without a
  sample only the rate limits bound it (``at least``); with neither it is unknown.
- Duration of the Batch API path: up to its completion window (``batch.completion_window``, default 24 h,
  assumed when not configured, and said so).

Pure but for ``measure_sample``, which sends the sample's requests; nothing else here does I/O.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from llmchat.core.errors import APIError, UsageError
from llmchat.core.observe import Price, TimingRecord

if TYPE_CHECKING:
    from llmchat.core.client._client import ChatClient
    from llmchat.core.load._jobs import Job
    from llmchat.core.policy import ProviderLimiter

#: Reply length assumed for a job with no max_tokens when no sample measured one.
ASSUMED_OUTPUT = 256
#: The Batch API's completion window when ``batch.completion_window`` is not configured (OpenAI's only one).
DEFAULT_WINDOW_S = 24 * 3600.0

Bound = Literal["about", "at least", "up to", "unknown"]
PATHS: tuple[tuple[str, str], ...] = (
    ("stream", "direct streaming"),
    ("batch", "direct whole replies"),
    ("batch-api", "Batch API"),
)


def prompt_tokens_of(messages: Sequence[Mapping[str, Any]]) -> int:
    """A chat prompt's tokens before any reply: about four characters a token, plus OpenAI's framing."""
    chars = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return 3 + 4 * len(messages) + math.ceil(chars / 4)


@dataclass(frozen=True, slots=True)
class Duration:
    """How long a path takes: ``seconds`` with its ``bound`` (about, at least, up to; unknown: None) and the
    ``basis`` in words (what set it)."""

    seconds: float | None
    bound: Bound
    basis: str

    def meets(self, sla_s: float) -> bool | None:
        """Whether the path finishes within ``sla_s``: an estimate (about) or a promise (up to: the Batch
        API promises only its window) decides; a lower bound decides only a miss; None when undecided."""
        if self.seconds is None:
            return None
        if self.bound == "at least":
            return False if self.seconds > sla_s else None
        return self.seconds <= sla_s


@dataclass(frozen=True, slots=True)
class PathEstimate:
    key: str
    """``stream``, ``batch`` or ``batch-api``."""
    name: str
    cost: float | None
    """None when a job's model has no price."""
    duration: Duration


@dataclass(slots=True)
class SampleStats:
    """What ``--sample N`` measured: N jobs sent streamed and N as whole replies, cache off."""

    n: int = 0
    stream_ms: list[float] = field(default_factory=list)
    batch_ms: list[float] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    output_tokens: list[int] = field(default_factory=list)
    estimated_prompt: list[int] = field(default_factory=list)
    """The same jobs' prompt estimate, to calibrate it against the server's count."""
    errors: list[str] = field(default_factory=list)

    @staticmethod
    def _mean(values: Sequence[float]) -> float | None:
        return sum(values) / len(values) if values else None

    @property
    def stream_latency_ms(self) -> float | None:
        return self._mean(self.stream_ms)

    @property
    def batch_latency_ms(self) -> float | None:
        return self._mean(self.batch_ms)

    @property
    def output_per_job(self) -> float | None:
        return self._mean(self.output_tokens)

    @property
    def prompt_ratio(self) -> float | None:
        """The server's prompt tokens over the estimate's, for the jobs that reported usage."""
        est = sum(self.estimated_prompt[: len(self.prompt_tokens)])
        return sum(self.prompt_tokens) / est if self.prompt_tokens and est else None


@dataclass(slots=True)
class Estimate:
    """Every path's cost and duration for ``jobs`` jobs, and what the figures rest on."""

    jobs: int
    model: str
    tokens_in: int
    tokens_out: int
    in_basis: str
    out_basis: str
    paths: list[PathEstimate]
    concurrency: int
    notes: list[str] = field(default_factory=list)
    sample: dict[str, Any] | None = None

    def path(self, key: str) -> PathEstimate:
        return next(p for p in self.paths if p.key == key)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (kept beside OUT.jsonl, so a real run's summary can show the estimate it had)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Estimate:
        """Back from ``to_dict``; ValueError (or KeyError, TypeError) for anything else."""
        paths = [PathEstimate(p["key"], p["name"], p["cost"], Duration(**p["duration"])) for p in data["paths"]]
        return cls(int(data["jobs"]), str(data["model"]), int(data["tokens_in"]), int(data["tokens_out"]),
                   str(data["in_basis"]), str(data["out_basis"]), paths, int(data["concurrency"]),
                   list(data.get("notes", [])), data.get("sample"))


def _direct(n: int, tokens_per_job: float, latency_ms: float | None, concurrency: int,
            limiter: ProviderLimiter | None) -> Duration:
    bounds: list[tuple[float, str]] = []
    latency_s = None if latency_ms is None else latency_ms / 1000.0
    if latency_s is not None:
        bounds.append((math.ceil(n / concurrency) * latency_s,
                       f"{concurrency} in flight at {latency_ms:.0f} ms each (sample)"))
    if limiter is not None:
        for bucket, amount, what in ((limiter.requests, float(n), "requests"),
                                     (limiter.tokens, n * tokens_per_job, "tokens")):
            if bucket.capacity > 0 and bucket.rate > 0:
                wait = max(0.0, amount - bucket.capacity) / bucket.rate
                per_minute = bucket.rate * 60
                bounds.append((wait + (latency_s or 0.0),
                               f"rate limit {bucket.capacity:,.0f} {what}, {per_minute:,.0f}/min"))
    if not bounds:
        return Duration(None, "unknown", "no sample and no rate limit known: add --sample N")
    seconds, basis = max(bounds)
    return Duration(seconds, "about" if latency_s is not None else "at least", basis)


def estimate(
    jobs: Sequence[Job],
    *,
    model: str,
    prices: Mapping[str, Price],
    batch_discount: float,
    concurrency: int,
    limiter: ProviderLimiter | None = None,
    sample: SampleStats | None = None,
    completion_window_s: float | None = None,
) -> Estimate:
    """The three paths for ``jobs`` (each job's own ``model`` param, else ``model``). ``completion_window_s``
    None assumes ``DEFAULT_WINDOW_S`` and says so in the basis."""
    ratio = sample.prompt_ratio if sample is not None else None
    out_mean = sample.output_per_job if sample is not None else None
    tokens_in = tokens_out = 0
    by_model: dict[str, list[int]] = {}
    capped = assumed = 0
    for job in jobs:
        p = prompt_tokens_of(job.messages)
        p = round(p * ratio) if ratio else p
        asked = job.params.get("max_completion_tokens", job.params.get("max_tokens"))
        asked = asked if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0 else None
        if out_mean is not None:
            o = min(round(out_mean), asked) if asked is not None else round(out_mean)
        elif asked is not None:
            o, capped = asked, capped + 1
        else:
            o, assumed = ASSUMED_OUTPUT, assumed + 1
        tokens_in += p
        tokens_out += o
        m = str(job.params.get("model") or model)
        pair = by_model.setdefault(m, [0, 0])
        pair[0] += p
        pair[1] += o
    n = len(jobs)
    in_basis = ("about 4 characters a token" + (f", scaled by {ratio:.2f} as the sample's usage said" if ratio
                                                 else ""))
    if out_mean is not None:
        out_basis = f"the sample's mean reply, {out_mean:.0f} tokens"
    else:
        parts = []
        if capped:
            parts.append(f"max_tokens of {capped} job{'s' if capped != 1 else ''} (at most)")
        if assumed:
            parts.append(f"{ASSUMED_OUTPUT} a job assumed for {assumed} without max_tokens (--sample N measures it)")
        out_basis = "; ".join(parts) or "no jobs"
    notes: list[str] = []
    unpriced = sorted(m for m in by_model if m not in prices)
    if unpriced:
        notes.append(f"no price for {', '.join(unpriced)}: set ui.prices.\"{unpriced[0]}\" = "
                     "{ input_per_mtok = ..., output_per_mtok = ... } for its cost")
        cost = None
    else:
        cost = sum(prices[m].cost(i, o) for m, (i, o) in by_model.items())
    per_job = (tokens_in + tokens_out) / n if n else 0.0
    # The tokens bucket counts prompt plus max_tokens as a request goes out, as OpenAI does.
    stream = _direct(n, per_job, sample.stream_latency_ms if sample else None, concurrency, limiter)
    whole = _direct(n, per_job, sample.batch_latency_ms if sample else None, concurrency, limiter)
    if completion_window_s is None:
        window = Duration(DEFAULT_WINDOW_S, "up to", "the completion window, 24 h assumed (batch.completion_window"
                          " not configured)")
    else:
        window = Duration(completion_window_s, "up to", "the completion window (batch.completion_window)")
    paths = [
        PathEstimate("stream", "direct streaming", cost, stream),
        PathEstimate("batch", "direct whole replies", cost, whole),
        PathEstimate("batch-api", "Batch API", None if cost is None else cost * (1 - batch_discount), window),
    ]
    if sample is not None and sample.errors:
        notes.append(f"{len(sample.errors)} sample request{'s' if len(sample.errors) != 1 else ''} failed: "
                     f"{sample.errors[0]}")
    sample_dict = None if sample is None else {
        "n": sample.n, "stream_latency_ms": sample.stream_latency_ms, "batch_latency_ms": sample.batch_latency_ms,
        "output_per_job": out_mean, "prompt_ratio": ratio, "errors": len(sample.errors),
    }
    return Estimate(n, model, tokens_in, tokens_out, in_basis, out_basis, paths, concurrency, notes, sample_dict)


async def measure_sample(client: ChatClient, jobs: Sequence[Job], n: int) -> SampleStats:
    """Send the first ``n`` jobs streamed and then as whole replies (2n requests, one at a time, so the latency
    is one request's), cache bypassed; failures are kept as messages, never raised. UsageError for n < 1."""
    if n < 1:
        raise UsageError(f"--sample must be at least 1, got {n}")
    stats = SampleStats(n=min(n, len(jobs)))
    cache, client.cache = client.cache, None  # a cached reply would measure the disk, not the provider
    try:
        for job in jobs[:n]:
            params = dict(job.params)
            model = params.pop("model", None)
            stats.estimated_prompt.append(prompt_tokens_of(job.messages))
            record: TimingRecord | None = None
            try:
                stream = client.stream(job.messages, model=model, **params)
                async for _ in stream:
                    pass
                record = stream.record
                # The request's own latency: a hold of the client's limiter is the run's pace, counted apart.
                stats.stream_ms.append((record.total_ms or 0.0) - record.limit_wait_ms)
                if record.ttft_ms is not None:
                    stats.ttft_ms.append(record.ttft_ms)
                reply = await client.complete(job.messages, model=model, **params)
                record = reply.record
                stats.batch_ms.append((record.total_ms or 0.0) - record.limit_wait_ms)
                if record.usage_from_server:
                    stats.output_tokens.append(record.output_tokens)
                    if record.prompt_tokens is not None:
                        stats.prompt_tokens.append(record.prompt_tokens)
            except (APIError, UsageError) as exc:
                stats.errors.append(str(exc))
    finally:
        client.cache = cache
    return stats


@dataclass(slots=True)
class Actuals:
    """What a real run used, for the summary beside the estimate: tokens from the server's usage, the cost
    at ``prices``, and the wall time (``start`` to ``stop``)."""

    prices: Mapping[str, Price]
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    unpriced: int = 0
    no_usage: int = 0
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None

    def add(self, record: TimingRecord | None) -> None:
        """Count one finished job's record (None: a job that failed before any request)."""
        if record is None or record.cache_hit:
            return
        if not record.usage_from_server or record.prompt_tokens is None:
            self.no_usage += 1
            return
        self.tokens_in += record.prompt_tokens
        self.tokens_out += record.output_tokens
        price = self.prices.get(record.model)
        if price is None:
            self.unpriced += 1
        else:
            self.cost += price.cost(record.prompt_tokens, record.output_tokens)

    def stop(self) -> None:
        self.ended = time.monotonic()

    @property
    def wall_s(self) -> float:
        return (self.ended if self.ended is not None else time.monotonic()) - self.started
