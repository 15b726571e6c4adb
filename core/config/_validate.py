"""Checking raw config values against the settings dataclasses, and building the dataclasses from them.

The checks are derived from the field annotations in ``_settings.py`` (one generic walker, no per-field
code); the few range rules a type cannot say live in ``RULES``, keyed by dotted name. A raw tree is what
``tomllib`` returns (or a nested dict built from the environment or flags); a validated tree has the same
shape with every value checked and converted (ints to floats where a float is wanted).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import tomllib
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal
from urllib.parse import urlsplit

from llmchat.core.config._secrets import is_secret_path, is_url_path, mask_url
from llmchat.core.config._settings import HttpSettings, Settings
from llmchat.core.config._toml import dotted_key, toml_value
from llmchat.core.errors import ConfigError

#: A validated tree: section -> key -> value, as nested dicts.
Tree = dict[str, Any]

# Longer quoted values are cut so a pasted blob cannot turn an error into a screenful.
_MAX_SHOWN = 80


@dataclasses.dataclass(frozen=True)
class Rule:
    """What a field needs beyond its type: ``expectation`` completes "must be ...", ``ok`` tests a value."""

    expectation: str
    ok: Callable[[Any], bool]


def _is_http_url(value: str) -> bool:
    try:
        parts = urlsplit(value)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_POSITIVE_INT = Rule("a positive integer", lambda v: v > 0)
_NON_NEGATIVE_INT = Rule("a non-negative integer", lambda v: v >= 0)
_POSITIVE_SECONDS = Rule("a positive number of seconds", lambda v: v > 0)
_NON_NEGATIVE_SECONDS = Rule("a non-negative number of seconds", lambda v: v >= 0)
_POSITIVE_MS = Rule("a positive number of milliseconds", lambda v: v > 0)
_NON_NEGATIVE_MS = Rule("a non-negative number of milliseconds", lambda v: v >= 0)
_PROBABILITY = Rule("a probability from 0 to 1", lambda v: 0 <= v <= 1)
_NON_EMPTY = Rule("a non-empty string", bool)

#: The range rules, by dotted name. ``providers.*`` is any provider; a provider's ``http`` overrides are
#: checked against the ``http.*`` rules.
RULES: dict[str, Rule] = {
    "http.max_connections": _POSITIVE_INT,
    "http.max_keepalive_connections": _NON_NEGATIVE_INT,
    "http.keepalive_expiry_s": _NON_NEGATIVE_SECONDS,
    "http.connect_timeout_s": _POSITIVE_SECONDS,
    # Reasoning models can think for a minute before the first byte, so the default is 120 s and 60 s is the
    # advice; a shorter value is allowed because a local server or a stall test may rightly want one.
    "http.read_timeout_s": Rule("a positive number of seconds", lambda v: v > 0),
    "http.write_timeout_s": _POSITIVE_SECONDS,
    "http.pool_timeout_s": _POSITIVE_SECONDS,
    "http.verify": Rule("true, false or the path of a CA bundle", lambda v: v != ""),
    "http.proxy": Rule(
        "an http:// proxy URL such as http://proxy.example:3128 (or https://), or empty",
        lambda v: v == "" or (_is_http_url(v) and urlsplit(v).path in ("", "/")),
    ),
    "http.keepalive_ping_s": _NON_NEGATIVE_SECONDS,
    "http.max_requests_per_connection": _NON_NEGATIVE_INT,
    "providers.*.base_url": Rule("an http:// or https:// URL", _is_http_url),
    "providers.*.api_key": _NON_EMPTY,
    "providers.*.api_key_env": Rule(
        "the name of an environment variable", lambda v: bool(_ENV_NAME.fullmatch(v))
    ),
    "providers.*.model": _NON_EMPTY,
    "providers.*.metrics_url": Rule(
        "an http:// or https:// URL, or empty", lambda v: v == "" or _is_http_url(v)
    ),
    "providers.*.metrics_interval_s": _POSITIVE_SECONDS,
    "providers.*.rate_limit_rpm": _NON_NEGATIVE_INT,
    "providers.*.rate_limit_tpm": _NON_NEGATIVE_INT,
    "providers.*.batch_discount": Rule("a share from 0 to 1 (0.5 is half price)", lambda v: 0 <= v <= 1),
    "providers.*.context_window": _NON_NEGATIVE_INT,
    "retry.max_attempts": _POSITIVE_INT,
    "retry.base_delay_s": _NON_NEGATIVE_SECONDS,
    "retry.max_delay_s": _NON_NEGATIVE_SECONDS,
    "retry.total_budget_s": _NON_NEGATIVE_SECONDS,
    "cache.ttl_s": _NON_NEGATIVE_SECONDS,
    "cache.size_limit_mb": _POSITIVE_INT,
    "batch.max_size": _POSITIVE_INT,
    "batch.window_ms": _NON_NEGATIVE_MS,
    "batch.concurrency": _POSITIVE_INT,
    "batch.completion_window": Rule(
        'a whole number of hours or days, such as "24h" or "7d"',
        lambda v: bool(re.fullmatch(r"[1-9][0-9]{0,4}[hd]", v)),
    ),
    "batch.poll_interval_s": _POSITIVE_SECONDS,
    "ui.theme": _NON_EMPTY,
    "ui.sla_ttft_ms": _POSITIVE_MS,
    "ui.sla_total_ms": _POSITIVE_MS,
    "ui.stall_s": _POSITIVE_SECONDS,
    "ui.headroom_warn": _PROBABILITY,
    "ui.hud_history": _POSITIVE_INT,
    "ui.temperature": Rule("a number from 0 to 2", lambda v: 0 <= v <= 2),
    "ui.max_tokens": _POSITIVE_INT,
    "ui.attachment_max_kb": _POSITIVE_INT,
    "ui.export_dir": Rule(
        "an absolute path, one starting with ~/, or empty",
        lambda v: v in ("", "~") or v.startswith(("/", "~/")),
    ),
    "ui.prices.*": Rule(
        "a table of input_per_mtok and output_per_mtok, non-negative prices per million tokens",
        lambda v: set(v) <= {"input_per_mtok", "output_per_mtok"} and all(p >= 0 for p in v.values()),
    ),
    "server.host": _NON_EMPTY,
    "server.port": Rule("a port number from 0 to 65535", lambda v: 0 <= v <= 65535),
    "server.models": Rule("a non-empty list of model ids", lambda v: bool(v) and all(v)),
    "server.ttft_ms": _NON_NEGATIVE_MS,
    "server.tokens_per_s": Rule("a non-negative number of tokens per second", lambda v: v >= 0),
    "server.jitter_ms": _NON_NEGATIVE_MS,
    "server.cold_start_ms": _NON_NEGATIVE_MS,
    "server.idle_unload_s": _NON_NEGATIVE_SECONDS,
    "server.rate_limit": _NON_NEGATIVE_INT,
    "server.rate_limit_tokens": _NON_NEGATIVE_INT,
    "server.rate_limit_window_s": _POSITIVE_SECONDS,
    "server.error_rate": _PROBABILITY,
    "server.drop_rate": _PROBABILITY,
    "server.stall_ms": _NON_NEGATIVE_MS,
    "server.max_concurrency": _NON_NEGATIVE_INT,
    "server.max_requests_per_connection": _NON_NEGATIVE_INT,
    "server.embedding_dim": _POSITIVE_INT,
    "server.default_max_tokens": _POSITIVE_INT,
    "server.rtt_ms": _NON_NEGATIVE_MS,
    "server.batch_turnaround_s": _NON_NEGATIVE_SECONDS,
    "server.batch_fail_share": _PROBABILITY,
    "server.reasoning_tokens": _NON_NEGATIVE_INT,
    "server.context_window": _NON_NEGATIVE_INT,
    "server.template_overhead": _NON_NEGATIVE_INT,
    "server.bunch": _POSITIVE_INT,
    "server.prefill_tokens_per_s": Rule("a non-negative number of tokens per second", lambda v: v >= 0),
}

#: ``dict[str, object]`` fields whose keys are another dataclass's fields: (that dataclass, its rule prefix).
SUBTABLES: dict[str, tuple[type[Any], str]] = {"providers.*.http": (HttpSettings, "http")}


class Source:
    """Where a raw tree came from, which decides how an error names a key.

    ``prefix`` starts every message (``"config.toml: "``); ``text_values`` says the values are text a person
    typed (environment, flags), to be read as TOML values where the field's type calls for that.
    """

    def __init__(self, prefix: str, *, text_values: bool = False) -> None:
        self.prefix = prefix
        self.text_values = text_values

    def name(self, parts: Sequence[str]) -> str:
        """How a message names the key at ``parts``."""
        return dotted_key(parts)

    def invalid(self, parts: Sequence[str], expectation: str, value: object) -> ConfigError:
        """The error for a value of the wrong type or out of range."""
        return ConfigError(
            f"{self.prefix}{self.name(parts)} must be {expectation}, got {_shown(parts, value)}"
        )

    def unknown(self, parts: Sequence[str], valid: Sequence[str], *, section: bool) -> ConfigError:
        """The error for a key no dataclass has, with the closest valid key of that table if one is close."""
        close = difflib.get_close_matches(parts[-1], list(valid), n=1)
        if section:
            what = f"section [{self.name(parts)}]"
            hint = f"did you mean [{self.name((*parts[:-1], close[0]))}]?" if close else ""
        else:
            what = f"key {self.name(parts)}"
            hint = f"did you mean {self.name((*parts[:-1], close[0]))}?" if close else ""
        if not hint:
            hint = "valid keys here: " + ", ".join(valid)
        return ConfigError(f"{self.prefix}unknown {what} ({hint})")


class EnvSource(Source):
    """One environment variable: messages name the variable, suggestions name the variable meant.

    ``parts`` is the key path the variable spells, so that a typo in its section can be answered with the
    whole corrected name (LLMCHAT_HTP__PORT -> LLMCHAT_HTTP__PORT is wrong, LLMCHAT_SERVER__PORT is meant).
    """

    def __init__(self, var: str, parts: Sequence[str] = (), *, text_values: bool = True) -> None:
        super().__init__("", text_values=text_values)
        self.var = var
        self.parts = tuple(parts)

    def name(self, parts: Sequence[str]) -> str:
        return self.var

    def unknown(self, parts: Sequence[str], valid: Sequence[str], *, section: bool) -> ConfigError:
        rest = self.parts[len(parts) :]
        close = difflib.get_close_matches(parts[-1], list(valid), n=1)
        if close:
            hint = f"did you mean {env_var_name((*parts[:-1], close[0], *rest))}?"
        else:
            hint = "valid names here: " + ", ".join(env_var_name((*parts[:-1], v)) for v in valid)
        return ConfigError(f"{self.var} is not a setting ({hint})")


def env_var_name(parts: Sequence[str]) -> str:
    """The environment variable for a setting: ``("server", "port")`` -> ``LLMCHAT_SERVER__PORT``."""
    return "LLMCHAT_" + "__".join(part.upper() for part in parts)


def _shown(parts: Sequence[str], value: object) -> str:
    if is_secret_path(parts):
        # A wrong-typed secret is still a secret: say what kind of thing it was, never what it was.
        return _kind(value)
    if isinstance(value, str) and is_url_path(parts):
        value = mask_url(value)  # a proxy's or a server's password stays out of the message
    text = toml_value(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string that is not allowed here"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, Mapping):
        return "a table"
    return "a value of another kind"


class _Invalid(Exception):
    """A value that does not fit a type; ``expectation`` says what would have."""

    def __init__(self, expectation: str) -> None:
        super().__init__(expectation)
        self.expectation = expectation


_NOUNS: dict[object, str] = {str: "strings", int: "integers", float: "numbers", bool: "booleans"}


def _alternatives(hint: object) -> list[str]:
    if hint is bool:
        return ["true", "false"]
    if hint is int:
        return ["an integer"]
    if hint is float:
        return ["a number"]
    if hint is str:
        return ["a string"]
    if hint is type(None):
        return []  # TOML has no null; an unset optional is a missing key
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return [toml_value(arg) for arg in args]
    if origin in (typing.Union, types.UnionType):
        return [alt for arg in args for alt in _alternatives(arg)]
    if origin is list:
        return [f"a list of {_NOUNS.get(args[0], 'values')}"]
    if origin is dict:
        return [f"a table of {_NOUNS.get(args[1], 'values')}"]
    raise TypeError(f"_config_validate: no check for a field annotated {hint!r}; add one to _alternatives")


def expectation(hint: object) -> str:
    """What a value of this annotation must be, as the end of "must be ...": ``true, false or "h2c"``."""
    alts = _alternatives(hint)
    if typing.get_origin(hint) is Literal and len(alts) > 2:
        return "one of " + ", ".join(alts)
    return alts[0] if len(alts) == 1 else ", ".join(alts[:-1]) + " or " + alts[-1]


@functools.cache
def _origin_args(hint: object) -> tuple[object, tuple[Any, ...]]:
    # Cached: the typing introspection costs more than the checks themselves, and there are few annotations.
    return typing.get_origin(hint), typing.get_args(hint)


def check_type(hint: object, value: object) -> Any:
    """``value`` if it fits ``hint`` (ints become floats where a float is wanted); raises ``_Invalid``."""
    origin, args = _origin_args(hint)
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    elif origin is Literal:
        # type() as well as ==, so that True does not pass for 1 or 1 for True.
        if any(type(value) is type(arg) and value == arg for arg in args):
            return value
    elif origin in (typing.Union, types.UnionType):
        for arg in args:
            if arg is type(None):
                continue
            try:
                return check_type(arg, value)
            except _Invalid:
                pass
    elif origin is list:
        if isinstance(value, list | tuple):
            try:
                return [check_type(args[0], item) for item in value]
            except _Invalid:
                pass
    elif origin is dict:
        if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
            try:
                return {k: check_type(args[1], v) for k, v in value.items()}
            except _Invalid:
                pass
    else:
        _alternatives(hint)  # raises TypeError naming the annotation nobody taught us
    raise _Invalid(expectation(hint))


def _accepts_text(hint: object) -> bool:
    try:
        check_type(hint, "x")
    except _Invalid:
        return typing.get_origin(hint) is Literal or any(
            typing.get_origin(a) is Literal for a in typing.get_args(hint)
        )
    return True


def _from_text(hint: object, text: str) -> object:
    """Read typed text (``20``, ``true``, ``"h2c"``, ``h2c``, ``["a", "b"]``) as the value the field wants.

    The text is parsed as a TOML value; when that fails, or gives a value the field rejects although it
    takes strings, the text itself is the value (so ``ui.theme=nord`` and ``cache.policy=always`` need no
    quotes).
    """
    if "\n" in text or "\r" in text:
        return text  # a line break would let the text add keys of its own to the TOML we parse
    try:
        parsed = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    try:
        check_type(hint, parsed)
    except _Invalid:
        return text if _accepts_text(hint) else parsed
    return parsed


_HINTS: dict[type[Any], dict[str, Any]] = {}


def field_hints(cls: type[Any]) -> dict[str, Any]:
    """The resolved annotation of each field of a settings dataclass, in declaration order."""
    if cls not in _HINTS:
        hints = typing.get_type_hints(cls)
        _HINTS[cls] = {f.name: hints[f.name] for f in dataclasses.fields(cls)}
    return _HINTS[cls]


@functools.cache
def _named_tables_of(hint: object) -> type[Any] | None:
    args = typing.get_args(hint)
    if typing.get_origin(hint) is dict and len(args) == 2 and dataclasses.is_dataclass(args[1]):
        return typing.cast(type[Any], args[1])
    return None


def _rule_key(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def validate_tree(raw: Mapping[str, object], source: Source) -> Tree:
    """Check a raw tree against ``Settings`` and return it validated (values converted, same shape).

    Raises ``ConfigError`` with one line naming the first bad key through ``source``: a value of the wrong
    type or out of range, an unknown key or section (with the closest valid name), a table where a value
    belongs or the reverse.
    """
    return _table(Settings, raw, (), "", source, frozenset())


def _table(
    cls: type[Any],
    raw: object,
    parts: tuple[str, ...],
    prefix: str,
    source: Source,
    loader_set: frozenset[str],
) -> Tree:
    if not isinstance(raw, Mapping):
        raise source.invalid(parts, "a table", raw)
    hints = field_hints(cls)
    valid = [name for name in hints if name not in loader_set]
    out: Tree = {}
    for key, value in raw.items():
        key_parts = (*parts, str(key))
        if key in loader_set:
            raise ConfigError(
                f"{source.prefix}{source.name(key_parts)} is taken from the table's name and cannot be set; "
                "remove it"
            )
        if key not in hints:
            tables = [n for n in valid if _is_table_hint(hints[n])] if not parts else valid
            section = not parts and isinstance(value, Mapping)
            raise source.unknown(key_parts, tables if section else valid, section=section)
        out[key] = _field(hints[key], value, key_parts, _rule_key(prefix, key), source)
    return out


def _is_table_hint(hint: object) -> bool:
    return dataclasses.is_dataclass(hint) or typing.get_origin(hint) is dict


def _field(hint: Any, value: object, parts: tuple[str, ...], rule_key: str, source: Source) -> Any:
    if dataclasses.is_dataclass(hint):
        return _table(typing.cast(type[Any], hint), value, parts, rule_key, source, frozenset())
    item_cls = _named_tables_of(hint)
    if item_cls is not None:
        if not isinstance(value, Mapping):
            raise source.invalid(parts, f"a table of [{source.name((*parts, 'NAME'))}] tables", value)
        named: Tree = {}
        for name, item in value.items():
            if not name:
                raise ConfigError(
                    f"{source.prefix}{source.name(parts)} names must not be empty; name the table"
                )
            named[name] = _table(item_cls, item, (*parts, name), f"{rule_key}.*", source, frozenset({"name"}))
        return named
    if rule_key in SUBTABLES:
        sub_cls, sub_prefix = SUBTABLES[rule_key]
        return _table(sub_cls, value, parts, sub_prefix, source, frozenset())
    if typing.get_origin(hint) is dict:
        # A table of plain values (keymap, headers): check entry by entry so a message names the entry.
        if not isinstance(value, Mapping):
            raise source.invalid(parts, expectation(hint), value)
        value_hint = typing.get_args(hint)[1]
        return {
            str(k): _leaf(value_hint, v, (*parts, str(k)), f"{rule_key}.*", source) for k, v in value.items()
        }
    return _leaf(hint, value, parts, rule_key, source)


def _leaf(hint: object, value: object, parts: tuple[str, ...], rule_key: str, source: Source) -> Any:
    rule = RULES.get(rule_key)
    if source.text_values and isinstance(value, str):
        value = _from_text(hint, value)
    try:
        converted = check_type(hint, value)
    except _Invalid as exc:
        error = source.invalid(parts, rule.expectation if rule else exc.expectation, value)
        close = _closest_choice(hint, value) if not is_secret_path(parts) else None
        raise (ConfigError(f"{error} (did you mean {toml_value(close)}?)") if close else error) from None
    if rule is not None and not rule.ok(converted):
        raise source.invalid(parts, rule.expectation, value)
    if parts[-1] == "base_url" and isinstance(converted, str) and "@" in urlsplit(converted).netloc:
        # Sent as Basic auth in place of the key, the provider's 401 would blame a key that is right.
        raise source.invalid(parts, "a URL without user:password@ (llmchat sends the key as a Bearer token: put "
                             "it in api_key or api_key_env)", value)
    return converted


def _closest_choice(hint: object, value: object) -> str | None:
    """The string choice of a ``Literal`` in ``hint`` closest to a mistyped string ``value``, if one is close
    (``"alwasy"`` -> ``"always"``; case is forgiven, so ``"H2C"`` -> ``"h2c"``)."""
    if not isinstance(value, str):
        return None
    hints = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    literals = [h for h in hints if typing.get_origin(h) is Literal]
    choices = [a for h in literals for a in typing.get_args(h) if isinstance(a, str)]
    by_fold = {c.casefold(): c for c in choices}
    close = difflib.get_close_matches(value.casefold(), list(by_fold), n=1)
    return by_fold[close[0]] if close else None


def validate_value(parts: Sequence[str], value: object, source: Source) -> Any:
    """Check one value for the setting at ``parts`` (``("providers", "openai", "base_url")``); return it.

    Raises ``ConfigError`` as ``validate_tree`` does.
    """
    raw: object = value
    for part in reversed(parts):
        raw = {part: raw}
    tree: Any = validate_tree(typing.cast(Mapping[str, object], raw), source)
    for part in parts:
        tree = tree[part]
    return tree


def merge(base: Tree, over: Tree) -> Tree:
    """``base`` with ``over`` laid on top, table by table: a later source replaces values, not tables."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def build(cls: type[Any], tree: Mapping[str, Any]) -> Any:
    """An instance of the settings dataclass ``cls`` from a validated tree; missing keys keep defaults."""
    kwargs: dict[str, Any] = {}
    for name, hint in field_hints(cls).items():
        if name not in tree:
            continue
        value = tree[name]
        item_cls = _named_tables_of(hint)
        if dataclasses.is_dataclass(hint):
            kwargs[name] = build(typing.cast(type[Any], hint), value)
        elif item_cls is not None:
            kwargs[name] = {n: build(item_cls, {**item, "name": n}) for n, item in value.items()}
        else:
            kwargs[name] = value
    return cls(**kwargs)
