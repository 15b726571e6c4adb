"""llama.cpp's llama-server, for real (issue 21): the client's rate agrees with llama's own, attribution's
parts add up without negative time, and a long run of short turns on its small window is never refused.

Marker ``realpeer`` (left out of the normal run). Fixture ``llama_server`` (tests/realpeer/conftest.py):
llama-server with a tiny model on 127.0.0.1, ``.base_url`` (root + ``/v1``), ``.root``, ``.model`` and
``.n_ctx``, its context window (512 by default). Over loopback it often delivers a whole reply in one or two
reads: before the fix, tokens/s read 18,000-107,000 where its ``timings`` said about 1,600.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from llamacpp import LlamaServer

from llmchat.core import ChatClient, HTTPStatusError, attribute
from llmchat.core.client import MESSAGE_TOKENS, ContextBudget
from llmchat.core.observe._attribution import format_shares, is_routine_overlap, shown_groups

pytestmark = pytest.mark.realpeer

PROMPT = [{"role": "user", "content": "Count from one to forty in words, separated by commas."}]


@pytest.fixture
def llama(llama_server: LlamaServer) -> LlamaServer:
    return llama_server


def _client(server: Any) -> ChatClient:
    return ChatClient(base_url=server.base_url, model=server.model, use_cache=False)


async def _stream(client: ChatClient, messages: Sequence[Mapping[str, Any]], max_tokens: int) -> Any:
    stream = client.stream(messages, max_tokens=max_tokens, temperature=0)
    async with stream:
        _ = [p async for p in stream]
    return stream


async def test_tokens_per_s_is_within_2x_of_llamas_own_predicted_per_second(llama: Any) -> None:
    async with _client(llama) as client:
        for _ in range(3):  # every one of a few: the bunching varies from reply to reply
            record = (await _stream(client, PROMPT, 64)).record
            timings = record.server_reported
            assert timings is not None and timings.get("predicted_per_second"), "llama-server sends timings"
            own = timings["predicted_per_second"]
            assert record.output_tokens >= 8 and record.tokens_per_s is not None
            assert own / 2 <= record.tokens_per_s <= own * 2, (record.tokens_per_s, own, record.rate_source)


async def test_attributions_unexplained_share_is_not_negative(llama: Any) -> None:
    # Before the fix one span was counted twice: "unexplained -7 %" to "-22 %" against this server. What may
    # remain is the routine overlap of a fraction of a millisecond (the client decoding chunk k while the
    # server generates k+1, and clocks), which the HUD folds into the server's figure: never more.
    async with _client(llama) as client:
        for _ in range(5):
            record = (await _stream(client, PROMPT, 64)).record
            a = attribute(record)
            assert a.reporter == "llama.cpp"
            assert sum(p.ms for p in a.parts) == pytest.approx(a.total_ms, abs=0.01)
            overlap = -min(0.0, a.ms("unexplained"))
            assert is_routine_overlap(overlap, a.group_ms().get("server", 0.0)), (a.to_dict(), record.bunched)
            assert shown_groups(a).get("unexplained", 0.0) >= 0.0
            assert "unexplained -" not in format_shares(a), format_shares(a)  # what ask --stats prints


async def test_twelve_short_turns_with_the_fitting_are_never_refused(llama: Any) -> None:
    async with _client(llama) as client:
        budget = ContextBudget(client)
        history: list[dict[str, Any]] = [{"role": "system", "content": "You answer in one short sentence."}]
        fits = []
        for i in range(12):
            history.append({"role": "user", "content": f"Name one animal that starts with letter {chr(65 + i)}."})
            fit = await budget.fit(history, max_tokens=32)
            fits.append(fit)
            try:
                stream = await _stream(client, fit.messages, 32)
            except HTTPStatusError as exc:  # the defect: a 400 for the context size
                pytest.fail(f"turn {i + 1} was refused: {exc}")
            history.append({"role": "assistant", "content": stream.text})
    # The window is llama's running one (/props), not the model's training window.
    assert fits[0].window == llama.n_ctx and fits[0].window_source == "server"
    # Its chat template costs more than 4 tokens a message, and the replies' usage taught that.
    assert budget.framing(client.model) > MESSAGE_TOKENS
