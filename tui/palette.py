"""The command palette's llmchat commands: providers and their models, system prompt, export.

Models come from each provider's own ``/models``, fetched once per palette session with a short timeout so an
unreachable provider costs one line of help text, not a frozen palette.
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


class ProviderCommands(Provider):
    """Switch provider or model (applies to the next message), set the system prompt, export."""

    async def startup(self) -> None:
        app: ChatApp = self.app  # type: ignore[assignment]
        self._commands: list[tuple[str, str, Callable[[], Awaitable[Any] | Any]]] = [
            ("Set system prompt", "a system prompt for this conversation", app.action_system_prompt),
            ("Export conversation to Markdown", "writes llmchat-ID.md here", partial(app.action_export, "markdown")),
            ("Export timing records to JSON", "writes llmchat-ID.json here", partial(app.action_export, "json")),
            ("Toggle stream / batch mode", "", app.action_toggle_mode),
            ("History", "open, rename or delete conversations", app.action_history),
        ]
        names = list(app.settings.providers) or [app.client.endpoint.name]
        models = await asyncio.gather(*(self._models(app, n) for n in names))
        for name, offered in zip(names, models, strict=True):
            self._commands.append((f"Provider: {name}", "use it from the next message", partial(app.switch_provider, name)))
            for model in offered:
                self._commands.append(
                    (f"Model: {name} / {model}", "use it from the next message", partial(app.switch_provider, name, model))
                )

    async def _models(self, app: ChatApp, name: str) -> list[str]:
        client = app.clients.get(name)
        try:
            if client is None:
                async with ChatClient(app.settings, provider=name, use_cache=False) as fresh:
                    return await asyncio.wait_for(fresh.models(), 3.0)
            return await asyncio.wait_for(client.models(), 3.0)
        except (APIError, asyncio.TimeoutError, Exception):  # a palette must open whatever the network does
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
