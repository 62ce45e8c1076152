"""What a tool call gives back: output chunks while it runs, then its result."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

from .errors import ProtocolError


@dataclass(frozen=True)
class ToolResult:
    """A call's result: ``content`` is what the model is shown."""

    id: str
    content: str
    is_error: bool

    @classmethod
    def from_json(cls, doc) -> ToolResult:
        if not isinstance(doc, dict):
            raise ProtocolError(f"a tool result is a JSON object, not {type(doc).__name__}")
        id_, content, is_error = doc.get("id"), doc.get("content"), doc.get("is_error", False)
        if not isinstance(id_, str) or not isinstance(content, str) or not isinstance(is_error, bool):
            raise ProtocolError(f"a tool result has a string id and content and a boolean is_error: {_short(doc)}")
        return cls(id_, content, is_error)


@dataclass(frozen=True)
class Chunk:
    """Bytes a running call wrote: ``stream`` is ``"stdout"`` or ``"stderr"``,
    ``offset`` the position of ``data``'s first byte in that stream."""

    stream: str
    offset: int
    data: bytes

    @property
    def end(self) -> int:
        """The offset just past this chunk: where to attach to read on."""
        return self.offset + len(self.data)

    @classmethod
    def from_json(cls, stream: str, doc) -> Chunk:
        if not isinstance(doc, dict):
            raise ProtocolError(f"a {stream} chunk is a JSON object, not {type(doc).__name__}")
        offset, data = doc.get("offset"), doc.get("data")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0 or not isinstance(data, str):
            raise ProtocolError(f"a {stream} chunk has an integer offset and base64 data: {_short(doc)}")
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as e:
            raise ProtocolError(f"a {stream} chunk's data is not base64: {e}") from e
        return cls(stream, offset, raw)


@dataclass(frozen=True)
class Approval:
    """A token approving one call of an always_ask tool with one input, until ``expires_at`` (RFC 3339)."""

    token: str
    expires_at: str


def _short(doc) -> str:
    text = json.dumps(doc)
    return text if len(text) <= 200 else text[:200] + "..."
