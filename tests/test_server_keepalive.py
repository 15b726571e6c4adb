"""The local server never closes a kept-alive connection for having served many requests."""

from __future__ import annotations

import httpx

from llmchat.core.server import RunningServer


async def test_one_h2_connection_serves_more_than_a_thousand_requests(local_server: RunningServer) -> None:
    # hypercorn's default (keep_alive_max_requests = 1000) would cut this connection and every stream on it.
    async with httpx.AsyncClient(http1=False, http2=True, base_url=local_server.url) as client:
        statuses = set()
        for _ in range(1010):
            statuses.add((await client.get("/health")).status_code)
    assert statuses == {200}
