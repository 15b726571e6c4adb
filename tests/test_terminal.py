"""The real-terminal harness itself (tests/terminal.py, tests/emulator.py): what the journeys rely on.

Each claim the journeys build on is checked here against a tiny program in the pseudo-terminal rather than the
app: a write arrives in one read, the window has the size asked for, a wait fails with the screen, closing
ends the whole process group, and the screen lays text out and releases frames as a terminal would.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pyte
import pytest
from emulator import SYNC_END, SYNC_START, AppScreen, Frames
from rich.cells import cell_len
from terminal import Terminal, TerminalSession, group_alive, isolated_env

# Reports each read of its stdin as repr() on a line of its own, in raw mode, as the app's input thread reads.
ECHO_READS = """
import os, sys, termios, tty
print(os.get_terminal_size(), os.environ["TERM"], flush=True)
tty.setraw(0)
while True:
    data = os.read(0, 4096)
    sys.stdout.write(repr(data) + "\\r\\n"); sys.stdout.flush()
    if data == b"q":
        break
"""


def python(tmp_path: Path, source: str, cols: int = 80, rows: int = 24) -> Terminal:
    return Terminal([sys.executable, "-c", source], env=isolated_env(tmp_path), cwd=tmp_path,
                    cols=cols, rows=rows)


def test_each_write_arrives_in_one_read_in_a_window_of_the_size_asked_for(tmp_path: Path) -> None:
    with python(tmp_path, ECHO_READS, cols=160, rows=45) as t:
        t.wait_for("xterm-256color", 10)
        assert "columns=160, lines=45" in t.screen_text(), t.dump()
        t.write("Explain why HTTP/2 multiplexing helps a chat client\r")
        t.wait_for("b'Explain why HTTP/2 multiplexing helps a chat client\\r'", 10)
        t.paste("two\nlines", then="\r")
        t.wait_for("b'\\x1b[200~two\\nlines\\x1b[201~\\r'", 10)
        for key, read in [("esc", "b'\\x1b'"), ("ctrl+b", "b'\\x02'"), ("f5", "b'\\x1b[15~'")]:
            t.press(key)  # writes typed faster than the program reads would share a read, as in any terminal
            t.wait_for(read, 10)
        t.write("q")
        assert t.wait_exit(10) == 0


def test_a_wait_fails_with_the_last_screen_on_timeout_and_when_the_program_ends(tmp_path: Path) -> None:
    t = python(tmp_path, "import time; print('on screen', flush=True); time.sleep(30)").start()
    t.wait_for("on screen", 10)
    with pytest.raises(AssertionError, match=r"(?s)waited 0.2 s for 'not on screen'.*running.*on screen"):
        t.wait_for("not on screen", 0.2)
    t.close(quit_s=0)
    with python(tmp_path, "print('bye')") as t:
        started = time.monotonic()
        with pytest.raises(AssertionError, match=r"(?s)ended while waiting.*exited with status 0.*bye"):
            t.wait_for("never", 10)
        assert time.monotonic() - started < 5  # it did not wait out the timeout


def test_close_kills_and_reaps_a_program_that_ignores_quit_and_its_children(tmp_path: Path) -> None:
    # Ctrl+Q reaches a program in cooked mode as XON: ignored, as by an app that hangs.
    source = ("import subprocess, time; subprocess.Popen(['sleep', '60']); print('ready', flush=True); "
              "time.sleep(60)")
    t = python(tmp_path, source).start()
    t.wait_for("ready", 10)
    assert t.process is not None
    pgid = t.process.pid
    assert t.close(quit_s=0.2) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while group_alive(pgid):  # the sleep too, once init has reaped it
        assert time.monotonic() < deadline, f"process group {pgid} outlived close() by 10 s"
        time.sleep(0.02)
    assert t.close() == -signal.SIGKILL  # closing twice is fine


def test_a_session_isolates_the_app_from_the_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-for-children")
    monkeypatch.setenv("LLMCHAT_CONFIG", "/nonexistent.toml")
    session = TerminalSession(tmp_path)
    assert not any(k.startswith(("OPENAI_", "LLMCHAT_")) for k in session.env)
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME", "HOME"):
        assert Path(session.env[var]).is_relative_to(tmp_path)
    assert session.history_path.is_relative_to(tmp_path / "xdg_data_home")
    assert session.write_config("x = 1\n").is_relative_to(tmp_path / "xdg_config_home")


def test_the_screen_lays_out_grapheme_clusters_as_wide_as_the_app_measures_them() -> None:
    screen = AppScreen(40, 3)
    stream = pyte.Stream(screen)
    text = "a 👩\u200d💻 b 🇫🇷 c e\u0301 日"
    stream.feed(text + "|\r\n\u200dafter a stray joiner")
    assert screen.display[0].rstrip() == "a 👩\u200d💻 b 🇫🇷 c é 日|"
    assert screen.buffer[0][cell_len(text)].data == "|"  # the cell the app put it in
    assert screen.display[1].rstrip() == "after a stray joiner"  # plain pyte drops the rest of the run


def test_frames_are_released_whole_and_the_sync_query_is_answered() -> None:
    frames = Frames()
    assert frames.push(b"before\x1b[?2026$p\x1b[?20") == (b"before", b"\x1b[?2026;2$y")
    assert frames.push(b"26hhalf a frame") == (b"", b"")  # the marker completed; the frame not yet
    show, _ = frames.push(b" and the rest" + SYNC_END + b"between" + SYNC_START + b"next")
    assert show == SYNC_START + b"half a frame and the rest" + SYNC_END + b"between"
    assert frames.push(b"\x1b[<u") == (b"", b"")  # still inside "next", and pyte's misread sequence dropped
    assert frames.flush() == SYNC_START + b"next"
