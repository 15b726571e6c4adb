"""Journeys with a reasoning model, in a real pseudo-terminal (tests/terminal.py): the installed `llmchat`
against `llmchat serve --reasoning-tokens` (think, then answer, with timings) and `--tool-call`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from terminal import TerminalSession
from test_journeys import (
    HUD_EDGE,
    REPLY_S,
    STEP_S,
    _serve,
    chat_column,
    quit_app,
    replies_ended,
    start_ready,
    type_prompt,
    wait_stored,
)

from llmchat.core.server._subprocess import SubprocessServer


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SubprocessServer]:
    """Thinks for 45 tokens at 30 tokens/s (about 1.5 s) in reasoning_content, then answers 20 tokens."""
    with _serve(tmp_path_factory, ["--ttft-ms", "100", "--tokens-per-s", "30", "--reasoning-tokens", "45"],
                LLMCHAT_SERVER__DEFAULT_MAX_TOKENS="20") as server:
        yield server


@pytest.fixture(scope="module")
def caller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SubprocessServer]:
    """Thinks inline (<think>) for a moment, then answers with a tool call."""
    with _serve(tmp_path_factory, ["--profile", "instant", "--reasoning-tokens", "6", "--reasoning-inline",
                                   "--tool-call"]) as server:
        yield server


def _chat(screen: str) -> str:
    return "\n".join(chat_column(screen))


def _hud(screen: str) -> str:
    return "\n".join(line.partition(HUD_EDGE)[2] for line in screen.splitlines())


def test_the_model_thinks_then_answers_and_the_screen_says_how_long(
    terminals: TerminalSession, thinker: SubprocessServer
) -> None:
    t = start_ready(terminals, "--base-url", thinker.base_url)
    type_prompt(t, "Why is the sky blue?")
    t.wait_for(lambda s: "▾ thinking…" in _chat(s), REPLY_S, what="the thinking streaming")
    screen = t.wait_for(lambda s: "▸ thought for" in _chat(s) and "You asked" in _chat(s), REPLY_S,
                        what="the thinking folded once the answer began")
    reply = wait_stored(t, terminals.history_path, replies_ended(1), "the reply saved")[1]
    assert reply.record is not None and reply.record["thinking_ms"] > 1000, reply.record
    thought = reply.record["thinking_ms"]
    # The note under the reply, the HUD's waterfall header (clipped to the panel) and its attribution note.
    screen = t.wait_for(lambda s: f"thought {thought:.0f} ms" in _chat(s) and s.count(f"thought {thought:.0f}")
                        >= 2 and "to first token" in _hud(s), STEP_S, what="the note and the HUD saying it")
    assert f"· thought {thought:.0f}" in _hud(screen), t.dump()
    assert f"▸ thought for {thought:.0f} ms · Ctrl+T shows it" in _chat(screen), t.dump()
    assert reply.record["ttft_ms"] == pytest.approx(reply.record["first_reasoning_ms"] + thought, abs=0.01)
    t.press("ctrl+t")
    t.wait_for(lambda s: f"▾ thought for {thought:.0f} ms · Ctrl+T hides it" in _chat(s), STEP_S,
               what="Ctrl+T opening the thinking")
    quit_app(t)


def test_a_tool_call_shows_as_a_card_and_after_continue(
    terminals: TerminalSession, caller: SubprocessServer
) -> None:
    t = start_ready(terminals, "--base-url", caller.base_url)
    type_prompt(t, "Weather in Lisbon?")
    wait_stored(t, terminals.history_path, replies_ended(1), "the reply saved")
    t.wait_for(lambda s: "⚙ tool call get_weather (call_" in _chat(s) and '"location": "Weather in Lisbon?"'
               in _chat(s), STEP_S, what="the tool-call card")
    quit_app(t)
    t = start_ready(terminals, "--continue", "--base-url", caller.base_url)
    t.wait_for(lambda s: "⚙ tool call get_weather" in _chat(s) and "▸ thought for" in _chat(s), STEP_S,
               what="the card and the folded thinking after --continue")
    quit_app(t)
