"""The app's state outside its running life: reactives set before start-up or after exit, a frame's report
arriving once the HUD is gone. None of it may touch a screen that is not there."""

from __future__ import annotations

from pathlib import Path

from test_app import _app

from llmchat.core.server import RunningServer
from llmchat.tui.widgets.chat import ChatMessage
from llmchat.tui.widgets.hud import Hud


async def test_hud_and_mode_set_before_start_or_after_exit_do_not_touch_the_screen(
    local_server: RunningServer, tmp_path: Path
) -> None:
    app = _app(local_server, tmp_path)
    app.show_hud = False  # no screen yet: the watchers must wait for on_mount, which applies both
    app.stream_mode = False
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.pause()
        assert not app.query_one(Hud).display
        assert "batch" in str(app.query_one("#badge").render()) and app.query_one(Hud).mode == "batch"
        app.show_hud = True
        assert app.query_one(Hud).display
    app.stream_mode = True  # the app has exited


async def test_a_frame_reported_after_the_hud_is_gone_is_dropped(
    local_server: RunningServer, tmp_path: Path
) -> None:
    app = _app(local_server, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        app.on_chat_message_render_lag(ChatMessage.RenderLag(4.0))
        await pilot.pause()
        assert app.query_one(Hud).metrics.series("render_lag") == [4.0]
    # The last frame of a reply can report while exit takes the widgets down.
    app.on_chat_message_render_lag(ChatMessage.RenderLag(4.0))
