"""The palette's Screenshot: an SVG of the screen, saved where llmchat keeps its data, and where it went said.

Textual's own Screenshot command saves to the platform's downloads folder (platformdirs'
``user_downloads_path()``, ``~/Downloads``), which a server, a container or a fresh account often does not
have: the write fails and all it says is "Failed to save screenshot". llmchat saves beside its history (the
data folder, ``$XDG_DATA_HOME/llmchat``, made if need be) or, when that cannot be written, in the current
folder, and names the file it wrote.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from textual.app import App

TITLE = "Screenshot"


def screenshot_folders(data_folder: Path) -> list[Path]:
    """Where a screenshot goes, in order: the data folder, then the current folder."""
    return [data_folder, Path.cwd()]


def save_screenshot(app: App[Any], folders: Iterable[Path]) -> Path:
    """Save an SVG of ``app``'s screen in the first of ``folders`` that takes it (the first is made, mode
    0700, when missing); its path. Raises OSError, naming every folder tried, when none does."""
    tried: list[str] = []
    for i, folder in enumerate(folders):
        try:
            if i == 0:
                folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            saved = Path(app.save_screenshot(path=os.fspath(folder)))
            saved.chmod(0o600)  # the screen shows the conversation: as private as the history beside it
            return saved
        except OSError as exc:
            tried.append(f"{folder} ({exc.__class__.__name__}: {exc.strerror or exc})")
    raise OSError(f"cannot save a screenshot in {' or '.join(tried)}; make one of them writable")
