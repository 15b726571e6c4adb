"""The chat app: the conversation and prompt on the left, the HUD on the right.

The app never touches httpx: it talks to ``ChatClient`` and listens to the engine's bus. Every reply runs in one
exclusive worker (group ``reply``); "a reply is in flight" is derived from that worker's state, never from a
flag reset in ``finally`` (a cancelled worker's cleanup can run after its replacement started).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar
from urllib.parse import urlsplit

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, Static
from textual.worker import Worker, WorkerState

from llmchat.core import (
    APIError,
    ChatClient,
    LLMChatError,
    ServerSignals,
    Settings,
    UsageError,
    Warmer,
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
from llmchat.tui.keys import binding, effective_keys, key_label
from llmchat.tui.palette import ProviderCommands
from llmchat.tui.paths import PathSuggester
from llmchat.tui.screens.help import HelpScreen
from llmchat.tui.screens.history import HistoryScreen
from llmchat.tui.screens.system_prompt import SystemPromptScreen
from llmchat.tui.screens.text_input import TextInputScreen
from llmchat.tui.screenshot import TITLE as SCREENSHOT
from llmchat.tui.screenshot import save_screenshot, screenshot_folders
from llmchat.tui.widgets.chat import ChatMessage, Conversation, PromptInput, Status, UserMessage
from llmchat.tui.widgets.hud import Hud

NARROW = 100  # columns under which the HUD folds away by itself
W = TypeVar("W", bound=Widget)


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
    if summary.get("mode") == "stream" and summary.get("ttft_ms") is not None:
        parts.append(f"TTFT {summary['ttft_ms']:.0f} ms")
    if summary.get("total_ms") is not None:
        parts.append(f"total {summary['total_ms']:.0f} ms")
    if summary.get("tokens_per_s"):
        parts.append(f"{summary['tokens_per_s']:.0f} tok/s")
    if summary.get("retries"):
        parts.append(f"{summary['retries']} retries")
    return " · ".join(p for p in parts if p)


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
        binding("hud.charts", "hud_detail"),
        binding("copy.reply", "copy_reply"),
        binding("copy.code", "copy_code"),
        binding("history.open", "history"),
        binding("conversation.new", "new_conversation"),
        binding("help.open", "keys_help"),
        binding("attach.file", "attach_file"),
        binding("app.quit", "quit", priority=True),
    ]

    stream_mode: reactive[bool] = reactive(True)
    show_hud: reactive[bool] = reactive(True)

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
    ) -> None:
        super().__init__()
        self._freeze_gc = freeze_gc
        self.settings = settings
        self.client = client
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
        if settings.ui.theme:
            self.theme = settings.ui.theme

    # -- layout ---------------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            with Vertical(id="chat"):
                yield Static(self._badge_text(), id="badge")
                yield Conversation(id="conversation")
                yield PromptInput(id="prompt", send_keys=self.keys_in_effect["prompt.send"],
                                  newline_keys=self.keys_in_effect["prompt.newline"], hold_on_send=True)
            yield Hud(bus=self.client.bus, ui=self.settings.ui, id="hud")
        yield Footer()

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
        ep = self.client.endpoint
        where = "local server (offline demo)" if self.offline else f"{ep.name} · {ep.hostport}"
        return f"{where} · {self.client.model or 'default model'} · {'stream' if self.stream_mode else 'batch'}"

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
        self._show_endpoint()
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

    def on_resize(self, event: Any) -> None:
        self._apply_hud_visibility(event.size.width)

    def _apply_hud_visibility(self, width: int) -> None:
        hud = self.query_one(Hud)
        hud.display = self.show_hud and width >= NARROW

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

    def watch_show_hud(self, _value: bool) -> None:
        if self._screen_up:
            self._apply_hud_visibility(self.size.width)

    def watch_stream_mode(self, value: bool) -> None:
        if not self._screen_up:
            return
        self.query_one("#badge", Static).update(self._badge_text())
        self.query_one(Hud).mode = "stream" if value else "batch"
        self.sub_title = "stream mode" if value else "batch mode"

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

    def _say_reply_coming(self) -> None:
        cancel = key_label(self.keys_in_effect["reply.cancel"]).split(" / ")[0]
        self.notify(f"a reply is still coming; {cancel} cancels it", severity="warning")

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
        self.show_hud = not self.show_hud

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
        client = (ChatClient(self.settings, provider=name, bus=self.client.bus) if configured
                  else ChatClient(self.settings, provider=name, base_url=base_url, bus=self.client.bus))
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
    async def _load_conversation(self, conv_id: int, *, at_start: bool = False) -> None:
        """Shows conversation ``conv_id`` and goes on with its system prompt, generation settings, provider
        and model (see ``_reconnect``; ``at_start``: opened by the command line)."""
        conv = await self.store.load(conv_id)
        self.conversation_id = conv_id
        self.system_prompt = conv.system_prompt
        self.generation = conv.generation
        await self._reconnect(conv, at_start=at_start)
        self.history = [m for m in conv.messages_for_api() if m["role"] != "system"]
        view = self.query_one(Conversation)
        await view.clear()
        widgets: list[UserMessage | ChatMessage] = []
        for msg in conv.messages:
            if msg.role == "user":
                widgets.append(UserMessage(msg.content))
            elif msg.role == "assistant":
                status: Status = msg.status if msg.status in ("cancelled", "error") else "done"  # type: ignore[assignment]
                if status == "done" and msg.record is not None and msg.record.get("cache_hit"):
                    status = "cached"
                note = msg.error or reply_note(msg.record)
                # "interrupted": llmchat quit mid-reply; "streaming": the process writing it was killed.
                # Either way the reply was cut off, and it must not look whole.
                if msg.status in ("interrupted", "streaming"):
                    cut = "interrupted: the reply was cut off"
                    status, note = "cancelled", f"{cut} · {note}" if note else cut
                widgets.append(ChatMessage(msg.content, status=status, note=note))
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
        try:
            await self._save_prompt(text)
        except HistoryError as exc:
            self.query_one(PromptInput).restore(event.text)
            self.notify(f"{exc}; your message is back in the input", severity="error", timeout=15,
                        markup=False)
            self._hold_prompt()  # nothing went out: the prompt is free to send it again
            return
        self.history.append({"role": "user", "content": content})
        view = self.query_one(Conversation)
        view.add_user(text)
        reply = view.add_assistant()
        self._last_reply = reply
        self._show_fit(fit)
        self._reply(event.text.strip(), reply, self.stream_mode, fit.messages)
        self._hold_prompt()  # the prompt held itself when it sent; from here on the worker's state decides

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
        origin, base_url = self._origin(self.client)
        self.conversation_id = await self.store.new_conversation(
            system_prompt=self.system_prompt, provider=self.client.endpoint.name, model=self.client.model,
            origin=origin, base_url=base_url, generation=self.generation,
        )
        await self.store.add_user_message(self.conversation_id, text)

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
                     messages: list[dict[str, Any]] | None = None) -> None:
        client = self.client
        params = self.generation.params()  # this conversation's settings, sent with every request
        origin, base_url = self._origin(client)
        assert self.conversation_id is not None
        writer: ReplyWriter | None = None
        record: TimingRecord | None = None
        status: Literal["done", "cached", "cancelled", "interrupted", "error"] = "done"
        note, error = "", None
        try:
            try:
                msg_id = await self.store.start_reply(
                    self.conversation_id, provider=client.endpoint.name, model=client.model,
                    mode="stream" if stream else "batch", origin=origin, base_url=base_url,
                )
                writer = self.store.reply_writer(msg_id)
            except HistoryError as exc:
                # The prompt is saved; its answer still comes, unsaved, and the user knows.
                self.notify(f"{exc}; this reply is not saved", severity="error", timeout=10, markup=False)
            messages = messages if messages is not None else self._messages()
            if stream:
                chat = client.stream(messages, **params)
                record = chat.record
                async for piece in chat:
                    reply.append(piece, time.perf_counter_ns())
                    if writer is not None:
                        writer.append(piece)
                # A hit here is a replayed stream ([cache] replay_streams).
                status = "cached" if record.cache_hit else "done"
            else:
                answer = await client.complete(messages, **params)
                record = answer.record
                reply.append(answer.text, time.perf_counter_ns())
                if writer is not None:
                    writer.append(answer.text)
                status = "cached" if record.cache_hit else "done"
        except APIError as exc:
            record = record or (exc.record if isinstance(exc.record, TimingRecord) else None)
            status, error = "error", str(exc)
            if isinstance(messages[-1].get("content") if messages else None, list) and exc.status == 400:
                error += "; the message had an image: use a vision model, or send the text alone"
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
            note = error or (reply_note(record.summary()) if record is not None else "")
            reply.finish(status="cancelled" if status == "interrupted" else status, note=note)
            partial = reply.text
            if status == "error" and not partial and self.history and self.history[-1]["role"] == "user":
                # The prompt went back into the input: it is not part of what the next request carries.
                self.history.pop()
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
    pinned: bool = False,
) -> ChatApp:
    """The app factory tests and the command line build the app through. The app closes ``client`` and
    ``store`` when it exits. ``freeze_gc``: move start-up's objects out of the garbage collector's reach
    after the first frame (the `llmchat` program only; see ``on_mount``). ``pinned``: the command line named
    the provider, model or URL, so a conversation resumed at start goes on with ``client`` as it is."""
    return ChatApp(settings=settings, client=client, store=store, conversation_id=conversation_id,
                   continue_last=continue_last, offline=offline, metrics_port=metrics_port,
                   freeze_gc=freeze_gc, pinned=pinned)


__all__ = ["ChatApp", "Offline", "make_app", "reply_note"]
