"""What a finished conversation looks like, pinned as SVG snapshots (update with ``--snapshot-update``).

``snap_compare`` runs the app itself, so these are plain ``def`` tests.
"""

from __future__ import annotations

import asyncio
from typing import Any

from textual.app import App, ComposeResult
from textual.pilot import Pilot

from llmchat.tui.widgets.chat import ChatMessage, Conversation, PromptInput, UserMessage

REPLY = """## Two ways

Use `asyncio.gather` to run both **at once**:

```python
async def both():
    return await asyncio.gather(first(), second())
```

| way | time | note |
|---|---:|---|
| one by one | 2.0 s | simple |
| gather | 1.0 s | 速い 🚀 |
"""


class FinishedConversation(App[None]):
    def compose(self) -> ComposeResult:
        yield Conversation()
        yield PromptInput()

    def on_mount(self) -> None:
        self.query_one(Conversation).add_history(
            [
                UserMessage("How do I run two coroutines at once?"),
                ChatMessage(REPLY, status="done", note="TTFT 212 ms · 70 tok/s · HTTP/2"),
                UserMessage("And if one fails?"),
                ChatMessage(
                    "The other keeps running unless you cancel it", status="cancelled", note="9 tokens"
                ),
            ]
        )


async def _settled(pilot: Pilot[None]) -> None:
    for message in pilot.app.query(ChatMessage):
        await asyncio.wait_for(message.wait_final(), 10)
    await pilot.pause()


def test_finished_conversation(snap_compare: Any) -> None:
    assert snap_compare(FinishedConversation(), terminal_size=(80, 34), run_before=_settled)


def test_finished_conversation_narrow(snap_compare: Any) -> None:
    assert snap_compare(FinishedConversation(), terminal_size=(44, 40), run_before=_settled)
