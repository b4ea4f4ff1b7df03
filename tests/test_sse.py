"""The incremental SSE parser: spec behaviour, and split-invariance at every byte boundary."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.llm.sse import SSEEvent
from dsh.llm.sse import SSEParser
from tests.servers import anthropic_chunks
from tests.servers import openai_chunks


def parse(pieces: Iterable[bytes]) -> list[SSEEvent]:
    parser = SSEParser()
    events: list[SSEEvent] = []
    for piece in pieces:
        events += parser.feed(piece)
    return events + parser.flush()


OPENAI = b"".join(
    openai_chunks(
        text=["Hel", "lo, wörld 🌍", " — ok"],
        calls=[
            ("call_a", "get_weather", ['{"ci', 'ty": "Pa', 'ris"}']),
            ("call_b", "get_time", ['{"tz":', ' "CET"}']),
        ],
    )
)
ANTHROPIC = b"".join(
    anthropic_chunks(
        text=["Olá ", "naïve café ☕"], calls=[("toolu_1", "read", ['{"path":', ' "a.txt"}'])]
    )
)


def test_basic_fields() -> None:
    stream = (
        b": keep-alive comment\n"
        b"event: update\nid: 7\nretry: 1500\ndata: first\ndata:second\n\n"
        b"data: no event name\n\n"
        b"id: bad\0id\ndata: x\n\n"
        b"field-without-colon\ndata\n\n"
        b"unknown: ignored\n\n"
    )
    assert parse([stream]) == [
        SSEEvent(data="first\nsecond", event="update", id="7", retry=1500),
        SSEEvent(data="no event name", event="message", id="7"),
        SSEEvent(data="x", id="7"),  # an id holding NUL is ignored; the last id persists
        SSEEvent(data="", id="7"),  # "data" without colon is an empty data line
    ]


def test_line_endings_are_equivalent() -> None:
    lf = b"event: a\ndata: 1\ndata: 2\n\ndata: 3\n\n"
    for sep in (b"\r\n", b"\r"):
        assert parse([lf.replace(b"\n", sep)]) == parse([lf])
    assert len(parse([lf])) == 2


def test_cr_then_lf_split_across_chunks_is_one_line_ending() -> None:
    # "\r" ends a chunk and "\n" starts the next: one line break, not an extra blank line
    # (a blank line would dispatch "a" early and the event name would be lost).
    assert parse([b"event: e\r", b"\ndata: a\r", b"\ndata: b\r\n\r\n"]) == [
        SSEEvent(data="a\nb", event="e")
    ]


def test_utf8_character_split_across_chunks() -> None:
    raw = "data: ☕🌍é\n\n".encode()
    for cut in range(len(raw)):
        assert parse([raw[:cut], raw[cut:]]) == [SSEEvent(data="☕🌍é")]


def test_bom_and_invalid_utf8() -> None:
    assert parse([b"\xef\xbb", b"\xbfdata: x\n\n"]) == [SSEEvent(data="x")]
    assert parse([b"data: \xff\n\n"]) == [SSEEvent(data="\ufffd")]


def test_flush_dispatches_unterminated_event_and_trailing_line() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\n\ndata: b") == [SSEEvent(data="a")]
    assert parser.flush() == [SSEEvent(data="b")]
    assert parse([b"data: c\n"]) == [SSEEvent(data="c")]


def test_empty_feed_and_no_data_blocks() -> None:
    parser = SSEParser()
    assert parser.feed(b"") == []
    assert parser.feed(b"event: lonely\n\n") == []  # no data: nothing to dispatch
    assert parser.feed(b"data: d\n\n") == [SSEEvent(data="d")]  # event name did not stick


@pytest.mark.parametrize("stream", [OPENAI, ANTHROPIC], ids=["openai", "anthropic"])
def test_every_split_point_gives_identical_events(stream: bytes) -> None:
    whole = parse([stream])
    assert len(whole) > 10
    for cut in range(len(stream) + 1):
        assert parse([stream[:cut], stream[cut:]]) == whole, cut


@pytest.mark.parametrize("stream", [OPENAI, ANTHROPIC], ids=["openai", "anthropic"])
@pytest.mark.parametrize("sep", [b"\r\n", b"\r"])
def test_every_split_point_with_other_line_endings(stream: bytes, sep: bytes) -> None:
    converted = stream.replace(b"\n", sep)
    whole = parse([converted])
    assert whole == parse([stream])
    for cut in range(len(converted) + 1):
        assert parse([converted[:cut], converted[cut:]]) == whole, cut
    assert parse(converted[i : i + 1] for i in range(len(converted))) == whole


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([OPENAI, ANTHROPIC]),
    st.sampled_from([b"\n", b"\r\n", b"\r"]),
    st.lists(st.integers(min_value=0, max_value=4000), max_size=40),
)
def test_random_chunkings(stream: bytes, sep: bytes, cuts: list[int]) -> None:
    data = stream.replace(b"\n", sep)
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    assert parse(pieces) == parse([data])


_text = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\r\n"), max_size=12
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.none() | _text, st.lists(_text, min_size=1, max_size=3)), max_size=6),
    st.sampled_from(["\n", "\r\n", "\r"]),
    st.data(),
)
def test_generated_events_round_trip(
    events: list[tuple[str | None, list[str]]], sep: str, data: st.DataObject
) -> None:
    text = ""
    for name, lines in events:
        if name is not None:
            text += f"event:{name}{sep}"
        text += "".join(f"data:{line}{sep}" for line in lines) + sep
    raw = text.encode()
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=10).map(sorted))
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    # spec: one leading space after the colon is dropped
    expected = [
        SSEEvent(
            data="\n".join(line.removeprefix(" ") for line in lines),
            event=(name.removeprefix(" ") if name else "") or "message",
        )
        for name, lines in events
    ]
    assert parse(pieces) == expected
