"""The local server's pure parts one at a time: tokeniser, replies, limiter, cold starts, dice, settings."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmchat.core.config._settings import ServerSettings
from llmchat.core.errors import UsageError
from llmchat.core.server import PROFILES, resolve_settings
from llmchat.core.server._encode import ChunkTemplate
from llmchat.core.server._faults import ColdStarts, FaultDice, RateLimiter, format_reset
from llmchat.core.server._http import Exchange
from llmchat.core.server._replies import (
    Reply,
    build_reply,
    chat_charge,
    count_prompt_tokens,
    count_tokens,
    tokenize,
)


@given(st.text())
def test_tokens_join_back_to_the_text(text: str) -> None:
    tokens = tokenize(text)
    assert "".join(tokens) == text
    assert all(tokens)
    assert count_tokens(text) == len(tokens)


def test_every_non_ascii_code_point_is_a_token_of_its_own() -> None:
    assert tokenize("café 日本 👩\u200d💻") == [
        "caf",
        "é",
        " 日",
        "本",
        " 👩",
        "\u200d",
        "💻",
    ]


def reply(max_tokens: int = 300, explicit: bool = False, seed: int = 0, stop: tuple[str, ...] = ()) -> Reply:
    return build_reply("m", '[{"role":"user","content":"hi"}]', "hi", seed, max_tokens, explicit, stop)


def test_explicit_max_tokens_is_the_exact_length() -> None:
    for limit in (1, 2, 50, 333, 2000):
        r = reply(limit, explicit=True)
        assert len(r.tokens) == limit and r.finish_reason == "length"


def test_default_length_ends_at_a_block_boundary_past_the_target() -> None:
    for target in (50, 300, 600):
        r = reply(target)
        assert r.finish_reason == "stop"
        assert target <= len(r.tokens) <= target + 150
        assert r.text == r.text.rstrip() and r.text.count("```") % 2 == 0


def test_escaped_tokens_are_json_string_bodies() -> None:
    r = reply(400, explicit=True)
    for token, escaped in zip(r.tokens, r.escaped, strict=True):
        assert json.loads(b'"' + escaped + b'"') == token
    assert any(b"\\n" in e for e in r.escaped) and any(b'\\"' in e for e in r.escaped)


def test_stop_cuts_inside_a_token() -> None:
    full = reply().text
    cut = full.index("ea")  # "ea" starts inside a word token
    r = reply(stop=("ea", "zzz"))
    assert r.text == full[:cut] and r.finish_reason == "stop"


def test_chunk_template_builds_valid_chunks() -> None:
    template = ChunkTemplate("chatcmpl-1", 123, 'model "quoted"', include_usage=True)
    chunks = [
        template.role(),
        template.content(b'a\\"b'),
        template.last(b"!", "stop", None),
        template.usage(
            {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
            {"server_timing": {"received_ns": 1}},
        ),
    ]
    parsed = [json.loads(c.removeprefix(b"data: ").removesuffix(b"\n\n")) for c in chunks]
    assert all(c.startswith(b"data: ") and c.endswith(b"}\n\n") for c in chunks)
    assert parsed[0]["choices"][0]["delta"]["role"] == "assistant"
    assert parsed[1]["choices"][0]["delta"]["content"] == 'a"b' and parsed[1]["model"] == 'model "quoted"'
    assert parsed[2]["choices"][0]["finish_reason"] == "stop"
    assert [p["usage"] for p in parsed[:3]] == [None] * 3
    assert parsed[3]["choices"] == [] and parsed[3]["usage"]["total_tokens"] == 3
    assert parsed[3]["server_timing"] == {"received_ns": 1}


def test_rate_limiter_is_a_refilling_bucket_whose_reset_is_time_to_full() -> None:
    # OpenAI's limits refill continuously and x-ratelimit-reset-* is the time until the bucket is full again.
    limiter = RateLimiter(2, window_s=60.0)  # one request back every 30 s
    first = limiter.check("a", 0.0)
    assert first.allowed and first.remaining == 1 and first.reset_s == pytest.approx(30.0)
    assert limiter.check("a", 10.0).allowed  # 1 + 10/30 left, now 1/3
    denied = limiter.check("a", 20.0)
    assert not denied.allowed and denied.remaining == 0 and denied.exceeded == "requests"
    assert denied.retry_s == pytest.approx(10.0) and denied.reset_s == pytest.approx(40.0)
    assert limiter.check("b", 20.0).allowed  # another bucket
    assert limiter.check("a", 30.0).allowed  # a whole request refilled
    assert not limiter.check("a", 35.0).allowed
    assert RateLimiter(0).check("a", 0.0).allowed


def test_rate_limiter_counts_tokens_as_they_are_asked_for() -> None:
    limiter = RateLimiter(0, window_s=60.0, token_limit=600)  # 10 tokens back per second
    ok = limiter.check("a", 0.0, tokens=500)
    assert ok.allowed and ok.tokens_remaining == 100 and ok.tokens_reset_s == pytest.approx(50.0)
    denied = limiter.check("a", 1.0, tokens=200)
    assert not denied.allowed and denied.exceeded == "tokens" and denied.retry_s == pytest.approx(9.0)
    assert limiter.check("a", 10.0, tokens=200).allowed
    # A request larger than the whole bucket passes a full one rather than never.
    assert limiter.check("b", 0.0, tokens=10_000).allowed


def test_chat_charge_is_prompt_plus_max_tokens() -> None:
    body = b'{"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 7}'
    assert chat_charge(body, 300) == count_prompt_tokens([{"role": "user", "content": "hello there"}]) + 7
    assert chat_charge(b'{"messages": []}', 300) == 3 + 300  # the server's default reply length
    assert chat_charge(b"not json", 300) == 0


def test_rate_limit_buckets_never_hold_the_key() -> None:
    bucket = RateLimiter.bucket("sk-secret-value")
    assert "secret" not in bucket and bucket == RateLimiter.bucket("sk-secret-value")
    assert RateLimiter.bucket(None) == RateLimiter.bucket("") == "anonymous"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0004, "1ms"),
        (0.12, "120ms"),
        (1.5, "1.5s"),
        (20.0, "20s"),
        (59.9991, "59.999s"),
        (360.0, "6m0s"),
        (61.2, "1m2s"),
    ],
)
def test_reset_durations_read_like_openai(seconds: float, text: str) -> None:
    assert format_reset(seconds) == text


def test_cold_start_is_shared_and_comes_back_after_idle() -> None:
    cold = ColdStarts(cold_start_s=5.0, idle_unload_s=100.0)
    assert cold.delay("m", 0.0) == 5.0
    assert cold.delay("m", 2.0) == 3.0  # still loading: waits for the same load
    assert cold.delay("m", 6.0) == 0.0
    cold.touch("m", 50.0)
    assert cold.delay("m", 149.0) == 0.0
    assert cold.delay("m", 250.0) == 5.0  # 101 s idle: unloaded
    assert cold.delay("other", 250.0) == 5.0
    never = ColdStarts(cold_start_s=1.0, idle_unload_s=0.0)
    assert never.delay("m", 0.0) == 1.0 and never.delay("m", 1e9) == 0.0
    assert ColdStarts(0.0, 1.0).delay("m", 0.0) == 0.0


def test_fault_dice_repeat_with_the_seed_and_keep_rates() -> None:
    def draws(seed: int) -> list[Any]:
        dice = FaultDice(seed, error_rate=0.3, drop_rate=0.2, jitter_ms=10.0)
        return [(dice.error_status(), dice.drop_after(10), dice.jitter()) for _ in range(2000)]

    first = draws(1)
    assert first == draws(1) and first != draws(2)
    errors = [e for e, _, _ in first if e is not None]
    drops = [d for _, d, _ in first if d is not None]
    assert 0.25 < len(errors) / 2000 < 0.35 and set(errors) == {500, 502, 503}
    assert 0.15 < len(drops) / 2000 < 0.25 and min(drops) >= 1 and max(drops) <= 9
    assert all(0.0 <= j <= 0.010 for _, _, j in first)
    quiet = FaultDice(0, 0.0, 0.0, 0.0)
    assert quiet.error_status() is None and quiet.drop_after(5) is None and quiet.jitter() == 0.0


async def test_write_splits_inside_the_first_multibyte_character() -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        raise AssertionError("not read")

    ex = Exchange({"headers": []}, receive, send, 0, 0.0)
    data = 'data: {"content":"caf\u00e9 \u65e5"}\n\n'.encode()
    await ex.write(data, more=False)
    await ex.write(b"ascii only")
    bodies = [m["body"] for m in sent]
    assert b"".join(bodies[:2]) == data
    with pytest.raises(UnicodeDecodeError):
        bodies[0].decode()
    assert [m["more_body"] for m in sent] == [True, False, True] and bodies[2] == b"ascii only"


def test_profiles_set_the_same_keys_and_explicit_keys_win() -> None:
    keys = {frozenset(p) for p in PROFILES.values()}
    assert len(keys) == 1
    slow = resolve_settings({"profile": "slow", "ttft_ms": 5.0})
    assert slow.ttft_ms == 5.0 and slow.tokens_per_s == PROFILES["slow"]["tokens_per_s"]
    assert slow.cold_start_ms == pytest.approx(6 * PROFILES["slow"]["ttft_ms"])
    # A later layer's profile replaces an earlier one; keys from every layer still win over it.
    layered = resolve_settings({"profile": "chat", "rate_limit": 7}, {"profile": "instant"})
    assert layered.profile == "instant" and layered.rate_limit == 7 and layered.ttft_ms == 0.0
    base = ServerSettings(profile="flaky")
    assert resolve_settings(base=base).error_rate == PROFILES["flaky"]["error_rate"]
    assert dataclasses.replace(resolve_settings(), port=1) == ServerSettings(port=1)


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        ({"profile": "fast"}, "unknown server profile 'fast': pick one of instant, chat, slow, flaky"),
        ({"ttfb_ms": 1}, "unknown key 'ttfb_ms'"),
        ({"error_rate": 1.5}, "server.error_rate must be a probability between 0 and 1, got 1.5"),
        ({"drop_rate": -0.1}, "server.drop_rate must be a probability between 0 and 1, got -0.1"),
        ({"ttft_ms": -1.0}, "server.ttft_ms must be a non-negative number, got -1.0"),
        ({"stall_ms": float("nan")}, "server.stall_ms must be a non-negative number, got nan"),
        ({"tokens_per_s": "fast"}, "server.tokens_per_s must be a non-negative number, got 'fast'"),
        ({"port": 70000}, "server.port must be an integer from 0 to 65535, got 70000"),
        ({"rate_limit": 1.5}, "server.rate_limit must be an integer"),
        ({"embedding_dim": 0}, "server.embedding_dim must be an integer from 1"),
        ({"models": []}, "server.models must be a non-empty list"),
        ({"certfile": "c.pem"}, "server.certfile is set but server.keyfile is not"),
    ],
)
def test_bad_settings_are_one_line_usage_errors(layer: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        resolve_settings(layer)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert caught.value.exit_code == 2
