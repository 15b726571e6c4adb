"""The transport reads a chunked HTTP/1.1 body itself (core/http/_transport.py ``_H11Connection`` and
``_Chunks``): every split of the bytes gives the same data, h11 keeps the framing (the last chunk, trailers,
keep-alive, every malformed line), and a body cut short fails as before. Raw peers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import peers as P
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_client_errors import MESSAGES, client, drain, isolated_env

from llmchat.core import StreamCutError
from llmchat.core.http._transport import _CHUNK_HEAD, _chunk_size, _Chunks

pytestmark = pytest.mark.usefixtures(isolated_env.__name__)  # no real config, cache or key


def _framed(payloads: list[bytes], sizes: list[str]) -> bytes:
    return b"".join(f"{size}\r\n".encode() + p + b"\r\n" for p, size in zip(payloads, sizes, strict=True))


@settings(max_examples=200, deadline=None)
@given(payloads=st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=8),
       style=st.sampled_from(["lower", "upper", "zeros", "ext"]), cuts=st.lists(st.integers(0, 400), max_size=12))
def test_every_split_of_a_chunked_body_gives_the_same_data(payloads: list[bytes], style: str,
                                                           cuts: list[int]) -> None:
    forms = {"lower": "{:x}", "upper": "{:X}", "zeros": "000{:x}", "ext": "{:x};name=value"}
    sizes = [forms[style].format(len(p)) for p in payloads]
    tail = b"0\r\nX-Trailer: 1\r\n\r\nNEXT"
    wire = _framed(payloads, sizes) + tail
    body, got, rest = _Chunks(), bytearray(), None
    bounds = sorted({c for c in cuts if c < len(wire)} | {0, len(wire)})
    for a, b in zip(bounds, bounds[1:], strict=False):
        piece, rest = body.feed(wire[a:b])
        got += piece
        if rest is not None:
            rest += wire[b:]
            break
    assert bytes(got) == b"".join(payloads) and rest == tail  # h11 gets the last chunk on, byte for byte


def test_a_line_that_is_not_a_plain_size_goes_to_h11_at_its_boundary() -> None:
    body = _Chunks()
    piece, rest = body.feed(b"5\r\nhello\r\nzz\r\nmore")
    assert piece == b"hello" and rest == b"zz\r\nmore"
    assert [_chunk_size(line) for line in (b"1a", b"1A ; x=y", b"0", b" 5", b"-1", b"0x5", b"", b"1_0")] == [
        26, 26, 0, 0, 0, 0, 0, 0]


@settings(max_examples=300, deadline=None)
@given(line=st.text(alphabet="0123456789abcdefABCDEF ;=\tx-_", max_size=24).map(str.encode))
def test_the_fast_size_line_and_the_slow_one_agree(line: bytes) -> None:
    # A whole chunk is cut by one regex match; a split one by _chunk_size: the same line, the same size.
    head = _CHUNK_HEAD.fullmatch(line + b"\r\n")
    slow = _chunk_size(line)
    if head is not None:
        assert int(head[1], 16) == slow or (slow == 0 and int(head[1], 16) == 0)
    if slow:
        assert head is not None and int(head[1], 16) == slow


def test_a_body_taken_over_within_a_chunk_or_its_crlf() -> None:
    assert _Chunks(left=3).feed(b"lo!\r\n2\r\nab\r\n0\r\n\r\n") == (b"lo!ab", b"0\r\n\r\n")
    assert _Chunks(crlf=1).feed(b"\n1\r\nz\r\n") == (b"z", None)
    with pytest.raises(Exception, match="malformed chunk footer"):
        _Chunks(left=1).feed(b"ab\r\n")


def _sse(*steps: P.Step) -> list[P.Step]:
    return [P.SSE_HEAD, *steps]


async def test_odd_splits_extensions_and_trailers_then_the_connection_is_reused(
    peer: Callable[..., P.Peer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Written as a server under load writes: the head with the first chunk, a chunk cut inside its data and
    # inside its CRLF, a size with an extension, then the last chunk with a trailer; the connection is kept.
    one = P.event(P.delta("Hel"))
    two = P.event(P.delta("lo, "))
    three = b"data: " + json.dumps(P.delta("world")).encode() + b"\n\n"
    three_ext = f"{len(three):x};x=1\r\n".encode() + three + b"\r\n"
    steps = [P.SSE_HEAD + one + two[:9], P.Pause(0.02), two[9:-1], P.Pause(0.02), two[-1:] + three_ext[:4],
             P.Pause(0.02), three_ext[4:] + P.DONE, P.Pause(0.02), b"0\r\nX-Done: yes\r\n\r\n"]
    p = peer(steps, then="keep")
    fed: list[bytes] = []
    feed = _Chunks.feed

    def counting(self: _Chunks, data: bytes) -> tuple[bytes, bytes | None]:
        fed.append(data)
        return feed(self, data)

    monkeypatch.setattr(_Chunks, "feed", counting)
    async with client(p.base_url, tmp_path) as c:
        first = c.stream(MESSAGES)
        text, exc = await drain(first)
        assert exc is None and text == "Hello, world"
        second = c.stream(MESSAGES)
        text2, exc2 = await drain(second)
    assert exc2 is None and text2 == "Hello, world"
    assert second.record.connection_reused and p.requests == 2
    assert len(fed) >= 6  # each body past its first write was read here (from within a chunk), not by h11


async def test_a_body_cut_short_fails_as_a_dropped_stream_with_the_partial_kept(
    peer: Callable[..., P.Peer], tmp_path: Path
) -> None:
    p = peer(_sse(P.event(P.delta("Hello")), P.Pause(0.02), P.event(P.delta(" wor"))), then="close")
    async with client(p.base_url, tmp_path) as c:
        text, exc = await drain(c.stream(MESSAGES))
    assert text == "Hello wor" and isinstance(exc, StreamCutError)
    assert "dropped mid-reply" in str(exc) and "incomplete chunked read" in str(exc)


async def test_a_malformed_chunk_line_mid_body_is_h11s_error(peer: Callable[..., P.Peer], tmp_path: Path) -> None:
    p = peer(_sse(P.event(P.delta("Hello")), P.Pause(0.02), b"zz\r\nnot a chunk\r\n"), then="close")
    async with client(p.base_url, tmp_path) as c:
        text, exc = await asyncio.wait_for(drain(c.stream(MESSAGES)), 10)
    assert text == "Hello" and isinstance(exc, StreamCutError)
    assert "invalid HTTP/1.1" in str(exc) and "chunk header" in str(exc)
