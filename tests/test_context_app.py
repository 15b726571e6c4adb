"""The app keeps a conversation inside the model's context window and says so; attaches files; keeps a
model or provider picked from the palette with the conversation it was picked for.

Pilot drives the app against the project's own server on 127.0.0.1 (with a small context window it refuses
a request past, as vLLM does), with a real SQLite history in tmp_path.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from test_app import _until
from test_conversation_settings import (
    BIG,
    MODEL,
    _app,
    _configured_app,
    _last_reply,
    _notes,
    _run,
    _send,
    _settings,
    slow,  # noqa: F401 - the fixture
)
from textual.widgets import Input

from llmchat.core import ChatClient
from llmchat.core.config._settings import UISettings
from llmchat.core.server import RunningServer
from llmchat.tui.app import ChatApp
from llmchat.tui.paths import complete_path
from llmchat.tui.screens.text_input import TextInputScreen
from llmchat.tui.widgets.chat import ChatMessage, PromptInput, UserMessage
from llmchat.tui.widgets.hud import Hud

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 40


def _small_window_app(server: RunningServer, tmp_path: Path, **ui: Any) -> ChatApp:
    settings = _settings(tmp_path, ui=UISettings(export_dir=str(tmp_path / "x"), **ui))
    client = ChatClient(settings, base_url=server.base_url, model=MODEL, http2="h2c")
    return _app(settings, client, tmp_path)


def _context_text(app: ChatApp) -> str:
    return str(app.query_one(Hud).context_line.render())


async def _stored_messages(app: ChatApp) -> list[Any]:
    assert app.conversation_id is not None
    return (await app.store.load(app.conversation_id)).messages


# -- context that fits --------------------------------------------------------------------------------------
async def test_a_history_past_a_small_window_leaves_out_the_oldest_turns_and_says_how_many(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    server = server_factory(profile="instant", context_window=260)
    app = _small_window_app(server, tmp_path, max_tokens=24)
    async with app.run_test(size=(140, 40)) as pilot:
        replies = [await _send(pilot, app, f"question number {i} about the weather today") for i in range(8)]
        hud = _context_text(app)
        notes = [n for n in _notes(app) if "left out" in n]
        record = (await _last_reply(app)).record
        saved = await _stored_messages(app)
    # Every request went through: without the fitting, the server refuses the first one past 260 tokens.
    assert [r.status for r in replies] == ["done"] * 8
    assert record["prompt_tokens"] <= 260 - 24
    assert notes and notes[-1].endswith(f"left out to fit the 260-token context window "
                                        f"({record['prompt_tokens']} tokens sent, 24 kept for the reply)")
    assert f"prompt {record['prompt_tokens']} / 260 tok · " in hud and " turns out" in hud
    # Nothing is lost: the history keeps every turn; only the request leaves the oldest out.
    assert len(saved) == 16


async def test_the_hud_shows_prompt_tokens_and_the_prefill_share_of_time_to_first_token(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    server = server_factory(profile="instant", context_window=4096, ttft_ms=40)
    app = _small_window_app(server, tmp_path, max_tokens=8)
    async with app.run_test(size=(140, 40)) as pilot:
        await _send(pilot, app, "hello")
        hud = app.query_one(Hud)
        await _until(pilot, lambda: "of TTFT" in _context_text(app))
        text = _context_text(app)
        record = (await _last_reply(app)).record
        assert hud.context_line.display
    assert f"prompt {record['prompt_tokens']} / 4,096 tok · all in" in text
    assert "turns out" not in text and "prefill " in text


async def test_a_message_too_long_for_the_window_is_one_line_sends_nothing_and_stays_in_the_prompt(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    server = server_factory(profile="instant", context_window=120)
    app = _small_window_app(server, tmp_path, max_tokens=20)
    typed = " ".join(["word"] * 150)
    async with app.run_test(size=(140, 40)) as pilot:
        prompt = app.query_one(PromptInput)
        prompt.text = typed
        await pilot.press("enter")
        await _until(pilot, lambda: any("context window" in n for n in _notes(app)))
        said = [n for n in _notes(app) if "context window" in n]
        assert prompt.text == typed and not prompt.held
        assert not app.query(ChatMessage) and not app.query(UserMessage)
        assert app.conversation_id is None  # nothing saved, nothing sent
    assert said == ["this message is 157 tokens, more than the 120-token context window of llmchat-local "
                    "takes with 20 kept for the reply; shorten it (or attach less), or lower max_tokens"]


# -- attachments --------------------------------------------------------------------------------------------
async def test_a_file_line_attaches_a_text_file_as_a_fenced_block(
    local_server: RunningServer, tmp_path: Path
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("alpha beta gamma\n" * 20, encoding="utf-8")
    app = _small_window_app(local_server, tmp_path, max_tokens=8)
    async with app.run_test(size=(140, 40)) as pilot:
        reply = await _send(pilot, app, f"/file {notes}\nwhat is in it?")
        saved = await _stored_messages(app)
    assert reply.status == "done"
    assert saved[0].content == f"what is in it?\n\n`{notes}`:\n```txt\n" + "alpha beta gamma\n" * 20 + "```"
    assert saved[1].record["prompt_tokens"] > 60  # the file's 60 words went with it


async def test_a_binary_file_is_one_line_and_the_prompt_keeps_the_text(
    local_server: RunningServer, tmp_path: Path
) -> None:
    blob = tmp_path / "a.out"
    blob.write_bytes(b"\x7fELF\x00\x00binary")
    app = _small_window_app(local_server, tmp_path)
    typed = f"/file {blob}\nexplain"
    async with app.run_test(size=(140, 40)) as pilot:
        prompt = app.query_one(PromptInput)
        prompt.text = typed
        await pilot.press("enter")
        await _until(pilot, lambda: any("cannot attach" in n for n in _notes(app)))
        assert prompt.text == typed and not app.query(UserMessage)
    assert [n for n in _notes(app) if "cannot attach" in n] == [
        f"cannot attach {blob}: it is a binary file, not UTF-8 text or a PNG, JPEG, GIF or WebP image; attach "
        "its text instead"]


async def test_the_attach_key_asks_for_a_path_with_completion_and_puts_a_file_line_in_the_prompt(
    local_server: RunningServer, tmp_path: Path
) -> None:
    (tmp_path / "report-2026.md").write_text("# Report\n", encoding="utf-8")
    app = _small_window_app(local_server, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        app.query_one(PromptInput).text = "summarize"
        await pilot.press("ctrl+l")
        await _until(pilot, lambda: isinstance(app.screen, TextInputScreen))
        box = app.screen.query_one(Input)
        box.value = str(tmp_path / "nothing-here")
        await pilot.press("enter")
        problem = app.screen.query_one("#problem")
        await _until(pilot, lambda: problem.display)
        assert "no such file" in str(problem.render()) and isinstance(app.screen, TextInputScreen)
        box.value = str(tmp_path / "rep")
        box.cursor_position = len(box.value)
        await _until(pilot, lambda: box._suggestion.endswith("report-2026.md"))
        await pilot.press("right")  # takes the suggestion
        assert box.value == str(tmp_path / "report-2026.md")
        await pilot.press("enter")
        await _until(pilot, lambda: not isinstance(app.screen, TextInputScreen))
        assert app.query_one(PromptInput).text == f"/file {tmp_path / 'report-2026.md'}\nsummarize"
        reply = await _send(pilot, app, app.query_one(PromptInput).text)
        saved = await _stored_messages(app)
    assert reply.status == "done" and "```md\n# Report\n```" in saved[0].content


def test_path_completion_completes_names_and_folders(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "setup.cfg").write_text("")
    (tmp_path / ".hidden").write_text("")
    assert complete_path(f"{tmp_path}/se") == f"{tmp_path}/setup.cfg"
    assert complete_path(f"{tmp_path}/sr") == f"{tmp_path}/src/"
    assert complete_path(f"{tmp_path}/.h") == f"{tmp_path}/.hidden"
    assert complete_path(f"{tmp_path}/zz") is None and complete_path("/no/such/dir/x") is None


async def test_an_image_to_a_model_that_does_not_take_images_is_one_clear_line_and_the_text_stays(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    (tmp_path / "cat.png").write_bytes(PNG)
    app = _small_window_app(server_factory(profile="instant"), tmp_path)
    typed = f"/file {tmp_path / 'cat.png'}\nwhat is this?"
    async with app.run_test(size=(140, 40)) as pilot:
        reply = await _send(pilot, app, typed)
        prompt = app.query_one(PromptInput)
        assert reply.status == "error" and prompt.text == typed
        error = [n for n in _notes(app) if "image" in n][-1]
        assert not app.history  # the refused message is not carried into the next request
    assert "image input is not supported by llmchat-local" in error and error.endswith(
        "use a vision model, or send the text alone")


async def test_an_image_goes_to_a_vision_model_as_a_data_uri(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    (tmp_path / "cat.png").write_bytes(PNG)
    app = _small_window_app(server_factory(profile="instant", vision=True), tmp_path, max_tokens=8)
    async with app.run_test(size=(140, 40)) as pilot:
        reply = await _send(pilot, app, f"/file {tmp_path / 'cat.png'}\nwhat is this?")
        saved = await _stored_messages(app)
        carried = app.history[0]["content"]
    assert reply.status == "done"
    assert carried[1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert saved[0].content == f"what is this?\n\n[image: {tmp_path / 'cat.png'}, 48 bytes]"
    assert saved[1].record["prompt_tokens"] >= 85  # the server counted the image


# -- per-conversation settings ------------------------------------------------------------------------------
async def test_a_model_picked_in_the_palette_stays_with_its_conversation(
    local_server: RunningServer, slow: RunningServer, tmp_path: Path  # noqa: F811
) -> None:
    app = _configured_app(local_server, slow, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        await _send(pilot, app, "first on the default")
        first = app.conversation_id
        await _run(pilot, app, "Model: fast", "Model: fast / llmchat-local-large")
        await _until(pilot, lambda: app.client.model == "llmchat-local-large")
        await _send(pilot, app, "then on the large one")
        await pilot.press("ctrl+n")
        await _run(pilot, app, "Model: slow", f"Model: slow-llama / {BIG}")
        await _until(pilot, lambda: app.client.endpoint.name == "slow-llama")
        await _send(pilot, app, "another conversation, another provider")
        second = app.conversation_id
        await app._open_from_history(first)
        assert (app.client.endpoint.name, app.client.model) == ("fast", "llmchat-local-large")
        reply = await _send(pilot, app, "back to the first")
        assert reply.status == "done" and (await _last_reply(app)).model == "llmchat-local-large"
        await app._open_from_history(second)
        assert (app.client.endpoint.name, app.client.model) == ("slow-llama", BIG)
