"""A Locust ``User`` that drives llmchat's engine, for load tests bigger than one machine.

Locust (the ``locust`` extra) runs users as gevent greenlets and can spread them over workers on many
machines; this module gives it a user that sends the same requests `llmchat bench` sends (the same synthetic
prompts, ``--long-ratio``, stream or batch mode, ``max_tokens``) through ``ChatClient``, and reports each as
Locust request events: ``ttft`` (time to first token, stream mode), ``e2e`` (end to end; a failure is
reported here, once, with its error) and ``ttfb`` (time to the response headers). Response lengths are output
tokens. Importing this module imports locust, which monkey-patches the standard library for gevent: import it
only in a locustfile, never from an application (``import llmchat.core`` does not import it).

How asyncio runs inside gevent: asyncio keeps its running loop per OS thread, not per greenlet, so users
cannot each run a loop of their own. One loop per Locust process runs in a greenlet of its own
(``run_forever``); Locust patches the standard library before asyncio is imported, so the loop's selector and
sockets are gevent's and a loop waiting for bytes yields to the other greenlets. A user hands each request to
that loop and waits on a gevent ``AsyncResult`` (same thread, so no locks), so Locust's scheduling, its
``wait_time`` and its stop all work as with its own HTTP users. Each user has a ``ChatClient`` with a
connection pool of its own, kept for the user's life: its second request reuses its connection, as a real
client's would, and users never share one. All timing comes from the engine's records
(``time.perf_counter_ns``), never from Locust's clock.

Use it from a locustfile (``llmchat.core.load.locustfile`` ships one; ``llmchat locust`` runs it)::

    from llmchat.core.load.locust_user import LLMChatUser

    class Chat(LLMChatUser):
        mode = "stream"
        max_tokens = 200

and run ``locust -f locustfile.py --host http://127.0.0.1:8000/v1``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any, ClassVar, TypeVar

import gevent
from gevent.event import AsyncResult
from locust import User, events, task

from llmchat.core.client import ChatClient
from llmchat.core.config import Http2Mode, Settings
from llmchat.core.http import Pools
from llmchat.core.load._locust_report import REQUEST_TYPE, report
from llmchat.core.load._prompts import PromptPlan
from llmchat.core.load._run import request_once
from llmchat.core.observe import TimingRecord

T = TypeVar("T")

__all__ = ["REQUEST_TYPE", "LLMChatUser", "report"]

_user_numbers = itertools.count()

_SETTLE_S = 5.0
"""How long a stop waits for requests on the engine's loop to unwind (closing their connections there)."""


def _fresh_clock(**_: Any) -> None:
    # gevent's loop reads the clock only when it runs. After a slow import (llmchat's engine, in a locustfile)
    # its "now" is seconds old, and Locust's --run-time timer, started from it, would fire that much early.
    gevent.get_hub().loop.update_now()


events.init.add_listener(_fresh_clock)  # type: ignore[no-untyped-call]


class LLMChatUser(User):
    """One chat user: one ``ChatClient`` (one pooled connection), requests sent one after another.

    Class attributes set the scenario; Locust's ``--host`` is the API root (``http://HOST:PORT/v1``). The API
    key comes from ``api_key``, else the environment variable named by ``api_key_env`` (default
    ``OPENAI_API_KEY``); it is sent only to ``--host`` and never reported.
    """

    abstract = True

    mode: ClassVar[str] = "stream"
    """``stream`` (reports ttft, ttfb and e2e) or ``batch`` (ttfb and e2e)."""
    model: ClassVar[str | None] = None
    """The model; None asks the server's /models once per user and takes the first."""
    max_tokens: ClassVar[int | None] = 200
    long_ratio: ClassVar[float] = 0.0
    """The share of prompts over 1,000 tokens, as `llmchat bench --long-ratio`."""
    seed: ClassVar[int] = 0
    http2: ClassVar[Http2Mode | None] = None
    """None follows the settings (HTTP/2 by ALPN over https, HTTP/1.1 over http); "h2c" for llmchat serve."""
    api_key: ClassVar[str | None] = None
    api_key_env: ClassVar[str] = "OPENAI_API_KEY"
    settings: ClassVar[Settings | None] = None
    """Engine settings (timeouts, retries, pool); the reply cache is always off: a load test measures the
    server, not the disk."""
    params: ClassVar[dict[str, Any]] = {}
    """More request parameters (temperature, seed, ...)."""

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        # Numbered across workers too, so no two users of a distributed run send the same prompts.
        worker = getattr(environment.runner, "worker_index", 0) or 0
        self.number = worker * 1_000_000 + next(_user_numbers)
        self.sent = 0
        self.plan = PromptPlan(self.seed, self.long_ratio)
        self._client: ChatClient | None = None
        # Pools of this user's own, closed in on_stop: users are separate clients and share no connection. Its
        # transport is made on the engine's loop (which owns its sockets), at the user's first request.
        self._pools = Pools()

    def on_start(self) -> None:
        settings = self.settings or Settings()
        settings = replace(settings, cache=replace(settings.cache, policy="off"))
        api_key = self.api_key or os.environ.get(self.api_key_env) or None
        self._client = ChatClient(settings, base_url=self.host, api_key=api_key, model=self.model,
                                  http2=self.http2, use_cache=False, pools=self._pools)

    def on_stop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            _engine(self.environment).run(self._close(client, self._pools))

    @staticmethod
    async def _close(client: ChatClient, pools: Pools) -> None:
        await client.aclose()
        await pools.aclose()

    @task
    def chat(self) -> None:
        """Send the next prompt of the scenario and report it."""
        messages, _ = self.plan.messages(self.number, self.sent)
        self.sent += 1
        record = self.send(messages)
        report(self.environment.events.request, record, self.context())

    def send(self, messages: list[dict[str, str]]) -> TimingRecord:
        """One request through the engine; its record (an APIError ends up in it). Blocks this greenlet."""
        assert self._client is not None, "on_start has not run"
        params = dict(self.params)
        if self.max_tokens is not None:
            params.setdefault("max_tokens", self.max_tokens)
        mode = "batch" if self.mode == "batch" else "stream"
        return _engine(self.environment).run(self._request(self._client, messages, mode, params))

    @staticmethod
    async def _request(client: ChatClient, messages: list[dict[str, str]], mode: Any,
                       params: dict[str, Any]) -> TimingRecord:
        model = client.model or await client._model(None)
        return await request_once(client, messages, mode=mode, model=model, params=params)


class _Engine:
    """The asyncio loop of one Locust process, running in a greenlet of its own."""

    def __init__(self) -> None:
        # Locust logs at INFO; httpx logs every request there, which at load is a line per request.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        self.loop = asyncio.new_event_loop()
        self.greenlet = gevent.spawn(self.loop.run_forever)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for it in this greenlet; a killed greenlet cancels it."""
        result: AsyncResult = AsyncResult()
        holder: list[asyncio.Task[T]] = []

        def done(task: asyncio.Task[T]) -> None:
            if task.cancelled():
                result.set_exception(asyncio.CancelledError())
            elif task.exception() is not None:
                result.set_exception(task.exception())
            else:
                result.set(task.result())

        def start() -> None:
            if abandoned:
                coro.close()  # the caller was killed before the loop got to it: never start it
                return
            task = self.loop.create_task(coro)
            holder.append(task)
            task.add_done_callback(done)

        abandoned = False
        self.loop.call_soon_threadsafe(start)
        try:
            value: T = result.get()
        except BaseException:
            # Killed (Locust stopping this user), often before the loop has even started the request. Started
            # or not, no request of this user may outlive the call: one started after its user's on_stop
            # closed the client would be left suspended mid-request when the loop stops, finalized at exit
            # with tracebacks, its connection (an asyncio transport of this loop) never closed. So a request
            # not yet started never starts, and a started one is cancelled and waited for while it unwinds
            # (closing its connection on its own loop).
            abandoned = True
            if holder and not holder[0].done():
                self.loop.call_soon_threadsafe(holder[0].cancel)
                result.wait(timeout=_SETTLE_S)
            raise
        return value

    def stop(self) -> None:
        """Cancel what still runs on the loop, wait for it to finish there, then stop the loop and close it
        (as ``asyncio.run`` ends; call once no user is running)."""
        if self.loop.is_closed():
            return
        if not self.greenlet.dead:
            try:
                self.run(self._settle())
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self.greenlet.join(timeout=_SETTLE_S)
        if not self.loop.is_running():
            self.loop.close()

    @staticmethod
    async def _settle() -> None:
        current = asyncio.current_task()
        pending = [t for t in asyncio.all_tasks() if t is not current]
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending, timeout=_SETTLE_S)
        for t in pending:
            if t.done() and not t.cancelled():
                t.exception()  # retrieved: the user already reported it, asyncio need not log it again
        await asyncio.get_running_loop().shutdown_asyncgens()


_engines: dict[int, _Engine] = {}


def _engine(environment: Any) -> _Engine:
    engine = _engines.get(id(environment))
    if engine is None or engine.loop.is_closed():
        engine = _engines[id(environment)] = _Engine()
        environment.events.quitting.add_listener(lambda **_: engine.stop())
    return engine
