"""The main screen as an SVG snapshot: a finished conversation on the left, the HUD on the right fed fixed
records. No request is made (warm-up off, a fixed address), so no clock or port reaches the picture. Update
with ``pytest tests/test_app_snapshot.py --snapshot-update`` and look at the SVG before committing it."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rich.text import Text
from test_hud_snapshots import feed, stream_records
from textual.pilot import Pilot
from textual.widgets import TextArea

from llmchat.core import CacheSettings, ChatClient, HttpSettings, RetryEvent, Settings, TimingRecord
from llmchat.core.history._store import HistoryStore
from llmchat.tui.app import NARROW, ChatApp, Offline, make_app
from llmchat.tui.request_state import Retry, describe
from llmchat.tui.screens.system_prompt import SystemPromptScreen
from llmchat.tui.widgets.chat import Conversation, PromptInput

REPLY = """Here is the **short** answer, with a table and some code.

| figure | p50 |
|---|---:|
| TTFT | 212 ms |

```python
print("héllo, 世界 🚀")
```
"""


def _app(tmp_path: Path, keymap: dict[str, str] | None = None, *, offline: bool = False) -> ChatApp:
    settings = replace(Settings(), http=replace(HttpSettings(), warmup=False),
                       cache=CacheSettings(path=str(tmp_path / "cache")), keymap=keymap or {})
    # Port 9 (discard) on loopback: nothing is sent, the badge and HUD just need a stable address.
    client = ChatClient(settings, base_url="http://127.0.0.1:9/v1", model="llmchat-local", http2="h2c")
    return make_app(settings=settings, client=client, store=HistoryStore(tmp_path / "history.sqlite3"),
                    offline=Offline("http://127.0.0.1:9/v1") if offline else None)


async def steady(pilot: Pilot[None], app: ChatApp) -> None:
    """Once start-up is over (it ends with the welcome), with no blinking cursor: a snapshot taken between two
    blinks would differ from the last."""
    app.query_one(PromptInput).cursor_blink = False
    for _ in range(200):
        if app.query_one(Conversation).welcome:
            return
        await pilot.pause(0.01)
    raise AssertionError("the app did not finish starting")


async def quiet(pilot: Pilot[None], app: ChatApp) -> None:
    """Without the note about the folded HUD under 100 columns (a notification arrives as a message, so it
    is waited for before it is cleared); at 100 columns and more there is none."""
    if app.size.width < NARROW:
        for _ in range(200):
            if app.screen.query("Toast"):
                break
            await pilot.pause(0.01)
        else:
            raise AssertionError("the note about the folded HUD never came")
    app.clear_notifications()
    await pilot.pause()


SIZES = [pytest.param((160, 45), id="160x45"), pytest.param((100, 30), id="100x30"),
         pytest.param((60, 20), id="60x20")]

S = 1_000_000_000


def rate_limited(now_ns: int, width: int) -> tuple[str, Text]:
    """A fixed state line (no clock reaches the picture): 8 s into a request the server rate-limited."""
    r = TimingRecord(mode="stream", model="llmchat-local", t0_ns=0)
    event = RetryEvent(attempt=2, max_attempts=4, reason="429", status=429, wait_s=45.0,
                       wait_source="retry-after-ms", error="rate limited")
    return "llmchat-local", describe(r, 8 * S, stall_s=3.0, retry=Retry(event, S)).line(width)


@pytest.mark.parametrize("size", SIZES)
def test_main_screen(snap_compare: Any, tmp_path: Path, size: tuple[int, int]) -> None:
    """A finished reply, labelled with its model, then one waiting out a rate limit: its state line under it.
    At 60 columns the HUD has folded away (the note saying so is the first screen's, gone here)."""
    app = _app(tmp_path)

    async def fill(pilot: Pilot[None]) -> None:
        await steady(pilot, app)
        await quiet(pilot, app)
        view = app.query_one(Conversation)
        view.add_user("Show me the latency figures")
        note = "llmchat-local · HTTP/2 · TTFT 212 ms · 70 tok/s"
        reply = view.add_assistant(REPLY, status="done", note=note, label="llmchat-local")
        view.add_user("And the rate limits?")
        pending = view.add_assistant(label="llmchat-local")
        pending.follow(rate_limited)
        app.sub_title = "Show me the latency figures"
        await pilot.pause()
        await reply.wait_final()
        feed(app.client.bus, stream_records())
        hud = app.query_one("#hud")
        hud.paint()  # type: ignore[attr-defined]
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=size, run_before=fill)


@pytest.mark.parametrize("size", SIZES)
def test_first_screen_offline(snap_compare: Any, tmp_path: Path, size: tuple[int, int],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    """What a newcomer sees: what answers, and how to add a provider (the config file of a fixed home)."""
    monkeypatch.setenv("HOME", "/home/you")
    monkeypatch.delenv("XDG_CONFIG_HOME")
    app = _app(tmp_path, offline=True)

    async def still(pilot: Pilot[None]) -> None:
        await steady(pilot, app)
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=still)


def test_hud_over_the_chat_at_60_columns(snap_compare: Any, tmp_path: Path) -> None:
    app = _app(tmp_path)

    async def fill(pilot: Pilot[None]) -> None:
        await steady(pilot, app)
        await quiet(pilot, app)  # the note about the folded HUD, which F8 answers
        feed(app.client.bus, stream_records())
        await pilot.press("f8")
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=(60, 20), run_before=fill)


@pytest.mark.parametrize("size", SIZES)
def test_help_screen(snap_compare: Any, tmp_path: Path, size: tuple[int, int]) -> None:
    """F1 over the main screen: every binding, its key in effect (two remapped), its id, what it does."""
    app = _app(tmp_path, keymap={"prompt.send": "ctrl+s", "history.open": "f6"})

    async def keys(pilot: Pilot[None]) -> None:
        await steady(pilot, app)
        await quiet(pilot, app)
        await pilot.press("f1")
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=size, run_before=keys)


def test_system_prompt_editor(snap_compare: Any, tmp_path: Path) -> None:
    """The palette's "Edit system prompt": the conversation's prompt over several lines, the keys in effect,
    Cancel and Save."""
    app = _app(tmp_path)

    async def open_editor(pilot: Pilot[None]) -> None:
        app.system_prompt = ("You are a terse assistant for latency questions.\n"
                             "Answer in one line, in English.\n\n"
                             "- give figures in ms\n- say which clock measured them")
        app.action_system_prompt()
        # Until the editor is up with the prompt in it and the cursor settled (a condition, not a guess).
        deadline = time.monotonic() + 10
        while not (isinstance(app.screen, SystemPromptScreen) and app.screen.query(TextArea)
                   and app.screen.query_one(TextArea).text == app.system_prompt):
            assert time.monotonic() < deadline, "the system prompt editor did not open"
            await pilot.pause(0.02)
        app.screen.query_one(TextArea).cursor_blink = False  # a blinking cursor is there in one frame of two
        await pilot.pause()

    assert snap_compare(app, terminal_size=(120, 36), run_before=open_editor)
