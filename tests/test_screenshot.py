"""The palette's Screenshot saves an SVG beside the history (or in the current folder) and says where."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from textual.pilot import Pilot

from llmchat.core import CacheSettings, ChatClient, HttpSettings, Settings
from llmchat.core.history._store import HistoryStore
from llmchat.core.server import RunningServer
from llmchat.tui.app import ChatApp, make_app
from llmchat.tui.screenshot import save_screenshot

WAIT_S = 10.0


def _app(server: RunningServer, tmp_path: Path, data: Path) -> ChatApp:
    settings = replace(Settings(), cache=CacheSettings(path=str(tmp_path / "cache")),
                       http=replace(HttpSettings(), warmup=False))
    client = ChatClient(settings, base_url=server.base_url, model="llmchat-local", http2="h2c")
    return make_app(settings=settings, client=client, store=HistoryStore(data / "history.sqlite3"))


async def until(pilot: Pilot[None], condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await pilot.pause(0.05)


def said(app: ChatApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def test_the_palettes_screenshot_saves_in_the_data_folder_and_says_where(
    local_server: RunningServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No downloads folder, as on a server or in a container: where Textual's own command fails.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    data = tmp_path / "data" / "llmchat"
    app = _app(local_server, tmp_path, data)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("ctrl+p")
        await pilot.pause()
        for key in "Screenshot":
            await pilot.press(key)
        await pilot.pause(0.3)
        await pilot.press("enter")
        await until(pilot, lambda: any(data.glob("*.svg")), "the screenshot file")
        [shot] = data.glob("*.svg")
        assert shot.read_text(encoding="utf-8").startswith("<svg")
        assert shot.stat().st_mode & 0o777 == 0o600
        await until(pilot, lambda: any(str(shot) in m for m in said(app)), "the notification naming it")
        assert not any("Failed" in m for m in said(app))


async def test_an_unwritable_data_folder_falls_back_to_the_current_one(
    local_server: RunningServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder", encoding="utf-8")
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    app = _app(local_server, tmp_path, tmp_path / "data")
    async with app.run_test(size=(100, 30)):
        saved = save_screenshot(app, [blocked / "llmchat", here])
        assert saved.parent == here and saved.is_file()
        with pytest.raises(OSError) as caught:
            save_screenshot(app, [blocked / "llmchat"])
    message = str(caught.value)
    assert str(blocked / "llmchat") in message and "make one of them writable" in message
    assert "\n" not in message
