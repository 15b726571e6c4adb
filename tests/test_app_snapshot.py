"""The main screen as an SVG snapshot: a finished conversation on the left, the HUD on the right fed fixed
records. No request is made (warm-up off, a fixed address), so no clock or port reaches the picture. Update
with ``pytest tests/test_app_snapshot.py --snapshot-update`` and look at the SVG before committing it."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from test_hud_snapshots import feed, stream_records
from textual.pilot import Pilot
from textual.widgets import TextArea

from llmchat.core import CacheSettings, ChatClient, HttpSettings, Settings
from llmchat.core.history._store import HistoryStore
from llmchat.tui.app import ChatApp, make_app
from llmchat.tui.screens.system_prompt import SystemPromptScreen
from llmchat.tui.widgets.chat import Conversation

REPLY = """Here is the **short** answer, with a table and some code.

| figure | p50 |
|---|---:|
| TTFT | 212 ms |

```python
print("héllo, 世界 🚀")
```
"""


def _app(tmp_path: Path, keymap: dict[str, str] | None = None) -> ChatApp:
    settings = replace(Settings(), http=replace(HttpSettings(), warmup=False),
                       cache=CacheSettings(path=str(tmp_path / "cache")), keymap=keymap or {})
    # Port 9 (discard) on loopback: nothing is sent, the badge and HUD just need a stable address.
    client = ChatClient(settings, base_url="http://127.0.0.1:9/v1", model="llmchat-local", http2="h2c")
    return make_app(settings=settings, client=client, store=HistoryStore(tmp_path / "history.sqlite3"))


def test_main_screen(snap_compare: Any, tmp_path: Path) -> None:
    app = _app(tmp_path)

    async def fill(pilot: Pilot[None]) -> None:
        view = app.query_one(Conversation)
        view.add_user("Show me the latency figures")
        reply = view.add_assistant(REPLY, status="done", note="llmchat-local · HTTP/2 · TTFT 212 ms · 70 tok/s")
        await pilot.pause()
        await reply.wait_final()
        feed(app.client.bus, stream_records())
        hud = app.query_one("#hud")
        hud.paint()  # type: ignore[attr-defined]
        await pilot.pause()

    assert snap_compare(app, terminal_size=(150, 44), run_before=fill)


def test_help_screen(snap_compare: Any, tmp_path: Path) -> None:
    """F1 over the main screen: every binding, its key in effect (two remapped), its id, what it does."""
    app = _app(tmp_path, keymap={"prompt.send": "ctrl+s", "history.open": "f6"})
    assert snap_compare(app, terminal_size=(120, 46), press=["f1"])


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
