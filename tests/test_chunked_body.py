"""The transport reads a chunked HTTP/1.1 body itself (core/http/_transport.py ``_H11Connection`` and
``_Chunks``): every split of the bytes gives the same data, h11 keeps the framing (the last chunk, trailers,
keep-alive, every malformed line), and a body cut short fails as before. Raw peers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import h11._readers
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
    lines = (b"1a", b"1A;x=y \t", b"1A ; x=y", b"2;x\nab", b"0", b" 5", b"-1", b"0x5", b"", b"1_0")
    assert [_chunk_size(line) for line in lines] == [26, 26, 0, 0, 0, 0, 0, 0, 0, 0]  # as h11 reads them


@settings(max_examples=500, deadline=None)
@given(line=st.text(alphabet="0123456789abcdefABCDEF ;=\tx-_\r\n", max_size=24).map(str.encode))
def test_a_size_line_reads_as_h11_reads_it(line: bytes) -> None:
    # The fast path (one regex match on a whole chunk) and the slow one (_chunk_size) take exactly the lines
    # h11's own grammar takes, with the same size; every other line goes to h11, which judges it.
    if b"\r\n" in line:
        return  # a line ends at its first CRLF
    h11_head = h11._readers.chunk_header_re.fullmatch(line + b"\r\n")
    ours = _chunk_size(line)
    fast = _CHUNK_HEAD.match(line + b"\r\nrest")
    if ours:
        assert h11_head is not None and int(h11_head["chunk_size"], 16) == ours
        assert fast is not None and fast.end() == len(line) + 2 and int(fast[1], 16) == ours
    elif h11_head is not None:
        assert len(h11_head["chunk_size"]) > 16 or int(h11_head["chunk_size"], 16) == 0
    if fast is not None:
        assert fast.end() == len(line) + 2 and int(fast[1], 16) in (ours, 0)


def test_a_body_taken_over_within_a_chunk_or_its_crlf() -> None:
    assert _Chunks(left=3).feed(b"lo!\r\n2\r\nab\r\n0\r\n\r\n") == (b"lo!ab", b"0\r\n\r\n")
    assert _Chunks(crlf=1).feed(b"\n1\r\nz\r\n") == (b"z", None)
    # A chunk not followed by its CRLF: the data before goes up, and h11 gets the rest, told what was due.
    body = _Chunks()
    assert body.feed(b"5\r\nHello\r\n1\r\nzX") == (b"Helloz", b"X") and body.footer == b"\r\n"
    body = _Chunks(left=1)
    assert body.feed(b"ab\r\n") == (b"a", b"b\r\n") and body.footer == b"\r\n"


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


@pytest.mark.parametrize("split", [True, False], ids=["own-write", "with-the-head"])
async def test_a_size_line_h11_refuses_is_refused_however_it_arrives(
    peer: Callable[..., P.Peer], tmp_path: Path, split: bool
) -> None:
    # Blanks before ';' are not in h11's grammar: the same bytes fail the same way in one write or two.
    bad = b"2 ;x\r\nhi\r\n"
    steps: list[P.Step] = [P.SSE_HEAD + P.event(P.delta("Hi")), P.Pause(0.02), bad] if split else [
        P.SSE_HEAD + P.event(P.delta("Hi")) + bad]
    p = peer(steps, then="close")
    async with client(p.base_url, tmp_path) as c:
        text, exc = await asyncio.wait_for(drain(c.stream(MESSAGES)), 10)
    assert text == "Hi" and isinstance(exc, StreamCutError) and "chunk header" in str(exc)


async def test_a_wrong_chunk_size_keeps_the_text_before_it(peer: Callable[..., P.Peer], tmp_path: Path) -> None:
    # A server that counted characters, not bytes: its chunk is one byte short for the "é" in it.
    good = P.event(P.delta("Hello")) + P.event(P.delta(" world"))
    payload = b"data: " + json.dumps(P.delta("caf\u00e9"), ensure_ascii=False).encode() + b"\n\n"
    short = f"{len(payload) - 1:x}\r\n".encode() + payload + b"\r\n"
    p = peer([P.SSE_HEAD, P.Pause(0.02), good + short], then="close")
    async with client(p.base_url, tmp_path) as c:
        text, exc = await asyncio.wait_for(drain(c.stream(MESSAGES)), 10)
    assert text == "Hello world" and isinstance(exc, StreamCutError)
    assert "invalid HTTP/1.1: malformed chunk footer" in str(exc)


async def test_a_malformed_chunk_line_mid_body_is_h11s_error(peer: Callable[..., P.Peer], tmp_path: Path) -> None:
    p = peer(_sse(P.event(P.delta("Hello")), P.Pause(0.02), b"zz\r\nnot a chunk\r\n"), then="close")
    async with client(p.base_url, tmp_path) as c:
        text, exc = await asyncio.wait_for(drain(c.stream(MESSAGES)), 10)
    assert text == "Hello" and isinstance(exc, StreamCutError)
    assert "invalid HTTP/1.1" in str(exc) and "chunk header" in str(exc)
