"""Lines out of a byte stream that arrives in pieces, each line bounded."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from .errors import ResponseTooLarge

_END = re.compile(rb"\r\n|\r|\n")


def split_lines(pieces: Iterable[bytes], limit: int, what: str = "stream") -> Iterator[bytes]:
    """Split bytes arriving in ``pieces`` into lines ended by CRLF, LF or CR
    (as server-sent events end them; a CRLF split across two pieces is one
    end). The ends are taken off. A line over ``limit`` bytes raises
    ``ResponseTooLarge`` as soon as that many bytes are held, so memory stays
    bounded. A last line without an end is yielded too."""
    buf = bytearray()
    after_cr = False
    for piece in pieces:
        if not piece:
            continue
        start = 0
        if after_cr and piece[:1] == b"\n":
            start = 1
        after_cr = False
        for m in _END.finditer(piece, start):
            buf += piece[start:m.start()]
            _check(buf, limit, what)
            yield bytes(buf)
            buf.clear()
            start = m.end()
            after_cr = m.group() == b"\r" and start == len(piece)
        buf += piece[start:]
        _check(buf, limit, what)
    if buf:
        yield bytes(buf)


def _check(buf: bytearray, limit: int, what: str) -> None:
    if len(buf) > limit:
        raise ResponseTooLarge(f"{what}: a line over {limit} bytes")
