"""Where a request's time went: client, network, server, retries, and what is left unexplained.

``attribute(record)`` cuts the request's total (t0 to the end of the body) into consecutive spans from the
record's own stamps, then splits the spans that hold the server's work with what the server reported about
itself. Every part says where its number came from:

- ``measured``: a span between two of the client's own stamps (or the client's own work, timed);
- ``reported``: a duration the server reported (``_server_reports`` reads and checks it);
- ``derived``: a measured span minus a reported one (the network's share of waiting for the server);
- ``estimated``: a figure neither measured nor reported (none of the parts below is, today).

The timeline, stream mode (batch mode has one reply span instead of the last two)::

    t0 ─ encode, retries ─ pool wait ─ connect ─ TLS ─ send ─┬─ to first token ─┬─ streaming ─ end
         client / retry     client     network   network  net│ server queue     │ server generation
                                                             │ server model load│ network (derived)
                                                             │ server prefill   │ client decode
                                                             │ network (derived)│
                                                             │ client decode    │

A reply that thought before answering (reasoning deltas, or an inline ``<think>`` block) has its time to first
token cut at the first reasoning token: the span before it is split as above, and the rest, to the first
answer token, is ``thinking`` (measured, group server: the model generating its reasoning). A note says
``thinking 4.2 s of 4.6 s to first token``. A server's reported generation (llama.cpp's ``predicted_ms``,
llmchat serve's first-to-last token) covers the reasoning tokens too, so the thinking is taken out of it for
the streaming span.

A request that had to look its model up (GET /models, no model named) starts with that lookup: its connect
and TLS (the connection it opened is the request's) and the rest as ``model lookup`` (network + server).

- ``client rate limit`` (group ``limit``): the client's own limiter holding the request back before an
  attempt (``record.limit_wait_ns``); the client chose to wait, so it is neither the network nor the server,
  and TTFB and TTFT do not count it.
- ``client setup``: building the client (SSL context, a connection slot's client) on the request's path, cut
  from the pool-wait span; only a request on a transport not prepared ahead has it.
- Parts sum to ``total_ms`` (exactly in integer nanoseconds; to float rounding in ms). ``unexplained`` takes
  the remainder: a span no stamp covers (a request that failed before its stamps were set), or, shown
  *negative*, a reported span longer than the measured span it should fit in (clocks, or a server that counts
  its own send time); a note says which. A derived part is never negative: the overlap goes to unexplained.
- A server that reports nothing gets ``network + server (not reported)`` parts, group ``network+server``:
  without a report the two cannot be told apart, and the attribution says so instead of guessing.
- ``server model load`` is the wait for the model to load that llmchat serve reports after a cold start
  (``server_timing.model_load_ns``); it is cut out of the prefill, never counted in it.
- llama.cpp's ``prompt_ms`` is the prefill and ``predicted_ms`` the generation; OpenAI's
  ``openai-processing-ms`` is the server's share of the time to the response headers, the rest up to the first
  token stays unsplit.
- A bunched stream (``TimingRecord.bunched``: its chunks arrived together, as llama-server's over loopback
  often do) had most of its generation happen before its first token arrived: the reported generation goes
  where it fits, the streaming span first and the rest of the time to first token, so it is counted once;
  a note says the chunks arrived together. A prompt the server counted far shorter than sent
  (``TimingRecord.prompt_truncated``) gets a note too (``record_notes``).
- A cache hit is all client.
- Render lag (from the TUI) happens after the bytes arrived, so it is outside the total: it is in ``after``.

Flags: ``cold_start`` (the server reported a model load, or a ``ColdStartDetector`` saw a first token
far slower than that provider and model's usual, right after idle), ``saturation`` (the server queued the
request for at least ``SATURATION_MIN_MS`` and at least ``SATURATION_SHARE`` of the client's time to first
token, or, in batch mode, of its total; or a metrics snapshot shows requests waiting: the one given, else
the one the record carries, ``TimingRecord.server_metrics``), ``cache_hit``.

Pure: records in, attributions out; no I/O, no clock read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from llmchat.core.observe._coldstart import ColdStartDetector
from llmchat.core.observe._server_reports import LLAMA_CPP, LLMCHAT, OPENAI, ServerReport, read_server_report
from llmchat.core.observe._timing import TimingRecord

Group = Literal["client", "limit", "network", "server", "network+server", "retry", "unexplained"]
Source = Literal["measured", "reported", "derived", "estimated"]

#: The groups in the order a stacked bar shows them.
GROUPS: tuple[Group, ...] = ("client", "limit", "network", "network+server", "server", "retry", "unexplained")

SATURATION_MIN_MS = 20.0
"""Queueing shorter than this is never called saturation: a busy event loop costs that much."""
SATURATION_SHARE = 0.25
"""...and it must be at least this share of the time to first token (batch mode: of the total)."""
KV_CACHE_FULL = 0.95
"""A metrics snapshot with the KV cache at least this full gets a note (preemption is near)."""

_NS_PER_MS = 1_000_000


class Part(NamedTuple):
    """One slice of a request's time. ``key`` is stable (charts, Prometheus labels, bench JSON); ``name`` is
    for people. A NamedTuple: a dozen are made per request, and a tuple is the cheapest immutable record."""

    key: str
    name: str
    group: Group
    ms: float
    source: Source

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: key, name, group, ms (rounded to the microsecond), source."""
        return {"key": self.key, "name": self.name, "group": self.group, "ms": round(self.ms, 3),
                "source": self.source}


# key -> (name, group, source) for every part attribute() can produce.
PARTS: dict[str, tuple[str, Group, Source]] = {
    "cache": ("cache hit", "client", "measured"),
    "model_lookup": ("model lookup (GET /models)", "network+server", "measured"),
    "rate_limit": ("client rate limit", "limit", "measured"),
    "encode": ("request encoding", "client", "measured"),
    "client_other": ("client (other)", "client", "measured"),
    "retries": ("retries and their waits", "retry", "measured"),
    "client_setup": ("client setup", "client", "measured"),
    "pool_wait": ("pool wait", "client", "measured"),
    "connect": ("connect", "network", "measured"),
    "tls": ("TLS handshake", "network", "measured"),
    "send": ("request transfer", "network", "measured"),
    "server_queue": ("server queue", "server", "reported"),
    "server_model_load": ("server model load", "server", "reported"),
    "server_prefill": ("server prefill", "server", "reported"),
    "server_generation": ("server generation", "server", "reported"),
    "server_processing": ("server processing", "server", "reported"),
    "thinking": ("thinking (reasoning tokens)", "server", "measured"),
    "network_first_token": ("network to first token", "network", "derived"),
    "network_stream": ("network while streaming", "network", "derived"),
    "network_reply": ("network (reply)", "network", "derived"),
    "network_server": ("network + server (not reported)", "network+server", "measured"),
    "network_server_stream": (
        "network + server while streaming (not reported)", "network+server", "measured"
    ),
    "decode": ("response decoding", "client", "measured"),
    "unexplained": ("unexplained", "unexplained", "measured"),
}
"""Every part ``attribute`` can produce, by key: (name, group, source). ``render_lag`` is in ``after``."""

RENDER_LAG = Part("render_lag", "render (after arrival)", "client", 0.0, "measured")


@dataclass(slots=True)
class Attribution:
    """A request's time in parts. ``parts`` sum to ``total_ms``; ``after`` holds what came after arrival
    (render lag), outside the total. ``reporter`` names the server report used ("" for none, "cache")."""

    parts: list[Part]
    total_ms: float
    flags: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    after: list[Part] = field(default_factory=list)
    reporter: str = ""
    server_metrics: dict[str, float] | None = None

    def part(self, key: str) -> Part | None:
        """The part with ``key``, or None when this request has none."""
        return next((p for p in self.parts if p.key == key), None)

    def ms(self, key: str) -> float:
        """The milliseconds of the part ``key``; 0.0 when this request has none."""
        found = self.part(key)
        return 0.0 if found is None else found.ms

    def group_ms(self) -> dict[str, float]:
        """Milliseconds per group, for the groups present, in ``GROUPS`` order."""
        out: dict[str, float] = {}
        for group in GROUPS:
            parts = [p.ms for p in self.parts if p.group == group]
            if parts:
                out[group] = sum(parts)
        return out

    def shares(self) -> dict[str, float]:
        """Each group's fraction of ``total_ms`` (``unexplained`` may be negative); {} for a zero total."""
        if self.total_ms <= 0:
            return {}
        return {g: ms / self.total_ms for g, ms in self.group_ms().items()}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``ask --json``'s ``attribution``, bench JSON, the request log). No text, no secrets."""
        return {
            "total_ms": round(self.total_ms, 3),
            "parts": [p.to_dict() for p in self.parts],
            "shares": {g: round(s, 4) for g, s in self.shares().items()},
            "after": [p.to_dict() for p in self.after],
            "flags": list(self.flags),
            "notes": list(self.notes),
            "reporter": self.reporter,
            "server_metrics": None if self.server_metrics is None else dict(self.server_metrics),
        }


MUTE_MS = 2.0
"""An unexplained remainder under this (either sign) is clock noise: shown as zero."""
ROUTINE_OVERLAP_MS = 5.0
"""A reported span overrunning the measured one by less than this is a routine clock overlap..."""
ROUTINE_OVERLAP_SHARE = 0.05
"""...and so is one under this share of the time the server reported (a long stream's first and last tokens
meet different one-way delays, a few ms apart, more on a busy machine)."""


def is_routine_overlap(overlap_ms: float, server_ms: float) -> bool:
    """Whether a reported span overrunning the measured one by ``overlap_ms`` is routine: under
    ``ROUTINE_OVERLAP_MS``, or under ``ROUTINE_OVERLAP_SHARE`` of the ``server_ms`` the server reported."""
    return overlap_ms < ROUTINE_OVERLAP_MS or overlap_ms < ROUTINE_OVERLAP_SHARE * server_ms


def shown_groups(attribution: Attribution) -> dict[str, float]:
    """Milliseconds per group as the HUD shows them: ``group_ms()``, with a negative unexplained part (a
    reported span longer than the measured one it fits in) that is a routine overlap folded into the server's
    figure (the server cannot have taken longer than the span the client measured), and any unexplained part
    under ``MUTE_MS`` dropped. A larger overlap stays, negative, for the reader to show as an overlap."""
    groups = attribution.group_ms()
    rest = groups.get("unexplained")
    if rest is None:
        return groups
    server = groups.get("server", 0.0)
    if rest < 0 and server > 0 and is_routine_overlap(-rest, server):
        groups["server"] = server + rest
        del groups["unexplained"]
    elif abs(rest) < MUTE_MS:
        del groups["unexplained"]
    return groups


def format_shares(attribution: Attribution) -> str:
    """One line of group shares, largest first: ``network 61% · server 30% · client 4% · unexplained 5%``;
    flags follow in brackets, a cold start with the model load the server reported
    (``[cold_start: server model load 1500 ms]``). Empty for a zero total. The shares are the HUD's
    (``shown_groups``): a routine overlap is folded into the server's figure, never a negative unexplained."""
    if attribution.total_ms <= 0:
        return ""
    shares = {g: ms / attribution.total_ms for g, ms in shown_groups(attribution).items()}
    ordered = sorted(shares.items(), key=lambda kv: -abs(kv[1]))
    text = " · ".join(f"{g} {s * 100:.0f}%" for g, s in ordered)
    if text and attribution.flags:
        load = attribution.part("server_model_load")
        flags = [f"{f}: {load.name} {load.ms:.0f} ms" if f == "cold_start" and load is not None else f
                 for f in attribution.flags]
        text += " [" + ", ".join(flags) + "]"
    return text


def shares_over(attributions: Iterable[Attribution]) -> dict[str, float]:
    """Each group's share of the summed totals of ``attributions`` (the HUD's "last N requests" bar)."""
    totals: dict[str, float] = {}
    grand = 0.0
    for a in attributions:
        grand += a.total_ms
        for g, ms in a.group_ms().items():
            totals[g] = totals.get(g, 0.0) + ms
    if grand <= 0:
        return {}
    return {g: totals[g] / grand for g in GROUPS if g in totals}


def part_samples(attributions: Iterable[Attribution]) -> dict[str, list[float]]:
    """Per part key, the milliseconds of every attribution that has the part (for per-part percentiles)."""
    out: dict[str, list[float]] = {}
    for a in attributions:
        for p in a.parts:
            out.setdefault(p.key, []).append(p.ms)
    return out


class _Builder:
    """Collects parts in integer nanoseconds so they sum to the total exactly."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = {}
        self.notes: list[str] = []

    def add(self, key: str, ns: int, *, keep_zero: bool = False) -> None:
        """Add ``ns`` to ``key``. Zero is kept only with ``keep_zero`` (a reported or always-present part, so
        per-part percentiles count it); negative spans, which only missing stamps produce, are dropped."""
        if ns > 0 or (ns == 0 and keep_zero):
            self.ns[key] = self.ns.get(key, 0) + ns

    def add_derived(self, key: str, span_ns: int, claimed_ns: int, what: str) -> None:
        """``span_ns`` minus ``claimed_ns`` (reported and measured parts inside it) as ``key``; a negative
        remainder goes to unexplained with a note."""
        rest = span_ns - claimed_ns
        self.add(key, max(0, rest), keep_zero=True)
        if rest < 0:
            # The final remainder (total less every other part) carries the overlap as negative unexplained.
            self.notes.append(
                f"the server reported {(-rest) / _NS_PER_MS:.1f} ms more than the measured {what} span; "
                "the overlap is shown as negative unexplained time"
            )


def _span(start: int | None, end: int | None, lo: int, hi: int) -> int:
    """``end - start`` clipped to [lo, hi]; 0 when a stamp is missing."""
    if start is None or end is None:
        return 0
    return max(0, min(end, hi) - max(start, lo))


def attribute(
    record: TimingRecord,
    *,
    render_lag_ms: float | None = None,
    server_metrics: Mapping[str, float] | None = None,
    detector: ColdStartDetector | None = None,
) -> Attribution:
    """Split ``record``'s total into parts (see the module docstring for the timeline and the rules).

    ``render_lag_ms``: the TUI's lag from arrival to paint, kept in ``after`` (outside the total).
    ``server_metrics``: a snapshot from ``scrape_server_metrics`` (requests_waiting, requests_running,
    kv_cache_usage), by default the one ``record.server_metrics`` carries; requests waiting flag saturation.
    ``detector``: a ``ColdStartDetector`` that is fed this record and may flag ``cold_start`` (call once per
    record); a model load the server reported flags it with or without one. Never raises for any record,
    finished or not, whatever the server reported; an unfinished record gives an empty attribution with a
    note.
    """
    after = [] if render_lag_ms is None else [_part("render_lag", round(render_lag_ms * _NS_PER_MS))]
    if server_metrics is None:
        server_metrics = record.server_metrics
    metrics = None if server_metrics is None else {k: float(v) for k, v in server_metrics.items()}
    if record.end_ns is None:
        return Attribution([], 0.0, notes=["the request has not finished"], after=after,
                           server_metrics=metrics)
    total_ns = max(0, record.end_ns - record.t0_ns)
    flags: list[str] = []
    if record.cache_hit:
        b = _Builder()
        b.add("cache", total_ns)
        report = ServerReport()
        reporter = "cache"
        flags.append("cache_hit")
    else:
        report = read_server_report(record)
        b = _timeline(record, report, total_ns)
        reporter = report.reporter
        b.notes[:0] = report.notes
        if _saturated(record, report):
            flags.append("saturation")
        b.notes.extend(record_notes(record))
    if metrics is not None:
        _read_metrics(metrics, flags, b.notes)
    spotted = detector is not None and detector.observe(record)  # fed every record, whatever the report
    if report.load_ns:
        flags.append("cold_start")
        b.notes.append(f"cold start: the server reported {report.load_ns / _NS_PER_MS:.0f} ms of model load")
    elif spotted:
        flags.append("cold_start")
        b.notes.append("likely cold start: the first token took far longer than usual, right after idle")
    if record.error_kind is not None:
        b.notes.append(f"the request ended early ({record.error_kind}): parts cover what happened until then")
    explained = sum(v for k, v in b.ns.items() if k != "unexplained")
    b.ns["unexplained"] = total_ns - explained
    parts = [_part(k, b.ns[k]) for k in PARTS if k in b.ns]
    return Attribution(parts, total_ns / _NS_PER_MS, flags, b.notes, after, reporter, metrics)


def _part(key: str, ns: int) -> Part:
    if key not in PARTS:
        return Part(key, RENDER_LAG.name, RENDER_LAG.group, ns / _NS_PER_MS, RENDER_LAG.source)
    name, group, source = PARTS[key]
    return Part(key, name, group, ns / _NS_PER_MS, source)


def _timeline(record: TimingRecord, report: ServerReport, total_ns: int) -> _Builder:
    b = _Builder()
    ph = record.phases
    t0 = record.t0_ns
    end = t0 + total_ns
    attempt = ph.start_ns if ph.start_ns and t0 <= ph.start_ns <= end else end

    # t0 -> the last attempt: a model lookup, encoding, then retries (earlier attempts and their waits) or
    # client work.
    before = attempt - t0 - _model_lookup(b, record, t0, attempt)
    held = min(max(0, record.limit_wait_ns), before)
    b.add("rate_limit", held)
    before -= held
    encode = min(max(0, record.encode_ns), before)
    b.add("encode", encode, keep_zero=True)
    b.add("retries" if record.retries else "client_other", before - encode)

    # The attempt up to the first byte sent: pool wait, connect, TLS; gaps between them are client work.
    send_start = ph.send_start_ns
    if send_start is not None and not attempt <= send_start <= end:
        send_start = None
    setup_end = send_start if send_start is not None else end
    first_conn = ph.connect_start_ns if ph.connect_start_ns is not None else send_start
    before_conn = _span(attempt, first_conn, attempt, setup_end)
    # Building the client on the request's path (a transport not prepared ahead) precedes the first connection
    # event like the pool wait does, and is not one.
    client_setup = min(max(0, ph.setup_ns), before_conn)
    pool = before_conn - client_setup
    connect = _span(ph.connect_start_ns, ph.connect_end_ns or setup_end, attempt, setup_end)
    tls = _span(ph.tls_start_ns, ph.tls_end_ns or setup_end, attempt, setup_end)
    b.add("client_setup", client_setup)
    b.add("pool_wait", pool, keep_zero=True)
    b.add("connect", connect)
    b.add("tls", tls)
    b.add("client_other", max(0, (setup_end - attempt) - before_conn - connect - tls))
    if send_start is None:
        return b

    send_end = ph.send_end_ns if ph.send_end_ns is not None and send_start <= ph.send_end_ns <= end else end
    b.add("send", send_end - send_start)

    decode_ns = max(0, record.decode_ns)
    first = record.first_token_ns
    if record.mode == "stream" and first is not None and send_end <= first <= end:
        decode_first = min(max(0, record.decode_before_first_ns), decode_ns)
        think = record.first_reasoning_ns
        thinking = 0
        if think is not None and send_end <= think < first:
            # Cut at the first reasoning token: what the server reports about its prefill fits before it.
            decode_think = min(max(0, record.decode_before_reasoning_ns), decode_first)
            thinking = first - think
            split = _bunched_generation(record, report, think - send_end, decode_think, end - first,
                                        decode_ns - decode_first, thinking)
            _to_first_token(b, record, report, think - send_end, decode_think, send_end,
                            0 if split is None else split[0])
            decode_during = min(decode_first - decode_think, thinking)
            b.add("decode", decode_during)
            b.add("thinking", thinking - decode_during, keep_zero=True)
            b.notes.append(f"thinking {_seconds(thinking)} of {_seconds(first - record.t0_ns)} to first token")
        else:
            split = _bunched_generation(record, report, first - send_end, decode_first, end - first,
                                        decode_ns - decode_first, 0)
            _to_first_token(b, record, report, first - send_end, decode_first, send_end,
                            0 if split is None else split[0])
        _streaming(b, report, end - first, decode_ns - decode_first, thinking,
                   None if split is None else split[1])
    else:
        _reply(b, report, end - send_end, decode_ns)
    return b


def _model_lookup(b: _Builder, record: TimingRecord, t0: int, attempt: int) -> int:
    """The model lookup before the first attempt, as connect, TLS and the lookup itself; its span in ns."""
    d = record.discovery
    if d is None or record.discovery_end_ns is None:
        return 0
    span = _span(d.start_ns, record.discovery_end_ns, t0, attempt)
    connect = _span(d.connect_start_ns, d.connect_end_ns, t0, attempt)
    tls = _span(d.tls_start_ns, d.tls_end_ns, t0, attempt)
    b.add("connect", connect)
    b.add("tls", tls)
    b.add("model_lookup", max(0, span - connect - tls))
    return span


def _bunched_generation(record: TimingRecord, report: ServerReport, first_span: int, first_decode: int,
                        stream_span: int, stream_decode: int, thinking: int) -> tuple[int, int] | None:
    """A bunched stream's reported generation, split where it happened: (before the first token arrived,
    while streaming). None unless the chunks were bunched (``record.bunched``) and the server reported a
    prefill and a generation.

    Bunched, the server generated most of the reply while the client still waited for its first bytes; put
    all in the streaming span it was both the network's share of the time to first token and the server's
    generation while streaming, and unexplained went negative by as much. So the streaming span takes what
    fits in it, the time to first token what fits there after the server's queue, load and prefill, and a
    remainder that fits in neither (clocks: a server stamp a little before the client's) is left out rather
    than shown as negative time: the server's figure is what tokens/s reads already."""
    if report.reporter not in (LLMCHAT, LLAMA_CPP) or report.generation_ns is None or report.prefill_ns is None:
        return None
    generation = max(0, report.generation_ns - thinking)
    while_streaming = min(generation, max(0, stream_span - min(max(0, stream_decode), stream_span)))
    if not record.bunched:
        # llama.cpp's predicted_ms counts the first token's own generation, which the client waited for before
        # that token arrived: one token's time of it belongs before the first token (without this, about that
        # much "negative unexplained" in one reply of three against llama-server). More than that over the
        # streaming span is a real overlap and stays one (llmchat serve's span is first to last token).
        if report.reporter != LLAMA_CPP or while_streaming == generation:
            return None
        one_token = generation // max(1, record.output_tokens or 1)
        spill = min(generation - while_streaming, one_token)
        return spill, generation - spill
    claimed_first = min(max(0, first_decode), first_span) + (report.queue_ns or 0) + (report.load_ns or 0) \
        + report.prefill_ns
    before_first = min(generation - while_streaming, max(0, first_span - claimed_first))
    return before_first, while_streaming


def _to_first_token(
    b: _Builder, record: TimingRecord, report: ServerReport, span: int, decode: int, send_end: int,
    spill: int = 0,
) -> None:
    decode = min(decode, span)
    b.add("decode", decode, keep_zero=True)
    if report.reporter in (LLMCHAT, LLAMA_CPP) and report.prefill_ns is not None:
        if report.queue_ns is not None:
            b.add("server_queue", report.queue_ns, keep_zero=True)
        if report.load_ns is not None:
            b.add("server_model_load", report.load_ns, keep_zero=True)
        b.add("server_prefill", report.prefill_ns, keep_zero=True)
        # A bunched stream's generation, before its first token arrived (``_bunched_generation``).
        b.add("server_generation", spill)
        claimed = decode + (report.queue_ns or 0) + (report.load_ns or 0) + report.prefill_ns + spill
        b.add_derived("network_first_token", span, claimed, "to-first-token")
    elif report.reporter == OPENAI and report.processing_ns is not None:
        headers = record.phases.headers_ns
        to_headers = _span(send_end, headers, send_end, send_end + span) if headers is not None else span
        b.add("server_processing", report.processing_ns, keep_zero=True)
        b.add_derived("network_first_token", to_headers, report.processing_ns, "to-headers")
        b.add("network_server", span - to_headers - decode)
    else:
        b.add("network_server", span - decode, keep_zero=True)


def _seconds(ns: int) -> str:
    """A note's duration: ``4.2 s`` from a second up, ``850 ms`` below."""
    return f"{ns / 1e9:.1f} s" if ns >= 1_000_000_000 else f"{ns / _NS_PER_MS:.0f} ms"


def _streaming(b: _Builder, report: ServerReport, span: int, decode: int, thinking: int = 0,
               bunched: int | None = None) -> None:
    decode = min(decode, span)
    b.add("decode", decode, keep_zero=True)
    if report.reporter in (LLMCHAT, LLAMA_CPP) and report.generation_ns is not None:
        # The reported generation began with the reasoning tokens, measured above as thinking; of a bunched
        # stream's, only what fits in this span (``_bunched_generation``).
        generation = max(0, report.generation_ns - thinking) if bunched is None else bunched
        b.add("server_generation", generation, keep_zero=True)
        b.add_derived("network_stream", span, decode + generation, "streaming")
    else:
        b.add("network_server_stream", span - decode, keep_zero=True)


def _reply(b: _Builder, report: ServerReport, span: int, decode: int) -> None:
    """Send end to the end of the body, no first token stamp (batch mode, or a stream without content)."""
    decode = min(decode, span)
    b.add("decode", decode, keep_zero=True)
    claimed = decode
    if report.reporter == OPENAI and report.processing_ns is not None:
        b.add("server_processing", report.processing_ns, keep_zero=True)
        claimed += report.processing_ns
    elif report.reporter in (LLMCHAT, LLAMA_CPP):
        for key, ns in (("server_queue", report.queue_ns), ("server_model_load", report.load_ns),
                        ("server_prefill", report.prefill_ns), ("server_generation", report.generation_ns)):
            if ns is not None:
                b.add(key, ns, keep_zero=True)
                claimed += ns
    else:
        b.add("network_server", span - decode, keep_zero=True)
        return
    b.add_derived("network_reply", span, claimed, "reply")


BUNCHED_NOTE = "the chunks arrived together"
TRUNCATED_NOTE = "the server counted"


def record_notes(record: TimingRecord) -> list[str]:
    """What a record's own figures need said beside them, one line each: chunks that arrived together (so the
    rate is the server's, or the stream's span), a prompt the server counted far shorter than sent (a context
    shift that dropped the start of the conversation). Empty for an ordinary reply; attribution's notes
    include these, and ``llmchat ask --stats`` prints them."""
    notes = []
    if record.bunched:
        source = record.rate_source
        where = ("the server's own timings" if source == "server" else
                 "the output tokens over the stream's span" if source == "span" else "no figure")
        notes.append(f"{BUNCHED_NOTE} ({record.content_chunks} in {record.content_reads} "
                     f"read{'s' if record.content_reads != 1 else ''}): tokens/s and the generation come from "
                     f"{where}, not from their arrival")
    if record.prompt_truncated:
        notes.append(f"{TRUNCATED_NOTE} {record.prompt_tokens:,} prompt tokens of about "
                     f"{record.prompt_sent_tokens:,} sent: it dropped the start of the conversation (a context "
                     "shift); start a new conversation, or give the server a larger context window")
    return notes


def _saturated(record: TimingRecord, report: ServerReport) -> bool:
    queue = report.queue_ns
    if not queue:
        return False
    streamed = record.mode == "stream" and record.first_token_ns is not None
    basis = record.ttft_ms if streamed else record.total_ms
    queue_ms = queue / _NS_PER_MS
    return basis is not None and queue_ms >= SATURATION_MIN_MS and queue_ms >= SATURATION_SHARE * basis


def _read_metrics(metrics: Mapping[str, float], flags: list[str], notes: list[str]) -> None:
    waiting = metrics.get("requests_waiting")
    running = metrics.get("requests_running")
    usage = metrics.get("kv_cache_usage")
    if waiting is not None and waiting > 0:
        if "saturation" not in flags:
            flags.append("saturation")
        running_text = "" if running is None else f", {running:g} running"
        plural = "" if waiting == 1 else "s"
        notes.append(
            f"the server's metrics show {waiting:g} request{plural} waiting{running_text}: it is saturated"
        )
    if usage is not None and usage >= KV_CACHE_FULL:
        notes.append(f"the server's KV cache is {usage * 100:.0f}% full: requests may be preempted or queued")
