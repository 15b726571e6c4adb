"""What surrounds the conversation tells the truth: the title, the welcome, the badge, the keys in effect and
the footer's keys at any width, the HUD folded away and shown over the chat. Pilot against the local server,
a real SQLite history."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_app import _app, _send, _settings, _until
from test_app_keys import record_notes

from llmchat.core import ChatClient
from llmchat.core.history._store import HistoryStore
from llmchat.core.server import RunningServer
from llmchat.tui.app import NARROW, ChatApp, Offline, make_app
from llmchat.tui.screens.history import HistoryScreen
from llmchat.tui.widgets.chat import ChatMessage, Conversation, PromptInput
from llmchat.tui.widgets.footer import KeyFooter
from llmchat.tui.widgets.hud import Hud


def _title(app: ChatApp) -> str:
    return str(app.query_one("#title").render())


# -- the keys in effect ----------------------------------------------------------------------------------
async def test_remapped_keys_show_in_the_placeholder_and_the_footer(local_server: RunningServer,
                                                                     tmp_path: Path) -> None:
    keymap = {"prompt.send": "ctrl+s", "help.open": "f9", "hud.overlay": "f10"}
    app = _app(local_server, tmp_path, settings=_settings(tmp_path, keymap=keymap))
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause()
        assert str(app.query_one(PromptInput).placeholder).startswith("Ask anything · Ctrl+S sends")
        shown = app.query_one(KeyFooter).shown
        assert ("^s", "Send") in shown and ("f9", "Keys") in shown and ("f10", "HUD over chat") in shown
        assert not any(key in ("⏎", "f1", "f8") for key, _ in shown)
        assert "F9 lists every key" in app.query_one(Conversation).welcome


# -- the title, the welcome, the badge -----------------------------------------------------------------------
async def test_the_title_comes_from_the_first_prompt_follows_a_rename_and_clears(
    local_server: RunningServer, tmp_path: Path
) -> None:
    app = _app(local_server, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        assert _title(app) == "new conversation"
        reply = await _send(pilot, app, "Why is my first token slow?")
        await _until(pilot, lambda: _title(app) == "Why is my first token slow?")
        await _until(pilot, lambda: reply.is_final)
        await pilot.press("ctrl+o")
        await _until(pilot, lambda: isinstance(app.screen, HistoryScreen) and app.screen.loaded)
        await pilot.press("r")
        await _until(pilot, lambda: app.screen.mode == "rename")  # type: ignore[attr-defined]
        app.screen.query_one("#history-rename").value = "TTFT hunt"  # type: ignore[attr-defined]
        await pilot.press("enter")
        await _until(pilot, lambda: _title(app) == "TTFT hunt")
        await pilot.press("escape")
        await _until(pilot, lambda: app.screen is app.screen_stack[0])
        await pilot.press("ctrl+n")
        await _until(pilot, lambda: _title(app) == "new conversation")


async def test_the_welcome_says_what_answers_and_goes_with_the_first_message(
    local_server: RunningServer, tmp_path: Path
) -> None:
    app = _app(local_server, tmp_path, offline=Offline(local_server.base_url))
    async with app.run_test(size=(140, 40)) as pilot:
        view = app.query_one(Conversation)
        await _until(pilot, lambda: bool(view.welcome))
        assert view.welcome.startswith("Talking to the built-in local server (offline demo)")
        assert "config.toml" in view.welcome and "llmchat --base-url URL" in view.welcome
        reply = await _send(pilot, app, "hi")
        await _until(pilot, lambda: not view.welcome)
        await _until(pilot, lambda: reply.is_final)
        await pilot.press("ctrl+n")  # an empty conversation again: it says it again
        await _until(pilot, lambda: bool(view.welcome) and not app.query(ChatMessage))


async def test_the_welcome_of_a_configured_provider_names_it(local_server: RunningServer,
                                                              tmp_path: Path) -> None:
    app = _app(local_server, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        view = app.query_one(Conversation)
        await _until(pilot, lambda: bool(view.welcome))
        hostport = local_server.base_url.removeprefix("http://").removesuffix("/v1")
        assert view.welcome.startswith(f"Talking to custom at {hostport}, llmchat-local.")


async def test_the_badge_names_the_model_the_server_named(local_server: RunningServer,
                                                          tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    client = ChatClient(settings, base_url=local_server.base_url, http2="h2c")  # no model named
    app = make_app(settings=settings, client=client, store=HistoryStore(tmp_path / "history.sqlite3"))
    async with app.run_test(size=(140, 40)) as pilot:
        badge = app.query_one("#badge")
        assert "default model" in str(badge.render())
        reply = await _send(pilot, app, "who are you")
        await _until(pilot, lambda: reply.is_final)
        await _until(pilot, lambda: "llmchat-local" in str(badge.render()))
        assert "default model" not in str(badge.render())
        assert reply.label == "llmchat-local"


async def test_the_badge_leaves_the_title_room_on_a_narrow_terminal(local_server: RunningServer,
                                                                     tmp_path: Path) -> None:
    app = _app(local_server, tmp_path, offline=Offline(local_server.base_url))
    async with app.run_test(size=(60, 20)) as pilot:
        reply = await _send(pilot, app, "A title that tells")
        await _until(pilot, lambda: _title(app) == "A title that tells" and reply.is_final)
        await pilot.pause()
        badge = str(app.query_one("#badge").render())
        assert badge.endswith("stream") and "(offline demo)" not in badge, badge
        assert app.query_one("#title").region.width >= len("A title that tells")


# -- narrow terminals: the HUD folded, shown over the chat ---------------------------------------------------
async def test_folding_the_hud_says_so_once_and_f8_shows_it_over_the_chat(
    local_server: RunningServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = _app(local_server, tmp_path)
    notes = record_notes(app, monkeypatch)
    async with app.run_test(size=(80, 30)) as pilot:
        hud = app.query_one(Hud)
        await _until(pilot, lambda: any("folds away under 100 columns" in n for n in notes))
        assert not hud.display
        assert [n for n in notes if "folds away" in n] == [
            f"The HUD folds away under {NARROW} columns (this terminal has 80); F8 shows it over the chat. "
            "Retries, stalls and errors show under each reply."]
        await pilot.press("f8")
        await _until(pilot, lambda: hud.display and hud.has_class("-overlay"))
        chat = app.query_one("#chat")
        assert chat.region.width == 80  # the chat keeps its width: the HUD lies over it
        assert hud.region.right == 80 and hud.region.x > 0
        await pilot.press("f8")
        await _until(pilot, lambda: not hud.display)
        # F2 where the HUD cannot sit beside the chat shows it over the chat too, rather than nothing.
        await pilot.press("f2")
        await _until(pilot, lambda: hud.display and hud.has_class("-overlay"))
        await pilot.press("f2")
        await _until(pilot, lambda: not hud.display)
        await pilot.resize_terminal(120, 30)
        await _until(pilot, lambda: hud.display and not hud.has_class("-overlay"))
        await pilot.resize_terminal(80, 30)
        await _until(pilot, lambda: not hud.display)
        assert len([n for n in notes if "folds away" in n]) == 1  # once


@pytest.mark.parametrize("width", [90, 60])
async def test_every_key_stays_in_the_footer_at(width: int, local_server: RunningServer,
                                                tmp_path: Path) -> None:
    app = _app(local_server, tmp_path)
    async with app.run_test(size=(width, 24)) as pilot:
        await pilot.pause()
        footer = app.query_one(KeyFooter)
        keys = list(footer.query("FooterKey"))
        shown = {b.binding.id for b in app.screen.active_bindings.values() if b.binding.show}
        assert len(keys) == len(shown) + 1  # every binding shown, and the palette's key
        assert all(k.region.right <= width for k in keys), [(k.region, k.render()) for k in keys]
        assert all(k.region.width > 0 for k in keys)
        # The help key keeps its label: it lists every key whose label had to go.
        assert ("f1", "Keys") in footer.shown


async def test_a_resumed_reply_keeps_the_label_of_the_model_that_answered(local_server: RunningServer,
                                                                          tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    client = ChatClient(settings, base_url=local_server.base_url, http2="h2c")  # no model named: the server's
    app = make_app(settings=settings, client=client, store=HistoryStore(tmp_path / "history.sqlite3"))
    async with app.run_test(size=(140, 40)) as pilot:
        reply = await _send(pilot, app, "who answers?")
        await _until(pilot, lambda: reply.is_final)
        assert reply.label == "llmchat-local"
    again = _app(local_server, tmp_path, continue_last=True)
    async with again.run_test(size=(140, 40)) as pilot:
        await _until(pilot, lambda: len(again.query(ChatMessage)) == 1)
        assert again.query_one(ChatMessage).label == "llmchat-local"
        assert _title(again) == "who answers?"
