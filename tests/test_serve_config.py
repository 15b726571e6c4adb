"""`llmchat serve` honours the config file's [server] section, under the flags and over the profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmchat.core import UsageError
from llmchat.core.server import resolve_settings
from llmchat.core.server._cli import config_values


def test_file_keys_layer_between_profile_and_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMCHAT_SERVER__TTFT_MS", raising=False)
    config = tmp_path / "config.toml"
    config.write_text('[server]\nprofile = "chat"\nttft_ms = 5\nrate_limit = 7\n', encoding="utf-8")
    layer = config_values(str(config))
    assert layer == {"profile": "chat", "ttft_ms": 5.0, "rate_limit": 7}
    from_file = resolve_settings(layer, {})
    assert from_file.ttft_ms == 5.0 and from_file.rate_limit == 7 and from_file.tokens_per_s == 70.0  # chat's rate
    with_flag = resolve_settings(layer, {"ttft_ms": 9.0})
    assert with_flag.ttft_ms == 9.0 and with_flag.rate_limit == 7


def test_environment_reaches_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMCHAT_SERVER__STALL_MS", "40")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))  # no file at the default path: defaults + env
    assert config_values(None)["stall_ms"] == 40.0


def test_a_bad_profile_in_the_file_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[server]\nprofile = "turbo"\n', encoding="utf-8")
    with pytest.raises(UsageError, match="unknown server profile 'turbo'"):
        resolve_settings(config_values(str(config)), {})
