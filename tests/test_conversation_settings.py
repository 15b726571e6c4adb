"""Each conversation keeps its settings, and resuming it is faithful: the provider, base URL and model it was
held with, its generation settings (temperature, seed, max tokens) and its system prompt. Also where the
app's exports go and what they look like.

Pilot drives the app against the project's own servers on 127.0.0.1 (each with its own models, so a request
sent to the wrong one fails), with a real SQLite history and a real cache folder in tmp_path.
"""

from __future__ import annotations

import re
import sqlite3
import stat
from collections.abc import Callable
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from history_files import make_old_history
from test_app import _until
from textual.command import CommandList, CommandPalette
from textual.widgets import Input, TextArea
from textual.worker import WorkerState

from llmchat.core import CacheSettings, ChatClient, HttpSettings, ProviderSettings, Settings
from llmchat.core.config._settings import UISettings
from llmchat.core.history._export import ExportError, export_folder, save_export
from llmchat.core.history._store import MIGRATIONS, Generation, HistoryStore, export_markdown, nest_headings
from llmchat.core.server import RunningServer
from llmchat.tui.app import ChatApp, Offline, make_app
from llmchat.tui.palette import CURRENT
from llmchat.tui.screens.system_prompt import SystemPromptScreen
from llmchat.tui.screens.text_input import TextInputScreen
from llmchat.tui.widgets.chat import ChatMessage, PromptInput

MODEL = "llmchat-local"
BIG = "llama3.1-70b"  # only the "slow-llama" server offers it
KEY = "sk-convsettings-0123456789abcdef"


def peek(path: Path, sql: str) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(path.as_uri() + "?mode=ro", uri=True)) as conn:
        return conn.execute(sql).fetchall()


def _settings(tmp_path: Path, **changes: Any) -> Settings:
    # The default cache policy ("deterministic"): what a user has without a config file.
    base = replace(Settings(), cache=CacheSettings(path=str(tmp_path / "cache")),
                   http=replace(HttpSettings(), warmup=False),
                   ui=UISettings(export_dir=str(tmp_path / "exports")))
    return replace(base, **changes)


def _providers(fast: RunningServer, slow: RunningServer) -> dict[str, ProviderSettings]:
    return {
        "fast": ProviderSettings(name="fast", base_url=fast.base_url, model=MODEL, http={"http2": "h2c"}),
        "slow-llama": ProviderSettings(name="slow-llama", base_url=slow.base_url, model=BIG,
                                       http={"http2": "h2c"}),
    }


@pytest.fixture
def slow(server_factory: Callable[..., RunningServer]) -> RunningServer:
    """The "remote" server: it offers only BIG, so a request for another model is a 404."""
    return server_factory(profile="instant", models=[BIG])


def _app(settings: Settings, client: ChatClient, tmp_path: Path, **kw: Any) -> ChatApp:
    return make_app(settings=settings, client=client, store=HistoryStore(tmp_path / "history.sqlite3"), **kw)


def _configured_app(fast: RunningServer, slow: RunningServer, tmp_path: Path, provider: str = "fast",
                    **kw: Any) -> ChatApp:
    """The app with providers "fast" (default_provider) and "slow-llama" configured, on ``provider``."""
    settings = _settings(tmp_path, providers=_providers(fast, slow), default_provider="fast")
    return _app(settings, ChatClient(settings, provider=provider), tmp_path, **kw)


def _local_app(server: RunningServer, tmp_path: Path, settings: Settings | None = None, **kw: Any) -> ChatApp:
    """The app on ``server`` reached by its URL (as `--base-url` does), with the model named."""
    settings = settings or _settings(tmp_path)
    client = ChatClient(settings, base_url=server.base_url, model=MODEL, http2="h2c")
    return _app(settings, client, tmp_path, **kw)


async def _send(pilot: Any, app: ChatApp, text: str) -> ChatMessage:
    prompt = app.query_one(PromptInput)
    prompt.text = text
    before = len(app.query(ChatMessage))
    await pilot.press("enter")
    await _until(pilot, lambda: len(app.query(ChatMessage)) > before)
    reply = list(app.query(ChatMessage))[-1]
    await _until(pilot, lambda: reply.is_final)
    return reply


async def _last_reply(app: ChatApp) -> Any:
    assert app.conversation_id is not None
    return (await app.store.load(app.conversation_id)).messages[-1]


def _notes(app: ChatApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def _palette(pilot: Any, app: ChatApp, query: str) -> list[str]:
    """Opens the palette, searches ``query`` and returns its entries once the search is over, each
    ``title\nhelp``."""
    await pilot.press("ctrl+p")
    await _until(pilot, lambda: isinstance(app.screen, CommandPalette))
    palette = app.screen
    palette.query_one(Input).value = query

    def searching() -> bool:
        # The palette gathers hits in workers of its own; while one runs, the list can still change.
        return any(w.node is palette and w.state in (WorkerState.PENDING, WorkerState.RUNNING)
                   for w in app.workers)

    await pilot.pause()
    await _until(pilot, lambda: palette.has_class("-ready") and not searching())
    return _options(app)


async def _run(pilot: Any, app: ChatApp, query: str, title: str) -> None:
    """Runs the palette entry titled ``title``, found by searching ``query``."""
    titles = [e.split("\n")[0] for e in await _palette(pilot, app, query)]
    assert title in titles, titles
    app.screen.query_one(CommandList).highlighted = titles.index(title)
    await pilot.press("enter")
    await _until(pilot, lambda: not isinstance(app.screen, CommandPalette))


def _options(app: ChatApp) -> list[str]:
    if not isinstance(app.screen, CommandPalette):
        return []
    listing = app.screen.query_one(CommandList)
    return [str(listing.get_option_at_index(i).prompt) for i in range(listing.option_count)]


async def _type(pilot: Any, text: str) -> None:
    await pilot.press(*("space" if c == " " else c for c in text))


# -- the history keeps them ----------------------------------------------------------------------------------
async def test_todays_history_migrates_and_keeps_its_conversations(tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite3"
    make_old_history(db, version=2)  # exactly what llmchat made before it kept these settings
    async with HistoryStore(db) as store:
        old = await store.load(1)
        assert (old.title, old.system_prompt, old.info.provider, old.info.model) == (
            "old one", "Be brief.", "slow-llama", "llama3")
        assert [(m.role, m.content) for m in old.messages] == [("user", "how slow?"), ("assistant", "very")]
        assert old.origin == "" and old.base_url == "" and old.generation == Generation()  # sent with none
        await store.set_generation(1, Generation(temperature=0.0, seed=7, max_tokens=64))
        await store.set_endpoint(1, provider="slow-llama", model="llama3", origin="provider",
                                 base_url="http://gpu-box:8000/v1/")
        new = await store.new_conversation(provider="custom", model="m", origin="base_url",
                                           base_url=f"http://me:{KEY}@127.0.0.1:9/v1?api-key={KEY}&v=2",
                                           generation=Generation(seed=-3))
        offline = await store.new_conversation(provider="local", model=MODEL, origin="offline",
                                               base_url="http://127.0.0.1:41234/v1")
        reply = await store.start_reply(new, provider="custom", model="m", mode="batch", origin="base_url",
                                        base_url=f"http://127.0.0.1:9/v1?token={KEY}")
        assert reply > 2
        resumed, adhoc, demo = await store.load(1), await store.load(new), await store.load(offline)
    assert peek(db, "PRAGMA user_version") == [(len(MIGRATIONS),)]
    assert peek(db, "PRAGMA integrity_check") == [("ok",)]
    assert resumed.generation == Generation(temperature=0.0, seed=7, max_tokens=64)
    assert (resumed.origin, resumed.base_url) == ("provider", "http://gpu-box:8000/v1")
    # Never a key: not the URL's password, not a query parameter that looks like one.
    assert (adhoc.origin, adhoc.base_url) == ("base_url", "http://127.0.0.1:9/v1")
    assert adhoc.generation == Generation(seed=-3)
    # The offline demo's server is "the local server": its port is that run's, not an address to keep.
    assert (demo.origin, demo.base_url) == ("offline", "")
    for path in db.parent.iterdir():
        assert KEY.encode() not in path.read_bytes(), path


@pytest.mark.parametrize(("text", "expected"), [
    ("# Title\ntext\n## Part\n### Deeper", "### Title\ntext\n#### Part\n##### Deeper"),
    ("#### four\n##### five\n###### six", "###### four\n###### five\n###### six"),  # Markdown stops at 6
    ("```python\n# a comment\n## not a heading\n```\n# after",
     "```python\n# a comment\n## not a heading\n```\n### after"),
    ("~~~~\n# x\n~~~\n# still code\n~~~~", "~~~~\n# x\n~~~\n# still code\n~~~~"),
    ("Setext\n======\n\nAnd two\nlines\n---", "### Setext\n\n#### And two lines"),
    ("- item\n---\n\n| a |\n---", "- item\n---\n\n| a |\n---"),  # a rule, not an underline
    ("#hashtag and ####### seven", "#hashtag and ####### seven"),  # neither is a heading
])
def test_a_messages_headings_are_nested_under_its_role_heading(text: str, expected: str) -> None:
    assert nest_headings(text) == expected


@pytest.mark.parametrize(("name", "text", "value"), [
    ("temperature", "0", 0.0), ("temperature", " 0.7 ", 0.7), ("temperature", "", None),
    ("seed", "42", 42), ("seed", "-1", -1), ("max_tokens", "1", 1),
])
def test_a_generation_setting_is_read_from_what_was_typed(name: str, text: str, value: object) -> None:
    assert getattr(Generation(temperature=1.0, seed=1, max_tokens=9).with_text(name, text), name) == value


@pytest.mark.parametrize(("name", "text"), [
    ("temperature", "2.5"), ("temperature", "nan"), ("temperature", "warm"), ("seed", "1.5"),
    ("max_tokens", "0"), ("max_tokens", "lots"),
])
def test_a_bad_generation_setting_is_one_line_saying_what_is_wanted(name: str, text: str) -> None:
    with pytest.raises(ValueError) as err:
        Generation().with_text(name, text)
    message = str(err.value)
    assert "\n" not in message and message.startswith(name.replace("_", " ") + " must be") and text in message


# -- exports -------------------------------------------------------------------------------------------------
def test_exports_go_to_their_own_folder_and_never_over_a_file(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path / "home"), "XDG_DATA_HOME": str(tmp_path / "data")}
    assert export_folder("", env) == tmp_path / "data" / "llmchat" / "exports"
    assert export_folder("~/llm exports", env) == tmp_path / "home" / "llm exports"
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "llmchat-3.md").write_text("mine", encoding="utf-8")
    first = save_export(folder, "llmchat-3", ".md", "one")
    second = save_export(folder, "llmchat-3", ".md", "two")
    assert (first.name, second.name) == ("llmchat-3 (2).md", "llmchat-3 (3).md")
    assert (folder / "llmchat-3.md").read_text(encoding="utf-8") == "mine"
    assert first.read_text(encoding="utf-8") == "one" and second.read_text(encoding="utf-8") == "two"
    assert {stat.S_IMODE(p.stat().st_mode) for p in (first, second)} == {0o600}
    made = save_export(tmp_path / "new" / "deeper", "llmchat-1", ".json", "[]")
    assert stat.S_IMODE(made.parent.stat().st_mode) == 0o700
    blocked = tmp_path / "a-file"
    blocked.write_text("", encoding="utf-8")
    with pytest.raises(ExportError) as err:
        save_export(blocked / "exports", "llmchat-1", ".md", "x")  # its "folder" is a file
    assert str(err.value).startswith(f"cannot write the export in {blocked / 'exports'}: ")
    assert "[ui] export_dir" in str(err.value)


async def test_the_app_exports_to_the_stated_folder_never_over_a_file_with_nested_headings(
    local_server: RunningServer, tmp_path: Path
) -> None:
    app = _local_app(local_server, tmp_path)
    exports = tmp_path / "exports"
    async with app.run_test(size=(140, 40)) as pilot:
        reply = await _send(pilot, app, "export me")
        assert reply.text.startswith("## On ")  # the local server's reply opens with a heading of its own
        entries = await _palette(pilot, app, "Export")
        assert f"Export conversation to Markdown\na new llmchat-ID.md in {exports}" in entries
        await pilot.press("escape")
        exports.mkdir()
        (exports / "llmchat-1.md").write_text("someone else's", encoding="utf-8")
        await _run(pilot, app, "Export conversation", "Export conversation to Markdown")
        await _until(pilot, lambda: any("exported to" in n for n in _notes(app)))
        await _run(pilot, app, "Export conversation", "Export conversation to Markdown")
        await _run(pilot, app, "Export timing", "Export timing records to JSON")
        await _until(pilot, lambda: sum("exported to" in n for n in _notes(app)) == 3)
        said = [n for n in _notes(app) if "exported to" in n]
    assert said == [f"exported to {exports / name}" for name in ("llmchat-1 (2).md", "llmchat-1 (3).md",
                                                                 "llmchat-1.json")]
    assert (exports / "llmchat-1.md").read_text(encoding="utf-8") == "someone else's"
    md = (exports / "llmchat-1 (2).md").read_text(encoding="utf-8")
    assert "## Assistant\n\n#### On " in md and "\n## On " not in md
    assert stat.S_IMODE((exports / "llmchat-1 (2).md").stat().st_mode) == 0o600


# -- generation settings -------------------------------------------------------------------------------------
async def test_temperature_0_from_the_palette_makes_a_batch_prompt_asked_twice_a_cache_hit(
    local_server: RunningServer, tmp_path: Path
) -> None:
    app = _local_app(local_server, tmp_path)  # default settings: cache policy "deterministic", no temperature
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("ctrl+b")
        first = await _send(pilot, app, "same question twice")
        await pilot.press("ctrl+n")
        again = await _send(pilot, app, "same question twice")
        assert (first.status, again.status) == ("done", "done")  # without a temperature nothing is cached
        await _run(pilot, app, "Set temperature", "Set temperature")
        await _until(pilot, lambda: isinstance(app.screen, TextInputScreen))
        await _type(pilot, "0")
        await pilot.press("enter")
        await _until(pilot, lambda: app.generation.temperature == 0)
        await pilot.press("ctrl+n")
        await _until(pilot, lambda: not app.query(ChatMessage))
        miss = await _send(pilot, app, "same question twice")
        await pilot.press("ctrl+n")
        await _until(pilot, lambda: not app.query(ChatMessage))
        hit = await _send(pilot, app, "same question twice")
        assert (miss.status, hit.status) == ("done", "cached") and hit.text == miss.text
        # Said once, and sensibly: the model and how long the lookup took; no rate, no first-token time.
        assert re.fullmatch(r"from cache · llmchat-local · \d+ ms", hit.rendered_text().splitlines()[-1])
        conv = await app.store.load(app.conversation_id)  # type: ignore[arg-type]
    assert conv.generation == Generation(temperature=0.0)  # the new conversation kept it


async def test_generation_settings_from_config_and_palette_are_sent_saved_and_resumed(
    local_server: RunningServer, tmp_path: Path
) -> None:
    settings = _settings(tmp_path, ui=UISettings(max_tokens=7, seed=11, export_dir=str(tmp_path / "x")))
    app = _local_app(local_server, tmp_path, settings)
    async with app.run_test(size=(140, 40)) as pilot:
        await _send(pilot, app, "short please")
        assert (await _last_reply(app)).record["output_tokens"] == 7  # [ui] max_tokens went with it
        entries = await _palette(pilot, app, "Set")
        assert "Set max tokens\nnow 7 · the longest reply" in entries
        assert "Set seed\nnow 11 · a seed makes batch replies cacheable" in entries
        await pilot.press("escape")
        await _run(pilot, app, "Set max tokens", "Set max tokens")
        await _until(pilot, lambda: isinstance(app.screen, TextInputScreen))
        box = app.screen.query_one(Input)
        assert box.value == "7"
        box.value = "lots"
        await pilot.press("enter")
        problem = app.screen.query_one("#problem")
        await _until(pilot, lambda: problem.display)
        # The box stays open with what was typed, and says what is wanted.
        assert isinstance(app.screen, TextInputScreen) and box.value == "lots"
        assert "max tokens must be a whole number of at least 1" in str(problem.render())
        box.value = "4"
        await pilot.press("enter")
        await _until(pilot, lambda: app.generation.max_tokens == 4)
        await _send(pilot, app, "shorter")
        assert (await _last_reply(app)).record["output_tokens"] == 4
        conv_id = app.conversation_id
    assert conv_id is not None
    again = _local_app(local_server, tmp_path, settings, continue_last=True)
    async with again.run_test(size=(140, 40)) as pilot:
        await _until(pilot, lambda: again.conversation_id == conv_id)
        assert again.generation == Generation(seed=11, max_tokens=4)
        await _send(pilot, again, "and once more")
        assert (await _last_reply(again)).record["output_tokens"] == 4


# -- the system prompt ---------------------------------------------------------------------------------------
async def test_the_system_prompt_editor_takes_several_lines_saves_with_ctrl_s_and_esc_cancels(
    local_server: RunningServer, tmp_path: Path
) -> None:
    app = _local_app(local_server, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        await _send(pilot, app, "hello")
        await _run(pilot, app, "Edit system", "Edit system prompt")
        await _until(pilot, lambda: isinstance(app.screen, SystemPromptScreen))
        await _type(pilot, "Be brief.")
        await pilot.press("enter")  # a new line, not a save
        await _type(pilot, "Answer in French.")
        assert isinstance(app.screen, SystemPromptScreen)
        await pilot.press("ctrl+s")
        await _until(pilot, lambda: app.system_prompt == "Be brief.\nAnswer in French.")
        entries = await _palette(pilot, app, "Edit system")
        assert "Edit system prompt\nnow: Be brief. Answer in French. · for this conversation" in entries
        await pilot.press("escape")
        await _run(pilot, app, "Edit system", "Edit system prompt")
        await _until(pilot, lambda: isinstance(app.screen, SystemPromptScreen))
        assert app.screen.query_one(TextArea).text == "Be brief.\nAnswer in French."
        await _type(pilot, " And more.")
        await pilot.press("escape")
        await _until(pilot, lambda: not isinstance(app.screen, SystemPromptScreen))
        assert app.system_prompt == "Be brief.\nAnswer in French."
        await _run(pilot, app, "Edit system", "Edit system prompt")
        await _until(pilot, lambda: isinstance(app.screen, SystemPromptScreen))
        app.screen.query_one(TextArea).text = "  \n"
        await pilot.click("#save")
        await _until(pilot, lambda: app.system_prompt == "")
        assert "system prompt cleared" in _notes(app)
        await _run(pilot, app, "Edit system", "Edit system prompt")
        await _until(pilot, lambda: isinstance(app.screen, SystemPromptScreen))
        app.screen.query_one(TextArea).text = "Only this."
        await pilot.press("ctrl+s")
        await _until(pilot, lambda: app.system_prompt == "Only this.")
        await _send(pilot, app, "and now")  # the store saves in order: the prompt is saved by now
        conv = await app.store.load(app.conversation_id)  # type: ignore[arg-type]
    assert conv.system_prompt == "Only this."
    assert conv.messages_for_api()[0] == {"role": "system", "content": "Only this."}


# -- the palette marks what is in use ------------------------------------------------------------------------
async def test_the_palette_marks_the_current_provider_and_model(
    local_server: RunningServer, slow: RunningServer, tmp_path: Path
) -> None:
    app = _configured_app(local_server, slow, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        entries = await _palette(pilot, app, "Model")
        assert f"Model: fast / {MODEL}\n{CURRENT}" in entries
        assert f"Model: slow-llama / {BIG}\nuse it from the next message" in entries
        await pilot.press("escape")
        await _run(pilot, app, "Model: slow", f"Model: slow-llama / {BIG}")
        await _until(pilot, lambda: app.client.endpoint.name == "slow-llama")
        entries = await _palette(pilot, app, "Provider")
        assert f"Provider: slow-llama\n{CURRENT}" in entries
        assert "Provider: fast\nuse it from the next message" in entries
        await pilot.press("escape")
        reply = await _send(pilot, app, "which one?")
        assert reply.status == "done" and (await _last_reply(app)).model == BIG


async def test_picking_a_model_on_the_demo_server_keeps_the_badge_saying_offline_demo(
    local_server: RunningServer, tmp_path: Path
) -> None:
    settings = _settings(tmp_path)
    client = ChatClient(settings, provider="local", base_url=local_server.base_url, model=MODEL, http2="h2c")
    app = _app(settings, client, tmp_path, offline=Offline(local_server.base_url))
    async with app.run_test(size=(140, 40)) as pilot:
        entries = await _palette(pilot, app, "Model")
        assert f"Model: local / {MODEL}\n{CURRENT}" in entries
        await pilot.press("escape")
        await _run(pilot, app, "Model: local", "Model: local / llmchat-local-large")
        await _until(pilot, lambda: app.client.model == "llmchat-local-large")
        badge = str(app.query_one("#badge").render())
        assert badge == "local server (offline demo) · llmchat-local-large · stream"


# -- resuming reconnects -------------------------------------------------------------------------------------
async def test_continue_goes_on_with_the_provider_and_model_the_conversation_was_held_with(
    local_server: RunningServer, slow: RunningServer, tmp_path: Path
) -> None:
    app = _configured_app(local_server, slow, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        await app.switch_provider("slow-llama", BIG)
        await _send(pilot, app, "on the big one")
    # A new run starts on the default provider, as `llmchat --continue` does.
    again = _configured_app(local_server, slow, tmp_path, continue_last=True)
    async with again.run_test(size=(140, 40)) as pilot:
        await _until(pilot, lambda: again.conversation_id is not None)
        assert (again.client.endpoint.name, again.client.model) == ("slow-llama", BIG)
        assert str(again.query_one("#badge").render()).startswith(f"slow-llama · {slow.url.removeprefix('http://')}")
        reply = await _send(pilot, again, "still the big one?")
        saved = await _last_reply(again)
        notes = _notes(again)
    assert reply.status == "done" and (saved.provider, saved.model) == ("slow-llama", BIG)
    assert saved.record["host"] == slow.url.removeprefix("http://")
    assert not [n for n in notes if "held with" in n]  # reconnected: nothing to say


async def test_a_provider_not_configured_here_is_one_notification_naming_what_is_used_instead(
    local_server: RunningServer, tmp_path: Path
) -> None:
    db = tmp_path / "history.sqlite3"
    async with HistoryStore(db) as store:
        conv = await store.new_conversation(provider="slow-llama", model=BIG, origin="provider",
                                            base_url="http://gpu-box:8000/v1")
        await store.add_user_message(conv, "remember the remote one")
    settings = _settings(tmp_path, providers={"fast": _providers(local_server, local_server)["fast"]})
    app = _app(settings, ChatClient(settings, provider="fast"), tmp_path, continue_last=True)
    async with app.run_test(size=(140, 40)) as pilot:
        await _until(pilot, lambda: any("held with" in n for n in _notes(app)))
        said = [n for n in _notes(app) if "held with" in n]
        here = local_server.url.removeprefix("http://")
        assert said == [f"this conversation was held with slow-llama · {BIG} (gpu-box:8000), which is not"
                        f" configured here; the next message goes to fast · {MODEL} ({here})"]
        reply = await _send(pilot, app, "then answer here")
        saved = await _last_reply(app)
    assert reply.status == "done" and (saved.provider, saved.model) == ("fast", MODEL)


async def test_an_ad_hoc_base_url_conversation_reconnects_to_its_url_and_keeps_no_key(
    local_server: RunningServer, slow: RunningServer, tmp_path: Path
) -> None:
    settings = _settings(tmp_path, providers={"fast": _providers(local_server, slow)["fast"]})
    # As `llmchat --base-url URL --api-key-env VAR` builds it: provider "custom", a key for this run only.
    adhoc = ChatClient(settings, base_url=slow.base_url, model=BIG, api_key=KEY)
    app = _app(settings, adhoc, tmp_path, pinned=True)
    async with app.run_test(size=(140, 40)) as pilot:
        await _send(pilot, app, "on an ad-hoc server")
    again = _configured_app(local_server, slow, tmp_path, continue_last=True)
    async with again.run_test(size=(140, 40)) as pilot:
        await _until(pilot, lambda: again.conversation_id is not None)
        assert (again.client.endpoint.name, again.client.endpoint.base_url, again.client.model) == (
            "custom", slow.base_url, BIG)
        reply = await _send(pilot, again, "still there?")
        saved = await _last_reply(again)
    assert reply.status == "done" and saved.record["host"] == slow.url.removeprefix("http://")
    assert peek(tmp_path / "history.sqlite3", "SELECT origin, base_url FROM conversations") == [
        ("base_url", slow.base_url)]
    for path in tmp_path.glob("history.sqlite3*"):
        assert KEY.encode() not in path.read_bytes(), path


async def test_an_offline_demo_conversation_goes_on_with_this_runs_local_server(
    local_server: RunningServer, server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    settings = _settings(tmp_path)

    def offline_app(server: RunningServer, **kw: Any) -> ChatApp:
        client = ChatClient(settings, provider="local", base_url=server.base_url, model=MODEL, http2="h2c")
        return _app(settings, client, tmp_path, offline=Offline(server.base_url), **kw)

    app = offline_app(local_server)
    async with app.run_test(size=(140, 40)) as pilot:
        await app.switch_provider("local", "llmchat-local-large")
        await _send(pilot, app, "on the demo")
    assert peek(tmp_path / "history.sqlite3", "SELECT origin, base_url, model FROM conversations") == [
        ("offline", "", "llmchat-local-large")]
    tomorrow = server_factory(profile="instant")  # the next run's demo server: another port
    again = offline_app(tomorrow, continue_last=True)
    async with again.run_test(size=(140, 40)) as pilot:
        await _until(pilot, lambda: again.conversation_id is not None)
        assert again.client.endpoint.base_url == tomorrow.base_url
        assert again.client.model == "llmchat-local-large"
        assert str(again.query_one("#badge").render()).startswith("local server (offline demo)")
        await _send(pilot, again, "still the demo")
        saved = await _last_reply(again)
        notes = _notes(again)
    assert saved.record["host"] == tomorrow.url.removeprefix("http://")
    assert not [n for n in notes if "held with" in n]


async def test_an_offline_demo_conversation_with_a_provider_configured_says_where_it_goes(
    local_server: RunningServer, tmp_path: Path
) -> None:
    async with HistoryStore(tmp_path / "history.sqlite3") as store:
        conv = await store.new_conversation(provider="local", model=MODEL, origin="offline")
        await store.add_user_message(conv, "from the demo days")
    settings = _settings(tmp_path, providers={"fast": _providers(local_server, local_server)["fast"]})
    app = _app(settings, ChatClient(settings, provider="fast"), tmp_path, continue_last=True)
    async with app.run_test(size=(140, 40)) as pilot:
        await _until(pilot, lambda: any("held with" in n for n in _notes(app)))
        [said] = [n for n in _notes(app) if "held with" in n]
    assert said.startswith(f"this conversation was held with the offline demo's local server · {MODEL}, which"
                           " this llmchat does not start")
    assert said.endswith(f"the next message goes to fast · {MODEL} ({local_server.url.removeprefix('http://')})")


async def test_opening_from_the_history_list_reconnects_too(
    local_server: RunningServer, slow: RunningServer, tmp_path: Path
) -> None:
    app = _configured_app(local_server, slow, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        await app.switch_provider("slow-llama")
        await _send(pilot, app, "the big one")
        held = app.conversation_id
        await pilot.press("ctrl+n")
        await app.switch_provider("fast")
        await _send(pilot, app, "the small one")
        assert app.client.endpoint.name == "fast"
        await app._open_from_history(held)
        assert (app.conversation_id, app.client.endpoint.name, app.client.model) == (held, "slow-llama", BIG)


async def test_names_given_on_the_command_line_win_over_the_conversations_own(
    local_server: RunningServer, slow: RunningServer, tmp_path: Path
) -> None:
    app = _configured_app(local_server, slow, tmp_path, "slow-llama")
    async with app.run_test(size=(140, 40)) as pilot:
        await _send(pilot, app, "big")
    # `llmchat --continue --provider fast`
    again = _configured_app(local_server, slow, tmp_path, continue_last=True, pinned=True)
    async with again.run_test(size=(140, 40)) as pilot:
        await _until(pilot, lambda: any("held with" in n for n in _notes(again)))
        assert again.client.endpoint.name == "fast"
        [said] = [n for n in _notes(again) if "held with" in n]
    far, here = slow.url.removeprefix("http://"), local_server.url.removeprefix("http://")
    assert said == (f"this conversation was held with slow-llama · {BIG} ({far}); it goes on with fast"
                    f" · {MODEL} ({here}), as the command line asks")


async def test_a_conversation_from_before_llmchat_kept_its_settings_resumes_by_its_providers_name(
    local_server: RunningServer, slow: RunningServer, tmp_path: Path
) -> None:
    make_old_history(tmp_path / "history.sqlite3", version=2)  # held with "slow-llama", model "llama3"
    app = _configured_app(local_server, slow, tmp_path, continue_last=True)
    async with app.run_test(size=(140, 40)) as pilot:
        await _until(pilot, lambda: app.conversation_id == 1)
        assert (app.client.endpoint.name, app.client.model) == ("slow-llama", "llama3")
        assert app.system_prompt == "Be brief." and app.generation == Generation()


def test_the_markdown_export_of_a_resumed_conversation_nests_headings(tmp_path: Path) -> None:
    import asyncio

    async def fill() -> str:
        async with HistoryStore(tmp_path / "h.sqlite3") as store:
            conv = await store.new_conversation(title="t", system_prompt="# Rules\nbe kind")
            await store.add_user_message(conv, "# my heading")
            writer = store.reply_writer(await store.start_reply(conv, provider="p", model="m", mode="stream"))
            writer.append("# Answer\n\n```sh\n# keep me\n```")
            await writer.finish(status="done")
            return export_markdown(await store.load(conv))

    md = asyncio.run(fill())
    assert "## System prompt\n\n### Rules\nbe kind" in md
    assert "## You\n\n### my heading" in md
    assert "## Assistant\n\n### Answer\n\n```sh\n# keep me\n```" in md
