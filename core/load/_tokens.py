"""Token figures of a load test: prompt and output lengths and who counted them, ITL per token beside ITL per
chunk, and TTFT by turn of a multi-turn run.

- **Prompt tokens** are counted before the run with the server's own tokenizer (``POST /tokenize``, through
  ``ContextBudget``, as the app counts a conversation: each message's tokens plus its chat framing, and the
  reply's priming), for every system prompt and human turn the run will send (at most ``MAX_COUNTED``
  texts). A model reply carried as history counts the server's ``completion_tokens`` for it. Where the server
  has no tokenizer (or a text was not counted, or a reply came without usage) the count is an estimate
  (``estimate_tokens``: 4 bytes a token) and the figures say "estimated". Only runs with ``--dataset`` or
  ``--prefix-share`` count prompts: a synthetic prompt's size is known by design (``_prompts``).
- **Output tokens**: the server's ``usage.completion_tokens``, else the content chunks (estimated).
- **ITL per token**: a chunk gap divided among the tokens the later chunk carried. Those come from per-chunk
  usage where the server streams it (vLLM's continuous usage stats: the completion tokens so far on every
  chunk; ``--chunk-usage`` asks for it), else from the request's token counts (completion tokens / content
  chunks, the same for every gap). With usage per chunk each token is one value (a 3-token chunk gives three
  values of a third of its gap); with counts each gap is one value. ITL per chunk is vLLM's chunk-gap figure
  (``_stats``); the two agree when every chunk holds one token.
- **TTFT by turn**: p50 and p95 of TTFT per turn number (1 is each conversation's first request), so what a
  prefix cache saves on later turns shows.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from llmchat.core.client import (
    MESSAGE_TOKENS,
    REPLY_TOKENS,
    ChatClient,
    ChatStream,
    ContextBudget,
    estimate_tokens,
)
from llmchat.core.observe import TimingRecord, percentile

MAX_COUNTED = 5000
"""Distinct prompt texts counted with the server's tokenizer before a run; the rest are estimated."""
BATCH = 64
"""Texts asked of the tokenizer at once (one request each, in parallel)."""
TURN_QUANTILES = (50, 95)

By = Literal["server", "estimated"]
ItlSource = Literal["chunk usage", "token counts"]


class Values(Protocol):
    """What a TokenTally keeps values in: ``_stats.Distribution`` (passed in: _stats holds a TokenTally)."""

    count: int
    high: float

    @property
    def mean(self) -> float | None: ...
    def add(self, value: float) -> None: ...
    def nbytes(self) -> int: ...
    def extend(self, values: Sequence[float]) -> None: ...
    def percentile(self, q: float) -> float | None: ...


class ReplyProbe:
    """What the bench keeps of one reply beyond its record: its text when the next turn needs it, and the
    completion tokens the server counted at each content chunk when it sends usage on every chunk."""

    __slots__ = ("keep_text", "text", "_stream", "_seen")

    def __init__(self, *, keep_text: bool = False) -> None:
        self.keep_text = keep_text
        self.text = ""
        self._stream: ChatStream | None = None
        self._seen: dict[int, int] = {}

    def watch(self, stream: ChatStream) -> None:
        self._stream = stream
        stream.on_usage = self._usage

    def _usage(self, usage: dict[str, Any]) -> None:
        tokens = usage.get("completion_tokens")
        if self._stream is not None and isinstance(tokens, int) and not isinstance(tokens, bool):
            self._seen[self._stream.record.content_chunks] = tokens

    def done(self, text: str) -> None:
        if self.keep_text:
            self.text = text

    def chunk_tokens(self, chunks: int) -> list[int] | None:
        """Tokens in each of the reply's ``chunks`` content chunks, from usage sent with every one of them;
        None when some chunk came without it (the server sends usage once, at the end)."""
        seen = self._seen
        if chunks < 2 or any(k not in seen for k in range(1, chunks + 1)):
            return None
        out = [seen[1]]
        out.extend(seen[k] - seen[k - 1] for k in range(2, chunks + 1))
        return out if all(n >= 0 for n in out) else None


def itl_per_token(record: TimingRecord, chunk_tokens: Sequence[int] | None,
                  gaps: Sequence[float] | None = None) -> tuple[Sequence[float], ItlSource]:
    """The reply's inter-token latencies (ms) and where the tokens per chunk came from; ``gaps``: its
    ``itl_ms`` when the caller has them already."""
    if gaps is None:
        gaps = record.itl_ms
    if chunk_tokens is not None and len(chunk_tokens) == len(gaps) + 1:
        values: list[float] = []
        for gap, n in zip(gaps, chunk_tokens[1:], strict=True):
            if n > 0:
                values.extend([gap / n] * n)
        return values, "chunk usage"
    per_chunk = record.output_tokens / record.content_chunks if record.content_chunks else 1.0
    if per_chunk == 1.0:
        return gaps, "token counts"  # one token a chunk: the gaps themselves
    if per_chunk <= 0:
        return [], "token counts"
    return [gap / per_chunk for gap in gaps], "token counts"


class PromptCounter:
    """Prompt lengths with the server's tokenizer: ``prime`` counts the texts before the run (each as one
    message, framing included), ``count`` then adds up a request's messages without asking the server."""

    def __init__(self) -> None:
        self.costs: dict[str, int] = {}
        """Each counted text's cost as a message: MESSAGE_TOKENS + its tokens."""
        self.asked = 0

    async def prime(self, client: ChatClient, texts: Iterable[str], model: str) -> None:
        """Count ``texts`` (the first MAX_COUNTED distinct ones) with the server's tokenizer. Never raises:
        a server without one, or one that fails, leaves them to be estimated."""
        budget = ContextBudget(client, timeout_s=10.0)
        wanted = list(dict.fromkeys(t for t in texts if t))[:MAX_COUNTED]
        for i in range(0, len(wanted), BATCH):
            batch = wanted[i:i + BATCH]
            costs, by = await budget.count([{"role": "user", "content": t} for t in batch], model)
            self.asked += len(batch)
            if by != "server":
                break  # no tokenizer (asked once), or it failed: the rest are estimates
            self.costs.update(zip(batch, costs, strict=True))

    def count(self, messages: Sequence[dict[str, str]], replies: Sequence[int | None] = ()) -> tuple[int, By]:
        """A request's prompt tokens and who counted them. ``replies``: the server's completion tokens of each
        assistant message in order (None where the reply came without usage)."""
        total, by = REPLY_TOKENS, "server"
        reply = iter(replies)
        for m in messages:
            text = m.get("content", "")
            cost = self.costs.get(text)
            if m.get("role") == "assistant":
                n = next(reply, None)
                cost = None if n is None else MESSAGE_TOKENS + n
            if cost is None:
                cost, by = MESSAGE_TOKENS + estimate_tokens(text), "estimated"
            total += cost
        return total, by  # type: ignore[return-value]


@dataclass(slots=True)
class RequestTokens:
    """One request's token figures beside its record: its turn, its prompt's counted length and the tokens
    of each content chunk when the server said (per-chunk usage)."""

    turn: int = 1
    prompt_tokens: int | None = None
    prompt_by: By = "estimated"
    chunk_tokens: list[int] | None = None

    def to_json(self, record: TimingRecord) -> dict[str, Any]:
        per_token, source = itl_per_token(record, self.chunk_tokens)
        return {
            "turn": self.turn,
            "prompt_tokens_counted": self.prompt_tokens,
            "prompt_tokens_by": None if self.prompt_tokens is None else self.prompt_by,
            "output_tokens_by": "server" if record.usage_from_server else "estimated",
            "itl_per_token_ms_p50": _r(percentile(list(per_token), 50)),
            "itl_per_token_source": source,
        }


@dataclass(slots=True)
class TokenFigures:
    """A configuration's token figures (see the module docstring); percentiles in ms or tokens."""

    prompt: dict[str, float | None]
    prompt_by: By | None
    """None when no prompt was counted (a synthetic run)."""
    output: dict[str, float | None]
    output_by: By | None
    itl_per_chunk: dict[str, float | None]
    itl_per_token: dict[str, float | None]
    itl_source: str | None
    """"chunk usage", "token counts", or both joined with " + " when requests differed; None with no gaps."""
    ttft_by_turn: dict[int, dict[str, float | None]] = field(default_factory=dict)
    """Turn number -> n, p50, p95 (ms)."""

    def to_json(self) -> dict[str, Any]:
        def qs(d: dict[str, float | None]) -> dict[str, float | None]:
            return {k: _r(v) for k, v in d.items()}

        return {
            "prompt_tokens": {**qs(self.prompt), "counted_by": self.prompt_by},
            "output_tokens": {**qs(self.output), "counted_by": self.output_by},
            "itl_ms": {"per_chunk": qs(self.itl_per_chunk), "per_token": qs(self.itl_per_token),
                       "per_token_source": self.itl_source},
            "ttft_by_turn": {str(t): qs(row) for t, row in sorted(self.ttft_by_turn.items())},
        }


class TokenTally:
    """A configuration's token figures in the making, bounded as ``Tally`` is: ``new`` makes each store of
    values (a ``Distribution`` with the tally's limit)."""

    def __init__(self, new: Callable[[], Values], itl: Values) -> None:
        self._new = new
        self.prompt = self._new()
        self.output = self._new()
        self.itl = itl
        """ITL per chunk (the Tally's): while every chunk held one token, it is ITL per token as well."""
        self.itl_token: Values | None = None
        """ITL per token once some chunk held more (or fewer): a copy of ``itl`` then, and apart from it."""
        self.prompt_by: Counter[str] = Counter()
        self.output_by: Counter[str] = Counter()
        self.sources: Counter[str] = Counter()
        self.turns: dict[int, Values] = {}

    def add(self, record: TimingRecord, tokens: RequestTokens | None, gaps: Sequence[float]) -> None:
        """Count one successful request; ``gaps``: its ``itl_ms``."""
        tokens = tokens or RequestTokens()
        self.output.add(record.output_tokens)
        self.output_by["server" if record.usage_from_server else "estimated"] += 1
        if tokens.prompt_tokens is not None:
            self.prompt.add(tokens.prompt_tokens)
            self.prompt_by[tokens.prompt_by] += 1
        if record.content_chunks > 1:
            values, source = itl_per_token(record, tokens.chunk_tokens, gaps)
            self.sources[source] += 1
            if self.itl_token is None and values is not gaps:
                # Kept apart only from here on, as two histograms of the same gaps would double their cost.
                self.itl_token = copy.deepcopy(self.itl)
            if self.itl_token is not None:
                self.itl_token.extend(values)
        ttft = record.ttft_ms
        if ttft is not None:
            found = self.turns.get(tokens.turn)
            if found is None:
                found = self.turns[tokens.turn] = self._new()
            found.add(ttft)

    def nbytes(self) -> int:
        kept = [self.prompt, self.output, *([self.itl_token] if self.itl_token else []), *self.turns.values()]
        return sum(d.nbytes() for d in kept)

    def figures(self) -> TokenFigures:
        def qs(d: Values) -> dict[str, float | None]:
            return {"p50": d.percentile(50), "p90": d.percentile(90), "p99": d.percentile(99), "mean": d.mean,
                    "max": d.high if d.count else None}

        def by(c: Counter[str]) -> By | None:
            return None if not c else "server" if set(c) == {"server"} else "estimated"

        return TokenFigures(
            prompt=qs(self.prompt), prompt_by=by(self.prompt_by), output=qs(self.output),
            output_by=by(self.output_by), itl_per_chunk={k: v for k, v in qs(self.itl).items() if k != "max"},
            itl_per_token=qs(self.itl if self.itl_token is None else self.itl_token),
            itl_source=" + ".join(sorted(self.sources)) or None,
            ttft_by_turn={t: {"n": d.count, **{f"p{q}": d.percentile(q) for q in TURN_QUANTILES}}
                          for t, d in sorted(self.turns.items())},
        )


def _r(v: float | None) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isinf(v)) else round(v, 3)
