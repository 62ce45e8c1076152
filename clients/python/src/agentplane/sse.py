"""Server-sent events (the text/event-stream format) from a stream of lines."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .errors import ResponseTooLarge


@dataclass(frozen=True)
class ServerEvent:
    """One dispatched event: its type (``message`` when none was named) and its data."""

    event: str
    data: str
    id: str | None = None


def parse_events(lines: Iterable[bytes], max_data: int, what: str = "stream") -> Iterator[ServerEvent]:
    """Events from the stream's lines (ends already taken off): ``field:
    value`` lines, a blank line dispatching what came before. Comments
    (``:`` lines, as keep-alives are sent) and unknown fields are ignored;
    an event's data lines are joined with LF and together bounded by
    ``max_data`` bytes. An event not ended by a blank line when the stream
    ends is dropped, as the format says."""
    name = ""
    data: list[str] = []
    size = 0
    last_id = None
    for raw in lines:
        if not raw:
            if data:
                yield ServerEvent(name or "message", "\n".join(data), last_id)
            name, data, size = "", [], 0
            continue
        if raw.startswith(b":"):
            continue
        line = raw.decode("utf-8", "replace")
        field, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if field == "event":
            name = value
        elif field == "data":
            size += len(raw) + 1
            if size > max_data:
                raise ResponseTooLarge(f"{what}: an event's data is over {max_data} bytes")
            data.append(value)
        elif field == "id" and "\0" not in value:
            last_id = value
