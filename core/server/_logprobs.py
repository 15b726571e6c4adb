"""Token log probabilities for the local server: ``logprobs`` / ``top_logprobs`` as OpenAI sends them.

Each content token gets a ``ChatCompletionTokenLogprob``: the token, its UTF-8 ``bytes``, a ``logprob`` (at most
0, mostly near it, as a confident model's are) and ``top_logprobs``: the token itself first, then distinct
alternatives, each less likely than the one before. The numbers are fixed by the request (``seed_text``), so a
repeated request gets the same ones. They are built only for a request that asks for them.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Any

from llmchat.core.server._encode import dumps

_ALTERNATIVES = (
    " the", " a", " and", " to", " of", " in", " is", " it", " that", " for", ",", ".", ":", "\n", " with",
    " on", " as", " this", " be", " or", " an", " by", " at", " not",
)
"""Enough distinct tokens for 20 alternatives besides any one token."""


def token_logprobs(tokens: Sequence[str], top: int, seed_text: str) -> list[dict[str, Any]]:
    """One ``{"token", "logprob", "bytes", "top_logprobs"}`` per token, ``top`` alternatives each (0 to 20).
    Never fails."""
    rng = random.Random(int.from_bytes(hashlib.sha256(b"logprobs\x00" + seed_text.encode()).digest()[:8], "big"))
    out: list[dict[str, Any]] = []
    for token in tokens:
        logprob = -round(rng.expovariate(8.0), 6)
        alternatives: list[dict[str, Any]] = []
        if top:
            alternatives.append({"token": token, "logprob": logprob, "bytes": list(token.encode())})
            below = logprob
            for other in rng.sample([a for a in _ALTERNATIVES if a != token], top - 1):
                below = round(below - 0.5 - rng.expovariate(1.0), 6)
                alternatives.append({"token": other, "logprob": below, "bytes": list(other.encode())})
        out.append({"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": alternatives})
    return out


def chunk_logprobs(entry: dict[str, Any]) -> bytes:
    """A stream chunk's ``logprobs`` object for one token, as JSON bytes."""
    return b'{"content":[' + dumps(entry) + b'],"refusal":null}'
