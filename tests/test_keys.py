"""Keys are a contract: one registry of binding ids, every binding in it, ``[keymap]`` checked against it,
the help screen (F1) and the README showing it."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from collections import defaultdict
from itertools import groupby
from pathlib import Path
from typing import Any

import pytest
from test_app import _app, _settings, _until
from textual.binding import Binding
from textual.dom import DOMNode
from textual.widgets import DataTable

import llmchat.tui
from llmchat.core import ConfigError, load_settings
from llmchat.core.server import RunningServer
from llmchat.tui.app import ChatApp
from llmchat.tui.cli import main
from llmchat.tui.keys import BY_ID, REGISTRY, check_keymap, effective_keys, key_label, key_names
from llmchat.tui.screens.help import HelpScreen
from llmchat.tui.screens.history import HistoryScreen

REPO = Path(__file__).resolve().parents[1]


def _tui_classes() -> list[type[DOMNode]]:
    """Every app, screen and widget class defined under llmchat.tui that declares BINDINGS of its own."""
    found = []
    for info in pkgutil.walk_packages(llmchat.tui.__path__, "llmchat.tui."):
        if info.name.endswith("__main__"):  # runs the command line
            continue
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and issubclass(cls, DOMNode) and "BINDINGS" in cls.__dict__:
                found.append(cls)
    return found


def test_every_binding_of_every_screen_and_widget_is_in_the_registry_with_its_default_keys() -> None:
    classes = _tui_classes()
    assert {c.__name__ for c in classes} >= {"ChatApp", "PromptInput", "HistoryScreen", "HelpScreen", "Hud"}
    keys: dict[tuple[str, str], list[str]] = defaultdict(list)
    unnamed: list[str] = []
    for cls in classes:
        for b in Binding.make_bindings(cls.__dict__["BINDINGS"]):
            if b.id is None:
                unnamed.append(cls.__name__)
            else:
                keys[(cls.__name__, b.id)].append(b.key)
    assert unnamed == [], "a binding without an id cannot be remapped"
    owners: dict[str, list[str]] = defaultdict(list)
    for (owner, bid), bound in keys.items():
        assert bid in BY_ID, f"{owner} binds {bid}, which the registry does not have"
        assert bound == list(key_names(BY_ID[bid].keys)), f"{owner}'s {bid} differs from the registry"
        owners[bid].append(owner)
    assert {bid: o for bid, o in owners.items() if len(o) > 1} == {}, "one id, one binding"
    assert sorted(set(BY_ID) - set(owners)) == [], "registry entries nothing binds"
    assert len(BY_ID) == len(REGISTRY)
    # One class, one place where its keys apply.
    where = {owner: {BY_ID[bid].where for (o, bid) in keys if o == owner} for owner, _ in keys}
    assert {o: w for o, w in where.items() if len(w) > 1} == {}


def test_every_default_passes_the_check_and_ids_read_as_area_dot_verb() -> None:
    check_keymap({b.id: b.keys for b in REGISTRY})
    assert [b.id for b in REGISTRY if not re.fullmatch(r"[a-z]+(\.[a-z]+)+", b.id)] == []
    places = [where for where, _ in groupby(REGISTRY, key=lambda b: b.where)]
    assert len(places) == len(set(places)), "the help screen shows each place once: keep them together"


@pytest.mark.parametrize(
    ("keymap", "message"),
    [
        ({"prompt.sned": "ctrl+s"}, '"prompt.sned" is not a key binding id (did you mean "prompt.send"?)'),
        ({"send": "ctrl+s"}, '"send" is not a key binding id (did you mean "prompt.send"?)'),
        ({"history.renam": "e"}, '"history.renam" is not a key binding id (did you mean "history.rename"?)'),
        ({"quit": "ctrl+c"}, '"quit" is not a key binding id (did you mean "app.quit"?)'),
        ({"zzz": "x"}, '"zzz" is not a key binding id (the ids: ' + ", ".join(BY_ID) + ")"),
        ({"prompt.send": "ctrl+"}, '"ctrl+" for "prompt.send" is not a key Textual knows'),
        ({"prompt.send": "ctrl+s,"}, '"" in "ctrl+s," for "prompt.send" is not a key Textual knows'),
        ({"mode.toggle": "control+b"}, '"control+b" for "mode.toggle" is not a key Textual knows'),
        ({"mode.toggle": "ctrl+?"}, '"ctrl+?" for "mode.toggle" is not a key Textual knows'),
        ({"copy.code": "f4, flour"}, '"flour" in "f4, flour" for "copy.code" is not a key Textual knows'),
    ],
)
def test_a_bad_keymap_is_one_line_naming_the_id_or_key(keymap: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_keymap(keymap)
    assert str(err.value).startswith(f"keymap: {message}") and "\n" not in str(err.value)


def test_keys_textual_reads_pass() -> None:
    check_keymap({"prompt.send": "ctrl+s", "prompt.newline": "enter, ctrl+j", "help.open": "?",
                  "history.open": "ctrl+question_mark", "copy.code": "shift+f4", "app.quit": "super+q",
                  "hud.toggle": "slash"})


def test_key_labels_read_as_the_readme_writes_them() -> None:
    assert key_label("ctrl+o") == "Ctrl+O"
    assert key_label("shift+enter,ctrl+j,alt+enter") == "Shift+Enter / Ctrl+J / Alt+Enter"
    assert key_label("escape,d") == "Esc / d"
    assert key_label("?") == "?" and key_label("f1") == "F1"
    assert effective_keys({"prompt.send": "ctrl+s"})["prompt.send"] == "ctrl+s"
    assert effective_keys({})["prompt.send"] == "enter"


def _write(tmp_path: Path, text: str) -> Path:
    config = tmp_path / "config.toml"
    config.write_text(text, encoding="utf-8")
    return config


def test_config_check_reports_a_bad_keymap(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = _write(tmp_path, '[keymap]\n"history.opne" = "ctrl+h"\n')
    assert main(["--config", str(config), "config", "check"]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", 'llmchat: keymap: "history.opne" is not a key binding id (did you mean '
                              '"history.open"?)\n')
    config = _write(tmp_path, '[keymap]\n"history.open" = "f6"\n')
    assert main(["--config", str(config), "config", "check"]) == 0


def test_the_app_does_not_start_on_a_bad_keymap(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def started(self: ChatApp, *a: Any, **kw: Any) -> None:
        raise AssertionError("the app started with a bad keymap")

    monkeypatch.setattr(ChatApp, "run", started)
    config = _write(tmp_path, '[keymap]\n"prompt.send" = "ctrl+enterr"\n')
    assert main(["--config", str(config)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith('llmchat: keymap: "ctrl+enterr" for "prompt.send" is not a key')
    assert err.count("\n") == 1 and "Traceback" not in err


def test_the_examples_keymap_loads_and_passes_the_check(tmp_path: Path) -> None:
    text = (REPO / "config.example.toml").read_text(encoding="utf-8")
    section = text.split("\n[keymap]\n", 1)[1]
    lines = [line[2:] for line in section.splitlines() if re.match(r'^# "[a-z.]+" = ', line)]
    assert len(lines) >= 2
    keymap = load_settings(_write(tmp_path, "[keymap]\n" + "\n".join(lines) + "\n"), env={}).keymap
    assert set(keymap) <= set(BY_ID) and "prompt.send" in keymap
    check_keymap(keymap)


def test_the_readme_lists_every_id() -> None:
    row = next(line for line in (REPO / "README.md").read_text(encoding="utf-8").splitlines()
               if line.startswith("| `llmchat` |"))
    named = set(re.findall(r"`([a-z]+(?:\.[a-z]+)+)`", row))
    assert named == set(BY_ID)


async def test_f1_lists_every_binding_with_the_key_in_effect(
    local_server: RunningServer, tmp_path: Path
) -> None:
    settings = _settings(tmp_path, keymap={"prompt.send": "ctrl+s", "help.close": "q"})
    app = _app(local_server, tmp_path, settings=settings)
    async with app.run_test(size=(140, 50)) as pilot:
        await pilot.press("f1")
        await _until(pilot, lambda: isinstance(app.screen, HelpScreen))
        table = app.screen.query_one(DataTable)
        places = [where for where, _ in groupby(REGISTRY, key=lambda b: b.where)]
        await _until(pilot, lambda: table.row_count == len(REGISTRY) + len(places))
        rows = {bid: table.get_row(bid) for bid in BY_ID}
        assert [str(table.get_row(f"where:{w}")[0]).lower() for w in places] == [w.lower() for w in places]
        assert str(rows["prompt.send"][0]) == "Ctrl+S" and str(rows["history.open"][0]) == "Ctrl+O"
        assert str(rows["help.close"][0]) == "q"
        assert rows["prompt.send"][2] == BY_ID["prompt.send"].help
        await pilot.press("escape")  # moved: Esc is no longer this screen's close key, nor the app's
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("q")
        await _until(pilot, lambda: app.screen is app.screen_stack[0])


@pytest.mark.parametrize("size", [(100, 30), (60, 20)])
async def test_f1_on_a_small_terminal_shows_what_every_key_does_without_scrolling_sideways(
    size: tuple[int, int], local_server: RunningServer, tmp_path: Path
) -> None:
    app = _app(local_server, tmp_path)
    async with app.run_test(size=size) as pilot:
        await pilot.press("f1")
        await _until(pilot, lambda: isinstance(app.screen, HelpScreen))
        table = app.screen.query_one(DataTable)
        places = [where for where, _ in groupby(REGISTRY, key=lambda b: b.where)]
        await _until(pilot, lambda: table.row_count == len(REGISTRY) + len(places))
        await pilot.pause()
        # No column past the table's right edge: what a key does is never scrolled out of sight.
        assert table.virtual_size.width <= table.scrollable_content_region.width, table.virtual_size
        for entry in REGISTRY:
            cells = [str(cell) for cell in table.get_row(entry.id)]
            assert cells[-1] == entry.help and any(entry.id in cell for cell in cells), cells


async def test_over_a_modal_esc_is_the_modals_own(local_server: RunningServer, tmp_path: Path) -> None:
    app = _app(local_server, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        await app.store.new_conversation(system_prompt="", provider="local", model="m")
        await pilot.press("ctrl+o")
        await _until(pilot, lambda: isinstance(app.screen, HistoryScreen) and app.screen.loaded)
        await pilot.press("r", "x")
        await _until(pilot, lambda: app.screen.mode == "rename")  # type: ignore[attr-defined]
        await pilot.press("escape")  # backs out of the rename; the list stays
        await _until(pilot, lambda: app.screen.mode == "list")  # type: ignore[attr-defined]
        assert isinstance(app.screen, HistoryScreen)
        await pilot.press("escape")
        await _until(pilot, lambda: app.screen is app.screen_stack[0])
