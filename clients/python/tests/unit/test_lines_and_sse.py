"""Splitting a byte stream into lines and lines into server-sent events."""

import pytest

from agentplane import ResponseTooLarge
from agentplane.lines import split_lines
from agentplane.sse import ServerEvent, parse_events


def lines(pieces, limit=1000):
    return list(split_lines(pieces, limit))


def test_lines_end_in_lf_crlf_or_cr():
    assert lines([b"a\nb\r\nc\rd"]) == [b"a", b"b", b"c", b"d"]


def test_a_line_split_across_pieces_is_one_line():
    assert lines([b"ev", b"ent: stdo", b"ut\n", b"da", b"ta: x\n"]) == [b"event: stdout", b"data: x"]


def test_a_crlf_split_across_pieces_is_one_end():
    assert lines([b"a\r", b"\nb\r", b"", b"\n"]) == [b"a", b"b"]


def test_cr_then_crlf_is_two_ends():
    assert lines([b"a\r", b"\r\nb"]) == [b"a", b"", b"b"]


def test_one_byte_pieces():
    text = b"event: result\r\ndata: {}\r\n\r\n"
    assert lines([bytes([c]) for c in text]) == [b"event: result", b"data: {}", b""]


def test_a_line_over_the_limit_raises_before_it_ends():
    def endless():
        yield b"ok\n"
        while True:
            yield b"x" * 100

    got = []
    with pytest.raises(ResponseTooLarge, match="over 250 bytes"):
        for line in split_lines(endless(), 250):
            got.append(line)
    assert got == [b"ok"]


def test_a_line_of_exactly_the_limit_passes():
    assert lines([b"x" * 10 + b"\n"], limit=10) == [b"x" * 10]


def events(text, max_data=10_000):
    return list(parse_events(text.encode().splitlines(), max_data))


def test_events_with_names_and_data():
    got = events("event: stdout\ndata: {\"a\":1}\n\nevent: result\ndata: {}\n\n")
    assert got == [ServerEvent("stdout", '{"a":1}'), ServerEvent("result", "{}")]


def test_comments_and_unknown_fields_are_skipped():
    got = events(": keep-alive\n\nretry: 10\nevent: x\nfoo: bar\ndata: 1\n\n")
    assert got == [ServerEvent("x", "1")]


def test_data_lines_join_with_lf_and_one_space_is_taken_off():
    assert events("data:a\ndata:  b\ndata\n\n") == [ServerEvent("message", "a\n b\n")]


def test_an_event_the_stream_did_not_end_is_dropped():
    assert events("event: stdout\ndata: 1\n\nevent: result\ndata: 2") == [ServerEvent("stdout", "1")]


def test_the_id_is_kept():
    assert events("id: 7\ndata: x\n\n") == [ServerEvent("message", "x", "7")]


def test_an_events_data_over_the_bound_raises():
    with pytest.raises(ResponseTooLarge):
        events("data: " + "x" * 60 + "\ndata: " + "y" * 60 + "\n\n", max_data=100)
