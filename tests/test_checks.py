"""Settings only the faces can check are checked before the screen opens: a theme Textual does not have is one
line naming the closest (exit status 2), from `llmchat config check` and from `llmchat` itself; an app built
another way says so on screen and goes on with the default theme."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_app import _app, _send, _settings, _until
from test_app_keys import record_notes

from llmchat.core import UISettings
from llmchat.core.server import RunningServer
from llmchat.tui.app import ChatApp
from llmchat.tui.checks import check_face_settings, check_theme
from llmchat.tui.cli import main

GRUVBX = 'llmchat: ui.theme: "gruvbx" is not a Textual theme (did you mean "gruvbox"?)\n'


def _write(tmp_path: Path, text: str) -> Path:
    config = tmp_path / "config.toml"
    config.write_text(text, encoding="utf-8")
    return config


def test_config_check_names_the_theme_meant(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["--config", str(_write(tmp_path, '[ui]\ntheme = "gruvbx"\n')), "config", "check"]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", GRUVBX)
    assert main(["--config", str(_write(tmp_path, '[ui]\ntheme = "zzzzzz"\n')), "config", "check"] ) == 2
    err = capsys.readouterr().err
    assert err.startswith('llmchat: ui.theme: "zzzzzz" is not a Textual theme (the Textual themes: ')
    assert "nord" in err and err.count("\n") == 1
    assert main(["--config", str(_write(tmp_path, '[ui]\ntheme = "nord"\n')), "config", "check"]) == 0


def test_the_app_does_not_start_on_an_unknown_theme(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def started(self: ChatApp, *a: Any, **kw: Any) -> None:
        raise AssertionError("the app started with an unknown theme")

    monkeypatch.setattr(ChatApp, "run", started)
    assert main(["--config", str(_write(tmp_path, '[ui]\ntheme = "gruvbx"\n'))]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", GRUVBX)


async def test_an_app_built_with_an_unknown_theme_says_so_and_runs(
    local_server: RunningServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = _app(local_server, tmp_path, settings=_settings(tmp_path, ui=UISettings(theme="gruvbx")))
    notes = record_notes(app, monkeypatch)
    async with app.run_test(size=(120, 30)) as pilot:
        await _until(pilot, lambda: any('"gruvbx" is not a Textual theme' in n for n in notes))
        assert app.theme == "textual-dark"
        reply = await _send(pilot, app, "still chatting")
        await _until(pilot, lambda: reply.is_final)




def test_every_builtin_theme_passes_and_the_keymap_is_checked_with_it() -> None:
    from textual.theme import BUILTIN_THEMES

    from llmchat.core import ConfigError, Settings

    for name in BUILTIN_THEMES:
        check_theme(name)
    with pytest.raises(ConfigError, match='keymap: "prompt.sned"'):
        check_face_settings(Settings(keymap={"prompt.sned": "ctrl+s"}))


@pytest.mark.parametrize("config", ['[ui]\ntheme = "gruvbx"\n', '[cache]\npolicy = "alwasy"\n',
                                    '[http]\nhttp2 = "h2"\n', '[server]\nprofile = "chta"\n',
                                    '[keymap]\n"prompt.sned" = "ctrl+s"\n'])
def test_the_app_and_config_check_refuse_a_mistyped_choice_with_the_same_line(
    config: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def started(self: ChatApp, *a: Any, **kw: Any) -> None:
        raise AssertionError("the app started with a mistyped choice")

    monkeypatch.setattr(ChatApp, "run", started)
    path = str(_write(tmp_path, config))
    assert main(["--config", path, "config", "check"]) == 2
    checked = capsys.readouterr()
    assert main(["--config", path]) == 2
    started_with = capsys.readouterr()
    assert checked == started_with and checked.out == ""
    assert checked.err.count("\n") == 1 and "did you mean" in checked.err, checked.err


def test_a_server_profile_none_is_close_to_lists_them(capsys: pytest.CaptureFixture[str],
                                                      tmp_path: Path) -> None:
    assert main(["--config", str(_write(tmp_path, '[server]\nprofile = "zzz"\n')), "config", "check"]) == 2
    assert capsys.readouterr().err == ('llmchat: server.profile: "zzz" is not a server profile '
                                       "(the server profiles: chat, flaky, instant, slow)\n")
