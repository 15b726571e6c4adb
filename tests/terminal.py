"""Test-only: the installed ``llmchat`` console script in a pseudo-terminal, its screen read by pyte.

Textual's Pilot hands the app one key at a time and lets each be processed before the next; a terminal does
not. It delivers what was typed in one ``read``: a whole prompt and its Enter, a bracketed paste and the Enter
after it, keys typed while a reply streams. ``Terminal`` writes input the way a terminal delivers it (each
``write`` is one ``os.write`` on the pty's master side, so the app reads it in one go) and keeps a pyte screen
of everything the app drew, fed by a reader thread frame by frame (tests/emulator.py), so a wait never sees
half of a frame.

Everything is bounded: every wait has a deadline, and ``close`` always reaps the child and everything it
started (the app runs in a session of its own, so its process group holds the local server it may start).
A wait that times out raises AssertionError with the last screen in its message.
"""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import pyte
from emulator import AppScreen, Frames
from processes import reap

from llmchat.core.config._load import default_config_path
from llmchat.core.history._store import default_history_path

#: What xterm sends for the keys the journeys press (legacy encodings: Textual asks for the kitty keyboard
#: protocol, and a terminal that does not answer keeps sending these).
KEYS: dict[str, str] = {
    "enter": "\r",
    "esc": "\x1b",
    "tab": "\t",
    "backspace": "\x7f",
    "up": "\x1b[A",
    "down": "\x1b[B",
    "right": "\x1b[C",
    "left": "\x1b[D",
    "pageup": "\x1b[5~",
    "pagedown": "\x1b[6~",
    "f1": "\x1bOP",
    "f2": "\x1bOQ",
    "f3": "\x1bOR",
    "f4": "\x1bOS",
    "f5": "\x1b[15~",
    "f6": "\x1b[17~",
    "f7": "\x1b[18~",
    "f8": "\x1b[19~",
    "f9": "\x1b[20~",
    "f10": "\x1b[21~",
    "f11": "\x1b[23~",
    "f12": "\x1b[24~",
    **{f"ctrl+{c}": chr(ord(c) - ord("a") + 1) for c in "abcdefghijklmnopqrstuvwxyz"},
}

PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"

#: How often a wait re-checks a condition the screen does not show (a row in the history file), when no
#: new output woke it first.
POLL_S = 0.05
#: How long ``close`` lets the app quit on its own (it stops the local server it started) before killing.
QUIT_S = 10.0

Condition = str | Callable[[str], object]


def console_script(name: str = "llmchat") -> Path:
    """The installed console script beside this interpreter (the venv's ``bin/llmchat``)."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise RuntimeError(f"{path} is not installed: pip install -e . in this venv")
    return path


def group_alive(pgid: int) -> bool:
    """Some process of process group ``pgid`` still exists (a killed one counts until it has been reaped)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def isolated_env(root: Path, **extra: str) -> dict[str, str]:
    """An environment for the child: the XDG folders (config, data, cache, state) and HOME under ``root``,
    TERM=xterm-256color and ``extra``; none of the parent's OPENAI_*, LLMCHAT_*, XDG_* or TEXTUAL_*."""
    # TEXTUAL_* (a headless driver, debug mode) and a size or colour set for pytest's own terminal would
    # change how the app runs; the pty says what size it is.
    dropped = ("OPENAI_", "LLMCHAT_", "XDG_", "TEXTUAL_")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(dropped) and k not in ("COLUMNS", "LINES", "COLORTERM")}
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
        folder = root / var.lower()
        folder.mkdir(parents=True, exist_ok=True)
        env[var] = str(folder)
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    env.update(HOME=str(home), TERM="xterm-256color", **extra)
    return env


class Terminal:
    """``argv`` running in a ``cols`` x ``rows`` pseudo-terminal; use as a context manager.

    ``write`` and the helpers built on it send input in one write each; ``screen_text`` is what the screen
    shows now; ``wait_for`` waits (bounded) for text or a condition on it; ``wait_exit`` for the process
    to end. ``close`` (also on leaving the ``with``) quits or kills the process and everything it started.
    """

    def __init__(self, argv: Sequence[str | os.PathLike[str]], *, env: Mapping[str, str], cwd: Path,
                 cols: int = 160, rows: int = 45) -> None:
        self.argv = [os.fspath(a) for a in argv]
        self.env = dict(env)
        self.cwd = cwd
        self.cols, self.rows = cols, rows
        self._screen = AppScreen(cols, rows)
        self._stream = pyte.ByteStream(self._screen)
        self._changed = threading.Condition()
        self._frames = Frames()
        self._reader_error: BaseException | None = None
        self._master = -1
        self.process: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> Terminal:
        master, slave = os.openpty()
        # The size the app reads at start (TIOCGWINSZ on its stdout): rows, cols, then pixels (unknown).
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", self.rows, self.cols, 0, 0))
        try:
            # A session of its own: nothing pytest's terminal does reaches it, and its process group holds
            # every process it starts (the offline default's local server), so close() can end them all.
            self.process = subprocess.Popen(self.argv, stdin=slave, stdout=slave, stderr=slave, env=self.env,
                                            cwd=self.cwd, start_new_session=True)
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)  # the child holds it now; EOF (EIO) on the master once the child is gone
        self._master = master
        self._reader = threading.Thread(target=self._read, name="terminal-reader", daemon=True)
        self._reader.start()
        return self

    def close(self, quit_s: float = QUIT_S) -> int | None:
        """Ask the app to quit (Ctrl+Q) and give it ``quit_s``; then kill its process group; reap it; stop the
        reader. Returns the exit status (negative for a signal), or None if it was never started.
        """
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            try:
                self.write(KEYS["ctrl+q"])
                process.wait(quit_s)
            except (OSError, subprocess.TimeoutExpired):
                pass
        # Whatever is left of its process group: the app if it did not quit, a child it had no time to stop.
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        reap(process, QUIT_S)
        if self._reader is not None:
            self._reader.join(QUIT_S)
        if self._master >= 0:
            os.close(self._master)
            self._master = -1
        return process.returncode

    def __enter__(self) -> Terminal:
        return self.start() if self.process is None else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _read(self) -> None:
        try:
            while True:
                try:
                    data = os.read(self._master, 65536)
                except OSError:  # EIO: every holder of the slave side has closed it
                    data = b""
                show, answer = self._frames.push(data) if data else (self._frames.flush(), b"")
                if answer:
                    self.write(answer)
                with self._changed:
                    if show:
                        self._stream.feed(show)
                    self._changed.notify_all()
                if not data:
                    return
        except BaseException as exc:  # reported by the next wait, not lost in a thread
            self._reader_error = exc
            with self._changed:
                self._changed.notify_all()

    # -- input -----------------------------------------------------------------------------------------------
    def write(self, data: str | bytes) -> None:
        """Send ``data`` as one write, as a terminal delivers a burst (a few KiB fit one pty read)."""
        raw = data.encode() if isinstance(data, str) else data
        while raw:
            raw = raw[os.write(self._master, raw):]

    def press(self, *keys: str) -> None:
        """Send each named key (``KEYS``: "esc", "enter", "ctrl+b", "f2" ...) as its own write."""
        for key in keys:
            self.write(KEYS[key])

    def paste(self, text: str, *, then: str = "") -> None:
        """A bracketed paste of ``text``, followed by ``then`` (e.g. ``"\\r"``) in the same write."""
        self.write(PASTE_START + text + PASTE_END + then)

    # -- output ----------------------------------------------------------------------------------------------
    def lines(self) -> list[str]:
        """The screen now, one string per row (wide characters take one string position, two cells)."""
        with self._changed:
            return [line.rstrip() for line in self._screen.display]

    def screen_text(self) -> str:
        return "\n".join(self.lines())

    def dump(self) -> str:
        """The screen and the process's state, for a failure message."""
        status = "running" if self.process is not None and self.process.poll() is None else (
            f"exited with status {self.process.returncode}" if self.process is not None else "not started")
        rule = "-" * self.cols
        return f"{' '.join(self.argv)} ({status}), last screen:\n{rule}\n{self.screen_text()}\n{rule}"

    def wait_for(self, condition: Condition, timeout: float = 10.0, *, what: str = "") -> str:
        """Wait until the screen shows ``condition`` (a str) or ``condition(screen_text)`` is truthy.

        Re-checks after every output and every ``POLL_S`` (for conditions that read something else, such as
        the history file). Returns the screen text that satisfied it. Raises AssertionError, with the last
        screen, on timeout or when the process exits first.
        """
        check = (lambda text: condition in text) if isinstance(condition, str) else condition
        label = what or (repr(condition) if isinstance(condition, str) else "the condition")
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen_text()
            if check(text):
                return text
            if self._reader_error is not None:
                raise AssertionError(f"the terminal reader failed: {self._reader_error!r}\n{self.dump()}")
            if self.process is not None and self.process.poll() is not None and self._reader_done():
                raise AssertionError(f"the program ended while waiting for {label}\n{self.dump()}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"waited {timeout:g} s for {label}\n{self.dump()}")
            with self._changed:
                self._changed.wait(min(left, POLL_S))

    def wait_exit(self, timeout: float = QUIT_S) -> int:
        """Wait for the process to end and its last output to be read; its exit status. AssertionError with
        the last screen if it is still running after ``timeout`` s."""
        assert self.process is not None
        try:
            status = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout:g} s\n{self.dump()}") from None
        if self._reader is not None:
            self._reader.join(timeout)
        return status

    def _reader_done(self) -> bool:
        return self._reader is None or not self._reader.is_alive()


class TerminalSession:
    """The terminals of one test. Each runs the installed ``llmchat`` with its own arguments, all in the same
    isolated folders under ``root`` (see ``isolated_env``), so a second run sees what the first one saved.
    ``close`` closes every terminal still open."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = isolated_env(root)
        self._terminals: list[Terminal] = []

    @property
    def history_path(self) -> Path:
        """The SQLite file the app keeps conversations in (under the isolated XDG_DATA_HOME)."""
        return default_history_path(self.env)

    @property
    def cache_folder(self) -> Path:
        """The reply cache's default folder (under the isolated XDG_CACHE_HOME)."""
        return Path(self.env["XDG_CACHE_HOME"]) / "llmchat"

    def write_config(self, text: str) -> Path:
        """Write the config file the app reads by default (under the isolated XDG_CONFIG_HOME)."""
        path = default_config_path(self.env)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return path

    def start(self, *args: str, cols: int = 160, rows: int = 45,
              env: Mapping[str, str] | None = None) -> Terminal:
        """``llmchat *args`` in a new ``cols`` x ``rows`` terminal, started; ``env`` adds variables."""
        terminal = Terminal([console_script(), *args], env={**self.env, **(env or {})}, cwd=self.root,
                            cols=cols, rows=rows)
        self._terminals.append(terminal)
        return terminal.start()

    def close(self) -> None:
        for terminal in self._terminals:
            terminal.close()
