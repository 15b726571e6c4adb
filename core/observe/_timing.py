"""The timing record: one per request, every stamp from ``time.perf_counter_ns()``.

Definitions (README.md repeats them for users):

- t0: the moment the request was handed to the client. Every latency below counts from t0, so retries, their
  waits and pool queueing are part of what the user waited for. The phase stamps (pool wait, connect, TLS,
  send) describe the *last* attempt, the one that produced the reply.
- TTFB: t0 to the response headers of the last attempt.
- TTFT: t0 to the first chunk carrying non-empty answer content (role-only, empty and reasoning-only deltas
  do not count, as in vLLM's and genai-perf's definitions). Batch mode has no TTFT.
- ITL: the gaps between consecutive content chunks (vLLM's chunk-gap definition; a chunk may carry more than
  one token).
- TPOT: (last token - first token) / (output tokens - 1), output tokens from the server's usage when it sends
  it, else the number of content chunks. When the server's usage counts reasoning tokens too (a reply that
  thought, with usage), the span starts at the first reasoning token.
- tokens/s: output tokens per second of generation, ``(output_tokens - 1) / (last - first)`` in stream mode
  (the decode rate, 1000 / TPOT); ``output_tokens / total`` in batch mode, where no per-token times exist.
- bunched: the chunks arrived together, so their arrival times say nothing about the generation: on average
  at least ``BUNCH_EVENTS_PER_READ`` content events per socket read, or a client TPOT below
  ``BUNCH_GAP_SHARE`` of the server's own per-token time (llama-server over loopback often delivers a whole
  reply in one or two reads). TPOT and tokens/s then come from the server's own figures (llama.cpp's
  ``timings.predicted_n / predicted_ms``, else llmchat serve's first-to-last token stamps), else from the
  output tokens over the stream's span (response headers to the last token); ``rate_source`` says which.
- prompt truncated: the server's ``usage.prompt_tokens`` is below ``TRUNCATED_SHARE`` of what llmchat counted
  before sending (``prompt_sent_tokens``), by at least ``TRUNCATED_MIN_TOKENS``: a server that shifts its
  context (llama.cpp) dropped the start of the conversation without a word.
- total: t0 to the end of the body (or to the error or the cancel).
- first reasoning: t0 to the first chunk carrying reasoning (``reasoning_content``, ``reasoning`` or an inline
  ``<think>`` block). Stream mode only.
- thinking: the first reasoning chunk to the first answer chunk (to the last reasoning chunk when no answer
  came), so first reasoning + thinking = TTFT for a reply that thought before answering.
- client rate limit: the time the client's own limiter held the request back before an attempt went out
  (``limit_wait_ns``, from t0 on). It is in the total (the user waited for it) but never in TTFB or TTFT,
  which count from the end of the hold: the hold is the client's choice, not the provider's latency.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

_NS_PER_MS = 1_000_000

BUNCH_EVENTS_PER_READ = 2.0
"""Content events per socket read, on average, from which a stream counts as bunched."""
BUNCH_GAP_SHARE = 0.5
"""A client TPOT below this share of the server's own per-token time makes a stream bunched."""
TRUNCATED_SHARE = 0.6
"""The server counting fewer than this share of the prompt tokens llmchat sent means it cut the prompt."""
TRUNCATED_MIN_TOKENS = 32
"""...and by at least this many tokens (a short prompt's counts differ by a template's worth)."""


def _ms(start: int | None, end: int | None) -> float | None:
    if start is None or end is None:
        return None
    return (end - start) / _NS_PER_MS


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between closest ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(slots=True)
class Phases:
    """Stamps of one attempt, filled by the transport's trace hook. Absolute perf_counter_ns values."""

    start_ns: int = 0
    connect_start_ns: int | None = None
    connect_end_ns: int | None = None
    tls_start_ns: int | None = None
    tls_end_ns: int | None = None
    send_start_ns: int | None = None
    send_end_ns: int | None = None
    headers_ns: int | None = None
    setup_ns: int = 0
    """A duration, not a stamp: building the client (SSL context, connection slot) on this attempt's path,
    which happens only when the transport was not prepared ahead. Between the start and the first connection
    event; not part of the pool wait."""
    closes_after_response: bool = False
    """Set on the one attempt after which the transport learnt that this host closes its connection after each
    response without saying so (llama.cpp's server does): from then on the pool opens a fresh connection for
    every request to it instead of trying an idle one it has closed. Once per pool, so a report can say it."""

    @property
    def reused(self) -> bool:
        """No connection was opened for this attempt: it went out on a pooled one (or an HTTP/2 stream)."""
        return self.connect_start_ns is None

    @property
    def pool_wait_ns(self) -> int | None:
        """From the attempt's start to the first thing done on a connection, less the setup: queueing for a
        pool slot."""
        first = self.connect_start_ns if self.connect_start_ns is not None else self.send_start_ns
        return None if first is None else max(0, first - self.start_ns - self.setup_ns)


@dataclass(frozen=True, slots=True)
class Headroom:
    """What a provider's ``x-ratelimit-*`` headers said on one reply: for requests and for tokens, the limit,
    what remains of it, and the seconds until it is back to full. None where a header was absent or unreadable."""

    limit_requests: int | None = None
    remaining_requests: int | None = None
    reset_requests_s: float | None = None
    limit_tokens: int | None = None
    remaining_tokens: int | None = None
    reset_tokens_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, every field (None where the provider said nothing)."""
        return {
            "limit_requests": self.limit_requests,
            "remaining_requests": self.remaining_requests,
            "reset_requests_s": round_ms(self.reset_requests_s),
            "limit_tokens": self.limit_tokens,
            "remaining_tokens": self.remaining_tokens,
            "reset_tokens_s": round_ms(self.reset_tokens_s),
        }


@dataclass(slots=True)
class TimingRecord:
    """Everything measured about one request. Mutable while the request runs; final once ``end_ns`` is set."""

    mode: str = "stream"
    provider: str = ""
    model: str = ""
    host: str = ""
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    wall_start: float = field(default_factory=time.time)
    t0_ns: int = field(default_factory=time.perf_counter_ns)
    # The same instant on time.monotonic_ns's clock, so server stamps (monotonic) can be compared on any OS.
    t0_mono_ns: int = field(default_factory=time.monotonic_ns)
    phases: Phases = field(default_factory=Phases)
    # A model lookup (GET /models) the request made before its first attempt, when no model was named: its
    # stamps, and when it ended. The connection it opened is the request's.
    discovery: Phases | None = None
    discovery_end_ns: int | None = None
    first_token_ns: int | None = None
    last_token_ns: int | None = None
    # Reasoning deltas (a reasoning model's thinking), kept apart from the answer: they never count as tokens
    # of TTFT, ITL or TPOT.
    first_reasoning_ns: int | None = None
    last_reasoning_ns: int | None = None
    reasoning_chunks: int = 0
    tool_calls: int = 0
    """How many tool calls the reply asked for (none is ever executed)."""
    end_ns: int | None = None
    chunk_ns: list[int] = field(default_factory=list)
    content_chunks: int = 0
    content_reads: int = 0
    """Socket reads that carried answer content (counted per read, not per event): with ``content_chunks``
    it says whether the chunks arrived together (``bunched``)."""
    output_tokens: int = 0
    prompt_tokens: int | None = None
    prompt_sent_tokens: int | None = None
    """The prompt's tokens as llmchat counted them before sending (the context budget's count when it knew
    every message, else the 4-bytes-a-token estimate); set once the server's usage arrived, to compare."""
    usage_from_server: bool = False
    http_version: str = ""
    # The proxy the request went through (its URL, credentials masked), None when direct or never sent.
    proxy: str | None = None
    status: int | None = None
    attempts: int = 1
    retries: list[Any] = field(default_factory=list)  # RetryEvent, kept untyped so this module stays a leaf
    cache_hit: bool = False
    cache_lookup: bool = False  # the reply cache was asked (so not cache_hit is a miss, not "not cacheable")
    cancelled: bool = False
    error: str | None = None
    error_kind: str | None = None
    finish_reason: str | None = None
    server_timing: dict[str, int] | None = None
    # What the client itself spent, measured: encoding the request body, and decoding the reply (SSE framing and
    # JSON). Attribution shows these apart so llmchat never blames the network for its own work.
    encode_ns: int = 0
    decode_ns: int = 0
    # The part of decode_ns spent before the bytes of the first token arrived: attribution puts it in the time
    # to first token and the rest in the streaming span.
    decode_before_first_ns: int = 0
    # ... and the part spent before the first reasoning token: attribution cuts thinking out of that span.
    decode_before_reasoning_ns: int = 0
    # What other servers report about themselves: llama.cpp's final ``timings`` object (prompt_ms,
    # predicted_ms, ...) and OpenAI's ``openai-processing-ms`` header.
    server_reported: dict[str, float] | None = None
    server_processing_ms: float | None = None
    # Characters of the reply that were not valid Unicode (a lone surrogate from a server), shown as U+FFFD.
    replaced_chars: int = 0
    # The provider's /metrics (requests waiting and running, KV cache use), the busiest scrape taken while the
    # request was in flight (``ServerMetricsPoller``): attribution flags saturation from it.
    server_metrics: dict[str, float] | None = None
    # The provider's rate-limit headroom from the last reply's x-ratelimit-* headers, and how long the client's
    # own limiter held the request back (every hold, from t0 on, before an attempt was sent).
    headroom: Headroom | None = None
    limit_wait_ns: int = 0

    # -- derived figures, in milliseconds ---------------------------------------------------------------
    @property
    def connection_reused(self) -> bool:
        """No connection was opened for the request: not by its last attempt, nor by its model lookup."""
        return self.phases.reused and (self.discovery is None or self.discovery.reused)

    @property
    def closes_after_response(self) -> bool:
        """This request is where the transport learnt that its host closes the connection after each response
        (``Phases.closes_after_response``, on its last attempt or its model lookup): said once per pool."""
        return self.phases.closes_after_response or (
            self.discovery is not None and self.discovery.closes_after_response)

    @property
    def pool_wait_ms(self) -> float | None:
        w = self.phases.pool_wait_ns
        return None if w is None else w / _NS_PER_MS

    def _opened(self) -> Phases:
        # The phases that opened the request's connection: the last attempt's, else the model lookup's.
        if self.phases.reused and self.discovery is not None and not self.discovery.reused:
            return self.discovery
        return self.phases

    @property
    def connect_ms(self) -> float | None:
        opened = self._opened()
        return _ms(opened.connect_start_ns, opened.connect_end_ns)

    @property
    def tls_ms(self) -> float | None:
        opened = self._opened()
        return _ms(opened.tls_start_ns, opened.tls_end_ns)

    @property
    def model_lookup_ms(self) -> float | None:
        """The model lookup (GET /models) the request made first, when no model was named; else None."""
        return None if self.discovery is None else _ms(self.discovery.start_ns, self.discovery_end_ns)

    @property
    def send_ms(self) -> float | None:
        return _ms(self.phases.send_start_ns, self.phases.send_end_ns)

    @property
    def ttfb_ms(self) -> float | None:
        """t0 to the response headers, less any hold of the client's rate limiter."""
        return _ms(self.t0_ns + self.limit_wait_ns, self.phases.headers_ns)

    @property
    def ttft_ms(self) -> float | None:
        """t0 to the first answer token, less any hold of the client's rate limiter."""
        return _ms(self.t0_ns + self.limit_wait_ns, self.first_token_ns)

    @property
    def limit_wait_ms(self) -> float:
        """How long the client's rate limiter held the request back (0 when it never did)."""
        return self.limit_wait_ns / _NS_PER_MS

    @property
    def total_ms(self) -> float | None:
        return _ms(self.t0_ns, self.end_ns)

    @property
    def first_reasoning_ms(self) -> float | None:
        """t0 to the first reasoning chunk; None when the reply had no reasoning (or in batch mode)."""
        return _ms(self.t0_ns, self.first_reasoning_ns)

    @property
    def thinking_end_ns(self) -> int | None:
        """Where thinking ended: the first answer chunk after it, else the last reasoning chunk."""
        if self.first_reasoning_ns is None:
            return None
        first = self.first_token_ns
        if first is not None and first >= self.first_reasoning_ns:
            return first
        return self.last_reasoning_ns

    @property
    def thinking_ms(self) -> float | None:
        """The first reasoning chunk to the first answer chunk (or the last reasoning chunk); None without
        reasoning. An answer that began before the reasoning did (a server that interleaves) counts none."""
        return _ms(self.first_reasoning_ns, self.thinking_end_ns)

    @property
    def itl_ms(self) -> list[float]:
        c = self.chunk_ns
        return [(c[i] - c[i - 1]) / _NS_PER_MS for i in range(1, len(c))]

    def _chunk_tpot_ms(self) -> float | None:
        """TPOT from the chunks' arrival times alone (what the client saw)."""
        if self.first_token_ns is None or self.last_token_ns is None or self.output_tokens < 2:
            return None
        first = self.first_token_ns
        if self.usage_from_server and self.first_reasoning_ns is not None and self.first_reasoning_ns < first:
            # The server's completion_tokens count the reasoning tokens too (OpenAI, vLLM): they were generated
            # from the first reasoning token on.
            first = self.first_reasoning_ns
        return (self.last_token_ns - first) / _NS_PER_MS / (self.output_tokens - 1)

    @property
    def reported_tokens_per_s(self) -> float | None:
        """The server's own decode rate: llama.cpp's ``timings`` (``predicted_n`` over ``predicted_ms``, or
        its ``predicted_per_second``), else llmchat serve's ``server_timing`` (output tokens - 1 over its first
        to last token); None when it reports neither (or nothing usable)."""
        t = self.server_reported
        if t:
            n, ms = t.get("predicted_n"), t.get("predicted_ms")
            if n is not None and ms is not None and n > 0 and 0 < ms < 86_400_000:
                return n * 1000.0 / ms
            per_s = t.get("predicted_per_second")
            if per_s is not None and 0 < per_s < 1e9:
                return float(per_s)
        st = self.server_timing
        if st and self.output_tokens >= 2:
            first, last = st.get("first_token_ns"), st.get("last_token_ns")
            if isinstance(first, int) and isinstance(last, int) and 0 < last - first < 86_400 * 10**9:
                return (self.output_tokens - 1) * 1e9 / (last - first)
        return None

    @property
    def bunched(self) -> bool:
        """The chunks arrived together (see the module docstring), so TPOT and tokens/s do not come from
        their arrival times. Stream mode only; never for a cache hit."""
        n = self.content_chunks
        if self.mode != "stream" or self.cache_hit or n < 2 or self.content_reads < 1:
            return False
        if n >= BUNCH_EVENTS_PER_READ * self.content_reads:
            return True
        rate = self.reported_tokens_per_s
        tpot = self._chunk_tpot_ms()
        return rate is not None and tpot is not None and tpot < BUNCH_GAP_SHARE * 1000.0 / rate

    def _span_rate(self) -> float | None:
        """Output tokens over the stream's span, response headers (else t0) to the last token: a rate that
        errs low (the span holds the prefill too), never the thousands a bunched stream's chunks claim."""
        last = self.last_token_ns
        if last is None or self.output_tokens < 1:
            return None
        start = self.phases.headers_ns if self.phases.headers_ns is not None else self.t0_ns
        span = last - start
        return None if span <= 0 else self.output_tokens * 1e9 / span

    @property
    def rate_source(self) -> str | None:
        """Where TPOT and tokens/s come from: ``"chunks"`` (their arrival), ``"server"`` (the server's own
        figures, the chunks being bunched), ``"span"`` (bunched, no server figures: tokens over the stream's
        span), ``"total"`` (batch mode); None when there is no rate."""
        if self.mode != "stream":
            return "total" if self.tokens_per_s is not None else None
        if self.tpot_ms is None:
            return None
        if not self.bunched:
            return "chunks"
        return "server" if self.reported_tokens_per_s else "span"

    @property
    def tpot_ms(self) -> float | None:
        tpot = self._chunk_tpot_ms()
        if tpot is None or not self.bunched:
            return tpot
        rate = self.reported_tokens_per_s or self._span_rate()
        return None if not rate else 1000.0 / rate

    @property
    def tokens_per_s(self) -> float | None:
        if self.mode == "stream":
            tpot = self.tpot_ms
            return None if not tpot else 1000.0 / tpot
        total = self.total_ms
        return None if not total or not self.output_tokens else self.output_tokens * 1000.0 / total

    @property
    def prompt_truncated(self) -> bool:
        """The server counted far fewer prompt tokens than llmchat sent (see the module docstring)."""
        sent, got = self.prompt_sent_tokens, self.prompt_tokens
        return (sent is not None and got is not None and got < TRUNCATED_SHARE * sent
                and sent - got >= TRUNCATED_MIN_TOKENS)

    @property
    def server_first_token_mono_ns(self) -> int | None:
        return None if self.server_timing is None else self.server_timing.get("first_token_ns")

    def to_mono_ns(self, perf_ns: int) -> int:
        """A perf_counter_ns stamp of this record on the time.monotonic_ns clock."""
        return self.t0_mono_ns + (perf_ns - self.t0_ns)

    def summary(self) -> dict[str, Any]:
        """The flat, JSON-ready figures (``llmchat ask --json``, logs, exports). Never text or secrets."""
        itl = self.itl_ms
        return {
            "request_id": self.request_id,
            "provider": self.provider,
            "model": self.model,
            "host": self.host,
            "mode": self.mode,
            "http_version": self.http_version,
            "proxy": self.proxy,
            "connection_reused": self.connection_reused,
            "closes_after_response": self.closes_after_response,
            "status": self.status,
            "model_lookup_ms": round_ms(self.model_lookup_ms),
            "rate_limit_wait_ms": round_ms(self.limit_wait_ms),
            "pool_wait_ms": round_ms(self.pool_wait_ms),
            "connect_ms": round_ms(self.connect_ms),
            "tls_ms": round_ms(self.tls_ms),
            "send_ms": round_ms(self.send_ms),
            "ttfb_ms": round_ms(self.ttfb_ms),
            "ttft_ms": round_ms(self.ttft_ms),
            "first_reasoning_ms": round_ms(self.first_reasoning_ms),
            "thinking_ms": round_ms(self.thinking_ms),
            "reasoning_chunks": self.reasoning_chunks,
            "tool_calls": self.tool_calls,
            "total_ms": round_ms(self.total_ms),
            "tpot_ms": round_ms(self.tpot_ms),
            "itl_ms_p50": round_ms(percentile(itl, 50)),
            "itl_ms_p99": round_ms(percentile(itl, 99)),
            "output_tokens": self.output_tokens,
            "prompt_tokens": self.prompt_tokens,
            "tokens_per_s": round_ms(self.tokens_per_s),
            "tokens_per_s_source": self.rate_source,
            "bunched": self.bunched,
            "prompt_sent_tokens": self.prompt_sent_tokens,
            "prompt_truncated": self.prompt_truncated,
            "attempts": self.attempts,
            "retries": len(self.retries),
            "retry_log": [r.describe() for r in self.retries],
            "cache_hit": self.cache_hit,
            "cancelled": self.cancelled,
            "finish_reason": self.finish_reason,
            "replaced_chars": self.replaced_chars,
            "error": self.error,
            "error_kind": self.error_kind,
            "ratelimit": None if self.headroom is None else self.headroom.to_dict(),
            "started_at": self.wall_start,
        }


def round_ms(v: float | None) -> float | None:
    """A figure as every JSON output rounds it (records, bench summaries, CSV rows): 3 decimals, None kept."""
    return None if v is None else round(v, 3)
