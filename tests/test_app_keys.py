"""Keys reach the app the way a terminal sends them: a whole burst posted at once, then Enter.

Pilot's ``press()`` lets the app go idle after every key. A terminal delivers a typed line and its Enter in
one read (fast typing, a paste without bracketed paste, tmux or ssh, a busy loop while a reply streams), and
the driver posts the keys from its thread without waiting. These tests post each burst the same way, with
``app.post_message`` and no wait between keys, then wait on a condition with a deadline and look at what was
sent and what the history (a real SQLite file) stored.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any

import pytest
from test_app import _app, _settings, _until
from textual import events
from textual.keys import KEY_NAME_REPLACEMENTS

from llmchat.core.server import RunningServer
from llmchat.tui.app import ChatApp
from llmchat.tui.screens.help import HelpScreen
from llmchat.tui.widgets.chat import ChatMessage, PromptInput

# What the xterm parser makes of the keys these tests send that are not characters.
NAMED = {"enter": "\r", "ctrl+j": "\n", "shift+enter": None, "alt+enter": None, "ctrl+s": "\x13"}


def _key(typed: str) -> events.Key:
    """The event the driver posts for one typed character, or for a named key such as ``enter``."""
    if typed in NAMED:
        return events.Key(typed, NAMED[typed])
    if typed.isalnum():
        return events.Key(typed, typed)
    name = unicodedata.name(typed).lower().replace(" ", "_").replace("-", "_")
    return events.Key(KEY_NAME_REPLACEMENTS.get(name, name), typed)


def burst(app: ChatApp, *parts: str | events.Event) -> None:
    """Post every key of ``parts`` at once: a str longer than one character that is not a named key is typed
    character by character; an Event (a Paste) goes as it is."""
    for part in parts:
        if isinstance(part, events.Event):
            app.post_message(part)
        elif part in NAMED or len(part) == 1:
            app.post_message(_key(part))
        else:
            for ch in part:
                app.post_message(_key(ch))


async def stored_prompts(app: ChatApp) -> list[str]:
    """The user messages of the current conversation, as the history file has them."""
    if app.conversation_id is None:
        return []
    conv = await app.store.load(app.conversation_id)
    return [m.content for m in conv.messages if m.role == "user"]


def sent(app: ChatApp) -> list[str]:
    return [m["content"] for m in app.history if m["role"] == "user"]


def record_notes(app: ChatApp, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    notes: list[str] = []
    notify = app.notify

    def recording(message: str, **kw: Any) -> None:
        notes.append(str(message))
        notify(message, **kw)

    monkeypatch.setattr(app, "notify", recording)
    return notes


async def _finished(pilot: Any, app: ChatApp, count: int) -> None:
    """Wait until ``count`` prompts were sent and every reply to them is over."""
    await _until(pilot, lambda: len(sent(app)) >= count)
    await _until(pilot, lambda: not app.replying and all(m.is_final for m in app.query(ChatMessage)))


@pytest.mark.parametrize("text", ["Explain why HTTP/2 multiplexing helps a chat client",
                                  "Tell me about latency"])
async def test_a_prompt_and_its_enter_in_one_burst_are_sent_whole(
    local_server: RunningServer, tmp_path: Path, text: str
) -> None:
    app = _app(local_server, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        burst(app, text, "enter")
        await _finished(pilot, app, 1)
        assert sent(app) == [text]
        assert app.query_one(PromptInput).text == ""
        assert await stored_prompts(app) == [text]


async def test_ten_prompts_typed_in_bursts_are_stored_whole_and_in_order(
    local_server: RunningServer, tmp_path: Path
) -> None:
    app = _app(local_server, tmp_path)
    prompts = [f"prompt {i}: where did the time to first token go, and why?" for i in range(10)]
    async with app.run_test(size=(140, 40)) as pilot:
        for i, text in enumerate(prompts):
            # Typed as soon as the previous reply is over: not once the app has settled after it.
            burst(app, text, "enter")
            await _finished(pilot, app, i + 1)
        assert sent(app) == prompts
        assert await stored_prompts(app) == prompts


async def test_a_burst_typed_while_a_reply_streams_stays_whole_in_the_input(
    server_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = server_factory(tokens_per_s=40)
    app = _app(server, tmp_path)
    notes = record_notes(app, monkeypatch)
    async with app.run_test(size=(140, 40)) as pilot:
        burst(app, "a long one please", "enter")
        await _until(pilot, lambda: len(app.query(ChatMessage)) == 1
                     and len(app.query_one(ChatMessage).text) > 10)
        burst(app, "Tell me about latency", "enter")
        await _until(pilot, lambda: "a reply is still coming; Esc cancels it" in notes)
        prompt = app.query_one(PromptInput)
        assert prompt.text == "Tell me about latency" and app.replying
        assert await stored_prompts(app) == ["a long one please"]
        await pilot.press("escape")
        await _until(pilot, lambda: not app.replying)
        burst(app, "enter")  # right after the reply ended: the prompt is no longer held
        await _finished(pilot, app, 2)
        assert await stored_prompts(app) == ["a long one please", "Tell me about latency"]
        assert prompt.text == ""


async def test_the_held_message_names_the_cancel_key_in_effect(
    server_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = server_factory(tokens_per_s=40)
    app = _app(server, tmp_path, settings=_settings(tmp_path, keymap={"reply.cancel": "ctrl+x"}))
    notes = record_notes(app, monkeypatch)
    async with app.run_test(size=(140, 40)) as pilot:
        burst(app, "first", "enter", "second", "enter")  # both Enters in one burst: the second is held
        await _until(pilot, lambda: "a reply is still coming; Ctrl+X cancels it" in notes)
        assert app.query_one(PromptInput).text == "second"
        assert await stored_prompts(app) == ["first"]


async def test_a_bracketed_paste_then_enter_sends_the_whole_paste(
    local_server: RunningServer, tmp_path: Path
) -> None:
    pasted = 'def handler(request):\n    return {"ok": True}\n\nwhy is this slow? ' + "x" * 300
    app = _app(local_server, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        burst(app, events.Paste(pasted), "enter")
        await _finished(pilot, app, 1)
        assert await stored_prompts(app) == [pasted]


async def test_keys_typed_after_enter_stay_in_the_input(local_server: RunningServer, tmp_path: Path) -> None:
    app = _app(local_server, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        burst(app, "first part", "enter", "second part")
        await _finished(pilot, app, 1)
        await _until(pilot, lambda: app.query_one(PromptInput).text == "second part")
        assert await stored_prompts(app) == ["first part"]


async def test_the_newline_keys_in_a_burst_keep_their_place(
    local_server: RunningServer, tmp_path: Path
) -> None:
    app = _app(local_server, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        burst(app, "a", "ctrl+j", "b", "shift+enter", "c", "alt+enter", "d", "enter")
        await _finished(pilot, app, 1)
        assert await stored_prompts(app) == ["a\nb\nc\nd"]


async def test_a_remapped_send_key_sends_and_enter_then_starts_a_new_line(
    local_server: RunningServer, tmp_path: Path
) -> None:
    app = _app(local_server, tmp_path, settings=_settings(tmp_path, keymap={"prompt.send": "ctrl+s"}))
    async with app.run_test(size=(140, 40)) as pilot:
        burst(app, "one", "enter", "two", "ctrl+s")
        await _finished(pilot, app, 1)
        assert await stored_prompts(app) == ["one\ntwo"]
        # The footer follows the keymap too.
        active = app.screen.active_bindings
        assert active["ctrl+s"].binding.id == "prompt.send" and "enter" not in active


async def test_the_prompt_is_released_when_a_reply_ends_behind_a_modal(
    local_server: RunningServer, tmp_path: Path
) -> None:
    app = _app(local_server, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        burst(app, "quick one", "enter", events.Key("f1", None))
        await _until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await _until(pilot, lambda: not app.replying and not app.screen_stack[0].query_one(PromptInput).held)
        await pilot.press("escape")
        await _until(pilot, lambda: not isinstance(app.screen, HelpScreen))
        burst(app, "next one", "enter")
        await _finished(pilot, app, 2)
        assert await stored_prompts(app) == ["quick one", "next one"]

