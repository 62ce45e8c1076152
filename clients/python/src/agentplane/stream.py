"""A streamed call: server-sent events read as chunks, then the result."""

from __future__ import annotations

import json

from .errors import GatewayError, ProtocolError, StreamInterrupted, StreamTimedOut, from_event
from .results import Chunk, ToolResult
from .sse import parse_events
from .transport import Response


class CallStream:
    """Iterate to get :class:`Chunk` s and finally one :class:`ToolResult`.

    ``id`` is the call's id; ``stdout_offset`` and ``stderr_offset`` are how
    much of each stream has been seen, so a stream that broke off (raising
    :class:`StreamInterrupted`) can be picked up with
    ``SessionHandle.attach(id, stdout_offset, stderr_offset)``. Bytes a
    resumed stream sends again are dropped, so every byte is seen once. An
    ``error`` event raises the matching :class:`GatewayError`.
    """

    def __init__(self, response: Response, call_id: str, *, stdout_offset: int = 0, stderr_offset: int = 0,
                 max_line: int, max_event: int):
        self.id = call_id
        self.stdout_offset = stdout_offset
        self.stderr_offset = stderr_offset
        self.result: ToolResult | None = None
        self._response = response
        self._events = parse_events(response.lines(max_line), max_event, response.what)
        self._done = False

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        try:
            while True:
                item = self._next_item()
                if item is not None:
                    return item
        except BaseException:
            self.close()
            raise

    def _next_item(self):
        try:
            ev = next(self._events)
        except StopIteration:
            raise self._interrupted("the stream ended before the call's result") from None
        except GatewayError as e:
            if e.code in ("connection", "timeout"):
                raise self._interrupted(f"the stream broke off: {e.message}", e.code) from e
            raise
        if ev.event not in ("stdout", "stderr", "result", "error"):
            return None  # a newer gateway's kind of event
        try:
            doc = json.loads(ev.data)
        except ValueError as e:
            raise ProtocolError(f"{self._response.what}: a {ev.event} event's data is not JSON: {e}") from e
        if ev.event == "result":
            self.result = ToolResult.from_json(doc)
            self.close()
            return self.result
        if ev.event == "error":
            self.close()
            raise from_event(doc if isinstance(doc, dict) else {})
        return self._fresh(Chunk.from_json(ev.event, doc))

    def _fresh(self, chunk: Chunk) -> Chunk | None:
        """The part of a chunk not seen yet (None if all of it was)."""
        seen = self.stdout_offset if chunk.stream == "stdout" else self.stderr_offset
        if chunk.end <= seen:
            return None
        if chunk.offset < seen:
            chunk = Chunk(chunk.stream, seen, chunk.data[seen - chunk.offset:])
        if chunk.stream == "stdout":
            self.stdout_offset = chunk.end
        else:
            self.stderr_offset = chunk.end
        return chunk

    def _interrupted(self, why: str, code: str = "interrupted") -> StreamInterrupted:
        cls = StreamTimedOut if code == "timeout" else StreamInterrupted
        return cls(
            f"{self._response.what}: {why}; call {self.id} goes on: attach to it "
            f"with stdout_offset={self.stdout_offset}, stderr_offset={self.stderr_offset}",
            id=self.id, stdout_offset=self.stdout_offset, stderr_offset=self.stderr_offset, code=code)

    def wait(self) -> ToolResult:
        """Read to the end, dropping the chunks; the result."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result

    def output(self) -> tuple[bytes, bytes, ToolResult]:
        """Read to the end: (stdout, stderr, result)."""
        out, err = bytearray(), bytearray()
        for item in self:
            if isinstance(item, Chunk):
                (out if item.stream == "stdout" else err).extend(item.data)
        assert self.result is not None
        return bytes(out), bytes(err), self.result

    def close(self):
        self._done = True
        self._response.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
