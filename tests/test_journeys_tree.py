"""Regenerate then switch, edit a prompt into a branch, search and open a hit: through the installed `llmchat`
in a real pseudo-terminal (tests/terminal.py), keys written as a terminal sends them, the history file read
straight from SQLite."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from terminal import TerminalSession
from test_journeys import (
    REPLY_S,
    STEP_S,
    quick,
    quit_app,
    replies_ended,
    start_with,
    type_prompt,
    wait_stored,
)

from llmchat.core.server._subprocess import SubprocessServer

__all__ = ["quick"]  # the module's server fixture, used here

CTRL_R, CTRL_F, F9 = "\x12", "\x06", "\x1b[20~"
ALT_LEFT, ALT_UP = "\x1b[1;3D", "\x1b[1;3A"


def rows(path: Path) -> list[tuple[int, str, str, int | None]]:
    with closing(sqlite3.connect(path.as_uri() + "?mode=ro", uri=True, timeout=5)) as db:
        return db.execute("SELECT id, role, content, parent_id FROM messages ORDER BY id").fetchall()


def leaf(path: Path) -> int:
    with closing(sqlite3.connect(path.as_uri() + "?mode=ro", uri=True, timeout=5)) as db:
        return int(db.execute("SELECT leaf_id FROM conversations").fetchone()[0])


def test_regenerate_then_switch_back(terminals: TerminalSession, quick: SubprocessServer) -> None:
    t = start_with(terminals, quick)
    type_prompt(t, "Name a colour")
    wait_stored(t, terminals.history_path, replies_ended(1), "the first reply")
    t.write(CTRL_R)
    t.wait_for("‹ 2/2 ›", REPLY_S, what="the regenerated reply marked 2/2")
    wait_stored(t, terminals.history_path, lambda m: sum(x.role == "assistant" and x.status == "done"
                                                          for x in m) == 2, "the second reply saved")
    (q, _, _, _), (first, _, _, p1), (second, _, _, p2) = rows(terminals.history_path)
    assert p1 == p2 == q and leaf(terminals.history_path) == second
    t.write(ALT_LEFT)
    t.wait_for("‹ 1/2 ›", STEP_S, what="the first reply shown again")
    t.wait_for(lambda _s: leaf(terminals.history_path) == first, STEP_S, what="the first reply's branch saved")
    # Alt+Up twice from the reply selected by the switch: the prompt; F3 copies it.
    t.write(ALT_UP)
    t.write(ALT_UP)
    t.press("f3")
    t.wait_for("selected prompt copied", STEP_S, what="the selected prompt copied")
    quit_app(t)


def test_edit_a_prompt_and_branch(terminals: TerminalSession, quick: SubprocessServer) -> None:
    t = start_with(terminals, quick)
    type_prompt(t, "Say ping")
    wait_stored(t, terminals.history_path, replies_ended(1), "the first reply")
    t.write(F9)
    t.wait_for("editing this prompt", STEP_S, what="the edit notice")
    t.write(" and pong\r")  # the edited text, then Enter, in one read
    t.wait_for("‹ 2/2 ›", REPLY_S, what="the edited prompt marked 2/2")
    wait_stored(t, terminals.history_path, lambda m: sum(x.role == "assistant" and x.status == "done"
                                                          for x in m) == 2, "the branch's reply saved")
    (ping, _, _, p1), (_, _, _, _), (pong, _, text, p2), _ = rows(terminals.history_path)
    assert text == "Say ping and pong" and p1 is None and p2 is None  # two roots: the first was edited
    assert "Say ping and pong" in t.screen_text(), t.dump()
    quit_app(t)


def test_search_and_open_a_hit(terminals: TerminalSession, quick: SubprocessServer) -> None:
    t = start_with(terminals, quick)
    type_prompt(t, "Where is the kettle")
    wait_stored(t, terminals.history_path, replies_ended(1), "the reply")
    t.press("ctrl+n")
    t.wait_for("new conversation", STEP_S, what="a new conversation")
    t.write(CTRL_F)
    t.wait_for("type to search", STEP_S, what="the search screen")
    t.write("kettle")
    t.wait_for("2 hits", STEP_S, what="the prompt and the reply that echoes it")
    t.press("enter")
    t.wait_for(lambda s: "Where is the kettle" in s and "type to search" not in s, STEP_S,
               what="the conversation opened at the hit")
    quit_app(t)
