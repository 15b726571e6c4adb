"""Path completion for the attach box: the rest of the first name in the folder that starts as typed."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from textual.suggester import Suggester


def complete_path(value: str) -> str | None:
    """``value`` completed to the first entry (in name order, hidden ones only when asked for with a dot)
    of its folder that starts with what follows the last ``/``; a folder gets its ``/``. None for no match."""
    folder_text, _, partial = value.rpartition("/")
    folder = Path(os.path.expanduser(folder_text + "/" if folder_text or value.startswith("/") else "."))
    try:
        names = sorted(e.name for e in os.scandir(folder) if e.name.startswith(partial)
                       and (partial.startswith(".") or not e.name.startswith(".")))
    except OSError:
        return None
    for name in names:
        if name == partial and not (folder / name).is_dir():
            continue
        suffix = "/" if (folder / name).is_dir() else ""
        done = (folder_text + "/" if folder_text or value.startswith("/") else "") + name + suffix
        if done != value:
            return done
    return None


class PathSuggester(Suggester):
    """Suggests :func:`complete_path` of what is typed (read off the event loop; never cached: files come
    and go)."""

    def __init__(self) -> None:
        super().__init__(use_cache=False, case_sensitive=True)

    async def get_suggestion(self, value: str) -> str | None:
        if not value:
            return None
        return await asyncio.to_thread(complete_path, value)
