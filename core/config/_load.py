"""Loading settings from their sources, and picking the provider a request goes to.

Sources, later wins: the defaults in ``_settings.py``, the TOML file, the environment (``OPENAI_API_KEY`` and
``OPENAI_BASE_URL`` as the rest of the ecosystem reads them, ``LLMCHAT_SECTION__KEY`` for everything else,
``LLMCHAT_PROVIDERS__NAME__KEY`` for a provider's keys),
then command-line flags. Every value is checked before it is used (``_config_validate``); a bad one is a
``ConfigError`` whose one line names the file or variable, the key and what was expected.

``load_settings`` reads a small file and so blocks briefly: call it before the event loop starts, or through
an executor from async code.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import stat
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from llmchat.core.config._secrets import is_secret_header, mask_secret, mask_url
from llmchat.core.config._settings import HttpSettings, ProviderSettings, Settings
from llmchat.core.config._toml import settings_to_toml
from llmchat.core.config._validate import (
    EnvSource,
    Source,
    Tree,
    build,
    merge,
    validate_tree,
    validate_value,
)
from llmchat.core.errors import ConfigError

__all__ = [
    "ResolvedProvider",
    "config_path_in_use",
    "default_config_path",
    "load_settings",
    "mask_secret",
    "mask_url",
    "resolve_provider",
    "settings_to_toml",
]

CONFIG_ENV = "LLMCHAT_CONFIG"
OPENAI_KEY_ENV = "OPENAI_API_KEY"
OPENAI_URL_ENV = "OPENAI_BASE_URL"
#: The name of the provider that OPENAI_* configure, implicitly when no provider is configured at all.
OPENAI_PROVIDER = "openai"
#: The only host OPENAI_API_KEY is sent to unless the user says otherwise.
OPENAI_HOST = "api.openai.com"
OPENAI_DEFAULT_URL = ProviderSettings().base_url
# Config files are a few KiB; a cap turns `--config /dev/zero` or a path to a log into an error, not a hang.
_MAX_FILE_BYTES = 1 << 20
_TOML_POSITION = re.compile(
    r"^(?P<msg>.*?)\s*\((?:at line (?P<line>\d+), column (?P<col>\d+)|at end of document)\)$"
)


def default_config_path(env: Mapping[str, str] = os.environ) -> Path:
    """The config file used when none is named on the command line.

    ``LLMCHAT_CONFIG`` if set (``~`` expanded), else ``$XDG_CONFIG_HOME/llmchat/config.toml``, where an unset,
    empty or relative XDG_CONFIG_HOME means ``~/.config`` as the XDG spec says. The file need not exist.
    Never fails.
    """
    named = env.get(CONFIG_ENV)
    if named:
        return Path(named).expanduser()
    xdg = env.get("XDG_CONFIG_HOME", "")
    if xdg and os.path.isabs(xdg):
        base = Path(xdg)
    else:
        home = env.get("HOME")
        base = (Path(home) if home else Path.home()) / ".config"
    return base / "llmchat" / "config.toml"


def config_path_in_use(path: str | Path | None, env: Mapping[str, str]) -> tuple[Path, str]:
    """The file ``load_settings`` reads for ``path``, and who named it.

    Who is ``"--config"`` (``path`` given), ``"LLMCHAT_CONFIG"``, or ``""`` for the default location, where
    a missing file is fine. Never fails.
    """
    if path is not None:
        return Path(path).expanduser(), "--config"
    if env.get(CONFIG_ENV):
        return default_config_path(env), CONFIG_ENV
    return default_config_path(env), ""


def _read_toml(path: Path, named_by: str) -> dict[str, Any]:
    """The parsed file, or ``{}`` for a missing file at the default location. Raises ConfigError."""
    label = path.name or str(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        if not named_by:
            return {}
        fix = "fix LLMCHAT_CONFIG" if named_by == CONFIG_ENV else "fix the path given to --config"
        raise ConfigError(
            f"config file {path} (named by {named_by}) does not exist; {fix} or create the file"
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"config file {path} cannot be read ({exc.strerror}); fix the path or its permissions"
        ) from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"config file {path} is a directory; name the TOML file inside it")
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"config file {path} is not a regular file; name a TOML file")
    try:
        with path.open("rb") as f:
            data = f.read(_MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(
            f"config file {path} cannot be read ({exc.strerror}); fix its permissions"
        ) from None
    if len(data) > _MAX_FILE_BYTES:
        raise ConfigError(
            f"config file {path} is larger than 1 MiB, too big to be a config file; check the path"
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{label}: line {line} is not UTF-8 (byte 0x{data[exc.start]:02x}); save the file as UTF-8"
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{label}: {_describe_toml_error(exc)}") from None


def _describe_toml_error(exc: tomllib.TOMLDecodeError) -> str:
    match = _TOML_POSITION.match(str(exc))
    if match is None:
        return f"invalid TOML: {exc}"
    msg = match["msg"][:1].lower() + match["msg"][1:]
    where = f"line {match['line']}, column {match['col']}" if match["line"] else "the end of the file"
    return f"invalid TOML at {where}: {msg}"


def _env_tree(env: Mapping[str, str]) -> tuple[Tree, str]:
    """The settings ``LLMCHAT_SECTION__KEY`` variables give, and the variable that set default_provider."""
    tree: Tree = {}
    default_by = ""
    for var in sorted(env):
        if not var.startswith("LLMCHAT_"):
            continue
        rest = var[len("LLMCHAT_") :]
        if rest == "DEFAULT_PROVIDER":
            parts: tuple[str, ...] = ("default_provider",)
            default_by = var
        elif "__" in rest:
            parts = tuple(part.lower() for part in rest.split("__"))
        else:
            continue  # LLMCHAT_CONFIG and whatever else is not a setting
        if parts[0] == "providers" and len(parts) < 3:
            raise ConfigError(
                f"{var} names no provider key; use LLMCHAT_PROVIDERS__NAME__KEY, for example "
                "LLMCHAT_PROVIDERS__OLLAMA__BASE_URL"
            )
        raw: object = env[var]
        for part in reversed(parts):
            raw = {part: raw}
        tree = merge(tree, validate_tree(raw, EnvSource(var, parts)))  # type: ignore[arg-type]
    return tree, default_by


def _overrides_tree(overrides: Mapping[str, object] | None) -> Tree:
    raw: Tree = {}
    for key, value in (overrides or {}).items():
        if value is None:
            continue  # a flag that was not given
        nested: Any = value
        for part in reversed(key.split(".")):
            nested = {part: nested}
        raw = merge(raw, nested)
    return validate_tree(raw, Source("command line: ", text_values=True))


def _openai_url(env: Mapping[str, str], *, check: bool) -> str:
    """OPENAI_BASE_URL without a trailing slash, empty when unset; with ``check``, a bad URL is a ConfigError.

    Only checked where it is used, so a value meant for another tool cannot break a setup that ignores it.
    """
    url = env.get(OPENAI_URL_ENV, "")
    if url and check:
        url = validate_value(
            ("providers", OPENAI_PROVIDER, "base_url"), url, EnvSource(OPENAI_URL_ENV, text_values=False)
        )
    return url.rstrip("/")


def load_settings(
    path: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> Settings:
    """The effective settings: defaults < the TOML file < the environment < ``overrides``.

    ``path`` None means ``default_config_path(env)``; a missing file there gives the defaults, but a missing
    file named by ``path`` or LLMCHAT_CONFIG is an error. ``env`` defaults to ``os.environ``. ``overrides``
    are flags as dotted keys (``{"http.http2": False}``); a value of None is a flag not given, and a string is
    read as a TOML value when the field wants another type. When no provider is configured but
    OPENAI_API_KEY or OPENAI_BASE_URL is set, a provider named ``openai`` appears; OPENAI_BASE_URL also
    replaces the ``base_url`` of a configured ``openai`` provider.

    Raises ``ConfigError`` (exit status 2) with one line naming the file or variable, the key and what was
    expected: unreadable, not UTF-8 or invalid TOML files, values of the wrong type or out of range, unknown
    keys (with the closest valid one), and a default_provider that names no provider. Nothing else escapes.
    """
    env = os.environ if env is None else env
    file_path, named_by = config_path_in_use(path, env)
    label = file_path.name or str(file_path)
    file_tree = validate_tree(_read_toml(file_path, named_by), Source(f"{label}: "))
    env_tree, env_default_by = _env_tree(env)
    flag_tree = _overrides_tree(overrides)

    configured = (
        set(file_tree.get("providers", {})) | set(env_tree.get("providers", {})) | set(flag_tree.get("providers", {}))
    )
    openai_url = _openai_url(env, check=not configured or OPENAI_PROVIDER in configured)
    if not configured and _has_openai_env(env):
        env_tree = merge(
            env_tree, {"providers": {OPENAI_PROVIDER: {"base_url": openai_url} if openai_url else {}}}
        )
    elif OPENAI_PROVIDER in configured and openai_url:
        env_tree = merge(env_tree, {"providers": {OPENAI_PROVIDER: {"base_url": openai_url}}})

    settings: Settings = build(Settings, merge(merge(file_tree, env_tree), flag_tree))
    if settings.default_provider and settings.default_provider not in settings.providers:
        if "default_provider" in flag_tree:
            who = "command line: default_provider"
        elif "default_provider" in env_tree:
            who = env_default_by
        else:
            who = f"{label}: default_provider"
        raise ConfigError(f"{who} {_unknown_provider(settings.default_provider, settings.providers)}")
    return settings


def _has_openai_env(env: Mapping[str, str]) -> bool:
    return bool(env.get(OPENAI_KEY_ENV) or env.get(OPENAI_URL_ENV))


def _unknown_provider(name: str, providers: Mapping[str, object]) -> str:
    if not providers:
        return f'"{name}" is not a configured provider (none are); add [providers.{name}] to the config file'
    close = difflib.get_close_matches(name, list(providers), n=1)
    hint = f'did you mean "{close[0]}"? ' if close else ""
    return f'"{name}" is not a configured provider ({hint}configured: {", ".join(providers)})'


@dataclasses.dataclass(frozen=True, kw_only=True, repr=False)
class ResolvedProvider:
    """One provider with everything a request needs: URL, key, model, headers and its HTTP settings.

    ``api_key_source`` says where the key came from, for messages ("env OPENAI_API_KEY", "none");
    ``api_key_hint``, when there is none, which config key or flag would send one. The key itself never
    appears in ``repr``.
    """

    name: str
    base_url: str
    api_key: str | None
    api_key_source: str
    model: str | None
    headers: dict[str, str]
    http: HttpSettings
    api_key_hint: str = ""
    """With no key: how to send one (the config key or flag to set), for a 401's message."""

    def __repr__(self) -> str:
        key = None if self.api_key is None else mask_secret(self.api_key)
        headers = {k: mask_secret(v) if is_secret_header(k) else v for k, v in self.headers.items()}
        return (
            f"ResolvedProvider(name={self.name!r}, base_url={mask_url(self.base_url)!r}, api_key={key!r}, "
            f"api_key_source={self.api_key_source!r}, model={self.model!r}, headers={headers!r}, "
            f"http={self.http!r})"
        )


def _host(url: str) -> str:
    try:
        return (urlsplit(url).hostname or "").lower()
    except ValueError:
        return ""


def _api_key(
    p: ProviderSettings, base_url: str, env: Mapping[str, str], openai_url: str
) -> tuple[str | None, str, str]:
    """The key for provider ``p``, where it came from, and (when there is none) how to send one.

    OPENAI_API_KEY goes only to api.openai.com, or to the provider ``openai`` when OPENAI_BASE_URL pointed it
    somewhere (the two variables travel together in the ecosystem). Anywhere else it would hand an OpenAI key
    to a stranger, so it needs an explicit ``api_key_env = "OPENAI_API_KEY"`` (or ``--api-key-env``).
    """
    openai_key = env.get(OPENAI_KEY_ENV, "")
    may_get_openai_key = _host(base_url) == OPENAI_HOST or (
        p.name == OPENAI_PROVIDER and bool(openai_url) and base_url == openai_url
    )
    if p.api_key_env and env.get(p.api_key_env):
        return env[p.api_key_env], f"env {p.api_key_env} (providers.{p.name}.api_key_env)", ""
    if p.name == OPENAI_PROVIDER and openai_key and may_get_openai_key:
        # The ecosystem's rule for the provider the variables are named after: the environment beats the file.
        return openai_key, f"env {OPENAI_KEY_ENV}", ""
    if p.api_key:
        return p.api_key, f"providers.{p.name}.api_key in the config file", ""
    if p.api_key_env:
        return None, f"none (env {p.api_key_env}, named by providers.{p.name}.api_key_env, is not set)", (
            f"export {p.api_key_env} (named by providers.{p.name}.api_key_env), or pass --api-key-env VAR"
        )
    if openai_key and may_get_openai_key:
        return openai_key, f"env {OPENAI_KEY_ENV}", ""
    if openai_key:
        host = _host(base_url) or base_url
        return None, (
            f'none ({OPENAI_KEY_ENV} is only sent to {OPENAI_HOST}; set api_key_env = "{OPENAI_KEY_ENV}" '
            f"in [providers.{p.name}] to send it to {host})"
        ), (
            f'set api_key_env = "{OPENAI_KEY_ENV}" in [providers.{p.name}] to send {OPENAI_KEY_ENV} to {host}, '
            f"or pass --api-key-env {OPENAI_KEY_ENV}"
        )
    return None, "none", (
        f'set api_key_env = "VAR" in [providers.{p.name}] of the config (VAR holding the key), or pass '
        "--api-key-env VAR"
    )


def resolve_provider(
    settings: Settings, name: str | None = None, *, env: Mapping[str, str] | None = None
) -> ResolvedProvider | None:
    """The provider to talk to: ``name``, else ``default_provider``, else the only one, else ``openai``.

    Returns None when no provider is configured and neither OPENAI_API_KEY nor OPENAI_BASE_URL is set: the
    caller then uses the local server. ``env`` (default ``os.environ``) supplies api_key_env and OPENAI_*
    keys. Raises ``ConfigError`` for an unknown name (listing the configured ones), or when several
    providers are configured, none is ``openai`` and default_provider is empty.
    """
    env = os.environ if env is None else env
    providers = dict(settings.providers)
    openai_url = _openai_url(env, check=not providers)
    if not providers and _has_openai_env(env):
        providers[OPENAI_PROVIDER] = ProviderSettings(
            name=OPENAI_PROVIDER, base_url=openai_url or OPENAI_DEFAULT_URL
        )
    if name is None:
        name = settings.default_provider or None
    if name is None:
        if not providers:
            return None
        if len(providers) == 1:
            name = next(iter(providers))
        elif OPENAI_PROVIDER in providers:
            name = OPENAI_PROVIDER
        else:
            raise ConfigError(
                f"several providers are configured ({', '.join(providers)}) and default_provider is not set; "
                "set default_provider in the config file"
            )
    if name not in providers:
        raise ConfigError(_unknown_provider(name, providers))
    p = providers[name]
    base_url = p.base_url.rstrip("/")
    api_key, source, hint = _api_key(p, base_url, env, openai_url)
    return ResolvedProvider(
        name=name,
        base_url=base_url,
        api_key=api_key,
        api_key_source=source,
        api_key_hint=hint,
        model=p.model,
        headers=dict(p.headers),
        http=dataclasses.replace(settings.http, **p.http),  # type: ignore[arg-type]
    )
