"""The chat app: the conversation and prompt on the left, the HUD on the right.

The app never touches httpx: it talks to ``ChatClient`` and listens to the engine's bus. Every reply runs in one
exclusive worker (group ``reply``); "a reply is in flight" is derived from that worker's state, never from a
flag reset in ``finally`` (a cancelled worker's cleanup can run after its replacement started).
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar
from urllib.parse import urlsplit

from rich.cells import cell_len
from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Static
from textual.worker import Worker, WorkerState

from llmchat.core import (
    APIError,
    ChatClient,
    ConfigError,
    LLMChatError,
    Pools,
    ServerSignals,
    Settings,
    UsageError,
    Warmer,
    default_config_path,
    resolve_provider,
)
from llmchat.core.client import ContextBudget, ContextFit, ContextOverflowError
from llmchat.core.history import (
    Conversation as SavedConversation,
)
from llmchat.core.history import (
    ConversationNotFoundError,
    ExportError,
    Generation,
    HistoryError,
    HistoryStore,
    Origin,
    ReplyWriter,
    export_folder,
    export_markdown,
    export_records_json,
    save_export,
)
from llmchat.core.http import (
    Attachment,
    AttachmentError,
    message_content,
    message_text,
    read_attachment,
    split_file_lines,
)
from llmchat.core.observe import TimingRecord, attach_observers, start_exporter
from llmchat.tui.branches import BranchActions
from llmchat.tui.checks import check_theme
from llmchat.tui.fit import fit
from llmchat.tui.keys import binding, effective_keys, key_label
from llmchat.tui.palette import ProviderCommands
from llmchat.tui.paths import PathSuggester
from llmchat.tui.request_state import RequestWatch
from llmchat.tui.screens.help import HelpScreen
from llmchat.tui.screens.history import HistoryScreen
from llmchat.tui.screens.system_prompt import SystemPromptScreen
from llmchat.tui.screens.text_input import TextInputScreen
from llmchat.tui.screenshot import TITLE as SCREENSHOT
from llmchat.tui.screenshot import save_screenshot, screenshot_folders
from llmchat.tui.widgets.chat import (
    ChatMessage,
    Conversation,
    PromptInput,
    ReplyExtras,
    Status,
    ThinkingBlock,
    UserMessage,
    history_widgets,
)
from llmchat.tui.widgets.footer import KeyFooter
from llmchat.tui.widgets.hud import Hud

NARROW = 100  # columns under which the HUD folds away by itself
_TITLE_ROOM = 24  # cells of the conversation's title the badge leaves room for on a narrow terminal
W = TypeVar("W", bound=Widget)
_SHOWN_AS: dict[str, Status] = {
    "cancelled": "cancelled", "interrupted": "interrupted", "streaming": "interrupted", "error": "error",
    "refused": "refused"}
"""How a stored reply's status shows ("streaming": the process writing it was killed); any other is done."""


@dataclass(frozen=True, slots=True)
class Offline:
    """Set when the app talks to a local server it started itself: the badge says so."""

    base_url: str


def reply_note(summary: dict[str, Any] | None) -> str:
    """The compact line under a finished reply, from its record's summary: model, HTTP version, TTFT, rate.

    A cache hit is the model and how long the answer took, ``llmchat-local · 2 ms``: the reply's status line
    puts "from cache" before it, and a rate or a first-token time would measure the disk, not a model.
    """
    if not summary:
        return ""
    parts = [str(summary.get("model") or "")]
    if summary.get("cache_hit"):
        if summary.get("total_ms") is not None:
            parts.append(f"{summary['total_ms']:.0f} ms")
        return " · ".join(p for p in parts if p)
    if summary.get("http_version"):
        parts.append(str(summary["http_version"]))
    if summary.get("mode") == "stream" and summary.get("thinking_ms") is not None:
        parts.append(f"thought {summary['thinking_ms']:.0f} ms")
    if summary.get("mode") == "stream" and summary.get("ttft_ms") is not None:
        parts.append(f"TTFT {summary['ttft_ms']:.0f} ms")
    if summary.get("total_ms") is not None:
        parts.append(f"total {summary['total_ms']:.0f} ms")
    if summary.get("tokens_per_s"):
        parts.append(f"{summary['tokens_per_s']:.0f} tok/s")
    if summary.get("retries"):
        parts.append(f"{summary['retries']} retries")
    if summary.get("prompt_truncated"):
        parts.append(f"the server counted {summary.get('prompt_tokens')} of about "
                     f"{summary.get('prompt_sent_tokens')} prompt tokens: it dropped the conversation's start")
    return " · ".join(p for p in parts if p)


def refusal_note(refusal: str, note: str = "") -> str:
    """The line under a reply the model refused: its words quoted on one line, then ``note`` (the timing)."""
    words = " ".join(refusal.split())
    said = f'the model declined: "{words}"' if words else "the model declined, with no reason given"
    return f"{said} · {note}" if note else said


#: The palette's generation settings: the title of the box that asks for one, and its hint line.
_GENERATION_PROMPTS: dict[str, tuple[str, str]] = {
    "temperature": ("Temperature", "0 to 2; 0 makes batch replies cacheable; empty sends none (the server's "
                    "default)"),
    "seed": ("Seed", "a whole number; a seed makes batch replies cacheable; empty sends none"),
    "max_tokens": ("Max tokens", "the longest reply, in tokens (at least 1); empty leaves it to the server"),
}


def _held_text(conv: SavedConversation) -> str:
    """Where ``conv`` was held, for a notification: ``slow-llama · llama3 (gpu-box:8000)``."""
    model = conv.info.model or "its default model"
    if conv.origin == "offline":
        return f"the offline demo's local server · {model}"
    where = f" ({urlsplit(conv.base_url).netloc})" if conv.base_url else ""
    return f"{conv.info.provider} · {model}{where}"


class ChatApp(BranchActions, App[None]):
    """llmchat's interactive chat. Build it with :func:`make_app`."""

    CSS_PATH = "app.tcss"
    TITLE = "llmchat"
    # The prompt has focus from the first frame: keys typed while the app starts (a prompt typed right after
    # `llmchat --continue`) reach it, not whatever widget would be focused first.
    AUTO_FOCUS = "PromptInput"
    COMMANDS = App.COMMANDS | {ProviderCommands}

    # Keys, labels and ids come from the registry (tui/keys.py), which [keymap] is checked against.
    BINDINGS: ClassVar[list[BindingType]] = [
        binding("mode.toggle", "toggle_mode"),
        binding("reply.cancel", "cancel_reply"),
        binding("reply.thinking", "toggle_thinking", show=False),  # the folded block names its key
        binding("hud.toggle", "toggle_hud"),
        binding("hud.overlay", "hud_overlay"),
        binding("hud.charts", "hud_detail"),
        binding("copy.reply", "copy_reply"),
        binding("copy.code", "copy_code"),
        binding("select.previous", "select(-1)", show=False),
        binding("select.next", "select(1)", show=False),
        binding("reply.regenerate", "regenerate", show=False),
        binding("message.edit", "edit", show=False),
        binding("alternative.previous", "alternative(-1)", show=False),
        binding("alternative.next", "alternative(1)", show=False),
        binding("search.open", "search", show=False),
        binding("history.open", "history"),
        binding("conversation.new", "new_conversation"),
        binding("help.open", "keys_help"),
        binding("attach.file", "attach_file"),
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
        pinned: bool = False,
        pools: Pools | None = None,
    ) -> None:
        super().__init__()
        self._freeze_gc = freeze_gc
        self.settings = settings
        self.client = client
        self.pools = pools if pools is not None else client.pools or Pools()
        """The connection pools every client of this session takes its transport from (closed on exit)."""
        self.clients: dict[str, ChatClient] = clients if clients is not None else {client.endpoint.name: client}
        """Every client this session opened, by key: a configured provider's name, else the name and URL."""
        self.store = store
        self.offline = offline
        self._offline = offline
        self._offline_client = client if offline is not None else None
        """The client of the offline demo's local server, which a conversation held there reconnects to."""
        self.pinned = pinned
        """The command line named the provider, model or URL: the conversation opened at start goes on with
        them rather than with the ones it was held with."""
        self.generation = Generation(temperature=settings.ui.temperature, seed=settings.ui.seed,
                                     max_tokens=settings.ui.max_tokens)
        """What every request of this conversation sends: [ui]'s defaults, a resumed conversation's own, or
        what the palette set; a new conversation (Ctrl+N) keeps them, as it keeps the provider."""
        self.conversation_id = conversation_id
        self.continue_last = continue_last
        self.system_prompt = ""
        self.history: list[dict[str, Any]] = []
        self._budgets: dict[ChatClient, ContextBudget] = {}
        """Each client's token counts and context window: kept for the session."""
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
                prompt = PromptInput(id="prompt", send_keys=self.keys_in_effect["prompt.send"],
                                     newline_keys=self.keys_in_effect["prompt.newline"], hold_on_send=True)
                prompt.use_reading_keys({where: self.keys_in_effect[f"conversation.{where}"]
                                         for where in PromptInput.READING})
                yield prompt
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
        # Where answers come from, on screen from the first frame (start-up below awaits the history and more).
        self._show_endpoint()
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
                await self._load_conversation(self.conversation_id, at_start=True)
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
        await self.pools.aclose()
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

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        # Textual's Screenshot saves to ~/Downloads, which many machines lack; ours says where it saved.
        for command in super().get_system_commands(screen):
            if command.title == SCREENSHOT:
                yield SystemCommand(SCREENSHOT, f"Save an SVG of the screen in {self.store.path.parent}",
                                    lambda: self.set_timer(0.1, self.action_save_screenshot))
            else:
                yield command

    def action_save_screenshot(self) -> None:
        try:
            saved = save_screenshot(self, screenshot_folders(self.store.path.parent))
        except OSError as exc:
            self.notify(str(exc), title="Screenshot", severity="error", timeout=10, markup=False)
            return
        self.notify(f"saved to {saved}", title="Screenshot", timeout=6, markup=False)

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
        # closes), and app bindings do not reach into a modal. With no reply in flight it backs out of an
        # edit, then out of a selection.
        if self.replying:
            self.workers.cancel_group(self, "reply")
        elif not self.stop_editing():
            self.query_one(Conversation).select(None)

    def action_toggle_thinking(self) -> None:
        blocks = self.query_one(Conversation).query(ThinkingBlock)
        if not blocks:
            self.notify("no reply here has thinking to show", timeout=3)
            return
        blocks.last().toggle()

    def _thinking_key(self) -> str:
        return key_label(self.keys_in_effect["reply.thinking"]).split(" / ")[0]

    async def action_new_conversation(self) -> None:
        if self.replying:
            self.workers.cancel_group(self, "reply")
        self.conversation_id = None
        self.history = []
        self.system_prompt = ""
        self._editing = None
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
            if text is None or text == self.system_prompt:
                return
            self.system_prompt = text
            if self.conversation_id is not None:
                self._save_in_background(self.store.set_system_prompt(self.conversation_id, text))
            self.notify("system prompt set" if text else "system prompt cleared", timeout=2)

        keys = self.keys_in_effect
        self.push_screen(SystemPromptScreen(self.system_prompt, save_keys=keys["system.save"],
                                            cancel_keys=keys["system.cancel"]), apply)

    def action_generation(self, name: str) -> None:
        """Ask for one generation setting ("temperature", "seed" or "max_tokens") of this conversation."""
        label, hint = _GENERATION_PROMPTS[name]

        def check(text: str) -> str:
            try:
                self.generation.with_text(name, text)
            except ValueError as exc:
                return str(exc)
            return ""

        def apply(text: str | None) -> None:
            if text is None:
                return
            generation = self.generation.with_text(name, text)
            if generation == self.generation:
                return
            self.generation = generation
            if self.conversation_id is not None:
                self._save_in_background(self.store.set_generation(self.conversation_id, generation))
            self.notify(f"this conversation sends {generation.describe()}", timeout=3)

        self.push_screen(TextInputScreen(f"{label} for this conversation", self.generation.shown(name),
                                         hint=hint, check=check), apply)

    def _save_in_background(self, save: Awaitable[None]) -> None:
        """Saves a change of the conversation without holding up the screen; a failure is one notification
        (the change still holds for this session), never a crash."""
        async def run() -> None:
            try:
                await save
            except ConversationNotFoundError:
                pass  # deleted meanwhile: the next message starts a new conversation, with the change
            except HistoryError as exc:
                self.notify(f"{exc}; the change holds for this session only", severity="error", timeout=10,
                            markup=False)

        self.run_worker(run(), group="store")

    def export_folder(self) -> Path:
        """Where exports go: [ui] export_dir, else $XDG_DATA_HOME/llmchat/exports."""
        return export_folder(self.settings.ui.export_dir)

    async def action_export(self, fmt: str = "markdown") -> None:
        """Writes the conversation (Markdown) or its timing records (JSON) to a new file in the export folder,
        never over an existing one, and says where."""
        if self.conversation_id is None:
            self.notify("nothing to export yet", severity="warning")
            return
        try:
            conv = await self.store.load(self.conversation_id)
        except HistoryError as exc:
            self.notify(str(exc), severity="error", timeout=10, markup=False)
            return
        text = export_markdown(conv) if fmt == "markdown" else export_records_json(conv)
        suffix = ".md" if fmt == "markdown" else ".json"
        try:
            path = await asyncio.to_thread(save_export, self.export_folder(), f"llmchat-{conv.id}", suffix,
                                           text)
        except ExportError as exc:
            self.notify(str(exc), severity="error", timeout=10, markup=False)
            return
        self.notify(f"exported to {path}", timeout=8, markup=False)

    async def switch_provider(self, key: str, model: str | None = None) -> None:
        """Use another provider (and model) from the next message on; the conversation keeps them. ``key`` is
        a key of :attr:`clients` or a configured provider's name."""
        client = self.clients.get(key)
        if client is None:
            try:
                resolved = resolve_provider(self.settings, key)
                if resolved is None:
                    raise UsageError(f"provider {key!r} is not configured; add [providers.{key}] to the "
                                     "config")
                client = await self._client_for(resolved.name, resolved.base_url, configured=True)
            except LLMChatError as exc:
                self.notify(str(exc), severity="error", timeout=10, markup=False)
                return
        await self._use(client, model, save=True)
        self.notify(f"next message goes to {self._where_text()}", timeout=3, markup=False)

    async def _client_for(self, name: str, base_url: str, *, configured: bool) -> ChatClient:
        """This session's client for provider ``name`` at ``base_url``, opened when there is none yet:
        the configured provider's own (its key, headers and [http] overrides), or an ad-hoc one for a
        ``--base-url`` conversation (no key: a key is never kept, nor sent to a URL unasked). Raises
        ConfigError or UsageError when the provider cannot be set up."""
        base_url = base_url.rstrip("/")
        for client in self.clients.values():
            if client is not self._offline_client and client.endpoint.name == name \
                    and client.endpoint.base_url == base_url:
                return client
        # One limiter per provider for the session: every client of a provider shares its buckets.
        limits = self.client.limits
        client = (ChatClient(self.settings, provider=name, bus=self.client.bus, limits=limits, pools=self.pools)
                  if configured
                  else ChatClient(self.settings, provider=name, base_url=base_url, bus=self.client.bus,
                                  limits=limits, pools=self.pools))
        await client.__aenter__()
        key = name if name not in self.clients else f"{name} {base_url}"
        self.clients[key] = client
        return client

    async def _use(self, client: ChatClient, model: str | None, *, save: bool) -> None:
        """Talk to ``client`` (with ``model``, when given) from the next message on; ``save``: the
        conversation on screen keeps it."""
        if model:
            client.model = model
        self.client = client
        # Still the demo's own server (another of its models, say): the badge goes on saying so.
        self.offline = self._offline if client is self._offline_client else None
        if self.signals is not None:
            self.signals.follow(client)
        self._show_endpoint()
        if save and self.conversation_id is not None:
            origin, base_url = self._origin(client)
            self._save_in_background(self.store.set_endpoint(
                self.conversation_id, provider=client.endpoint.name, model=client.model, origin=origin,
                base_url=base_url))

    def _origin(self, client: ChatClient) -> tuple[Origin, str]:
        """How ``client`` is reached, to save with the conversation: the offline demo's server (no URL: its
        port is this run's), a configured provider, or an ad-hoc URL."""
        if client is self._offline_client:
            return "offline", ""
        ep = client.endpoint
        try:
            resolved = resolve_provider(self.settings, ep.name)
        except LLMChatError:
            resolved = None
        if resolved is not None and resolved.name == ep.name and resolved.base_url.rstrip("/") == ep.base_url:
            return "provider", ep.base_url
        return "base_url", ep.base_url

    def _where_text(self) -> str:
        """Where the next message goes, for a notification: ``groq · llama-3.1 (api.groq.com:443)``."""
        model = self.client.model or "default model"
        if self.offline is not None:
            return f"the local server (offline demo) · {model}"
        return f"{self.client.endpoint.name} · {model} ({self.client.endpoint.hostport})"

    async def _reconnect(self, conv: SavedConversation, *, at_start: bool) -> None:
        """Go on with the provider and model ``conv`` was held with; when they are not configured here, or
        the command line named others (``at_start`` with ``pinned``), say so in one notification and what
        the next message goes to instead."""
        name, model = conv.info.provider, conv.info.model
        if not name:
            return  # nothing was kept: the conversation goes on where the app is
        held = _held_text(conv)
        if at_start and self.pinned:
            if (name, model) != (self.client.endpoint.name, self.client.model):
                self.notify(f"this conversation was held with {held}; it goes on with {self._where_text()}, "
                            "as the command line asks", timeout=10, markup=False)
            return
        try:
            client, why = await self._saved_client(conv)
        except LLMChatError as exc:  # configured, but it cannot be set up (a key's variable is unset...)
            client, why = None, f"which cannot be used here ({exc})"
        if client is None:
            self.notify(f"this conversation was held with {held}, {why}; the next message goes to "
                        f"{self._where_text()}", severity="warning", timeout=15, markup=False)
            return
        await self._use(client, model or None, save=False)

    async def _saved_client(self, conv: SavedConversation) -> tuple[ChatClient | None, str]:
        """The client that reaches where ``conv`` was held, or None and why not."""
        name = conv.info.provider
        if conv.origin == "offline":
            if self._offline_client is not None:
                return self._offline_client, ""
            return None, "which this llmchat does not start (a provider is configured)"
        if conv.origin == "base_url":
            if not conv.base_url:
                return None, "whose address was not kept"
            return await self._client_for(name, conv.base_url, configured=False), ""
        try:
            resolved = resolve_provider(self.settings, name)
        except LLMChatError:
            resolved = None
        if resolved is not None and resolved.name == name:
            return await self._client_for(name, resolved.base_url, configured=True), ""
        if conv.origin == "" and name == self.client.endpoint.name:
            # Saved before llmchat kept more than the name: the same name is all there is to go by.
            return self.client, ""
        return None, "which is not configured here"

    # -- conversation ----------------------------------------------------------------------------------------
    async def _load_conversation(self, conv_id: int, *, at_start: bool = False,
                                 at_message: int | None = None) -> None:
        """Shows conversation ``conv_id`` and goes on with its system prompt, generation settings, provider
        and model (see ``_reconnect``; ``at_start``: opened by the command line). ``at_message``: on the
        branch through that message (made current), which is selected and brought into view."""
        conv = await (self.store.load(conv_id) if at_message is None else self.store.select(conv_id, at_message))
        self.conversation_id = conv_id
        self.system_prompt = conv.system_prompt
        self.generation = conv.generation
        self._editing = None
        await self._reconnect(conv, at_start=at_start)
        await self._show(conv)
        self.sub_title = conv.info.title
        if at_message is not None:
            self.call_after_refresh(self._select_message, at_message)

    async def _show(self, conv: SavedConversation) -> None:
        """Shows the current branch of ``conv`` (all of it, in one mount) and goes on from its end."""
        self.history = [m for m in conv.messages_for_api() if m["role"] != "system"]
        view = self.query_one(Conversation)
        await view.clear()
        widgets: list[Widget] = []
        for msg in conv.messages:
            widget: UserMessage | ChatMessage
            if msg.role == "user":
                widget = UserMessage(msg.content)
            elif msg.role == "assistant":
                # "interrupted": llmchat quit mid-reply; "streaming": the process writing it was killed.
                # Either way the reply was cut off, and it must not look whole, nor as if the user stopped it.
                status = _SHOWN_AS.get(msg.status, "done")
                if status == "done" and msg.record is not None and msg.record.get("cache_hit"):
                    status = "cached"
                note = msg.error or reply_note(msg.record)
                if msg.status == "refused":
                    note = refusal_note(msg.refusal, note)
                # The model that answered: the server's own name for it when the record has one.
                label = (msg.record or {}).get("model") or msg.model or None
                thinking, cards = history_widgets(
                    msg.reasoning, (msg.record or {}).get("thinking_ms"), msg.tool_calls,
                    keep_open=self.settings.ui.show_thinking, toggle_key=self._thinking_key())
                widget = ChatMessage(msg.content, status=status, note=note, label=label)
                widget.message_id, widget.alternatives = msg.id, msg.alternatives
                widgets += [*thinking, widget, *cards]
                continue
            else:
                continue
            widget.message_id, widget.alternatives = msg.id, msg.alternatives
            widgets.append(widget)
        # One mount, one layout: resuming a long conversation costs one frame, not one per message.
        await view.add_history(widgets)
        replies = [w for w in widgets if isinstance(w, ChatMessage) and not w.ASIDE]
        self._last_reply = replies[-1] if replies else None

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
        # Files named by /file lines are read, and the request fitted into the context window, before
        # anything is saved or sent: a file that cannot go or a message too long for the window is one line,
        # and the text stays in the input as typed.
        try:
            prompt, attachments = self._attachments(text)
            content = message_content(prompt, attachments)
            fit = await self._fit([*self._messages(), {"role": "user", "content": content}])
        except (AttachmentError, ContextOverflowError) as exc:
            self.query_one(PromptInput).restore(event.text)
            self.notify(str(exc), severity="error", timeout=15, markup=False)
            self._hold_prompt()
            return
        text = message_text(prompt, attachments)
        # Saved before the request goes out: a crash from here on loses nothing the user typed. A message that
        # cannot be saved (the file is locked) goes back into the input and is not sent.
        edit_of = self._editing
        try:
            msg_id = await self._save_prompt(text, alternative_to=edit_of)
        except HistoryError as exc:
            self.query_one(PromptInput).restore(event.text)
            self.notify(f"{exc}; your message is back in the input", severity="error", timeout=15,
                        markup=False)
            self._hold_prompt()  # nothing went out: the prompt is free to send it again
            return
        view = self.query_one(Conversation)
        if edit_of is not None and self.conversation_id is not None:
            # A new branch from the edited prompt: the screen shows it, the old one is kept.
            self._editing, self._edit_saved = None, ""
            await self._show(await self.store.load(self.conversation_id))
            # The branch now ends with the edited prompt: it goes out as sent (its files included), and the
            # request is fitted again, to this branch's history.
            if self.history and self.history[-1]["role"] == "user":
                self.history[-1] = {"role": "user", "content": content}
            try:
                fit = await self._fit(self._messages())
            except ContextOverflowError as exc:
                self.notify(f"{exc}; the edited prompt is saved as a branch: edit it again to send it",
                            severity="error", timeout=15, markup=False)
                self._hold_prompt()
                return
        else:
            self.history.append({"role": "user", "content": content})
            view.add_user(text).message_id = msg_id
        reply = view.add_assistant(label=self.client.model)
        self._last_reply = reply
        self._show_fit(fit)
        self._reply(event.text.strip(), reply, self.stream_mode, messages=fit.messages)
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

    async def _save_prompt(self, text: str, *, alternative_to: int | None = None) -> int:
        """Saves ``text`` as the next user message (with ``alternative_to``, as that prompt's edit) and returns
        its id, in a new conversation when there is none, or when the one on screen is gone from the history
        (deleted in another window, or the history fell back to memory)."""
        if self.conversation_id is not None:
            try:
                return await self.store.add_user_message(self.conversation_id, text,
                                                         alternative_to=alternative_to)
            except ConversationNotFoundError:
                self.notify("this conversation is no longer in the history; it goes on as a new one",
                            timeout=5)
        origin, base_url = self._origin(self.client)
        self.conversation_id = await self.store.new_conversation(
            system_prompt=self.system_prompt, provider=self.client.endpoint.name, model=self.client.model,
            origin=origin, base_url=base_url, generation=self.generation,
        )
        return await self.store.add_user_message(self.conversation_id, text)

    def _attachments(self, text: str) -> tuple[str, list[Attachment]]:
        """The prompt without its ``/file PATH`` lines and those files, read; AttachmentError for the first
        that cannot go."""
        prompt, paths = split_file_lines(text)
        limit = self.settings.ui.attachment_max_kb * 1024
        return prompt, [read_attachment(p, max_bytes=limit) for p in paths]

    async def _fit(self, messages: list[dict[str, Any]]) -> ContextFit:
        """``messages`` fitted into the model's context window (see ContextBudget); ContextOverflowError
        when the last message alone does not fit."""
        budget = self._budgets.get(self.client)
        if budget is None:
            budget = self._budgets[self.client] = ContextBudget(self.client)
        return await budget.fit(messages, max_tokens=self.generation.max_tokens)

    def _show_fit(self, fit: ContextFit) -> None:
        """The HUD's context lines; one notification when older turns were left out."""
        hud = self._on_main_screen(Hud)
        if hud is not None:
            hud.show_context(fit)
        if fit.note:
            # After a refusal for length: what the budget learnt, said once.
            self.notify(fit.note, timeout=8, markup=False)
        if fit.turns_left_out:
            turns = "1 earlier turn" if fit.turns_left_out == 1 else f"{fit.turns_left_out} earlier turns"
            self.notify(f"{turns} left out to fit the {fit.window:,}-token context window "
                        f"({fit.prompt_tokens:,} tokens sent, {fit.reserve:,} kept for the reply)", timeout=6,
                        markup=False)

    def action_attach_file(self) -> None:
        """Ask for a file (with path completion) and put a ``/file PATH`` line for it at the prompt's top."""
        limit = self.settings.ui.attachment_max_kb * 1024

        def check(path: str) -> str:
            if not path.strip():
                return "type a path, or Esc to attach nothing"
            try:
                read_attachment(path.strip(), max_bytes=limit)
            except AttachmentError as exc:
                return str(exc)
            return ""

        def apply(path: str | None) -> None:
            if path:
                prompt = self.query_one(PromptInput)
                prompt.load_text(f"/file {path.strip()}\n{prompt.text}")
                prompt.move_cursor(prompt.document.end)
                prompt.focus()

        hint = (f"a text file (as a fenced block) or an image (for vision models), up to "
                f"{self.settings.ui.attachment_max_kb:,} KB; → completes the path")
        self.push_screen(TextInputScreen("Attach a file", "", hint=hint, check=check,
                                         suggester=PathSuggester()), apply)

    @work(exclusive=True, group="reply")
    async def _reply(self, prompt: str, reply: ChatMessage, stream: bool,
                     alternative_to: ChatMessage | None = None,
                     messages: list[dict[str, Any]] | None = None) -> None:
        client = self.client
        params = self.generation.params()  # this conversation's settings, sent with every request
        origin, base_url = self._origin(client)
        assert self.conversation_id is not None
        writer: ReplyWriter | None = None
        record: TimingRecord | None = None
        unwatch: Callable[[], None] | None = None
        status: Literal["done", "cached", "cancelled", "interrupted", "error", "refused"] = "done"
        note, error, refusal = "", None, ""
        # The state line under the reply from the start: saving the reply's row comes first, and can wait.
        watch = RequestWatch(stall_s=self.settings.ui.stall_s, cancel_key=self._cancel_key,
                             label=client.model)
        reply.follow(watch)
        if alternative_to is None:
            self.query_one(Hud).compare_alternatives([], 0)  # a new prompt: the last comparison is not about it
        extras: ReplyExtras | None = None
        calls: list[dict[str, Any]] = []
        try:
            try:
                msg_id = await self.store.start_reply(
                    self.conversation_id, provider=client.endpoint.name, model=client.model,
                    mode="stream" if stream else "batch", origin=origin, base_url=base_url,
                    alternative_to=None if alternative_to is None else alternative_to.message_id,
                )
                writer = self.store.reply_writer(msg_id)
                reply.message_id = msg_id
                if alternative_to is not None and alternative_to.message_id is not None:
                    reply.alternatives = (*(alternative_to.alternatives or (alternative_to.message_id,)), msg_id)
            except HistoryError as exc:
                # The prompt is saved; its answer still comes, unsaved, and the user knows.
                self.notify(f"{exc}; this reply is not saved", severity="error", timeout=10, markup=False)
            messages = messages if messages is not None else self._messages()
            extras = ReplyExtras(reply, writer, keep_open=self.settings.ui.show_thinking,
                                 toggle_key=self._thinking_key())
            if stream:
                chat = client.stream(messages, **params)
                chat.on_reasoning = extras.reasoning
                chat.on_reclaim = extras.reclaim
                record = chat.record
                unwatch = watch.follow(client.bus, record=record)
                watch.reasoning_from(lambda: chat.reasoning)
                async for piece in chat:
                    if extras.thinking:
                        extras.answer_started(record.thinking_ms)
                    reply.append(piece, time.perf_counter_ns())
                    if writer is not None:
                        writer.append(piece)
                calls, refusal = [c.to_dict() for c in chat.tool_calls], chat.refusal
                # A hit here is a replayed stream ([cache] replay_streams); a refusal is never cached.
                status = "refused" if refusal else "cached" if record.cache_hit else "done"
            else:
                unwatch = watch.follow(client.bus, messages=messages)
                answer = await client.complete(messages, **params)
                record = answer.record
                extras.reasoning(answer.reasoning)
                calls, refusal = [c.to_dict() for c in answer.tool_calls], answer.refusal
                reply.append(answer.text, time.perf_counter_ns())
                if writer is not None:
                    writer.append(answer.text)
                status = "refused" if refusal else "cached" if record.cache_hit else "done"
        except APIError as exc:
            record = record or (exc.record if isinstance(exc.record, TimingRecord) else None)
            status, error = "error", str(exc)
            if isinstance(messages[-1].get("content") if messages else None, list) and exc.status == 400:
                error += "; the message had an image: use a vision model, or send the text alone"
            self.notify(error, severity="error", timeout=10)
            # Nothing typed is lost: the prompt goes back into the input (a regenerated reply's prompt is
            # saved and still on screen: putting it back would send it twice).
            if alternative_to is None:
                self.query_one(PromptInput).restore(prompt)
        except UsageError as exc:
            status, error = "error", str(exc)
            self.notify(error, severity="error", timeout=10)
            if alternative_to is None:
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
            if status == "refused":
                note = refusal_note(refusal, note)
            # (mypy narrows ``status`` here to the try body's normal endings; the cancel branch set it too)
            shown: Status = "cancelled" if status == "interrupted" else status  # type: ignore[comparison-overlap]
            if extras is not None:
                extras.finish(record.thinking_ms if record is not None else None, calls, shown)
            reply.finish(status=shown, note=note)
            # A request that had to ask the server for its model made it the client's: say which it is.
            if record is not None and record.model:
                reply.set_label(record.model)
            self._update_badge()
            partial = reply.text
            if status == "error" and not partial and self.history and self.history[-1]["role"] == "user":
                # The prompt went back into the input: it is not part of what the next request carries.
                self.history.pop()
            if partial or refusal:
                # A refusal is what the model said: the next request carries it, as a resumed one does.
                self.history.append({"role": "assistant", "content": partial or refusal})
            if writer is not None:
                try:
                    await writer.finish(
                        status="done" if status == "cached" else status,
                        error=error,
                        record=record.summary() if record is not None else None,
                        tool_calls=calls,
                        refusal=refusal,
                    )
                except HistoryError as exc:
                    self.notify(f"{exc}; this reply is not saved", severity="error", timeout=10, markup=False)
            if alternative_to is not None and self.is_running:
                # A regenerated or re-asked reply is compared with the ones before it in the HUD.
                await self.compare_alternatives(reply)


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
    pinned: bool = False,
    pools: Pools | None = None,
) -> ChatApp:
    """The app factory tests and the command line build the app through. The app closes ``client``, ``pools``
    (by default ``client``'s: every client the app opens shares them) and ``store`` when it exits.
    ``freeze_gc``: move start-up's objects out of the garbage collector's reach after the first frame (the
    `llmchat` program only; see ``on_mount``). ``pinned``: the command line named the provider, model or URL,
    so a conversation resumed at start goes on with ``client`` as it is."""
    return ChatApp(settings=settings, client=client, store=store, conversation_id=conversation_id,
                   continue_last=continue_last, offline=offline, metrics_port=metrics_port,
                   freeze_gc=freeze_gc, pinned=pinned, pools=pools)


__all__ = ["ChatApp", "Offline", "make_app", "reply_note"]
