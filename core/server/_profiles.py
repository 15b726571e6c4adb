"""Named latency and fault profiles for `llmchat serve`, and how a ServerSettings is resolved and checked.

Layers, later wins: the dataclass defaults, then the named profile, then each mapping of explicitly given keys
(the config file's ``[server]`` section, then the command-line flags). A profile sets every timing and fault
key, so switching profile never inherits half of another; a key given explicitly always beats the profile.

Profiles:

``instant``
    Everything zero or unlimited: no delay, no faults. The benchmark and test target.
``chat``
    A hosted API's feel: first token after about 250 ms, about 70 tokens/s with up to 30 ms jitter per token.
``slow``
    A local model on modest hardware: first token after about 1.5 s, about 15 tokens/s, and a cold start of
    9 s (6x the time to first token) on the first request for a model or after 5 minutes idle.
``flaky``
    ``chat`` timings plus faults: 10 % of requests fail with 500/502/503, 5 % of streams are cut mid-way,
    and 30 requests per minute per API key before 429.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from llmchat.core.config import ServerSettings
from llmchat.core.errors import UsageError

_OFF: dict[str, Any] = {
    "ttft_ms": 0.0,
    "tokens_per_s": 0.0,
    "jitter_ms": 0.0,
    "cold_start_ms": 0.0,
    "idle_unload_s": 300.0,
    "rate_limit": 0,
    "error_rate": 0.0,
    "drop_rate": 0.0,
    "stall_ms": 0.0,
}

_CHAT: dict[str, Any] = {**_OFF, "ttft_ms": 250.0, "tokens_per_s": 70.0, "jitter_ms": 30.0}

#: Profile name -> the ServerSettings keys it sets. Every profile sets the same keys.
PROFILES: dict[str, dict[str, Any]] = {
    "instant": dict(_OFF),
    "chat": _CHAT,
    "slow": {**_OFF, "ttft_ms": 1500.0, "tokens_per_s": 15.0, "jitter_ms": 60.0, "cold_start_ms": 9000.0},
    "flaky": {**_CHAT, "error_rate": 0.1, "drop_rate": 0.05, "rate_limit": 30},
}

#: One line per profile, for `llmchat serve --help`.
PROFILE_SUMMARIES: dict[str, str] = {
    "instant": "no delay, unlimited speed, no faults (benchmarks, tests)",
    "chat": "hosted-API feel: ~250 ms to first token, ~70 tokens/s, 30 ms jitter",
    "slow": "local-model feel: ~1.5 s to first token, ~15 tokens/s, 9 s cold start",
    "flaky": "chat timings + 10% 5xx errors, 5% cut streams, 30 requests/min per key",
}

_FIELDS = {f.name for f in dataclasses.fields(ServerSettings)}
_NON_NEGATIVE = (
    "ttft_ms", "tokens_per_s", "jitter_ms", "cold_start_ms", "idle_unload_s", "stall_ms", "rtt_ms",
    "batch_turnaround_s",
    "prefill_tokens_per_s",
)
_PROBABILITIES = ("error_rate", "drop_rate", "batch_fail_share")
MAX_REASONING_TOKENS = 100_000


def resolve_settings(*layers: Mapping[str, Any], base: ServerSettings | None = None) -> ServerSettings:
    """A validated ServerSettings: ``base`` (default: the defaults), the profile, then ``layers`` in order.

    The profile is the last ``profile`` named by a layer, else ``base.profile``. Each layer holds only keys
    that were given explicitly (ServerSettings field names). Raises UsageError, one line, for an unknown key,
    an unknown profile or a value out of range.
    """
    settings = base if base is not None else ServerSettings()
    profile = settings.profile
    for layer in layers:
        unknown = sorted(set(layer) - _FIELDS)
        if unknown:
            raise UsageError(
                f"server settings: unknown key {unknown[0]!r}; known keys are {', '.join(sorted(_FIELDS))}"
            )
        if layer.get("profile"):
            profile = str(layer["profile"])
    if profile:
        if profile not in PROFILES:
            raise UsageError(f"unknown server profile {profile!r}: pick one of {', '.join(PROFILES)}")
        settings = dataclasses.replace(settings, profile=profile, **PROFILES[profile])
    for layer in layers:
        settings = dataclasses.replace(settings, **layer)
    validate_settings(settings)
    return settings


def validate_settings(settings: ServerSettings) -> None:
    """Check every ServerSettings value is in range; raises UsageError naming the key, rule and value."""
    for name in _NON_NEGATIVE:
        value = getattr(settings, name)
        if not _is_number(value) or not math.isfinite(value) or value < 0:
            raise UsageError(f"server.{name} must be a non-negative number, got {value!r}")
    for name in _PROBABILITIES:
        value = getattr(settings, name)
        if not _is_number(value) or not 0.0 <= value <= 1.0:
            raise UsageError(f"server.{name} must be a probability between 0 and 1, got {value!r}")
    _check_int(settings, "port", 0, 65535)
    _check_int(settings, "rate_limit", 0, 10**9)
    _check_int(settings, "rate_limit_tokens", 0, 10**12)
    window = settings.rate_limit_window_s
    if not _is_number(window) or not math.isfinite(window) or window <= 0:
        raise UsageError(f"server.rate_limit_window_s must be a positive number of seconds, got {window!r}")
    _check_int(settings, "max_concurrency", 0, 10**6)
    _check_int(settings, "reasoning_tokens", 0, MAX_REASONING_TOKENS)
    _check_int(settings, "max_requests_per_connection", 0, 10**8)
    _check_int(settings, "embedding_dim", 1, 65536)
    _check_int(settings, "template_overhead", 0, 10_000)
    _check_int(settings, "bunch", 1, 100_000)
    _check_int(settings, "default_max_tokens", 1, 1_000_000)
    _check_int(settings, "seed", -(2**63), 2**63 - 1)
    if not settings.host:
        raise UsageError("server.host must not be empty; use 127.0.0.1 to listen on this machine only")
    if not settings.models or not all(isinstance(m, str) and m.strip() for m in settings.models):
        raise UsageError(f"server.models must be a non-empty list of model ids, got {settings.models!r}")
    if bool(settings.certfile) != bool(settings.keyfile):
        given, missing = ("certfile", "keyfile") if settings.certfile else ("keyfile", "certfile")
        raise UsageError(
            f"server.{given} is set but server.{missing} is not; give both, or neither with --tls"
        )
    if settings.profile and settings.profile not in PROFILES:
        raise UsageError(f"unknown server profile {settings.profile!r}: pick one of {', '.join(PROFILES)}")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_int(settings: ServerSettings, name: str, low: int, high: int) -> None:
    value = getattr(settings, name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UsageError(f"server.{name} must be an integer from {low} to {high}, got {value!r}")
