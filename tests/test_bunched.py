"""Chunks that arrive together (issue 21): a stream whose events come several to a read measures its rate from
the server's own figures, says so, and attribution never counts its generation twice.

Unit tests build records the way the client fills them (content chunks stamped per read, ``content_reads``
counted per read); the end-to-end ones run the installed ``llmchat ask`` and ``ChatClient`` against
``llmchat serve --timings --bunch N`` on 127.0.0.1, whose true rate is the one it was told to pace at.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from llmchat.core import ChatClient, TimingRecord, attribute, record_notes
from llmchat.core.server import RunningServer

MODEL = "llmchat-local"
MSG = [{"role": "user", "content": "bunch them up"}]
MS = 1_000_000

Factory = Callable[..., RunningServer]

LLAMA_TIMINGS = {"prompt_n": 12.0, "prompt_ms": 8.0, "prompt_per_token_ms": 0.667, "prompt_per_second": 1500.0,
                 "predicted_n": 50.0, "predicted_ms": 31.25, "predicted_per_token_ms": 0.625,
                 "predicted_per_second": 1600.0, "cache_n": 0.0}
"""What llama-server's final chunk says of a 50-token reply decoded at 1,600 tokens/s."""


def _llama_record(*, reads: int, timings: dict[str, float] | None = LLAMA_TIMINGS) -> TimingRecord:
    """A 50-token stream from llama-server over loopback: headers at 1 ms, prefill 8 ms, generation
    31.25 ms, the whole reply delivered in ``reads`` reads at the end (the last at 41 ms)."""
    r = TimingRecord(mode="stream")
    t0 = r.t0_ns
    r.phases.start_ns = t0
    r.phases.send_start_ns = t0 + MS // 10
    r.phases.send_end_ns = t0 + MS // 5
    r.phases.headers_ns = t0 + MS
    per_read = 50 // reads
    stamps = [t0 + 41 * MS - (reads - 1 - k // per_read) * MS // 10 for k in range(50)]
    r.chunk_ns = stamps
    r.first_token_ns, r.last_token_ns = stamps[0], stamps[-1]
    r.content_chunks, r.content_reads = 50, reads
    r.output_tokens, r.usage_from_server, r.prompt_tokens = 50, True, 12
    r.server_reported = timings
    r.end_ns = t0 + 41 * MS + MS // 5
    return r


# -- the record ------------------------------------------------------------------------------------------
def test_a_reply_in_two_reads_takes_llamas_own_rate_and_says_so() -> None:
    r = _llama_record(reads=2)
    # From the arrival times alone: 49 tokens in 0.1 ms, about 490,000 tokens/s.
    assert r.bunched and r.rate_source == "server"
    assert r.tokens_per_s == pytest.approx(1600.0)
    assert r.tpot_ms == pytest.approx(0.625)
    summary = r.summary()
    assert summary["bunched"] is True and summary["tokens_per_s_source"] == "server"
    assert summary["tokens_per_s"] == pytest.approx(1600.0)
    assert any("arrived together" in n and "2 reads" in n for n in record_notes(r))


def test_without_server_figures_a_bunched_rate_is_the_tokens_over_the_streams_span() -> None:
    r = _llama_record(reads=2, timings=None)
    assert r.bunched and r.rate_source == "span"
    # 50 tokens from the headers (1 ms) to the last token (41 ms): 1,250 tokens/s, low but not 490,000.
    assert r.tokens_per_s == pytest.approx(50 / 0.040, rel=1e-6)


def test_a_stream_read_token_by_token_keeps_its_own_rate() -> None:
    r = TimingRecord(mode="stream")
    r.chunk_ns = [r.t0_ns + (10 + k) * MS for k in range(20)]  # one token a millisecond, one read each
    r.first_token_ns, r.last_token_ns = r.chunk_ns[0], r.chunk_ns[-1]
    r.content_chunks = r.content_reads = r.output_tokens = 20
    r.end_ns = r.last_token_ns + MS
    r.server_reported = {"predicted_n": 20.0, "predicted_ms": 19.5}  # the server agrees within a few %
    assert not r.bunched and r.rate_source == "chunks"
    assert r.tokens_per_s == pytest.approx(1000.0)
    assert record_notes(r) == [] and r.summary()["bunched"] is False


def test_gaps_far_below_the_servers_per_token_time_are_bunched_even_one_event_a_read() -> None:
    r = _llama_record(reads=50)
    # One event a read, the reads 0.1 ms apart, while llama says 0.625 ms a token: gaps under half the
    # server's per-token time are chunks that queued up on the way, not the model's pace.
    assert r.bunched and r.tokens_per_s == pytest.approx(1600.0)


# -- attribution -----------------------------------------------------------------------------------------
def test_a_bunched_streams_generation_is_counted_once_and_nothing_goes_negative() -> None:
    r = _llama_record(reads=2)
    a = attribute(r)
    total_ns = r.end_ns - r.t0_ns  # type: ignore[operator]
    assert sum(p.ms for p in a.parts) == pytest.approx(total_ns / MS)
    # The 31.25 ms llama generated for happened before the first token arrived: once, as the server's.
    assert a.ms("server_generation") == pytest.approx(31.25)
    assert a.ms("server_prefill") == pytest.approx(8.0)
    assert a.ms("unexplained") >= 0.0
    assert a.shares().get("unexplained", 0.0) >= 0.0
    assert not any("negative unexplained" in n for n in a.notes)
    assert any("arrived together" in n for n in a.notes)


# -- llmchat serve --timings --bunch, end to end ---------------------------------------------------------
def _llmchat() -> str:
    path = Path(sys.executable).parent / "llmchat"
    assert path.exists(), "the llmchat entry point is installed beside this Python"
    return str(path)


def test_ask_json_stats_reports_the_servers_rate_for_a_bunched_stream(server_factory: Factory) -> None:
    # 200 tokens/s, twelve events a write: a 24-token reply arrives in two reads 60 ms apart, so its arrival
    # times claim about 380 tokens/s. The server's own figures say 200 (24 tokens over the 23 gaps: 209).
    server = server_factory(profile="instant", tokens_per_s=200, timings=True, bunch=12)
    done = subprocess.run(
        [_llmchat(), "ask", "bunch them up", "--json", "--stats", "--base-url", server.base_url, "--model", MODEL,
         "--max-tokens", "24"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    obj = json.loads(done.stdout)
    assert obj["output_tokens"] == 24 and obj["bunched"] is True
    assert obj["tokens_per_s_source"] == "server"
    assert obj["tokens_per_s"] == pytest.approx(200 * 24 / 23, rel=0.2)
    parts = {p["key"]: p["ms"] for p in obj["attribution"]["parts"]}
    assert parts.get("unexplained", 0.0) >= 0.0
    assert obj["attribution"]["shares"].get("unexplained", 0.0) >= 0.0
    # Generated over about 115 ms whatever the bunching: counted once, as the server's.
    assert parts["server_generation"] == pytest.approx(23 * 5.0, rel=0.3)
    lines = done.stderr.strip().splitlines()
    assert any("chunks arrived together" in line for line in lines)
    assert "tok/s" in lines[-1]  # the timing line stays the last


async def test_serve_timings_look_like_llamas_and_bunch_sends_n_events_a_write(server_factory: Factory) -> None:
    server = server_factory(profile="instant", tokens_per_s=400, timings=True, bunch=6)
    async with ChatClient(base_url=server.base_url, model=MODEL, http2="h2c", use_cache=False) as client:
        stream = client.stream(MSG, max_tokens=18)
        _ = [p async for p in stream]
        whole = await client.complete(MSG, max_tokens=18)
    r = stream.record
    t = r.server_reported
    assert t is not None and t["predicted_n"] == 18 and t["prompt_n"] == r.prompt_tokens
    assert t["predicted_per_second"] == pytest.approx(18 * 1000 / t["predicted_ms"])
    assert t["predicted_per_token_ms"] == pytest.approx(t["predicted_ms"] / 18)
    assert set(t) >= {"prompt_ms", "prompt_per_token_ms", "prompt_per_second", "cache_n"}
    # Three writes of six events: never more than one read for each, however the reads fall.
    assert r.content_chunks == 18 and r.content_reads <= 3 and r.bunched
    assert whole.record.server_reported is not None and whole.record.server_reported["predicted_n"] == 18


async def test_without_bunch_a_paced_stream_is_not_bunched(server_factory: Factory) -> None:
    server = server_factory(profile="instant", tokens_per_s=50, timings=True)
    async with ChatClient(base_url=server.base_url, model=MODEL, http2="h2c", use_cache=False) as client:
        stream = client.stream(MSG, max_tokens=8)
        _ = [p async for p in stream]
    r = stream.record
    # 20 ms between tokens, one event a write: read one by one, the client's own rate stands.
    assert not r.bunched and r.rate_source == "chunks" and r.content_reads >= 6
