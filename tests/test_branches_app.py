"""Regenerate, edit, switch, search and read from the keyboard in the chat app: Pilot drives the app against
the local server over real sockets, on a real SQLite file in tmp."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from test_app import MODEL, _send, _settings, _until

from llmchat.core import ChatClient
from llmchat.core.history._store import HistoryStore
from llmchat.core.server import RunningServer
from llmchat.tui.app import ChatApp, make_app
from llmchat.tui.numbers import duration
from llmchat.tui.screens.search import SearchScreen
from llmchat.tui.widgets.chat import ChatMessage, Conversation, PromptInput, UserMessage
from llmchat.tui.widgets.hud import Hud


def _app(server: RunningServer, tmp_path: Path, **kw: object) -> ChatApp:
    settings = _settings(tmp_path)
    client = ChatClient(settings, base_url=server.base_url, model=MODEL, http2="h2c")
    return make_app(settings=settings, client=client, store=HistoryStore(tmp_path / "history.sqlite3"),
                    **kw)  # type: ignore[arg-type]


def _shown(app: ChatApp) -> list[UserMessage | ChatMessage]:
    return app.query_one(Conversation).messages()


async def test_regenerate_then_switch_between_the_two_replies(local_server: RunningServer,
                                                              tmp_path: Path) -> None:
    app = _app(local_server, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        first = await _send(pilot, app, "tell me a story")
        await _until(pilot, lambda: first.is_final and first.message_id is not None)
        first_id = first.message_id
        await pilot.press("ctrl+r")
        await _until(pilot, lambda: _shown(app)[-1] is not first and _shown(app)[-1].is_final)  # type: ignore[union-attr]
        second = _shown(app)[-1]
        assert isinstance(second, ChatMessage) and second.message_id not in (None, first_id)
        assert second.alternatives == (first_id, second.message_id) and second.marker == "2/2"
        assert "‹ 2/2 ›" in second.rendered_text()
        assert len(_shown(app)) == 2 and app.query_one(PromptInput).text == ""
        # The request for the new reply carried the prompt once, not the old reply.
        assert [m["role"] for m in app.history] == ["user", "assistant"]
        assert app.conversation_id is not None
        saved = await app.store.load(app.conversation_id)
        assert [m.id for m in saved.messages][-1] == second.message_id
        # Alt+Left shows the first reply again, with its own record's line; the history follows.
        await pilot.press("alt+left")
        await _until(pilot, lambda: _shown(app)[-1].message_id == first_id)
        back = _shown(app)[-1]
        assert back.marker == "1/2" and "‹ 1/2 ›" in back.rendered_text() and "TTFT" in back.rendered_text()
        assert app.history[-1]["content"] == back.text
        assert [m.id for m in (await app.store.load(app.conversation_id)).messages][-1] == first_id
        await pilot.press("alt+right")
        await _until(pilot, lambda: _shown(app)[-1].message_id == second.message_id)
        # The HUD compares the two replies from their stored records, the one on screen marked.
        hud = app.query_one(Hud)
        await _until(pilot, lambda: len(hud.alternatives.shown) == 2 and hud.alternatives.shown[1].startswith("▸ 2/2"))
        lines = hud.alternatives.shown
        assert len(lines) == 2 and lines[0].startswith("  1/2  ") and hud.alternatives_title.display
        assert first_id is not None and second.message_id is not None
        records = await app.store.records([first_id, second.message_id])
        for line, msg_id in zip(lines, (first_id, second.message_id), strict=True):
            record = records[msg_id]
            assert record is not None and duration(record["ttft_ms"]) in line and duration(record["total_ms"]) in line
        # A new prompt's reply has no alternatives: the comparison goes.
        third = await _send(pilot, app, "and another thing")
        await _until(pilot, lambda: third.is_final)
        assert not hud.alternatives.display and not hud.alternatives_title.display


async def test_edit_an_earlier_prompt_and_branch(local_server: RunningServer, tmp_path: Path) -> None:
    app = _app(local_server, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        r1 = await _send(pilot, app, "first question")
        await _until(pilot, lambda: r1.is_final)
        r2 = await _send(pilot, app, "second question, badly put")
        await _until(pilot, lambda: r2.is_final)
        prompt = app.query_one(PromptInput)
        prompt.text = "half-typed"
        # F9 then Esc: nothing typed is lost.
        await pilot.press("f9")
        assert prompt.text == "second question, badly put"
        await pilot.press("escape")
        assert prompt.text == "half-typed" and app._editing is None
        prompt.text = ""
        # Select the first prompt (Alt+Up from the end: reply 2, prompt 2, reply 1, prompt 1) and edit it.
        for _ in range(4):
            await pilot.press("alt+up")
        selected = app.query_one(Conversation).selected
        assert isinstance(selected, UserMessage) and selected.text == "first question"
        await pilot.press("f9")
        assert prompt.text == "first question" and prompt.has_focus
        prompt.text = "first question, put better"
        await pilot.press("enter")
        await _until(pilot, lambda: len(_shown(app)) == 2 and _shown(app)[-1].is_final)  # type: ignore[union-attr]
        edited = _shown(app)[0]
        assert edited.text == "first question, put better" and edited.marker == "2/2"
        assert "‹ 2/2 ›" in edited.rendered_text()
        assert [m["content"] for m in app.history][0] == "first question, put better"
        assert app.conversation_id is not None
        conv = await app.store.load(app.conversation_id)
        assert [m.content for m in conv.messages][0] == "first question, put better" and len(conv.messages) == 2
        # The old branch is all there: switching back shows both of its turns.
        await pilot.press("alt+up", "alt+up")
        await pilot.press("alt+left")
        await _until(pilot, lambda: len(_shown(app)) == 4)
        assert [m.text for m in _shown(app) if isinstance(m, UserMessage)] == [
            "first question", "second question, badly put"]


async def test_search_and_open_a_hit(local_server: RunningServer, tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite3"
    async with HistoryStore(db) as store:
        for n in range(3):
            conv = await store.new_conversation(title=f"talk {n}")
            for turn in range(6):
                await store.add_user_message(conv, f"question {turn} of talk {n}")
                msg = await store.start_reply(conv, provider="local", model=MODEL, mode="stream")
                writer = store.reply_writer(msg)
                writer.append("the kettle whistles" if (n, turn) == (1, 2) else f"answer {turn}\n\n" * 6)
                await writer.finish(status="done")
                if (n, turn) == (1, 2):
                    target = (conv, msg)
    app = _app(local_server, tmp_path)
    async with app.run_test(size=(140, 30)) as pilot:
        await pilot.press("ctrl+f")
        await _until(pilot, lambda: isinstance(app.screen, SearchScreen))
        screen = app.screen
        assert isinstance(screen, SearchScreen)
        await pilot.press(*"kettle")
        await _until(pilot, lambda: bool(screen.hits))
        assert [(h.conversation_id, h.message_id) for h in screen.hits] == [target]
        await pilot.press("enter")
        await _until(pilot, lambda: app.conversation_id == target[0]
                     and (app.query_one(Conversation).selected is not None))
        selected = app.query_one(Conversation).selected
        assert selected is not None and selected.message_id == target[1] and selected.text == "the kettle whistles"
        view = app.query_one(Conversation)
        await _until(pilot, lambda: view.region.overlaps(selected.region))  # brought into view
        assert app.sub_title == "talk 1"


async def test_reading_keys_scroll_with_the_prompt_focused_and_the_view_keeps_its_place(
        server_factory: Any, tmp_path: Path) -> None:
    server = server_factory(tokens_per_s=200)
    app = _app(server, tmp_path)
    async with app.run_test(size=(120, 24)) as pilot:
        view = app.query_one(Conversation)
        for n in range(12):
            view.add_user(f"question {n}")
            view.add_assistant("\n\n".join(f"line {i}" for i in range(6)), status="done")
        await pilot.pause()
        await _until(pilot, lambda: view.max_scroll_y > 40)
        await pilot.press("end")  # empty prompt: End goes to the bottom
        await _until(pilot, lambda: view.scroll_y >= view.max_scroll_y)
        prompt = app.query_one(PromptInput)
        await pilot.press("pageup")
        await _until(pilot, lambda: view.scroll_y < view.max_scroll_y)
        assert prompt.has_focus and not view.following
        place = view.scroll_y
        # A reply streaming in below leaves the view where it is.
        reply = await _send(pilot, app, "one more, at length")
        await _until(pilot, lambda: reply.is_final)
        await pilot.pause()
        assert view.scroll_y == place and view.max_scroll_y > place
        # Home with text in the prompt moves its cursor; Ctrl+Home goes to the top.
        prompt.text = "draft"
        prompt.move_cursor((0, 5))
        await pilot.press("home")
        assert prompt.cursor_location == (0, 0) and view.scroll_y == place
        await pilot.press("ctrl+home")
        await _until(pilot, lambda: view.scroll_y == 0)
        await pilot.press("pagedown")
        await _until(pilot, lambda: view.scroll_y > 0)
        await pilot.press("ctrl+end")
        await _until(pilot, lambda: view.following and view.scroll_y >= view.max_scroll_y)
        assert prompt.text == "draft"


async def test_copy_the_selected_message_and_each_code_block(local_server: RunningServer,
                                                             tmp_path: Path) -> None:
    app = _app(local_server, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        view = app.query_one(Conversation)
        view.add_user("show me two snippets")
        view.add_assistant("one:\n\n```py\nprint(1)\n```\n\ntwo:\n\n```sh\necho 2\n```\n", status="done")
        await pilot.pause()
        await pilot.press("alt+up")
        await pilot.press("f4")
        assert app.clipboard == "echo 2\n" or app.clipboard.strip() == "echo 2"
        await pilot.press("f4")
        assert app.clipboard.strip() == "print(1)"
        await pilot.press("alt+up")
        await pilot.press("f3")
        assert app.clipboard == "show me two snippets"
        await pilot.press("escape")
        assert view.selected is None
