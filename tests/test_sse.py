"""The SSE decoder against the WHATWG event-stream rules, one rule per test, then against a slow reference."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmchat.core.http._sse import ServerSentEvent, SSEDecoder

# ----------------------------------------------------------------------------------------------------
# Reference: the spec's algorithm transcribed line by line, slow and obvious, over the whole stream at once.


def reference_decode(stream: bytes) -> tuple[list[ServerSentEvent], int | None, str]:
    """Events, final reconnection time and final last event ID string of ``stream``, as the spec says."""
    text = stream.decode("utf-8", "replace")
    if text.startswith("\ufeff"):
        text = text[1:]
    lines: list[str] = []
    current = ""
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\r":
            lines.append(current)
            current = ""
            if i + 1 < len(text) and text[i + 1] == "\n":
                i += 1
        elif char == "\n":
            lines.append(current)
            current = ""
        else:
            current += char
        i += 1
    # ``current`` is an unterminated last line: the spec discards it at end of file.

    events: list[ServerSentEvent] = []
    data_buffer = ""
    event_type_buffer = ""
    last_event_id_buffer = ""
    last_event_id_string = ""
    reconnection_time: int | None = None
    event_retry: int | None = None  # the retry line of the event's own block (httpx-sse's, eventsource-parser's)
    for line in lines:
        if line == "":
            last_event_id_string = last_event_id_buffer
            if data_buffer == "":
                event_type_buffer = ""
                event_retry = None
                continue
            if data_buffer.endswith("\n"):
                data_buffer = data_buffer[:-1]
            events.append(
                ServerSentEvent(
                    event=event_type_buffer if event_type_buffer != "" else "message",
                    data=data_buffer,
                    id=last_event_id_string,
                    retry=event_retry,
                )
            )
            data_buffer = ""
            event_type_buffer = ""
            event_retry = None
            continue
        if line.startswith(":"):
            continue
        if ":" in line:
            field, value = line.split(":", 1)
            if value.startswith(" "):
                value = value[1:]
        else:
            field, value = line, ""
        if field == "event":
            event_type_buffer = value
        elif field == "data":
            data_buffer += value + "\n"
        elif field == "id":
            if "\0" not in value:
                last_event_id_buffer = value
        elif field == "retry":
            if value != "" and all(c in "0123456789" for c in value):
                reconnection_time = event_retry = int(value)
    return events, reconnection_time, last_event_id_string


def decode_chunks(chunks: list[bytes]) -> tuple[list[ServerSentEvent], int | None, str]:
    decoder = SSEDecoder()
    events: list[ServerSentEvent] = []
    for chunk in chunks:
        events.extend(decoder.feed(chunk))
    events.extend(decoder.close())
    return events, decoder.retry, decoder.last_event_id


def decode(*chunks: bytes) -> list[ServerSentEvent]:
    return decode_chunks(list(chunks))[0]


def datas(*chunks: bytes) -> list[str]:
    return [event.data for event in decode(*chunks)]


# ----------------------------------------------------------------------------------------------------
# One rule at a time.


def test_a_data_event_has_the_defaults() -> None:
    assert decode(b"data: hello\n\n") == [ServerSentEvent(event="message", data="hello", id="", retry=None)]


def test_events_come_out_of_the_chunk_that_completes_them() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: one\n\ndata: tw") == [ServerSentEvent(data="one")]
    assert decoder.feed(b"o\n") == []
    assert decoder.feed(b"\n") == [ServerSentEvent(data="two")]
    assert decoder.close() == []


def test_id_then_ping_then_blank_line_dispatches_nothing() -> None:
    events = decode(b"id: 7\n: ping\n\ndata: {}\n\n")
    assert events == [ServerSentEvent(data="{}", id="7")]


def test_blank_lines_alone_dispatch_nothing() -> None:
    assert decode(b"\n\n\r\n\r\r\n\n") == []


def test_event_type_without_data_dispatches_nothing_and_resets() -> None:
    assert decode(b"event: lost\n\ndata: x\n\n") == [ServerSentEvent(event="message", data="x")]


def test_cr_only_line_ends() -> None:
    assert decode(b"event: a\rdata: 1\rdata: 2\r\rdata: 3\r\r") == [
        ServerSentEvent(event="a", data="1\n2"),
        ServerSentEvent(data="3"),
    ]


def test_crlf_line_ends() -> None:
    assert decode(b"data: 1\r\ndata: 2\r\n\r\ndata: 3\r\n\r\n") == [
        ServerSentEvent(data="1\n2"),
        ServerSentEvent(data="3"),
    ]


def test_crlf_split_across_chunks_is_one_line_end() -> None:
    # Were the LF a second line end, it would be a blank line dispatching "a" on its own.
    assert datas(b"data: a\r", b"\ndata: b\r\n\r\n") == ["a\nb"]


def test_cr_at_chunk_end_then_cr_is_two_line_ends() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\r") == [ServerSentEvent(data="a")]


def test_cr_at_chunk_end_ends_the_line_at_once() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n\r") == [ServerSentEvent(data="a")]


def test_lf_after_cr_is_skipped_even_after_an_empty_decoded_chunk() -> None:
    # The middle chunk is half a character, decoding to nothing; the LF after it still pairs with the CR.
    assert datas(b"data: a\r", b"", b"\ndata: \xc3", b"\xa9\r\n\r\n") == ["a\n\u00e9"]


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e"])
def test_unicode_line_separators_stay_inside_data(separator: str) -> None:
    value = f'{{"content": "a{separator}b"}}'
    assert datas(f"data: {value}\n\n".encode()) == [value]


def test_one_leading_bom_is_stripped() -> None:
    assert datas(b"\xef\xbb\xbfdata: a\n\n") == ["a"]


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_a_leading_bom_split_across_chunks_is_stripped(cut: int) -> None:
    stream = b"\xef\xbb\xbfdata: a\n\n"
    assert datas(stream[:cut], stream[cut:]) == ["a"]


def test_a_second_bom_is_kept() -> None:
    # The kept BOM makes the first field "\ufeffdata", an unknown name, so only the second event is seen.
    assert datas(b"\xef\xbb\xbf\xef\xbb\xbfdata: a\n\ndata: b\n\n") == ["b"]
    assert datas(b"\xef\xbb\xbfdata: \xef\xbb\xbfa\n\n") == ["\ufeffa"]


def test_a_bom_after_the_start_is_not_stripped() -> None:
    assert datas(b"data: a\n", b"\xef\xbb\xbfdata: b\n\n") == ["a"]


def test_invalid_utf8_becomes_replacement_characters() -> None:
    assert datas(b"data: \xff\xfe ok \xc3(\n\n") == ["\ufffd\ufffd ok \ufffd("]


def test_a_truncated_character_before_a_line_end_becomes_one_replacement() -> None:
    assert datas(b"data: x\xe2\x82\n\n") == ["x\ufffd"]


def test_a_truncated_character_at_end_of_stream_does_not_raise() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n\ndata: \xf0\x9f") == [ServerSentEvent(data="a")]
    assert decoder.close() == []


@pytest.mark.parametrize("cuts", [(1,), (2,), (3,), (1, 2, 3), (1, 3), (2, 3)])
def test_an_emoji_split_anywhere_decodes_whole(cuts: tuple[int, ...]) -> None:
    prefix = b"data: <"
    stream = prefix + "\U0001f600".encode() + b">\n\n"
    bounds = [0, *(len(prefix) + cut for cut in cuts), len(stream)]
    chunks = [stream[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    assert datas(*chunks) == ["<\U0001f600>"]


def test_only_one_leading_space_is_stripped() -> None:
    assert datas(b"data:  two\n\ndata:none\n\ndata: \n\n") == [" two", "none", ""]


def test_a_field_without_colon_has_an_empty_value() -> None:
    assert decode(b"data\n\n") == [ServerSentEvent(data="")]
    assert decode(b"event\ndata\ndata\n\n") == [ServerSentEvent(event="message", data="\n")]


def test_multi_line_data_joins_with_lf_and_drops_one_trailing_lf() -> None:
    assert datas(b"data: a\ndata: b\ndata:c\n\n") == ["a\nb\nc"]
    assert datas(b"data: a\ndata:\n\n") == ["a\n"]


def test_colons_after_the_first_belong_to_the_value() -> None:
    assert datas(b'data: {"a": "b:c"}\n\n') == ['{"a": "b:c"}']


def test_comments_unknown_and_miscased_fields_are_ignored() -> None:
    assert decode(b": hi\nDATA: x\ndata : y\nfoo: bar\ndata: z\n\n") == [ServerSentEvent(data="z")]


def test_event_type_applies_to_one_event_then_resets() -> None:
    assert decode(b"event: delta\ndata: 1\n\ndata: 2\n\nevent:\ndata: 3\n\n") == [
        ServerSentEvent(event="delta", data="1"),
        ServerSentEvent(event="message", data="2"),
        ServerSentEvent(event="message", data="3"),
    ]


def test_id_persists_across_events_and_an_empty_id_clears_it() -> None:
    assert [e.id for e in decode(b"id: 1\ndata: a\n\ndata: b\n\nid\ndata: c\n\n")] == ["1", "1", ""]


def test_an_id_with_nul_is_ignored() -> None:
    assert [e.id for e in decode(b"id: 1\ndata: a\n\nid: 2\x003\ndata: b\n\n")] == ["1", "1"]


def test_the_last_id_line_before_dispatch_wins() -> None:
    assert decode(b"data: a\nid: 1\nid: 2\n\n") == [ServerSentEvent(data="a", id="2")]


def test_last_event_id_updates_on_a_blank_line_even_without_data() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n\nid: 9\n") == [ServerSentEvent(data="a")]
    assert decoder.last_event_id == ""
    assert decoder.feed(b"\n") == []
    assert decoder.last_event_id == "9"


def test_retry_is_the_events_own_and_the_stream_keeps_the_last() -> None:
    decoder = SSEDecoder()
    events = decoder.feed(b"data: a\n\nretry: 1500\ndata: b\n\ndata: c\n\n")
    # Only the event whose block carried the line reports it (as httpx-sse and eventsource-parser do); the
    # reconnection time in force stays on the decoder.
    assert [e.retry for e in events] == [None, 1500, None]
    assert decoder.retry == 1500


@pytest.mark.parametrize(
    "value",
    [b"1a", b"-1", b"+1", b" 1", b"1.5", b"", "\u0661\u0662".encode(), "\u00b2".encode(), b"1 "],
)
def test_retry_that_is_not_all_ascii_digits_is_ignored(value: bytes) -> None:
    decoder = SSEDecoder()
    events = decoder.feed(b"retry: 10\n\nretry: " + value + b"\ndata: x\n\n")
    assert [e.retry for e in events] == [None]
    assert decoder.retry == 10


def test_retry_too_long_for_int_is_ignored_without_raising() -> None:
    decoder = SSEDecoder()
    events = decoder.feed(b"retry: 5\n\nretry: " + b"9" * 5000 + b"\ndata: x\n\n")
    assert [e.retry for e in events] == [None] and decoder.retry == 5


def test_an_unterminated_event_is_discarded_at_close() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n\ndata: b\n") == [ServerSentEvent(data="a")]
    assert decoder.close() == []
    assert decode(b"data: a") == []


def test_a_retry_line_of_a_discarded_event_still_counts() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\nretry: 300\ndata: b") == []
    assert decoder.close() == []
    assert decoder.retry == 300


def test_close_resets_the_stream_but_keeps_retry_and_last_event_id() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"retry: 20\nid: 4\ndata: a\n\ndata: lost") == [
        ServerSentEvent(data="a", id="4", retry=20)
    ]
    assert decoder.close() == []
    assert (decoder.retry, decoder.last_event_id) == (20, "4")
    # A new stream: its BOM is stripped again, nothing of "lost" leaks in, the last-event-ID buffer is fresh.
    assert decoder.feed(b"\xef\xbb\xbfdata: b\n\n") == [ServerSentEvent(data="b", id="", retry=None)]


def test_an_empty_chunk_yields_nothing() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"") == []
    assert decoder.feed(b"data: a\n\n") == [ServerSentEvent(data="a")]


def test_a_large_event_across_many_chunks_arrives_whole() -> None:
    value = "x" * 999 + "\u2028"
    stream = b"data: " + (value * 1000).encode() + b"\n" + b"data: " + value.encode() + b"\n\n"
    chunks = [stream[i : i + 1024] for i in range(0, len(stream), 1024)]
    assert datas(*chunks) == [value * 1000 + "\n" + value]


def test_data_only_stream_mixed_with_other_fields_keeps_order() -> None:
    stream = b"data: 1\n\ndata: 2\n\nevent: e\ndata: 3\n\ndata: 4\n\n: c\n\ndata: 5\n\n"
    assert [(e.event, e.data) for e in decode(stream)] == [
        ("message", "1"),
        ("message", "2"),
        ("e", "3"),
        ("message", "4"),
        ("message", "5"),
    ]


def test_events_are_immutable() -> None:
    event = ServerSentEvent(data="a")
    with pytest.raises(AttributeError):
        event.data = "b"  # type: ignore[misc]


# ----------------------------------------------------------------------------------------------------
# Generated streams: every chunking yields the events of the whole stream, which are the reference's.

_TRICKY = ["\u2028", "\u2029", "\u0085", "\U0001f600", "\u00e9", "\ufeff", "\0", ":", " ", "\ufffd", "{", '"']
_value_chars = st.one_of(
    st.sampled_from(_TRICKY), st.characters(codec="utf-8"), st.sampled_from(["\r", "\n"])
)
_values = st.text(alphabet=_value_chars, max_size=10)
_names = st.sampled_from(["data", "data", "data", "event", "id", "retry", "", "dat", "DATA", "data ", "x"])
_separators = st.sampled_from([": ", ": ", ":", ":  ", None])
_retry_values = st.one_of(st.from_regex(r"[0-9]{1,6}", fullmatch=True), _values)


@st.composite
def _field_lines(draw: st.DrawFn) -> str:
    name = draw(_names)
    separator = draw(_separators)
    if separator is None:
        return name
    value = draw(_retry_values if name == "retry" else _values)
    return name + separator + value


_lines = st.one_of(
    _field_lines(),
    st.builds(lambda value: ":" + value, _values),
    st.just(""),
)
# Blocks shaped like an OpenAI stream, so the data-only fast path meets the general path mid-chunk.
_openai_block = st.builds(
    lambda value: ["data: " + value, ""], _values.filter(lambda v: "\r" not in v and "\n" not in v)
)
_blocks = st.one_of(_openai_block, st.lists(_lines, max_size=4).map(lambda lines: [*lines, ""]))
_endings = st.sampled_from(["\n", "\r", "\r\n"])


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    lines = [line for block in draw(st.lists(_blocks, max_size=8)) for line in block]
    uniform = draw(st.one_of(st.none(), _endings))
    text = "".join(line + (uniform or draw(_endings)) for line in lines)
    text = (
        draw(st.sampled_from(["", "\ufeff", "\ufeff\ufeff"]))
        + text
        + draw(st.sampled_from(["", "data: tail"]))
    )
    stream = text.encode()
    # Splice in malformed UTF-8: stray continuation bytes, truncated sequences, arbitrary bytes.
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(stream)))
        junk = draw(
            st.one_of(
                st.sampled_from([b"\xff", b"\x80", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98"]),
                st.binary(max_size=3),
            )
        )
        stream = stream[:at] + junk + stream[at:]
    return stream


_settings = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_settings
@given(stream=streams(), data=st.data())
def test_every_chunking_yields_the_events_of_the_whole_stream(stream: bytes, data: st.DataObject) -> None:
    whole = decode_chunks([stream])
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(stream) - 1)))))
    bounds = [0, *cuts, len(stream)]
    chunks = [stream[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    assert decode_chunks(chunks) == whole
    assert decode_chunks([stream[i : i + 1] for i in range(len(stream))]) == whole


@_settings
@given(stream=streams())
def test_decoder_matches_the_reference(stream: bytes) -> None:
    assert decode_chunks([stream]) == reference_decode(stream)


def test_extra_fields_dispatch_off_spec_error_lines() -> None:
    # llama.cpp's server sends a bare "error: {...}" line mid-stream; by the standard it is an unknown field.
    stream = b'data: {"a":1}\n\nerror: {"code":500,"message":"boom"}\n\n'
    assert [e.data for e in SSEDecoder().feed(stream)] == ['{"a":1}']
    events = SSEDecoder(extra_fields=("error",)).feed(stream)
    assert [(e.event, e.data) for e in events] == [("message", '{"a":1}'), ("error", '{"code":500,"message":"boom"}')]
