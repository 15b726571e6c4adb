"""Writing settings back out as TOML: for `llmchat config show` and for quoting values in error messages.

The writer only has to cover what ``Settings`` holds (bools, numbers, strings, lists of strings, tables of
scalars, one level of named sub-tables), so it is a few functions rather than a TOML library.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import re
import typing
from collections.abc import Mapping, Sequence

from llmchat.core.config._secrets import is_secret_path, is_url_path, mask_secret, mask_url
from llmchat.core.config._settings import Settings

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def toml_key(key: str) -> str:
    """``key`` as a TOML key: bare when it can be, a quoted basic string otherwise. Never fails."""
    return key if _BARE_KEY.fullmatch(key) else _toml_string(key)


def dotted_key(parts: Sequence[str]) -> str:
    """A key path as TOML writes it: ``providers.groq.http.http2``, quoting parts that need it."""
    return ".".join(toml_key(part) for part in parts)


def _toml_string(text: str) -> str:
    # JSON's escapes are all valid in a TOML basic string; DEL is the one control character JSON leaves raw
    # and TOML forbids.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_value(value: object) -> str:
    """``value`` the way a TOML file would spell it (``"ten"``, ``true``, ``[1, 2]``, ``{ a = 1 }``).

    Used both to write valid TOML and to quote a rejected value in an error message, so it accepts anything:
    types TOML has no syntax for (``None``, other objects) come out as their JSON or ``repr`` spelling.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, Mapping):
        if not value:
            return "{}"
        inner = ", ".join(f"{toml_key(str(k))} = {toml_value(v)}" for k, v in value.items())
        return "{ " + inner + " }"
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if value is None:
        return "null"
    return repr(value)


def _shown(parts: tuple[str, ...], value: object, mask: bool) -> object:
    if not mask:
        return value
    if isinstance(value, str) and is_secret_path(parts):
        return mask_secret(value)
    if isinstance(value, str) and is_url_path(parts):
        return mask_url(value)
    if isinstance(value, Mapping):
        return {k: _shown((*parts, str(k)), v, mask) for k, v in value.items()}
    return value


def _table_lines(parts: tuple[str, ...], obj: object, mask: bool, skip: frozenset[str]) -> list[str]:
    lines: list[str] = []
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        if f.name in skip:
            continue
        value = getattr(obj, f.name)
        if value is None:
            # TOML has no null: say so in a comment rather than invent a value that would load differently.
            lines.append(f"# {toml_key(f.name)}: not set")
            continue
        shown = _shown((*parts, f.name), value, mask)
        lines.append(f"{toml_key(f.name)} = {toml_value(shown)}")
    return lines


def _is_named_tables(hint: object) -> bool:
    """True for ``dict[str, SomeDataclass]``: a section of named sub-tables such as [providers.NAME]."""
    args = typing.get_args(hint)
    return typing.get_origin(hint) is dict and len(args) == 2 and dataclasses.is_dataclass(args[1])


def settings_to_toml(settings: Settings, *, mask: bool = True) -> str:
    """The effective settings as a TOML document, sections in the order ``Settings`` declares them.

    With ``mask`` (the default) every secret (any ``api_key``, headers whose name contains auth, key, token)
    is replaced by ``mask_secret``'s hint. Without it the text loads back into equal settings. Never fails.
    """
    hints = typing.get_type_hints(Settings)
    top: list[str] = []
    tables: list[str] = []
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if dataclasses.is_dataclass(value):
            tables += ["", f"[{toml_key(f.name)}]", *_table_lines((f.name,), value, mask, frozenset())]
        elif _is_named_tables(hints[f.name]):
            # The name field of [providers.NAME] is the table's name, not a key inside it.
            for name, item in value.items():
                parts = (f.name, str(name))
                tables += [
                    "",
                    f"[{dotted_key(parts)}]",
                    *_table_lines(parts, item, mask, frozenset({"name"})),
                ]
        elif isinstance(value, Mapping):
            tables += ["", f"[{toml_key(f.name)}]"]
            tables += [
                f"{toml_key(str(k))} = {toml_value(_shown((f.name, str(k)), v, mask))}"
                for k, v in value.items()
            ]
        else:
            top.append(f"{toml_key(f.name)} = {toml_value(_shown((f.name,), value, mask))}")
    return "\n".join(top + tables).lstrip("\n") + "\n"


_HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")


def _header_path(line: str) -> tuple[str, ...] | None:
    """The key path of a ``[a.b."c d"]`` table header line; None for any other line (``[[arrays]]`` too)."""
    m = _HEADER.match(line)
    if m is None or line.lstrip().startswith("[["):
        return None
    try:
        import tomllib

        doc = tomllib.loads(f"[{m.group(1)}]")
    except ValueError:
        return None
    parts: list[str] = []
    node: object = doc
    while isinstance(node, dict) and len(node) == 1:
        key = next(iter(node))
        parts.append(key)
        node = node[key]
    return tuple(parts)


def set_toml_keys(text: str, changes: Mapping[tuple[str, ...], Mapping[str, object]]) -> str:
    """``text`` (a TOML document) with each ``table path -> {key: value}`` set, everything else kept as it is
    (comments, order, blank lines). A key already in its table has its line replaced; a new key goes after the
    table's last line; a table the document lacks is appended. Raises ValueError when the result is not valid
    TOML (the document spelled that table inline, ``http = { ... }``): the caller says to edit by hand."""
    import tomllib

    lines = text.splitlines()
    for path, keys in changes.items():
        path = tuple(path)
        start = next((i for i, line in enumerate(lines) if _header_path(line) == path), None)
        if start is None:
            if lines and lines[-1].strip():
                lines.append("")
            lines.append(f"[{dotted_key(path)}]")
            lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in keys.items()]
            continue
        end = next((i for i in range(start + 1, len(lines)) if _header_path(lines[i]) is not None
                    or lines[i].lstrip().startswith("[[")), len(lines))
        for key, value in keys.items():
            pattern = re.compile(rf"^\s*{re.escape(toml_key(key))}\s*=")
            new = f"{toml_key(key)} = {toml_value(value)}"
            hit = next((i for i in range(start + 1, end) if pattern.match(lines[i])), None)
            if hit is not None:
                lines[hit] = new
                continue
            last = end
            while last - 1 > start and not lines[last - 1].strip():
                last -= 1
            lines.insert(last, new)
            end += 1
    result = "\n".join(lines) + "\n"
    tomllib.loads(result)  # TOMLDecodeError is a ValueError
    return result
