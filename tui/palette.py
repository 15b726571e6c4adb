"""The command palette's llmchat commands: providers and their models, the conversation's system prompt and
generation settings, export.

Each entry's help says what is in effect now: "● current" on the provider and model the next message goes
to, the system prompt's first line, each setting's value, the folder exports go to. Models come from each
provider's own ``/models``, fetched once per palette session with a short timeout so an unreachable provider
costs one line of help text, not a frozen palette.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from textual.command import DiscoveryHit, Hit, Hits, Provider

from llmchat.core import APIError, ChatClient

if TYPE_CHECKING:
    from llmchat.tui.app import ChatApp

CURRENT = "● current"
NEXT = "use it from the next message"
#: How much of the system prompt an entry's help shows.
PROMPT_SHOWN = 60


def _shown(text: str, limit: int = PROMPT_SHOWN) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


class ProviderCommands(Provider):
    """Switch provider or model (from the next message on; the conversation keeps them), edit the system
    prompt, set temperature, seed and max tokens for this conversation, export it."""

    async def startup(self) -> None:
        app: ChatApp = self.app  # type: ignore[assignment]
        gen = app.generation
        prompt = f"now: {_shown(app.system_prompt)}" if app.system_prompt else "none set"
        folder = app.export_folder()
        self._commands: list[tuple[str, str, Callable[[], Awaitable[Any] | Any]]] = [
            ("Edit system prompt", f"{prompt} · for this conversation", app.action_system_prompt),
            ("Set temperature",
             f"now {gen.shown('temperature') or 'not set'} · 0 makes batch replies cacheable",
             partial(app.action_generation, "temperature")),
            ("Set seed", f"now {gen.shown('seed') or 'not set'} · a seed makes batch replies cacheable",
             partial(app.action_generation, "seed")),
            ("Set max tokens", f"now {gen.shown('max_tokens') or 'not set'} · the longest reply",
             partial(app.action_generation, "max_tokens")),
            ("Export conversation to Markdown", f"a new llmchat-ID.md in {folder}",
             partial(app.action_export, "markdown")),
            ("Export timing records to JSON", f"a new llmchat-ID.json in {folder}",
             partial(app.action_export, "json")),
            ("Toggle stream / batch mode", "", app.action_toggle_mode),
            ("History", "open, rename or delete conversations", app.action_history),
            ("Search conversations", "find a message of any conversation by its words", app.action_search),
        ]
        current = next((key for key, client in app.clients.items() if client is app.client), None)
        keys = list(app.settings.providers)
        if current is not None and current not in keys:
            keys.insert(0, current)  # the offline demo's server or an ad-hoc --base-url
        models = await asyncio.gather(*(self._models(app, key) for key in keys))
        for key, offered in zip(keys, models, strict=True):
            here = key == current
            help_text = CURRENT if here else NEXT
            if here and app.offline is not None:
                help_text += " · the offline demo's local server"
            self._commands.append((f"Provider: {key}", help_text, partial(app.switch_provider, key)))
            if here and app.client.model and app.client.model not in offered:
                offered = [app.client.model, *offered]  # the model in use, even when /models does not say it
            for model in offered:
                mark = here and model == app.client.model
                self._commands.append((f"Model: {key} / {model}", CURRENT if mark else NEXT,
                                       partial(app.switch_provider, key, model)))

    async def _models(self, app: ChatApp, key: str) -> list[str]:
        client = app.clients.get(key)
        try:
            if client is None:
                async with ChatClient(app.settings, provider=key, use_cache=False, pools=app.pools) as fresh:
                    return await asyncio.wait_for(fresh.models(), 3.0)
            return await asyncio.wait_for(client.models(), 3.0)
        except (APIError, TimeoutError, Exception):  # a palette must open whatever the network does
            return []

    async def discover(self) -> Hits:
        for title, help_text, command in self._commands:
            yield DiscoveryHit(title, command, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, command in self._commands:
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), command, help=help_text)
