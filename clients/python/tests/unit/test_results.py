"""Chunks (base64 output) and results read from their JSON."""

import base64

import pytest

from agentplane import Chunk, ProtocolError, ToolResult


def test_chunk_data_is_decoded_from_base64():
    raw = bytes(range(256))
    c = Chunk.from_json("stdout", {"offset": 10, "data": base64.b64encode(raw).decode()})
    assert c == Chunk("stdout", 10, raw)
    assert c.end == 10 + 256


def test_an_empty_chunk():
    assert Chunk.from_json("stderr", {"offset": 0, "data": ""}) == Chunk("stderr", 0, b"")


@pytest.mark.parametrize("doc", [
    {"offset": 0, "data": "not base64!"},
    {"offset": 0, "data": "YQ"},  # bad padding
    {"offset": -1, "data": ""},
    {"offset": "0", "data": ""},
    {"offset": True, "data": ""},
    {"data": "YQ=="},
    [1, 2],
])
def test_malformed_chunks_are_protocol_errors(doc):
    with pytest.raises(ProtocolError):
        Chunk.from_json("stdout", doc)


def test_results():
    assert ToolResult.from_json({"id": "a", "content": "x", "is_error": True}) == ToolResult("a", "x", True)
    assert ToolResult.from_json({"id": "a", "content": "x"}).is_error is False
    for bad in [{"id": 1, "content": "x"}, {"id": "a"}, {"id": "a", "content": "x", "is_error": "no"}, "x"]:
        with pytest.raises(ProtocolError):
            ToolResult.from_json(bad)
