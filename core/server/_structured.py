"""Structured replies for the local server: ``response_format`` ``json_object`` and ``json_schema``.

A ``json_schema`` reply is a value built from the schema: an object has every ``required`` property and, by
the dice, some of the others; ``type`` (one or a list), ``enum``, ``const``, ``anyOf`` / ``oneOf`` /
``allOf``, ``$ref`` into ``$defs`` / ``definitions`` (what pydantic writes for a nested model), ``items`` and
``prefixItems``, ``minItems`` / ``maxItems``, ``minimum`` / ``maximum`` (and their exclusive forms),
``minLength`` / ``maxLength`` and the common string ``format``s are honoured; ``pattern`` is not. A
``json_object`` reply is an object of a fixed shape with varying values. Both are fixed by the request's seed
and messages, as every reply of this server is.
"""

from __future__ import annotations

import json
import math
import random
import uuid
from typing import Any

MAX_DEPTH = 8
"""Past this depth only what the schema requires is built (arrays at their ``minItems``), so a recursive
schema ends."""
_GIVE_UP_DEPTH = 32
"""A schema whose requirements recurse for ever gets ``null`` here rather than no reply at all."""
_MOST_ITEMS = 1000
_LONGEST = 4096
"""Caps on what a schema can ask for (``minItems``, ``minLength``): a test server answers, whatever it is asked."""
_WORDS = (
    "pool", "stream", "token", "latency", "cache", "retry", "socket", "window", "prefill", "decode", "queue",
    "budget", "jitter", "header", "frame", "record", "steady", "quick", "careful", "plain", "warm", "cold",
)
_FORMATS = {
    "date-time": ("2024-05-01T12:30:00Z", "2025-01-17T08:05:42Z", "2023-11-30T23:59:59Z"),
    "date": ("2024-05-01", "2025-01-17", "2023-11-30"),
    "time": ("12:30:00", "08:05:42", "23:59:59"),
    "email": ("ada@example.com", "grace@example.org", "alan@example.net"),
    "uri": ("https://example.com/pool", "https://example.org/stream", "https://example.net/token"),
    "hostname": ("example.com", "api.example.org", "localhost"),
    "ipv4": ("127.0.0.1", "192.0.2.7", "198.51.100.23"),
    "ipv6": ("::1", "2001:db8::7", "2001:db8::23"),
    "duration": ("PT1S", "PT2M", "P1D"),
}
_OBJECT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "minLength": 12},
        "topic": {"type": "string"},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "steps": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 4},
        "done": {"type": "boolean"},
    },
    "required": ["answer", "topic", "confidence", "steps", "done"],
}
"""The shape of a ``json_object`` reply (any object will do there; a fixed one is easy to read)."""


def json_text(schema: dict[str, Any] | None, rng: random.Random) -> str:
    """A compact JSON document: a value of ``schema`` (None: ``json_object``'s object). Never fails; a
    malformed part of a schema is read as "any value" (a string)."""
    value = _value(_OBJECT_SCHEMA if schema is None else schema, rng, schema or _OBJECT_SCHEMA, 0)
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def _value(schema: Any, rng: random.Random, root: dict[str, Any], depth: int) -> Any:
    if depth > _GIVE_UP_DEPTH or not isinstance(schema, dict):
        return None if depth > _GIVE_UP_DEPTH else _words(rng, 1, 3)
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return _value(_resolve(ref, root), rng, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return rng.choice(enum)
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            # A null option is taken only when it is the only one: a value says more than a null.
            real = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")] or options
            return _value(rng.choice(real), rng, root, depth + 1)
    parts = schema.get("allOf")
    if isinstance(parts, list) and parts:
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        properties, required = dict(_dict(schema.get("properties"))), list(_list(schema.get("required")))
        for part in parts:
            if isinstance(part, dict) and isinstance(part.get("$ref"), str):
                part = _resolve(part["$ref"], root)
            if isinstance(part, dict):
                merged.update({k: v for k, v in part.items() if k not in ("properties", "required")})
                properties.update(_dict(part.get("properties")))
                required += _list(part.get("required"))
        merged["properties"], merged["required"] = properties, required
        return _value(merged, rng, root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"] or kind
        kind = rng.choice(kinds) if kinds else None
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if kind == "object":
        return _object(schema, rng, root, depth)
    if kind == "array":
        return _array(schema, rng, root, depth)
    if kind == "integer":
        low, high = _bounds(schema, 0, 100, 1)
        return rng.randint(int(low), int(high)) if low <= high else int(low)
    if kind == "number":
        low, high = _bounds(schema, 0.0, 100.0, 0.01)
        return round(rng.uniform(low, high), 2) if low < high else low
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    return _string(schema, rng)


def _object(schema: dict[str, Any], rng: random.Random, root: dict[str, Any], depth: int) -> dict[str, Any]:
    properties = _dict(schema.get("properties"))
    required = {name for name in _list(schema.get("required")) if isinstance(name, str)}
    out: dict[str, Any] = {}
    for name, sub in properties.items():
        if name in required or (depth < MAX_DEPTH and rng.random() < 0.5):
            out[name] = _value(sub, rng, root, depth + 1)
    extra = schema.get("additionalProperties")
    if not properties and isinstance(extra, dict) and depth < MAX_DEPTH:
        for word in rng.sample(_WORDS, 2):
            out[word] = _value(extra, rng, root, depth + 1)
    return out


def _array(schema: dict[str, Any], rng: random.Random, root: dict[str, Any], depth: int) -> list[Any]:
    prefix = schema.get("prefixItems")
    prefix = prefix if isinstance(prefix, list) else []
    low = min(_int(schema.get("minItems"), 0), _MOST_ITEMS)
    high = min(_int(schema.get("maxItems"), max(low, 3)), _MOST_ITEMS)
    fewest = max(low, 1) if high >= 1 else 0  # an array with an item says more than an empty one
    count = low if depth >= MAX_DEPTH else rng.randint(fewest, max(fewest, min(high, max(low, 3))))
    count = max(count, min(len(prefix), high))
    items = schema.get("items", {})
    return [_value(prefix[i] if i < len(prefix) else items, rng, root, depth + 1) for i in range(count)]


def _string(schema: dict[str, Any], rng: random.Random) -> str:
    samples = _FORMATS.get(str(schema.get("format")))
    if samples is not None:
        return rng.choice(samples)
    if schema.get("format") == "uuid":
        return _uuid(rng)
    low = min(_int(schema.get("minLength"), 0), _LONGEST)
    high = _int(schema.get("maxLength"), 0)
    text = _words(rng, 1, 4)
    while len(text) < low:
        text += " " + rng.choice(_WORDS)
    return text[:high] if high and len(text) > high else text


def _words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(low, high)))


def _bounds(schema: dict[str, Any], low: float, high: float, step: float) -> tuple[float, float]:
    """The range a number of ``schema`` may take: the schema's bounds, an exclusive one moved in by ``step``;
    a range of 100 beyond a bound given alone."""
    lo = _number(schema.get("minimum"))
    hi = _number(schema.get("maximum"))
    ex_lo = _number(schema.get("exclusiveMinimum"))
    ex_hi = _number(schema.get("exclusiveMaximum"))
    if ex_lo is not None:
        lo = max(lo, ex_lo + step) if lo is not None else ex_lo + step
    if ex_hi is not None:
        hi = min(hi, ex_hi - step) if hi is not None else ex_hi - step
    if lo is None and hi is None:
        return low, high
    if lo is None:
        assert hi is not None
        return hi - 100, hi
    if hi is None:
        return lo, lo + 100
    return lo, max(lo, hi)


def _resolve(ref: str, root: dict[str, Any]) -> Any:
    """A local ``$ref`` (``#``, ``#/$defs/Name``, any JSON pointer into the root); an unknown one is {}."""
    if not ref.startswith("#"):
        return {}
    node: Any = root
    for part in ref[1:].lstrip("/").split("/") if ref != "#" else ():
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return {}
    return node


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _number(value: object) -> float | None:
    """A finite number of the schema (a bound of NaN or infinity, which Python's JSON parser takes, is none)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer past float's range
        return None
    return number if math.isfinite(number) else None


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))
