"""Where exports are written and how: a folder of their own, private files, and never over an existing one.

Synchronous file work: the chat app runs it in a thread (the event loop never waits on the disk).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from llmchat.core.errors import LLMChatError
from llmchat.core.history._file import default_history_path

#: The most numbered names tried (``llmchat-3 (2).md`` ... ) before giving up on a folder.
MAX_COPIES = 1000


class ExportError(LLMChatError):
    """An export could not be written: one line naming the file or folder, the cause and the fix."""


def export_folder(configured: str = "", env: Mapping[str, str] | None = None) -> Path:
    """The folder exports go to: ``configured`` (``~`` expanded) when set, else ``exports/`` beside the
    history, ``$XDG_DATA_HOME/llmchat/exports`` (``~/.local/share/llmchat/exports``). Pure: touches no file.

    A fixed folder rather than the one llmchat was started from: an app started from anywhere would leave
    conversations wherever that was, and they are as private as the history they come from.
    """
    env = os.environ if env is None else env
    if configured:
        if configured == "~" or configured.startswith("~/"):
            home = env.get("HOME") or str(Path.home())
            return Path(home) / configured[2:]
        return Path(configured)
    return default_history_path(env).parent / "exports"


def write_private(path: Path, text: str, *, exclusive: bool = False) -> None:
    """Writes ``text`` (UTF-8) to ``path``, readable by its owner only (a conversation is private).

    ``exclusive``: FileExistsError when ``path`` exists, which is then left as it was. Otherwise replaces it.
    Raises OSError when the file cannot be written.
    """
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    # O_CREAT's mode does not apply to a file that already existed.
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)


def numbered(folder: Path, stem: str, suffix: str, n: int) -> Path:
    """The ``n``-th name for an export: ``stem.suffix`` first, then ``stem (2).suffix``, ``stem (3).suffix``
    and so on."""
    return folder / (f"{stem}{suffix}" if n == 1 else f"{stem} ({n}){suffix}")


def save_export(folder: Path, stem: str, suffix: str, text: str) -> Path:
    """Writes ``text`` to a new file in ``folder`` and returns its path: ``stem + suffix`` when that name is
    free, else the first free ``stem (N) + suffix``; an existing file is never touched. Makes the folder
    (0700) when missing; the file is 0600.

    Raises ExportError (one line: where, why, the fix) when the folder or the file cannot be written.
    """
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        for n in range(1, MAX_COPIES + 1):
            path = numbered(folder, stem, suffix, n)
            try:
                write_private(path, text, exclusive=True)
            except FileExistsError:
                continue
            return path
    except OSError as exc:
        raise ExportError(f"cannot write the export in {folder}: {exc.strerror or exc}; set [ui] export_dir "
                          "to a folder you can write to") from None
    raise ExportError(f"cannot write the export in {folder}: {stem}{suffix} and {MAX_COPIES - 1} numbered "
                      "copies exist already; move some away or set [ui] export_dir to another folder")
