"""A target that costs next to nothing, for benchmarks about the client alone: every POST gets the same
chunked SSE reply (``--tokens`` deltas, a usage chunk, ``[DONE]``) in one write, every GET the model list, on
keep-alive connections. Run as a process of its own; it prints its base URL on its first line.

    python benchmarks/_canned.py [--tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json

MODEL = "llmchat-local"


def _chunk(payload: bytes) -> bytes:
    return f"{len(payload):x}\r\n".encode() + payload + b"\r\n"


def reply(tokens: int) -> bytes:
    """The whole HTTP/1.1 response to a chat completion, one content delta per token."""
    def event(delta: dict[str, object], finish: str | None = None, **extra: object) -> bytes:
        obj = {"id": "canned", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
        return _chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")

    body = b"".join(event({"content": f"token{i} "}) for i in range(tokens))
    body += event({}, "length", usage={"prompt_tokens": 5, "completion_tokens": tokens,
                                       "total_tokens": tokens + 5})
    body += _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    return (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            + body)


def models() -> bytes:
    body = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body) + body


class _Canned(asyncio.Protocol):
    """Reads each request's head and body (by content-length) and writes the canned response."""

    def __init__(self, post: bytes, get: bytes) -> None:
        self._post, self._get = post, get
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self._buffer
        buf += data
        while (end := buf.find(b"\r\n\r\n")) >= 0:
            head = bytes(buf[:end]).lower()
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.startswith(b"content-length:")), 0)
            if len(buf) < end + 4 + length:
                return
            del buf[:end + 4 + length]
            assert self._transport is not None
            self._transport.write(self._get if head.startswith(b"get") else self._post)


async def serve(tokens: int) -> None:
    post, get = reply(tokens), models()
    server = await asyncio.get_running_loop().create_server(lambda: _Canned(post, get), "127.0.0.1", 0)
    print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1", flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    asyncio.run(serve(parser.parse_args().tokens))
