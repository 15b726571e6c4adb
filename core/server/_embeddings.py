"""Deterministic embeddings: hashed word and word-pair features, L2-normalised.

Texts that share words point the same way (a cosine above zero), identical texts give identical vectors, and
the model id is mixed into the hash so two models disagree, as two real models would.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
from collections.abc import Sequence

from llmchat.core.server._replies import tokenize


def embed(text: str | Sequence[int], model: str, dim: int) -> list[float]:
    """A unit vector of length ``dim`` for a text (or a list of token ids). Never fails; ``dim`` >= 1."""
    if isinstance(text, str):
        words = [t.strip().lower() for t in tokenize(text) if t.strip()]
    else:
        words = [f"#{token_id}" for token_id in text]
    features = words + [f"{a} {b}" for a, b in zip(words, words[1:], strict=False)] or [""]
    vector = [0.0] * dim
    salt = model.encode() + b"\x00"
    for feature in features:
        h = int.from_bytes(hashlib.blake2b(salt + feature.encode(), digest_size=8).digest(), "little")
        # The low bits pick the slot, one high bit the sign, so collisions cancel rather than pile up.
        vector[h % dim] += 1.0 if h >> 63 else -1.0
    norm = math.sqrt(sum(v * v for v in vector))
    if norm == 0.0:  # every feature cancelled out; any fixed unit vector will do
        vector[0], norm = 1.0, 1.0
    return [v / norm for v in vector]


def encode_base64(vector: list[float]) -> str:
    """The vector as OpenAI's ``encoding_format: base64`` sends it: little-endian float32, base64."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
