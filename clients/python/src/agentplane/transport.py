"""One HTTP(S) request with a total deadline and bounded reads.

Standard library only. Each request opens its own connection. The deadline
covers connecting, sending and reading the whole answer: before every read
the socket's timeout is set to what is left, and a timer shuts the socket
down when the deadline passes, so a server that trickles bytes cannot hold
a caller past it.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
from urllib.parse import urlencode, urlsplit

from .errors import ConnectionFailed, ResponseTooLarge, Timeout
from .lines import split_lines

MiB = 1 << 20

# What one read from the socket asks for.
READ_SIZE = 64 << 10


def tls_context(ca_file: str | None = None, *, cert_file: str | None = None,
                key_file: str | None = None) -> ssl.SSLContext:
    """A client TLS context verifying the server against ``ca_file`` (the
    system's roots when ``None``), with an optional client certificate."""
    ctx = ssl.create_default_context(cafile=ca_file)
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


class Deadline:
    """A point in time a request must be done by."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        return self.at - time.monotonic()

    def passed(self) -> bool:
        return self.left() <= 0

    def expired(self, what: str) -> Timeout:
        return Timeout(f"{what}: no complete answer within {self.seconds:g} s")


class Endpoint:
    """A server's base URL (``https://host:port/optional/prefix``) and how to reach it."""

    def __init__(self, url: str, *, ca_file: str | None = None, context: ssl.SSLContext | None = None,
                 headers: dict[str, str] | None = None, connect_to: str | None = None):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r}: an http:// or https:// URL with a host is needed")
        self.url = url
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port
        self.prefix = parts.path.rstrip("/")
        self.headers = dict(headers or {})
        # "host:port" to open the TCP connection to, while the Host header
        # and the certificate check keep the URL's name (curl's
        # --connect-to): a Service's DNS name reached at its address.
        self.connect_to = _address(connect_to) if connect_to else None
        self.context = None
        if self.scheme == "https":
            self.context = context or tls_context(ca_file)

    def request(self, method: str, path: str, *, query: dict | None = None, body=None,
                headers: dict[str, str] | None = None, deadline: Deadline) -> Response:
        """Send a request and return once the status line and headers are in.
        ``body`` is JSON-encoded unless it is bytes."""
        target = self.prefix + path
        if query:
            target += "?" + urlencode(query)
        data = None
        hdrs = {**self.headers, **(headers or {})}
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        what = f"{method} {self.url.rstrip('/')}{path}"
        left = deadline.left()
        if left <= 0:
            raise deadline.expired(what)
        if self.scheme == "https":
            conn = _HTTPS(self.host, self.port, timeout=left, context=self.context)
        else:
            conn = _HTTP(self.host, self.port, timeout=left)
        conn.connect_to = self.connect_to
        watch = None
        try:
            conn.connect()
            # Kept: the connection lets go of its socket when the answer is
            # the last on it, but the answer is still read from it.
            sock = conn.sock
            watch = _Watch(sock, deadline)
            conn.request(method, target, body=data, headers=hdrs)
            sock.settimeout(max(deadline.left(), 0.001))
            resp = conn.getresponse()
        except BaseException as e:
            if watch:
                watch.stop()
            conn.close()
            raise _failure(e, deadline, what) from e
        return Response(conn, sock, resp, watch, deadline, what)


def _address(s: str) -> tuple[str, int]:
    host, sep, port = s.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{s!r}: connect_to is host:port")
    return host.strip("[]"), int(port)


class _HTTP(http.client.HTTPConnection):
    connect_to: tuple[str, int] | None = None

    def connect(self):
        if self.connect_to is None:
            return super().connect()
        self.sock = socket.create_connection(self.connect_to, self.timeout)


class _HTTPS(http.client.HTTPSConnection):
    connect_to: tuple[str, int] | None = None

    def connect(self):
        if self.connect_to is None:
            return super().connect()
        sock = socket.create_connection(self.connect_to, self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


class _Watch:
    """Shuts a socket down at its deadline, waking any read blocked on it."""

    def __init__(self, sock: socket.socket, deadline: Deadline):
        self._sock = sock
        self._timer = threading.Timer(max(deadline.left(), 0), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self):
        try:
            # The plain socket's shutdown, also for a TLS socket: the TLS
            # layer's own would tear down state a reading thread is using.
            socket.socket.shutdown(self._sock, socket.SHUT_RDWR)
        except OSError:
            pass

    def stop(self):
        self._timer.cancel()


def _failure(e: BaseException, deadline: Deadline, what: str) -> BaseException:
    """The error for an exception raised while talking to the server."""
    if isinstance(e, (Timeout, ResponseTooLarge)):
        return e
    if deadline.passed() or isinstance(e, (socket.timeout, TimeoutError)):
        return deadline.expired(what)
    if isinstance(e, ssl.SSLCertVerificationError):
        return ConnectionFailed(f"{what}: the server's certificate is not trusted: {e.verify_message}")
    if isinstance(e, (OSError, http.client.HTTPException)):
        return ConnectionFailed(f"{what}: {type(e).__name__}: {e}")
    return e


class Response:
    """An answer whose body is read in bounded pieces before the deadline."""

    def __init__(self, conn, sock: socket.socket, resp: http.client.HTTPResponse, watch: _Watch,
                 deadline: Deadline, what: str):
        self._conn = conn
        self._sock = sock
        self._resp = resp
        self._watch = watch
        self._deadline = deadline
        self.what = what
        self.status = resp.status
        self.headers = resp.headers

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    def retry_after(self) -> float | None:
        try:
            return float(self.header("Retry-After") or "")
        except ValueError:
            return None

    def read_some(self) -> bytes:
        """The next bytes of the body (``b""`` at its end)."""
        left = self._deadline.left()
        if left <= 0:
            raise self._deadline.expired(self.what)
        try:
            self._sock.settimeout(left)
            piece = self._resp.read1(READ_SIZE)
        except BaseException as e:
            raise _failure(e, self._deadline, self.what) from e
        if not piece and self._deadline.passed():
            # The watch shut the socket: an end that is not the body's.
            raise self._deadline.expired(self.what)
        return piece

    def read_all(self, limit: int, *, truncate: bool = False) -> bytes:
        """The whole body, at most ``limit`` bytes: past that, the first
        ``limit`` bytes when ``truncate``, else ``ResponseTooLarge``."""
        buf = bytearray()
        try:
            while True:
                piece = self.read_some()
                if not piece:
                    return bytes(buf)
                buf += piece
                if len(buf) > limit:
                    if truncate:
                        return bytes(buf[:limit])
                    raise ResponseTooLarge(f"{self.what}: the answer is over {limit} bytes")
        finally:
            self.close()

    def lines(self, limit: int):
        """The body's lines (ending in LF, CRLF or CR; the end taken off),
        each at most ``limit`` bytes, else ``ResponseTooLarge``. The last
        line is yielded even without an end."""
        return split_lines(self._pieces(), limit, self.what)

    def _pieces(self):
        while True:
            piece = self.read_some()
            if not piece:
                return
            yield piece

    def close(self):
        self._watch.stop()
        self._resp.close()
        self._conn.close()

    def __del__(self):
        # An answer dropped unread: its deadline timer need not wait on.
        try:
            self._watch.stop()
        except Exception:
            pass
