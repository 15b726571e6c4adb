"""Journeys in a real pseudo-terminal (tests/terminal.py): a conversation that outgrows a small context
window goes on, the screen saying what was left out; a file attached with Ctrl+L and its path completion.

The server is `llmchat serve` as a child process with a 300-token window that it enforces as vLLM does, so
a request the app did not fit fails there.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from terminal import Terminal, TerminalSession
from test_journeys import (
    PLACEHOLDER,
    REPLY_S,
    START_S,
    STEP_S,
    _serve,
    replies_ended,
    type_prompt,
    wait_stored,
)

from llmchat.core.server._subprocess import SubprocessServer

WINDOW = 300


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SubprocessServer]:
    with _serve(tmp_path_factory, ["--profile", "instant", "--context-window", str(WINDOW)]) as server:
        yield server


def _start(terminals: TerminalSession, server: SubprocessServer) -> Terminal:
    terminals.write_config(f'[providers.local]\nbase_url = "{server.base_url}"\nhttp = {{ http2 = "h2c" }}\n'
                           "[ui]\nmax_tokens = 24\n")
    # Tall enough for the HUD's context lines, which come after its figures.
    t = terminals.start(rows=60)
    t.wait_for(lambda s: "⏎ Send" in s and PLACEHOLDER in s, START_S, what="the app ready for a prompt")
    return t


def test_a_conversation_past_a_small_window_goes_on_and_the_screen_says_what_was_left_out(
    terminals: TerminalSession, small: SubprocessServer
) -> None:
    t = _start(terminals, small)
    for i in range(9):
        type_prompt(t, f"question {i} about the latency of a long chat")
        messages = wait_stored(t, terminals.history_path, replies_ended(i + 1), f"reply {i}")
    replies = [m for m in messages if m.role == "assistant"]
    assert [m.status for m in replies] == ["done"] * 9  # the server refuses any request past its window
    last = replies[-1].record
    assert last is not None and last["prompt_tokens"] <= WINDOW - 24
    context = f"prompt {last['prompt_tokens']} / {WINDOW} tok · "
    t.wait_for(lambda s: context in s and " turns out" in s, STEP_S, what="the HUD's context lines")


def test_a_file_attached_with_ctrl_l_and_path_completion_goes_in_as_a_fenced_block(
    terminals: TerminalSession, small: SubprocessServer, tmp_path: Path
) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "release-notes.txt").write_text("faster first tokens\n", encoding="utf-8")
    t = _start(terminals, small)
    t.press("ctrl+l")
    t.wait_for("Attach a file", STEP_S, what="the attach box")
    t.write(f"{folder}/rel")
    t.wait_for("release-notes.txt", STEP_S, what="the completion suggested")
    t.press("right")
    t.press("enter")
    t.wait_for(lambda s: "Attach a file" not in s and "/file " in s, STEP_S,
               what="the /file line in the prompt")
    t.write("what changed?")
    t.wait_for("what changed?", STEP_S, what="the question typed")
    t.press("enter")
    messages = wait_stored(t, terminals.history_path, replies_ended(1), "the reply", REPLY_S)
    user = messages[0]
    assert user.content == (f"what changed?\n\n`{folder}/release-notes.txt`:\n```txt\nfaster first tokens\n```")
    assert messages[1].status == "done"
