"""The chat app: the conversation and prompt on the left, the HUD on the right.

The app never touches httpx: it talks to ``ChatClient`` and listens to the engine's bus. Every reply runs in one
exclusive worker (group ``reply``); "a reply is in flight" is derived from that worker's state, never from a
flag reset in ``finally`` (a cancelled worker's cleanup can run after its replacement started).
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from rich.cells import cell_len
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Static
from textual.worker import Worker, WorkerState

from llmchat.core import (
    APIError,
    ChatClient,
    ConfigError,
    ServerSignals,
    Settings,
    UsageError,
    Warmer,
    default_config_path,
)
from llmchat.core._history import ConversationNotFoundError, HistoryError, HistoryStore, ReplyWriter
from llmchat.core._prometheus import start_exporter
from llmchat.core._requestlog import attach_observers
from llmchat.core._timing import TimingRecord
from llmchat.tui.checks import check_theme
from llmchat.tui.fit import fit
from llmchat.tui.keys import binding, effective_keys, key_label
from llmchat.tui.palette import ProviderCommands
from llmchat.tui.request_state import RequestWatch
from llmchat.tui.screens.help import HelpScreen
from llmchat.tui.screens.history import HistoryScreen
from llmchat.tui.screens.text_input import TextInputScreen
from llmchat.tui.widgets.chat import ChatMessage, Conversation, PromptInput, Status, UserMessage
from llmchat.tui.widgets.footer import KeyFooter
from llmchat.tui.widgets.hud import Hud

NARROW = 100  # columns under which the HUD folds away by itself
_TITLE_ROOM = 24  # cells of the conversation's title the badge leaves room for on a narrow terminal
W = TypeVar("W", bound=Widget)
_SHOWN_AS: dict[str, Status] = {
    "cancelled": "cancelled", "interrupted": "interrupted", "streaming": "interrupted", "error": "error"}
"""How a stored reply's status shows ("streaming": the process writing it was killed); any other is done."""


@dataclass(frozen=True, slots=True)
class Offline:
    """Set when the app talks to a local server it started itself: the badge says so."""

    base_url: str


def reply_note(summary: dict[str, Any] | None) -> str:
    """The compact line under a finished reply, from its record's summary: model, HTTP version, TTFT, rate."""
    if not summary:
        return ""
    parts = [str(summary.get("model") or "")]
    if summary.get("cache_hit"):
        parts.append("from cache")
    elif summary.get("http_version"):
        parts.append(str(summary["http_version"]))
    if summary.get("mode") == "stream" and summary.get("ttft_ms") is not None:
        parts.append(f"TTFT {summary['ttft_ms']:.0f} ms")
    if summary.get("total_ms") is not None:
        parts.append(f"total {summary['total_ms']:.0f} ms")
    if summary.get("tokens_per_s"):
        parts.append(f"{summary['tokens_per_s']:.0f} tok/s")
    if summary.get("retries"):
        parts.append(f"{summary['retries']} retries")
    return " · ".join(p for p in parts if p)


class ChatApp(App[None]):
    """llmchat's interactive chat. Build it with :func:`make_app`."""

    CSS_PATH = "app.tcss"
    TITLE = "llmchat"
    COMMANDS = App.COMMANDS | {ProviderCommands}

    # Keys, labels and ids come from the registry (tui/keys.py), which [keymap] is checked against.
    BINDINGS: ClassVar[list[BindingType]] = [
        binding("mode.toggle", "toggle_mode"),
        binding("reply.cancel", "cancel_reply"),
        binding("hud.toggle", "toggle_hud"),
        binding("hud.overlay", "hud_overlay"),
        binding("hud.charts", "hud_detail"),
        binding("copy.reply", "copy_reply"),
        binding("copy.code", "copy_code"),
        binding("history.open", "history"),
        binding("conversation.new", "new_conversation"),
        binding("help.open", "keys_help"),
        binding("app.quit", "quit", priority=True),
    ]

    stream_mode: reactive[bool] = reactive(True)
    show_hud: reactive[bool] = reactive(True)
    hud_over_chat: reactive[bool] = reactive(False)
    """The HUD is shown over the chat's right side (``hud.overlay``), whatever the width and ``show_hud``."""

    def __init__(
        self,
        *,
        settings: Settings,
        client: ChatClient,
        store: HistoryStore,
        conversation_id: int | None = None,
        continue_last: bool = False,
        offline: Offline | None = None,
        clients: dict[str, ChatClient] | None = None,
        metrics_port: int | None = None,
        freeze_gc: bool = False,
    ) -> None:
        super().__init__()
        self._freeze_gc = freeze_gc
        self.settings = settings
        self.client = client
        self.clients: dict[str, ChatClient] = clients if clients is not None else {client.endpoint.name: client}
        self.store = store
        self.offline = offline
        self.conversation_id = conversation_id
        self.continue_last = continue_last
        self.system_prompt = ""
        self.history: list[dict[str, str]] = []
        self.warmer: Warmer | None = None
        self.metrics_port = metrics_port
        self.signals: ServerSignals | None = None
        """Cold-start baselines across runs and the providers' metrics pollers (from mount to unmount)."""
        self._observers: list[Any] = []
        self._last_reply: ChatMessage | None = None
        self.keys_in_effect = effective_keys(settings.keymap)
        """Each binding id's keys, [keymap] over the registry's defaults (checked before the app starts)."""
        # Initial values without running the watchers: nothing is mounted yet.
        self.set_reactive(ChatApp.stream_mode, settings.ui.stream)
        self.set_reactive(ChatApp.show_hud, settings.ui.show_hud)
        self._fold_told = False
        self._theme_problem = ""
        if settings.ui.theme:
            # `llmchat` checked it before the screen opened; an app built another way says so on screen.
            try:
                check_theme(settings.ui.theme)
            except ConfigError as exc:
                self._theme_problem = str(exc)
            else:
                self.theme = settings.ui.theme

    # -- layout ---------------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            with Vertical(id="chat"):
                with Horizontal(id="top"):
                    yield Static(self._title_text(), id="title", markup=False,
                                 classes="" if self.sub_title else "-untitled")
                    yield Static(self._badge_text(), id="badge", markup=False)
                yield Conversation(id="conversation")
                yield PromptInput(id="prompt", send_keys=self.keys_in_effect["prompt.send"],
                                  newline_keys=self.keys_in_effect["prompt.newline"], hold_on_send=True)
            yield Hud(bus=self.client.bus, ui=self.settings.ui, id="hud")
        yield KeyFooter()

    def _show_endpoint(self) -> None:
        hud = self.query_one(Hud)
        # The endpoint's own name: warm-up reports its state under it (the badge says "offline demo").
        hud.provider = self.client.endpoint.name
        hud.model = self.client.model
        hud.host = self.client.endpoint.hostport
        self.query_one("#badge", Static).update(self._badge_text())

    def on_chat_message_render_lag(self, event: ChatMessage.RenderLag) -> None:
        # Painting time is the terminal's, not the network's: the HUD shows it on a line of its own. The last
        # frame of a reply can report while exit is taking the widgets down: then there is no HUD to tell.
        hud = self._on_main_screen(Hud)
        if hud is not None:
            hud.metrics.observe_render_lag(event.ms)

    def _badge_text(self) -> str:
        """Where answers come from, the model and the mode, shortened to leave the title room on a narrow
        terminal (the host first, then the model; the mode always stays)."""
        ep = self.client.endpoint
        where = ("local server (offline demo)", "offline demo", "") if self.offline else (
            f"{ep.name} · {ep.hostport}", ep.name, "")
        # The client's model is the one the server named once a request had to look it up.
        model = self.client.model or "default model"
        forms = [where, (model, model, ""), ("stream" if self.stream_mode else "batch",)]
        chat = self._main("#chat", Widget)
        room = (chat.size.width if chat is not None and chat.size.width else 10_000) - 4
        room -= min(cell_len(self._title_text()), _TITLE_ROOM)
        chosen = fit(forms, lambda parts: cell_len(" · ".join(p for p in parts if p)), room,
                     importance=[2, 1, 0])
        return " · ".join(part for part in chosen if part)

    def _title_text(self) -> str:
        """The conversation's title (the app's ``sub_title``: from its first prompt, or as renamed)."""
        return self.sub_title or "new conversation"

    def watch_sub_title(self, _value: str) -> None:
        title = self._main("#title", Static)
        if title is not None:
            title.update(self._title_text())
            title.set_class(not self.sub_title, "-untitled")
            self._update_badge()

    def _update_badge(self) -> None:
        badge = self._main("#badge", Static)
        if badge is not None:
            badge.update(self._badge_text())

    async def on_mount(self) -> None:
        # The HUD's detector carries the cold-start baselines from one run to the next; the provider's
        # metrics_url is scraped beside the requests.
        signals = await ServerSignals(self.settings, detector=self.query_one(Hud).metrics.detector).open()
        self.signals = signals
        signals.follow(self.client)
        # Every provider's client shares this bus, so one request log and one exporter see them all.
        self._observers.append(attach_observers(self.client.bus, self.settings, baselines=signals.baselines))
        if self.metrics_port is not None:
            exporter = start_exporter(self.client.bus, self.metrics_port)
            signals.seed(exporter.metrics.detector)
            self._observers.append(exporter)
            self.notify(f"Prometheus metrics at {exporter.url}", timeout=5)
        if self.settings.keymap:
            self.set_keymap(dict(self.settings.keymap))
        if self._theme_problem:
            self.notify(f"{self._theme_problem}; using {self.theme}", severity="error", timeout=15,
                        markup=False)
        self._show_endpoint()
        self.watch_sub_title(self.sub_title)
        self.query_one(Hud).mode = "stream" if self.stream_mode else "batch"
        self._apply_hud_visibility(self.size.width)
        if self.client.endpoint.http.warmup:
            self.warmer = Warmer(self.client)
            # After the first frame: a ping measured while the app is still starting would time the start-up.
            self.call_after_refresh(self.warmer.start)
        # The store falls back rather than fail: read-only, damaged or failing later, the chat goes on in
        # memory, and the store's state says so, here and whenever it changes.
        await self.store.open(fallback=True, on_change=self._show_history_state)
        self._show_history_state()
        try:
            if self.conversation_id is None and self.continue_last:
                self.conversation_id = await self.store.last_conversation_id()
                if self.conversation_id is None:
                    self.notify("no earlier conversation to continue", timeout=3)
            if self.conversation_id is not None:
                await self._load_conversation(self.conversation_id)
        except HistoryError as exc:
            self.conversation_id = None
            self.notify(str(exc), severity="error", timeout=15, markup=False)
        if self.conversation_id is None:
            self._welcome()
        self.query_one(PromptInput).focus()
        if self._freeze_gc:
            # Move everything alive after start-up (Textual's tens of thousands of objects) out of the
            # collector's reach: a full collection over them pauses the event loop for 40-70 ms, mid-stream.
            # Only for the `llmchat` program itself: in a test run or a library's process, freezing would
            # also pin everything else alive there for good.
            self.call_after_refresh(gc.freeze)

    def _show_history_state(self) -> None:
        if self.store.state != "ok":
            # Long enough to read a command off it; it is the one time the user is told. No markup: a path
            # may hold square brackets.
            self.notify(self.store.problem, title="History", timeout=30, markup=False,
                        severity="warning" if self.store.state == "read-only" else "error")

    async def on_unmount(self) -> None:
        if self.warmer is not None:
            await self.warmer.aclose()
        for client in self.clients.values():
            await client.aclose()
        for observer in self._observers:
            observer.close()
        if self.signals is not None:
            await self.signals.aclose()
        await self.store.aclose()

    def _welcome(self) -> None:
        """What an empty conversation says to a newcomer: what answers, and how to point llmchat elsewhere."""
        help_key = key_label(self.keys_in_effect["help.open"]).split(" / ")[0]
        if self.offline:
            path = str(default_config_path(os.environ))
            home = str(Path.home())
            shown = "~" + path[len(home):] if home != "/" and path.startswith(home + "/") else path
            text = ("Talking to the built-in local server (offline demo): its replies are made up, its "
                    f"timings real. Add a provider in {shown} (see config.example.toml), or start with "
                    f"`llmchat --base-url URL`. {help_key} lists every key.")
        else:
            ep = self.client.endpoint
            model = self.client.model or "the first model it lists"
            text = (f"Talking to {ep.name} at {ep.hostport}, {model}. Ctrl+P picks another provider or "
                    f"model; {help_key} lists every key.")
        self.query_one(Conversation).show_welcome(text)

    def on_resize(self, event: Any) -> None:
        self._apply_hud_visibility(event.size.width)

    def _apply_hud_visibility(self, width: int) -> None:
        hud = self.query_one(Hud)
        narrow = width < NARROW
        hud.set_class(self.hud_over_chat, "-overlay")
        hud.display = self.hud_over_chat or (self.show_hud and not narrow)
        self.call_after_refresh(self._update_badge)  # fitted to the chat column, once it is laid out
        if narrow and self.show_hud and not self.hud_over_chat and not self._fold_told:
            # Once: folding away is the right thing on a narrow terminal, but it must not look like a loss.
            self._fold_told = True
            over = key_label(self.keys_in_effect["hud.overlay"]).split(" / ")[0]
            self.notify(f"The HUD folds away under {NARROW} columns (this terminal has {width}); {over} "
                        "shows it over the chat. Retries, stalls and errors show under each reply.",
                        title="HUD", timeout=6, markup=False)

    @property
    def _screen_up(self) -> bool:
        """The main screen is mounted: not before start-up (on_mount applies the state then) nor after exit.
        ``App.is_mounted`` is a method taking a widget, so as a bare guard it would always be true."""
        stack = self.screen_stack
        return bool(stack) and stack[0].is_mounted

    def _on_main_screen(self, kind: type[W]) -> W | None:
        """The main screen's widget of that type; None before start-up, or once exit has removed it."""
        if not self._screen_up:
            return None
        return next(iter(self.screen_stack[0].query(kind)), None)

    def _main(self, selector: str, kind: type[W]) -> W | None:
        """The main screen's widget ``selector`` names; None before start-up, or once exit has removed it."""
        if not self._screen_up:
            return None
        return next(iter(self.screen_stack[0].query(selector).results(kind)), None)

    def watch_show_hud(self, _value: bool) -> None:
        if self._screen_up:
            self._apply_hud_visibility(self.size.width)

    watch_hud_over_chat = watch_show_hud

    def watch_stream_mode(self, value: bool) -> None:
        if not self._screen_up:
            return
        self.query_one("#badge", Static).update(self._badge_text())
        self.query_one(Hud).mode = "stream" if value else "batch"

    # -- state derived from the worker ----------------------------------------------------------------------
    @property
    def replying(self) -> bool:
        """A reply is in flight: some worker of the ``reply`` group is pending or running."""
        return any(
            w.group == "reply" and w.state in (WorkerState.PENDING, WorkerState.RUNNING) for w in self.workers
        )

    @on(Worker.StateChanged)
    def _reply_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.group == "reply":
            self._hold_prompt()

    def _hold_prompt(self) -> None:
        # Held exactly while a reply is in flight. A worker posts its state change as it changes state, so
        # keys that reach the app after a reply ended find the prompt released.
        prompt = self._on_main_screen(PromptInput)
        if prompt is not None:
            prompt.held = self.replying

    def on_prompt_input_held(self, _event: PromptInput.Held) -> None:
        self._say_reply_coming()

    @property
    def _cancel_key(self) -> str:
        """The first key that cancels a reply, as a person reads it: ``Esc``."""
        return key_label(self.keys_in_effect["reply.cancel"]).split(" / ")[0]

    def _say_reply_coming(self) -> None:
        self.notify(f"a reply is still coming; {self._cancel_key} cancels it", severity="warning")

    # -- actions -------------------------------------------------------------------------------------------
    def action_toggle_mode(self) -> None:
        self.stream_mode = not self.stream_mode
        self.notify(f"{'stream' if self.stream_mode else 'batch'} mode", timeout=2)

    def action_toggle_hud(self) -> None:
        if self.size.width < NARROW:
            # Beside the chat it cannot show here: toggling the setting would change nothing on screen.
            self.hud_over_chat = not self.hud_over_chat
        else:
            self.hud_over_chat = False
            self.show_hud = not self.show_hud

    def action_hud_overlay(self) -> None:
        self.hud_over_chat = not self.hud_over_chat

    def action_hud_detail(self) -> None:
        self.query_one(Hud).action_detail()

    def action_cancel_reply(self) -> None:
        # Not a priority binding: over a modal, Esc is the modal's own (a rename backs out before the list
        # closes), and app bindings do not reach into a modal.
        if self.replying:
            self.workers.cancel_group(self, "reply")

    def action_copy_reply(self) -> None:
        if self._last_reply is None or not self._last_reply.text:
            self.notify("nothing to copy yet", severity="warning")
            return
        self.copy_to_clipboard(self._last_reply.text)
        self.notify("reply copied", timeout=2)

    def action_copy_code(self) -> None:
        blocks = self._last_reply.code_blocks() if self._last_reply is not None else []
        if not blocks:
            self.notify("the last reply has no code block", severity="warning")
            return
        self.copy_to_clipboard(blocks[-1])
        self.notify("code block copied", timeout=2)

    async def action_new_conversation(self) -> None:
        if self.replying:
            self.workers.cancel_group(self, "reply")
        self.conversation_id = None
        self.history = []
        self.system_prompt = ""
        await self.query_one(Conversation).clear()
        self._last_reply = None
        self.sub_title = ""
        self._welcome()
        self.notify("new conversation", timeout=2)

    def action_keys_help(self) -> None:
        self.push_screen(HelpScreen(self.keys_in_effect))

    def action_history(self) -> None:
        self.push_screen(HistoryScreen(self.store, current_id=self.conversation_id), self._open_from_history)

    def on_history_screen_deleted(self, event: HistoryScreen.Deleted) -> None:
        if event.conversation_id == self.conversation_id:
            # Its rows are gone: what is on screen stays, but the next message starts a new conversation.
            if self.replying:
                self.workers.cancel_group(self, "reply")
            self.conversation_id = None
            self.sub_title = ""

    def on_history_screen_renamed(self, event: HistoryScreen.Renamed) -> None:
        if event.conversation_id == self.conversation_id:
            self.sub_title = event.title

    async def _open_from_history(self, conv_id: int | None) -> None:
        if conv_id is not None:
            if self.replying:
                self.workers.cancel_group(self, "reply")
            await self._load_conversation(conv_id)

    def action_system_prompt(self) -> None:
        def apply(text: str | None) -> None:
            if text is None:
                return
            self.system_prompt = text
            if self.conversation_id is not None:
                self.run_worker(self.store.set_system_prompt(self.conversation_id, text), group="store")
            self.notify("system prompt set" if text else "system prompt cleared", timeout=2)

        self.push_screen(TextInputScreen("System prompt for this conversation", self.system_prompt), apply)

    async def action_export(self, fmt: str = "markdown") -> None:
        from llmchat.core._history import export_markdown, export_records_json

        if self.conversation_id is None:
            self.notify("nothing to export yet", severity="warning")
            return
        conv = await self.store.load(self.conversation_id)
        text = export_markdown(conv) if fmt == "markdown" else export_records_json(conv)
        path = Path.cwd() / f"llmchat-{self.conversation_id}.{'md' if fmt == 'markdown' else 'json'}"
        path.write_text(text, encoding="utf-8")
        path.chmod(0o600)
        self.notify(f"exported to {path}", timeout=4)

    async def switch_provider(self, name: str, model: str | None = None) -> None:
        """Use another provider (and model) from the next message on."""
        client = self.clients.get(name)
        if client is None:
            client = ChatClient(self.settings, provider=name, bus=self.client.bus)
            await client.__aenter__()
            self.clients[name] = client
        if model:
            client.model = model
        self.client = client
        self.offline = None
        if self.signals is not None:
            self.signals.follow(client)
        self._show_endpoint()
        self.notify(f"next message goes to {name}{' · ' + model if model else ''}", timeout=3)

    # -- conversation ----------------------------------------------------------------------------------------
    async def _load_conversation(self, conv_id: int) -> None:
        conv = await self.store.load(conv_id)
        self.conversation_id = conv_id
        self.system_prompt = conv.system_prompt
        self.history = [m for m in conv.messages_for_api() if m["role"] != "system"]
        view = self.query_one(Conversation)
        await view.clear()
        widgets: list[UserMessage | ChatMessage] = []
        for msg in conv.messages:
            if msg.role == "user":
                widgets.append(UserMessage(msg.content))
            elif msg.role == "assistant":
                # "interrupted": llmchat quit mid-reply; "streaming": the process writing it was killed.
                # Either way the reply was cut off, and it must not look whole, nor as if the user stopped it.
                status = _SHOWN_AS.get(msg.status, "done")
                note = msg.error or reply_note(msg.record)
                # The model that answered: the server's own name for it when the record has one.
                label = (msg.record or {}).get("model") or msg.model or None
                widgets.append(ChatMessage(msg.content, status=status, note=note, label=label))
        # One mount, one layout: resuming a long conversation costs one frame, not one per message.
        await view.add_history(widgets)
        replies = [w for w in widgets if isinstance(w, ChatMessage)]
        self._last_reply = replies[-1] if replies else None
        self.sub_title = conv.info.title

    def _messages(self) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return system + self.history

    async def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        text = event.text.strip()
        if not text:
            return
        if self.replying:
            # Only a Submitted posted by other code: the prompt holds itself while a reply is in flight.
            self.query_one(PromptInput).restore(event.text)
            self._say_reply_coming()
            return
        # Saved before the request goes out: a crash from here on loses nothing the user typed. A message that
        # cannot be saved (the file is locked) goes back into the input and is not sent.
        try:
            await self._save_prompt(text)
        except HistoryError as exc:
            self.query_one(PromptInput).restore(event.text)
            self.notify(f"{exc}; your message is back in the input", severity="error", timeout=15,
                        markup=False)
            self._hold_prompt()  # nothing went out: the prompt is free to send it again
            return
        self.history.append({"role": "user", "content": text})
        view = self.query_one(Conversation)
        view.add_user(text)
        reply = view.add_assistant(label=self.client.model)
        self._last_reply = reply
        self._reply(text, reply, self.stream_mode)
        self._hold_prompt()  # the prompt held itself when it sent; from here on the worker's state decides
        if not self.sub_title:
            # The store titled the conversation from its first prompt; shown once the request is out.
            self.run_worker(self._show_title(self.conversation_id), group="title")

    async def _show_title(self, conv_id: int | None) -> None:
        if conv_id is None:
            return
        try:
            conv = await self.store.load(conv_id)
        except HistoryError:
            return  # the title is a nicety; the store's own trouble is said where it matters
        if conv_id == self.conversation_id and not self.sub_title:
            self.sub_title = conv.info.title

    async def _save_prompt(self, text: str) -> None:
        """Saves ``text`` as the next user message, in a new conversation when there is none, or when the one
        on screen is gone from the history (deleted in another window, or the history fell back to memory)."""
        if self.conversation_id is not None:
            try:
                await self.store.add_user_message(self.conversation_id, text)
                return
            except ConversationNotFoundError:
                self.notify("this conversation is no longer in the history; it goes on as a new one",
                            timeout=5)
        self.conversation_id = await self.store.new_conversation(
            system_prompt=self.system_prompt, provider=self.client.endpoint.name, model=self.client.model
        )
        await self.store.add_user_message(self.conversation_id, text)

    @work(exclusive=True, group="reply")
    async def _reply(self, prompt: str, reply: ChatMessage, stream: bool) -> None:
        client = self.client
        assert self.conversation_id is not None
        writer: ReplyWriter | None = None
        record: TimingRecord | None = None
        unwatch: Callable[[], None] | None = None
        status: Literal["done", "cached", "cancelled", "interrupted", "error"] = "done"
        note, error = "", None
        # The state line under the reply from the start: saving the reply's row comes first, and can wait.
        watch = RequestWatch(stall_s=self.settings.ui.stall_s, cancel_key=self._cancel_key,
                             label=client.model)
        reply.follow(watch)
        try:
            try:
                msg_id = await self.store.start_reply(
                    self.conversation_id, provider=client.endpoint.name, model=client.model,
                    mode="stream" if stream else "batch",
                )
                writer = self.store.reply_writer(msg_id)
            except HistoryError as exc:
                # The prompt is saved; its answer still comes, unsaved, and the user knows.
                self.notify(f"{exc}; this reply is not saved", severity="error", timeout=10, markup=False)
            messages = self._messages()
            if stream:
                chat = client.stream(messages)
                record = chat.record
                unwatch = watch.follow(client.bus, record=record)
                watch.reasoning_from(lambda: chat.reasoning)
                async for piece in chat:
                    reply.append(piece, time.perf_counter_ns())
                    if writer is not None:
                        writer.append(piece)
            else:
                unwatch = watch.follow(client.bus, messages=messages)
                answer = await client.complete(messages)
                record = answer.record
                reply.append(answer.text, time.perf_counter_ns())
                if writer is not None:
                    writer.append(answer.text)
                status = "cached" if record.cache_hit else "done"
        except APIError as exc:
            record = record or (exc.record if isinstance(exc.record, TimingRecord) else None)
            status, error = "error", str(exc)
            self.notify(error, severity="error", timeout=10)
            # Nothing typed is lost: the prompt goes back into the input.
            self.query_one(PromptInput).restore(prompt)
        except UsageError as exc:
            status, error = "error", str(exc)
            self.notify(error, severity="error", timeout=10)
            self.query_one(PromptInput).restore(prompt)
        except BaseException:
            # The worker was cancelled. While the app runs, the user did it (Esc, a new conversation): the
            # reply is "cancelled". Quitting or a crash cancels it too, after the app stopped running: the
            # reply was "interrupted", and history must not say the user stopped it.
            status = "cancelled" if self.is_running else "interrupted"
            raise
        finally:
            if unwatch is not None:
                unwatch()
            note = error or (reply_note(record.summary()) if record is not None else "")
            reply.finish(status="cancelled" if status == "interrupted" else status, note=note)
            # A request that had to ask the server for its model made it the client's: say which it is.
            if record is not None and record.model:
                reply.set_label(record.model)
            self._update_badge()
            partial = reply.text
            if partial:
                self.history.append({"role": "assistant", "content": partial})
            if writer is not None:
                try:
                    await writer.finish(
                        status="done" if status == "cached" else status,
                        error=error,
                        record=record.summary() if record is not None else None,
                    )
                except HistoryError as exc:
                    self.notify(f"{exc}; this reply is not saved", severity="error", timeout=10, markup=False)


def make_app(
    *,
    settings: Settings,
    client: ChatClient,
    store: HistoryStore,
    conversation_id: int | None = None,
    continue_last: bool = False,
    offline: Offline | None = None,
    metrics_port: int | None = None,
    freeze_gc: bool = False,
) -> ChatApp:
    """The app factory tests and the command line build the app through. The app closes ``client`` and
    ``store`` when it exits. ``freeze_gc``: move start-up's objects out of the garbage collector's reach
    after the first frame (the `llmchat` program only; see ``on_mount``)."""
    return ChatApp(settings=settings, client=client, store=store, conversation_id=conversation_id,
                   continue_last=continue_last, offline=offline, metrics_port=metrics_port, freeze_gc=freeze_gc)


__all__ = ["ChatApp", "Offline", "make_app", "reply_note"]
