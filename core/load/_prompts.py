"""Deterministic synthetic prompts for `llmchat bench`: short questions, and long ones of over 1,000 tokens.

Every prompt is a pure function of ``(seed, prompt id, long)``, so each configuration of a comparison and each
repeat of a run sends the same bytes. Words come from a small vocabulary of short, common English words: one
token each for llmchat's own server (a word of up to 8 letters is one token there) and, mostly, for the BPE
tokenizers of hosted models, so a long prompt's size holds across servers.

A plan may take its prompts from a dataset instead (``_dataset``: each prompt id names one of its
conversations), and may put a shared system-prompt prefix before every prompt (``prefix_share``): the first
``ceil(prefix_share x the prompt's words)`` words of one seeded text, the same start for every request, so a
server that caches prefixes can reuse it (vLLM's automatic prefix caching, llama.cpp's cache_prompt).
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass

from llmchat.core.load._dataset import Conversation, Dataset

_WORDS = (
    "the a model answer token stream latency server client request network cache retry pool socket packet "
    "window buffer queue thread signal budget metric median tail burst region route header body frame byte "
    "clock timer event loop batch prompt reply node shard disk page table index field value record error "
    "limit rate load peak quiet fast slow early late first last next open close keep send read write wait "
    "start stop run test check count measure compare explain describe summary detail reason example"
).split()

LONG_WORDS = 1100
"""Words in a long prompt: with a full stop every 12 words, about 1,190 tokens by the local server's count."""
SHORT_WORDS = 12
_SENTENCE = 12


@dataclass(frozen=True, slots=True)
class PromptPlan:
    """Which prompt request ``index`` of slice ``slice_no`` sends: the same under every configuration.

    ``long_ratio`` is the share of long prompts; ``distinct`` > 0 draws prompt ids from that many (so repeats
    happen: with temperature 0 in batch mode they are cache hits), 0 gives every request a prompt of its own.
    """

    seed: int = 0
    long_ratio: float = 0.0
    distinct: int = 0
    dataset: Dataset | None = None
    """Take each prompt from this dataset's conversation for the prompt id (never long)."""
    prefix_share: float = 0.0
    """A shared system prompt of this share of each prompt's words (0: none)."""

    def pick(self, slice_no: int, index: int) -> tuple[int, bool]:
        """``(prompt id, long)`` for one request. Pure; never fails."""
        rng = random.Random(f"llmchat-bench:{self.seed}:{slice_no}:{index}")
        long = rng.random() < self.long_ratio
        if self.distinct > 0:
            return rng.randrange(self.distinct), long
        # Unique across slices too, so no two requests of a run share a prompt.
        return slice_no * 1_000_000 + index, long

    def messages(self, slice_no: int, index: int) -> tuple[list[dict[str, str]], bool]:
        """The chat messages of one request and whether its prompt is a long one."""
        if self.dataset is None and not self.prefix_share:
            pid, long = self.pick(slice_no, index)
            return [{"role": "user", "content": prompt_text(self.seed, pid, long=long)}], long
        conversation, long = self.conversation(slice_no, index)
        return opening(conversation), long

    def conversation(self, slice_no: int, index: int) -> tuple[Conversation, bool]:
        """The whole conversation of request ``index`` (one turn for a synthetic prompt), its system prompt
        with the shared prefix in front, and whether its prompt is a long one."""
        pid, long = self.pick(slice_no, index)
        if self.dataset is None:
            found = Conversation("", (prompt_text(self.seed, pid, long=long),))
        else:
            found, long = self.dataset.pick(pid), False
        if not self.prefix_share:
            return found, long
        prefix = shared_prefix(self.seed, math.ceil(self.prefix_share * len(found.turns[0].split())))
        system = "\n\n".join(p for p in (prefix, found.system) if p)
        return Conversation(system, found.turns), long


def opening(conversation: Conversation) -> list[dict[str, str]]:
    """The messages of a conversation's first request: its system prompt, if any, and its first human turn."""
    head = [{"role": "system", "content": conversation.system}] if conversation.system else []
    return [*head, {"role": "user", "content": conversation.turns[0]}]


def shared_prefix(seed: int, words: int) -> str:
    """The first ``words`` words of the run's one shared text (seeded): a shorter prefix is the start of every
    longer one, so requests of different lengths still share their first tokens."""
    if words <= 0:
        return ""
    return " ".join(_prefix_words(seed, 1 << max(10, (words - 1).bit_length()))[:words])


@functools.lru_cache(maxsize=8)
def _prefix_words(seed: int, n: int) -> list[str]:
    # Built in powers of two, so a run's prompts of many lengths share a few cached lists.
    rng = random.Random(f"llmchat-prefix:{seed}")
    out: list[str] = []
    for i in range(n):
        word = rng.choice(_WORDS)
        out.append(word.capitalize() if i % _SENTENCE == 0 else word + ("." if i % _SENTENCE == _SENTENCE - 1 else ""))
    return out


@functools.lru_cache(maxsize=512)
def prompt_text(seed: int, pid: int, *, long: bool) -> str:
    """The text of prompt ``pid``: a one-line question, or with ``long`` a document of LONG_WORDS words and
    the question after it. Deterministic for a given seed; never fails."""
    rng = random.Random(f"llmchat-prompt:{seed}:{pid}:{int(long)}")
    question = f"Request {pid}: " + _sentences(rng, SHORT_WORDS).rstrip(".") + "?"
    if not long:
        return question
    document = _sentences(rng, LONG_WORDS)
    return f"Read this log and answer the question after it.\n\n{document}\n\n{question}"


def _sentences(rng: random.Random, n: int) -> str:
    out: list[str] = []
    for i in range(n):
        word = rng.choice(_WORDS)
        out.append(word.capitalize() if i % _SENTENCE == 0 else word)
        if i % _SENTENCE == _SENTENCE - 1 or i == n - 1:
            out[-1] += "."
    return " ".join(out)
