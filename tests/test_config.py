"""Config loading, validation, provider resolution and `llmchat config`, against real files in tmp dirs."""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import textwrap
import typing
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import llmchat.core.config._settings as _settings_module
from llmchat.core.config._load import (
    ResolvedProvider,
    default_config_path,
    load_settings,
    mask_secret,
    resolve_provider,
    settings_to_toml,
)
from llmchat.core.config._settings import HttpSettings, ProviderSettings, Settings, UISettings
from llmchat.core.config._validate import RULES, SUBTABLES
from llmchat.core.errors import ConfigError
from llmchat.tui.cli import main

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "config.example.toml"
SETTINGS_SOURCE = Path(_settings_module.__file__)
# Fake keys, long enough that mask_secret shows a tail: a test fails if any of them is printed whole.
FILE_KEY = "sk-test-" + "abcdefghijklmnopqrstuvwx"
ENV_KEY = "sk-test-" + "ZYXWVUTSRQPONMLKJIHGFEDC"
HEADER_KEY = "sk-test-" + "hdrhdrhdrhdrhdrhdrhdrhdr"
SERVER_KEY = "srv-token-" + "qwertyuiopasdfghjklzxcvb"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Never read the real user's config or keys: a fresh XDG home and no OPENAI_*/LLMCHAT_* variables."""
    for var in list(os.environ):
        if var.startswith(("LLMCHAT_", "OPENAI_")):
            monkeypatch.delenv(var)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


def assert_config_error(capsys: pytest.CaptureFixture[str], config: Path, expected: str) -> None:
    rc, out, err = cli(capsys, "--config", str(config), "config", "check")
    assert (rc, out, err) == (2, "", f"llmchat: {expected}\n")


# --- the message for each kind of broken file, through the real command line ----------------------------

BAD_VALUES = [
    ('[http]\nmax_connections = "ten"', 'http.max_connections must be a positive integer, got "ten"'),
    ("[http]\nmax_connections = 0", "http.max_connections must be a positive integer, got 0"),
    ("[http]\nmax_connections = 2.5", "http.max_connections must be a positive integer, got 2.5"),
    ("[retry]\nmax_attempts = true", "retry.max_attempts must be a positive integer, got true"),
    ('[http]\nhttp2 = "yes"', 'http.http2 must be true, false or "h2c", got "yes"'),
    ("[http]\nhttp2 = 2", 'http.http2 must be true, false or "h2c", got 2'),
    ('[http]\nverify = ""', 'http.verify must be true, false or the path of a CA bundle, got ""'),
    ("[http]\nread_timeout_s = 0", "http.read_timeout_s must be a positive number of seconds, got 0"),
    (
        "[http]\nkeepalive_expiry_s = -1",
        "http.keepalive_expiry_s must be a non-negative number of seconds, got -1",
    ),
    ("[ui]\nsla_ttft_ms = nan", "ui.sla_ttft_ms must be a positive number of milliseconds, got nan"),
    ('[ui]\nshow_hud = "yes"', 'ui.show_hud must be true or false, got "yes"'),
    ("[ui]\ntheme = 7", "ui.theme must be a non-empty string, got 7"),
    (
        '[cache]\npolicy = "sometimes"',
        'cache.policy must be one of "deterministic", "always", "off", got "sometimes"',
    ),
    (
        '[cache]\npolicy = "alwasy"',
        'cache.policy must be one of "deterministic", "always", "off", got "alwasy" (did you mean "always"?)',
    ),
    ('[http]\nhttp2 = "H2C"', 'http.http2 must be true, false or "h2c", got "H2C" (did you mean "h2c"?)'),
    (
        '[providers.x.http]\nhttp2 = "h2"',
        'providers.x.http.http2 must be true, false or "h2c", got "h2" (did you mean "h2c"?)',
    ),
    ("[server]\nerror_rate = 1.5", "server.error_rate must be a probability from 0 to 1, got 1.5"),
    ("[server]\nport = 70000", "server.port must be a port number from 0 to 65535, got 70000"),
    ('[server]\nmodels = ["a", 1]', 'server.models must be a non-empty list of model ids, got ["a", 1]'),
    ("[server]\nmodels = []", "server.models must be a non-empty list of model ids, got []"),
    ("[keymap]\nsend = 1", "keymap.send must be a string, got 1"),
    ("default_provider = 3", "default_provider must be a string, got 3"),
    ("http = 3", "http must be a table, got 3"),
    ("[http.http2]\nx = 1", 'http.http2 must be true, false or "h2c", got { x = 1 }'),
    ("providers = 3", "providers must be a table of [providers.NAME] tables, got 3"),
    ('[providers]\nx = "y"', 'providers.x must be a table, got "y"'),
    (
        '[providers.x]\nbase_url = "ftp://h/v1"',
        'providers.x.base_url must be an http:// or https:// URL, got "ftp://h/v1"',
    ),
    (
        '[providers.x]\napi_key_env = "MY KEY"',
        'providers.x.api_key_env must be the name of an environment variable, got "MY KEY"',
    ),
    ('[providers.x.http]\nhttp2 = "h3"', 'providers.x.http.http2 must be true, false or "h2c", got "h3"'),
    (
        "[providers.x]\nmetrics_interval_s = 0",
        "providers.x.metrics_interval_s must be a positive number of seconds, got 0",
    ),
    (
        "[providers.x.http]\nmax_connections = 0",
        "providers.x.http.max_connections must be a positive integer, got 0",
    ),
    ("[providers.x.headers]\nX-Org = 1", "providers.x.headers.X-Org must be a string, got 1"),
    (
        '[providers.x]\nname = "y"',
        "providers.x.name is taken from the table's name and cannot be set; remove it",
    ),
    (
        '[ui.prices."gpt-4.1-mini"]\ninput_per_mtoks = 0.15',
        'ui.prices."gpt-4.1-mini" must be a table of input_per_mtok and output_per_mtok, non-negative prices '
        "per million tokens, got { input_per_mtoks = 0.15 }",
    ),
    (
        "[ui.prices.m]\noutput_per_mtok = -1",
        "ui.prices.m must be a table of input_per_mtok and output_per_mtok, non-negative prices per million "
        "tokens, got { output_per_mtok = -1 }",
    ),
    (
        '[ui.prices.m]\ninput_per_mtok = "cheap"',
        "ui.prices.m must be a table of input_per_mtok and output_per_mtok, non-negative prices per million "
        'tokens, got { input_per_mtok = "cheap" }',
    ),
]


def test_prices_per_model_load_as_numbers(tmp_path: Path) -> None:
    config = write(
        tmp_path / "config.toml",
        """
        [ui.prices."gpt-4o-mini"]
        input_per_mtok = 0.15
        output_per_mtok = 0.6
        [ui.prices.local]
        output_per_mtok = 0
        """,
    )
    prices = load_settings(config, env={}).ui.prices
    assert prices == {
        "gpt-4o-mini": {"input_per_mtok": 0.15, "output_per_mtok": 0.6},
        "local": {"output_per_mtok": 0.0},
    }
    assert isinstance(prices["local"]["output_per_mtok"], float)


@pytest.mark.parametrize(("text", "message"), BAD_VALUES, ids=[m.split(" ")[0] for _, m in BAD_VALUES])
def test_a_bad_value_is_one_line_naming_file_key_expectation_and_value(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, message: str
) -> None:
    config = write(tmp_path / "config.toml", text + "\n")
    assert_config_error(capsys, config, f"config.toml: {message}")


UNKNOWN_KEYS = [
    ("[http]\nmax_conections = 3", "unknown key http.max_conections (did you mean http.max_connections?)"),
    ("[htp]\nmax_connections = 3", "unknown section [htp] (did you mean [http]?)"),
    ("[retry]\nattempts = 3", "unknown key retry.attempts (did you mean retry.max_attempts?)"),
    ('default_providr = "x"', "unknown key default_providr (did you mean default_provider?)"),
    ('[providers.x]\napikey = "k"', "unknown key providers.x.apikey (did you mean providers.x.api_key?)"),
    (
        "[providers.x.http]\nmax_conections = 3",
        "unknown key providers.x.http.max_conections (did you mean providers.x.http.max_connections?)",
    ),
    (
        "[batch]\nzzz = 1",
        "unknown key batch.zzz (valid keys here: max_size, window_ms, concurrency, completion_window, "
        "poll_interval_s)",
    ),
]


@pytest.mark.parametrize(("text", "message"), UNKNOWN_KEYS, ids=[m.split(" ")[2] for _, m in UNKNOWN_KEYS])
def test_an_unknown_key_or_section_names_the_closest_valid_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, message: str
) -> None:
    config = write(tmp_path / "config.toml", text + "\n")
    assert_config_error(capsys, config, f"config.toml: {message}")


def test_toml_syntax_error_names_file_line_and_column(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = write(tmp_path / "config.toml", "[http]\nmax_connections = = 3\n")
    assert_config_error(capsys, config, "config.toml: invalid TOML at line 2, column 19: invalid value")
    config = write(tmp_path / "config.toml", "[ui]\n[http\n")
    rc, _, err = cli(capsys, "--config", str(config), "config", "check")
    assert rc == 2
    assert re.fullmatch(r"llmchat: config\.toml: invalid TOML at line 2, column \d+: expected '\]'.*\n", err)


def test_a_file_that_is_not_utf8_names_the_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_bytes(b'[ui]\ntheme = "caf\xe9"\n')
    assert_config_error(
        capsys, config, "config.toml: line 2 is not UTF-8 (byte 0xe9); save the file as UTF-8"
    )


def test_a_directory_instead_of_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    folder = tmp_path / "llmchat"
    folder.mkdir()
    assert_config_error(capsys, folder, f"config file {folder} is a directory; name the TOML file inside it")


def test_a_path_through_a_file_cannot_be_read(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    blocker = write(tmp_path / "plain", "x")
    config = blocker / "config.toml"
    assert_config_error(
        capsys,
        config,
        f"config file {config} cannot be read (Not a directory); fix the path or its permissions",
    )


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_pipe_is_refused_without_blocking_on_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    assert_config_error(capsys, fifo, f"config file {fifo} is not a regular file; name a TOML file")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = write(tmp_path / "config.toml", "")
    config.chmod(0)
    assert_config_error(
        capsys, config, f"config file {config} cannot be read (Permission denied); fix its permissions"
    )


def test_a_huge_file_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_bytes(b"#" * (1 << 20) + b"\n")
    assert_config_error(
        capsys,
        config,
        f"config file {config} is larger than 1 MiB, too big to be a config file; check the path",
    )


def test_a_missing_file_named_by_flag_or_env_is_an_error_but_not_at_the_default_path(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = tmp_path / "nope.toml"
    assert_config_error(
        capsys,
        missing,
        f"config file {missing} (named by --config) does not exist; fix the path given to --config or "
        "create the file",
    )
    monkeypatch.setenv("LLMCHAT_CONFIG", str(missing))
    rc, out, err = cli(capsys, "config", "check")
    assert (rc, out) == (2, "")
    assert err == (
        f"llmchat: config file {missing} (named by LLMCHAT_CONFIG) does not exist; fix LLMCHAT_CONFIG or "
        "create the file\n"
    )
    monkeypatch.delenv("LLMCHAT_CONFIG")
    assert cli(capsys, "config", "check") == (
        0,
        "config.toml: not found, defaults apply (0 providers, default: the local server)\n",
        "",
    )
    assert load_settings() == Settings()


# --- environment and flags --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        (
            "LLMCHAT_HTTP__MAX_CONNECTIONS",
            "ten",
            'LLMCHAT_HTTP__MAX_CONNECTIONS must be a positive integer, got "ten"',
        ),
        ("LLMCHAT_RETRY__MAX_ATTEMPTS", "0", "LLMCHAT_RETRY__MAX_ATTEMPTS must be a positive integer, got 0"),
        ("LLMCHAT_HTTP__HTTP2", "yes", 'LLMCHAT_HTTP__HTTP2 must be true, false or "h2c", got "yes"'),
        (
            "LLMCHAT_HTTP__MAX_CONECTIONS",
            "20",
            "LLMCHAT_HTTP__MAX_CONECTIONS is not a setting (did you mean LLMCHAT_HTTP__MAX_CONNECTIONS?)",
        ),
        (
            "LLMCHAT_HTP__MAX_CONNECTIONS",
            "20",
            "LLMCHAT_HTP__MAX_CONNECTIONS is not a setting (did you mean LLMCHAT_HTTP__MAX_CONNECTIONS?)",
        ),
        (
            "LLMCHAT_PROVIDERS__GROQ",
            "x",
            "LLMCHAT_PROVIDERS__GROQ names no provider key; use LLMCHAT_PROVIDERS__NAME__KEY, for example "
            "LLMCHAT_PROVIDERS__OLLAMA__BASE_URL",
        ),
        (
            "LLMCHAT_PROVIDERS__GROQ__BASE_URL",
            "localhost:8000",
            'LLMCHAT_PROVIDERS__GROQ__BASE_URL must be an http:// or https:// URL, got "localhost:8000"',
        ),
        (
            "LLMCHAT_PROVIDERS__GROQ__MODL",
            "x",
            "LLMCHAT_PROVIDERS__GROQ__MODL is not a setting (did you mean LLMCHAT_PROVIDERS__GROQ__MODEL?)",
        ),
        (
            "OPENAI_BASE_URL",
            "localhost:8000",
            'OPENAI_BASE_URL must be an http:// or https:// URL, got "localhost:8000"',
        ),
    ],
)
def test_a_bad_environment_variable_is_named_in_the_message(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, var: str, value: str, message: str
) -> None:
    monkeypatch.setenv(var, value)
    assert cli(capsys, "config", "check") == (2, "", f"llmchat: {message}\n")


def test_environment_values_are_read_as_toml_where_the_field_wants_it() -> None:
    env = {
        "LLMCHAT_HTTP__HTTP2": "h2c",
        "LLMCHAT_HTTP__VERIFY": "/etc/ssl/ca.pem",
        "LLMCHAT_HTTP__KEEPALIVE_EXPIRY_S": "5",
        "LLMCHAT_HTTP__TRUST_ENV": "false",
        "LLMCHAT_UI__THEME": "true",
        "LLMCHAT_CACHE__POLICY": '"always"',
        "LLMCHAT_SERVER__MODELS": '["a", "b"]',
        "LLMCHAT_KEYMAP__SEND": "ctrl+s",
        "LLMCHAT_DEFAULT_PROVIDER": "",
        "LLMCHAT_NOT_A_SETTING": "ignored: no double underscore",
    }
    s = load_settings(env=env)
    assert s.http.http2 == "h2c"
    assert s.http.verify == "/etc/ssl/ca.pem"
    assert s.http.keepalive_expiry_s == 5.0 and isinstance(s.http.keepalive_expiry_s, float)
    assert s.http.trust_env is False
    assert s.ui.theme == "true"  # a string field keeps the text even when it looks like a bool
    assert s.cache.policy == "always"
    assert s.server.models == ["a", "b"]
    assert s.keymap == {"send": "ctrl+s"}
    assert load_settings(env={"LLMCHAT_HTTP__HTTP2": "false"}).http.http2 is False


def test_precedence_defaults_then_file_then_env_then_flags(tmp_path: Path) -> None:
    config = write(
        tmp_path / "config.toml",
        """\
        [http]
        max_connections = 20
        http2 = false

        [retry]
        max_attempts = 2

        [keymap]
        send = "ctrl+s"
        """,
    )
    env = {"LLMCHAT_HTTP__MAX_CONNECTIONS": "30", "LLMCHAT_KEYMAP__QUIT": "ctrl+q"}
    flags = {"http.max_connections": 40, "retry.base_delay_s": 2, "ui.stream": None}

    file_only = load_settings(config, env={})
    assert (file_only.http.max_connections, file_only.http.http2, file_only.retry.max_attempts) == (
        20,
        False,
        2,
    )
    assert file_only.http.read_timeout_s == HttpSettings().read_timeout_s

    with_env = load_settings(config, env=env)
    assert (with_env.http.max_connections, with_env.http.http2, with_env.retry.max_attempts) == (30, False, 2)
    assert with_env.keymap == {"send": "ctrl+s", "quit": "ctrl+q"}  # tables merge key by key

    everything = load_settings(config, env=env, overrides=flags)
    assert everything.http.max_connections == 40
    assert everything.retry.base_delay_s == 2.0
    assert everything.ui.stream is UISettings().stream  # None is a flag that was not given
    assert (everything.http.http2, everything.retry.max_attempts) == (False, 2)


def test_flags_are_validated_the_same_way() -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(env={}, overrides={"http.max_connections": 0})
    assert str(err.value) == "command line: http.max_connections must be a positive integer, got 0"
    assert err.value.exit_code == 2
    with pytest.raises(
        ConfigError, match=r"^command line: unknown key http\.htp2 \(did you mean http\.http2\?\)$"
    ):
        load_settings(env={}, overrides={"http.htp2": False})
    assert (
        load_settings(env={}, overrides={"http.http2": "h2c", "retry.max_attempts": "1"}).retry.max_attempts
        == 1
    )


def test_config_path_follows_flag_then_llmchat_config_then_xdg(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    xdg_file = write(tmp_path / "xdg" / "llmchat" / "config.toml", "[http]\nmax_connections = 11\n")
    env_file = write(tmp_path / "env.toml", "[http]\nmax_connections = 12\n")
    flag_file = write(tmp_path / "flag.toml", "[http]\nmax_connections = 13\n")

    assert default_config_path() == xdg_file
    assert load_settings().http.max_connections == 11
    assert cli(capsys, "config", "path") == (0, f"{xdg_file}\n", "(the default location; exists)\n")

    monkeypatch.setenv("LLMCHAT_CONFIG", str(env_file))
    assert default_config_path() == env_file
    assert load_settings().http.max_connections == 12
    assert cli(capsys, "config", "path") == (0, f"{env_file}\n", "(named by LLMCHAT_CONFIG; exists)\n")

    assert load_settings(flag_file).http.max_connections == 13
    assert cli(capsys, "--config", str(flag_file), "config", "path")[1] == f"{flag_file}\n"
    assert cli(capsys, "--config", str(flag_file), "config", "show")[1].count("max_connections = 13\n") == 1

    # A relative XDG_CONFIG_HOME is ignored, as the XDG spec says.
    assert default_config_path({"XDG_CONFIG_HOME": "rel", "HOME": "/h"}) == Path(
        "/h/.config/llmchat/config.toml"
    )


# --- providers ---------------------------------------------------------------------------------------------


def providers_file(tmp_path: Path, text: str) -> Path:
    return write(tmp_path / "config.toml", text)


def test_no_provider_and_no_openai_env_means_the_local_server() -> None:
    settings = load_settings(env={})
    assert settings.providers == {}
    assert resolve_provider(settings, env={}) is None


def test_openai_env_alone_makes_an_implicit_openai_provider() -> None:
    env = {"OPENAI_API_KEY": ENV_KEY}
    settings = load_settings(env=env)
    assert list(settings.providers) == ["openai"]
    p = resolve_provider(settings, env=env)
    assert p is not None
    assert (p.name, p.base_url, p.api_key, p.api_key_source) == (
        "openai",
        "https://api.openai.com/v1",
        ENV_KEY,
        "env OPENAI_API_KEY",
    )

    # Both variables together, as the ecosystem uses them: the key goes where OPENAI_BASE_URL points.
    env = {"OPENAI_API_KEY": ENV_KEY, "OPENAI_BASE_URL": "http://127.0.0.1:8000/v1/"}
    p = resolve_provider(load_settings(env=env), env=env)
    assert p is not None
    assert (p.name, p.base_url, p.api_key) == ("openai", "http://127.0.0.1:8000/v1", ENV_KEY)
    # resolve_provider alone (settings built without that env) reaches the same answer.
    assert resolve_provider(Settings(), env=env) == p


def test_openai_key_is_never_sent_to_another_host(tmp_path: Path) -> None:
    config = providers_file(
        tmp_path,
        """\
        [providers.groq]
        base_url = "https://api.groq.com/openai/v1"

        [providers.openai]
        base_url = "http://127.0.0.1:8000/v1"

        [providers.direct]
        base_url = "https://API.openai.com/v1/"

        [providers.optin]
        base_url = "https://proxy.example/v1"
        api_key_env = "OPENAI_API_KEY"
        """,
    )
    env = {"OPENAI_API_KEY": ENV_KEY}
    settings = load_settings(config, env=env)

    groq = resolve_provider(settings, "groq", env=env)
    assert groq is not None and groq.api_key is None
    assert groq.api_key_source == (
        'none (OPENAI_API_KEY is only sent to api.openai.com; set api_key_env = "OPENAI_API_KEY" in '
        "[providers.groq] to send it to api.groq.com)"
    )
    # Named openai, but pointed elsewhere by the file rather than by OPENAI_BASE_URL: still no key.
    local = resolve_provider(settings, "openai", env=env)
    assert local is not None and local.api_key is None

    direct = resolve_provider(settings, "direct", env=env)
    assert direct is not None
    assert (direct.api_key, direct.api_key_source, direct.base_url) == (
        ENV_KEY,
        "env OPENAI_API_KEY",
        "https://API.openai.com/v1",
    )
    optin = resolve_provider(settings, "optin", env=env)
    assert optin is not None
    assert (optin.api_key, optin.api_key_source) == (
        ENV_KEY,
        "env OPENAI_API_KEY (providers.optin.api_key_env)",
    )


def test_openai_env_beats_the_files_openai_provider(tmp_path: Path) -> None:
    config = providers_file(
        tmp_path,
        f"""\
        [providers.openai]
        base_url = "https://api.openai.com/v1"
        api_key = "{FILE_KEY}"
        model = "gpt-4o-mini"

        [providers.other]
        base_url = "https://other.example/v1"
        """,
    )
    p = resolve_provider(load_settings(config, env={}), env={})
    assert p is not None
    assert (p.name, p.api_key, p.api_key_source) == (
        "openai",
        FILE_KEY,
        "providers.openai.api_key in the config file",
    )

    env = {"OPENAI_API_KEY": ENV_KEY, "OPENAI_BASE_URL": "http://127.0.0.1:9000/v1"}
    settings = load_settings(config, env=env)
    assert settings.providers["openai"].base_url == "http://127.0.0.1:9000/v1"
    assert settings.providers["other"].base_url == "https://other.example/v1"
    p = resolve_provider(settings, env=env)  # several providers, one of them openai: openai is the default
    assert p is not None
    assert (p.name, p.base_url, p.api_key, p.model) == (
        "openai",
        "http://127.0.0.1:9000/v1",
        ENV_KEY,
        "gpt-4o-mini",
    )


def test_api_key_env_and_http_overrides(tmp_path: Path) -> None:
    config = providers_file(
        tmp_path,
        """\
        default_provider = "groq"

        [http]
        read_timeout_s = 90

        [providers.groq]
        base_url = "https://api.groq.com/openai/v1/"
        api_key_env = "GROQ_KEY"
        headers = { X-Team = "perf" }
        http = { http2 = "h2c", max_connections = 3 }

        [providers.local]
        base_url = "http://127.0.0.1:8000/v1"
        """,
    )
    settings = load_settings(config, env={})
    p = resolve_provider(settings, env={"GROQ_KEY": ENV_KEY})
    assert p is not None
    assert (p.name, p.base_url, p.api_key, p.api_key_source) == (
        "groq",
        "https://api.groq.com/openai/v1",
        ENV_KEY,
        "env GROQ_KEY (providers.groq.api_key_env)",
    )
    assert p.headers == {"X-Team": "perf"}
    assert p.http == HttpSettings(http2="h2c", max_connections=3, read_timeout_s=90.0)

    unset = resolve_provider(settings, env={})
    assert unset is not None and unset.api_key is None
    assert unset.api_key_source == "none (env GROQ_KEY, named by providers.groq.api_key_env, is not set)"

    local = resolve_provider(settings, "local", env={})
    assert local is not None
    assert (local.api_key, local.api_key_source, local.http.read_timeout_s) == (None, "none", 90.0)


def test_choosing_the_default_provider(tmp_path: Path) -> None:
    one = load_settings(providers_file(tmp_path, "[providers.only]\n"), env={})
    assert resolve_provider(one, env={}).name == "only"  # type: ignore[union-attr]

    two = load_settings(providers_file(tmp_path, "[providers.groq]\n[providers.local]\n"), env={})
    with pytest.raises(ConfigError) as err:
        resolve_provider(two, env={})
    assert str(err.value) == (
        "several providers are configured (groq, local) and default_provider is not set; "
        "set default_provider in the config file"
    )
    assert resolve_provider(two, "local", env={}).name == "local"  # type: ignore[union-attr]
    with pytest.raises(ConfigError) as err:
        resolve_provider(two, "grok", env={})
    assert (
        str(err.value) == '"grok" is not a configured provider (did you mean "groq"? configured: groq, local)'
    )
    with pytest.raises(ConfigError, match=r"none are\); add \[providers\.x\] to the config file$"):
        resolve_provider(Settings(), "x", env={})


def test_default_provider_must_name_a_configured_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = providers_file(tmp_path, 'default_provider = "grok"\n[providers.groq]\n[providers.local]\n')
    assert_config_error(
        capsys,
        config,
        'config.toml: default_provider "grok" is not a configured provider (did you mean "groq"? configured: '
        "groq, local)",
    )
    monkeypatch.setenv("LLMCHAT_DEFAULT_PROVIDER", "lokal")
    assert_config_error(
        capsys,
        config,
        'LLMCHAT_DEFAULT_PROVIDER "lokal" is not a configured provider (did you mean "local"? configured: '
        "groq, local)",
    )
    monkeypatch.setenv("LLMCHAT_DEFAULT_PROVIDER", "local")
    assert cli(capsys, "--config", str(config), "config", "check") == (
        0,
        "config.toml: ok (2 providers, default: local)\n",
        "",
    )


def test_resolved_provider_repr_masks_the_key_and_credential_headers() -> None:
    p = ResolvedProvider(
        name="x",
        base_url="https://h/v1",
        api_key=FILE_KEY,
        api_key_source="providers.x.api_key in the config file",
        model=None,
        headers={"Authorization": f"Bearer {HEADER_KEY}", "X-Team": "perf"},
        http=HttpSettings(),
    )
    for text in (repr(p), str(p), f"{p}", str([p])):
        assert FILE_KEY not in text and HEADER_KEY not in text
        assert "'sk-...uvwx'" in text and "'X-Team': 'perf'" in text


# --- secrets ---------------------------------------------------------------------------------------------


def test_mask_secret_examples() -> None:
    assert mask_secret(FILE_KEY) == "sk-...uvwx"
    assert mask_secret("gsk_" + "a" * 40 + "wxyz") == "...wxyz"
    assert mask_secret("short-token") == "***"
    assert mask_secret("") == ""


@given(st.text())
def test_mask_secret_never_shows_more_than_the_last_four(value: str) -> None:
    masked = mask_secret(value)
    assert len(masked) <= len("sk-...") + 4
    if len(value) >= 16:
        assert masked.endswith(value[-4:])
        assert value[:-4] not in masked
    else:
        assert masked in ("", "***")


def test_no_command_prints_a_key(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = providers_file(
        tmp_path,
        f"""\
        default_provider = "mine"

        [providers.mine]
        base_url = "https://h.example/v1"
        api_key = "{FILE_KEY}"
        headers = {{ Authorization = "Bearer {HEADER_KEY}", X-Api-Key = "{HEADER_KEY}", X-Team = "perf" }}

        [providers.openai]

        [server]
        api_key = "{SERVER_KEY}"
        """,
    )
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    outputs = []
    for action in ("path", "check", "show"):
        rc, out, err = cli(capsys, "--config", str(config), "config", action)
        assert rc == 0
        outputs.append(out + err)
    show = outputs[-1]
    for secret in (FILE_KEY, ENV_KEY, HEADER_KEY, SERVER_KEY):
        for text in outputs:
            assert secret not in text and secret[:-4] not in text
    assert 'api_key = "sk-...uvwx"' in show
    assert 'X-Team = "perf"' in show
    assert "# providers.openai: key from env OPENAI_API_KEY (sk-...FEDC)" in show

    # A secret of the wrong type is described, never quoted.
    write(config, f'[providers.mine]\napi_key = ["{FILE_KEY}"]\n')
    rc, out, err = cli(capsys, "--config", str(config), "config", "check")
    assert (rc, err) == (
        2,
        "llmchat: config.toml: providers.mine.api_key must be a non-empty string, got a list\n",
    )


def test_settings_repr_leaves_keys_out(tmp_path: Path) -> None:
    """Settings end up in logs and tracebacks (Textual's show locals); their repr must not carry a key."""
    config = providers_file(
        tmp_path, f'[providers.mine]\napi_key = "{FILE_KEY}"\n\n[server]\napi_key = "{SERVER_KEY}"\n'
    )
    settings = load_settings(config, env={})
    assert settings.providers["mine"].api_key == FILE_KEY and settings.server.api_key == SERVER_KEY
    assert FILE_KEY not in repr(settings) and SERVER_KEY not in repr(settings)


def test_config_without_an_action_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(capsys, "config") == (
        2,
        "",
        "llmchat: config needs an action: path, check or show; try `llmchat config check`\n",
    )


# --- settings_to_toml --------------------------------------------------------------------------------------


def test_settings_to_toml_loads_back_to_equal_settings(tmp_path: Path) -> None:
    settings = Settings(
        default_provider="my provider",
        providers={
            "my provider": ProviderSettings(
                name="my provider",
                base_url="http://127.0.0.1:8000/v1",
                api_key=FILE_KEY,
                model='quoted "model"\x7f',
                headers={"Authorization": "Bearer x" * 3, "X Team": "perf"},
                http={"http2": "h2c", "read_timeout_s": 75.0},
            )
        },
        http=HttpSettings(http2=False, max_connections=3, verify="/ca.pem"),
        ui=UISettings(theme="nord", sla_ttft_ms=1e-3),
        keymap={"send": "ctrl+s"},
    )
    config = tmp_path / "config.toml"
    config.write_text(settings_to_toml(settings, mask=False), encoding="utf-8")
    assert load_settings(config, env={}) == settings
    masked = settings_to_toml(settings)
    assert FILE_KEY not in masked and "Bearer x" not in masked


# --- the example file ---------------------------------------------------------------------------------------

_KEY_LINE = re.compile(r"^#?\s*([A-Za-z0-9_]+)\s*=\s*\S")
_SECTION_LINE = re.compile(r"^#?\s*\[([A-Za-z0-9_.]+)\]\s*$")


def _example_keys() -> set[str]:
    """Every dotted key the example writes, commented or not; provider tables count as providers.*."""
    keys: set[str] = set()
    section = ""
    for line in EXAMPLE.read_text(encoding="utf-8").splitlines():
        if m := _SECTION_LINE.match(line):
            section = m[1]
            if section.startswith("providers."):
                section = "providers.*"
        elif (m := _KEY_LINE.match(line)) and section != "keymap":
            keys.add(f"{section}.{m[1]}" if section else m[1])
    return keys


def _field_names() -> set[str]:
    names = set()
    for name, hint in typing.get_type_hints(Settings).items():
        if dataclasses.is_dataclass(hint):
            names |= {f"{name}.{g.name}" for g in dataclasses.fields(hint)}
        else:
            names.add(name)
    names |= {f"providers.*.{g.name}" for g in dataclasses.fields(ProviderSettings) if g.name != "name"}
    return names


def _docstrings() -> dict[str, str]:
    """Field docstrings from _settings.py, by class and field: ``{"HttpSettings.http2": "..."}``."""
    docs: dict[str, str] = {}
    for node in ast.parse(SETTINGS_SOURCE.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef):
            for stmt, nxt in zip(node.body, node.body[1:], strict=False):
                if (
                    isinstance(stmt, ast.AnnAssign)
                    and isinstance(stmt.target, ast.Name)
                    and isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant)
                ):
                    docs[f"{node.name}.{stmt.target.id}"] = str(nxt.value.value)
    return docs


def test_example_loads_to_exactly_the_defaults() -> None:
    assert load_settings(EXAMPLE, env={}) == Settings()


def test_example_names_every_field_and_nothing_else() -> None:
    keys = _example_keys()
    expected = _field_names() - {"providers", "keymap"}  # tables whose entries are the user's own names
    assert sorted(expected - keys) == [], "fields missing from config.example.toml"
    assert sorted(keys - expected) == [], "keys in config.example.toml that are not fields"


def test_example_comments_carry_each_field_docstring() -> None:
    comments = " ".join(
        line.lstrip("#").strip()
        for line in EXAMPLE.read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    )
    comments = " ".join(comments.split())
    docs = _docstrings()
    del docs["ProviderSettings.name"]  # set from the table's name, never written in a file
    missing = [name for name, doc in docs.items() if " ".join(doc.split()) not in comments]
    assert missing == []


def test_example_provider_sections_load_when_uncommented(tmp_path: Path) -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    uncommented = re.sub(r"(?m)^# (\[[^\]]+\]|[A-Za-z0-9_]+ = .*)$", r"\1", text)
    config = tmp_path / "config.toml"
    config.write_text(uncommented, encoding="utf-8")
    settings = load_settings(config, env={})
    assert list(settings.providers) == ["openai", "ollama", "vllm", "local"]
    assert settings.providers["ollama"].base_url == "http://127.0.0.1:11434/v1"
    assert settings.providers["ollama"].http == {"http2": False}
    assert settings.providers["local"].http == {"http2": "h2c"}
    assert resolve_provider(settings, env={}).name == "openai"  # type: ignore[union-attr]


def test_every_rule_names_a_real_field() -> None:
    """A typo in RULES would silently check nothing; every key must resolve to a field."""

    def resolves(dotted: str) -> bool:
        dotted = dotted.removesuffix(".*")  # a rule for each entry of a table field, like ui.prices.*
        section, _, key = dotted.rpartition(".")
        if section == "providers.*":
            return key in {f.name for f in dataclasses.fields(ProviderSettings)}
        hints = typing.get_type_hints(Settings)
        return section in hints and key in {f.name for f in dataclasses.fields(hints[section])}

    assert [k for k in RULES if not resolves(k)] == []
    assert all(resolves(k) for k in SUBTABLES)


def test_a_provider_from_the_environment_alone_and_over_the_file(tmp_path: Path) -> None:
    env = {
        "LLMCHAT_PROVIDERS__OLLAMA__BASE_URL": "http://127.0.0.1:11434/v1",
        "LLMCHAT_PROVIDERS__OLLAMA__MODEL": "llama3.2",
        "LLMCHAT_PROVIDERS__OLLAMA__HTTP__HTTP2": "false",
    }
    settings = load_settings(env=env)
    p = resolve_provider(settings, env=env)
    assert p is not None
    assert (p.name, p.base_url, p.model, p.http.http2) == ("ollama", "http://127.0.0.1:11434/v1", "llama3.2", False)

    # The environment beats the file's value for the same key, and leaves the file's other keys alone.
    config = providers_file(
        tmp_path,
        """\
        [providers.ollama]
        base_url = "http://10.0.0.9:11434/v1"
        model = "qwen3"
        """,
    )
    over = resolve_provider(load_settings(config, env={"LLMCHAT_PROVIDERS__OLLAMA__MODEL": "llama3.2"}), env={})
    assert over is not None and (over.base_url, over.model) == ("http://10.0.0.9:11434/v1", "llama3.2")


def test_the_hint_for_a_missing_key_names_the_config_key_and_the_flag(tmp_path: Path) -> None:
    config = providers_file(
        tmp_path,
        """\
        default_provider = "groq"
        [providers.groq]
        base_url = "https://api.groq.com/openai/v1"
        api_key_env = "GROQ_KEY"
        [providers.local]
        base_url = "http://127.0.0.1:8000/v1"
        """,
    )
    settings = load_settings(config, env={})
    groq = resolve_provider(settings, env={})
    local = resolve_provider(settings, "local", env={"OPENAI_API_KEY": ENV_KEY})
    bare = resolve_provider(settings, "local", env={})
    assert groq is not None and local is not None and bare is not None
    assert groq.api_key_hint == "export GROQ_KEY (named by providers.groq.api_key_env), or pass --api-key-env VAR"
    assert local.api_key is None and local.api_key_hint == (
        'set api_key_env = "OPENAI_API_KEY" in [providers.local] to send OPENAI_API_KEY to 127.0.0.1, '
        "or pass --api-key-env OPENAI_API_KEY"
    )
    assert bare.api_key_hint == (
        'set api_key_env = "VAR" in [providers.local] of the config (VAR holding the key), or pass --api-key-env VAR'
    )
    with_key = resolve_provider(settings, env={"GROQ_KEY": ENV_KEY})
    assert with_key is not None and with_key.api_key_hint == ""


def test_a_password_or_a_key_inside_a_url_is_masked_wherever_the_url_is_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from llmchat.core import mask_url

    secret = "hunter2-" + "s3cr3t"
    assert mask_url(f"http://user:{secret}@host:8080/v1") == "http://user:***@host:8080/v1"
    assert mask_url(f"https://host/v1?api_key={secret}&x=1") == "https://host/v1?api_key=***&x=1"
    assert mask_url("https://host/v1?x=1") == "https://host/v1?x=1"
    assert mask_url("not a url") == "not a url"
    config = providers_file(
        tmp_path,
        f"""\
        [providers.gw]
        base_url = "http://127.0.0.1:8080/v1?api_key={secret}"
        metrics_url = "http://127.0.0.1:8080/metrics?token={secret}"
        """,
    )
    assert main(["config", "show", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert secret not in out and 'base_url = "http://127.0.0.1:8080/v1?api_key=***"' in out
    # A password in base_url itself is refused (it would go out as Basic auth), and masked in the refusal.
    with_userinfo = write(tmp_path / "userinfo.toml", f'[providers.gw]\nbase_url = "http://user:{secret}@127.0.0.1:8080/v1"\n')
    with pytest.raises(ConfigError, match=r"without user:password@") as caught:
        load_settings(with_userinfo, env={})
    assert secret not in str(caught.value) and "user:***@" in str(caught.value)
    resolved = resolve_provider(load_settings(config, env={}), env={})
    assert resolved is not None and secret not in repr(resolved)
