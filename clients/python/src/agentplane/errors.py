"""The errors this package raises, one class per error code.

Every error is a :class:`GatewayError` with ``code`` (the gateway's short
code, or one of this client's own: ``connection``, ``timeout``,
``protocol``, ``not_ready``), ``status`` (the HTTP status, ``None`` when no
HTTP answer was had) and ``message``. The Kubernetes API's errors map to
the same classes (``Cluster`` raises ``NotFound`` for a missing session,
``Conflict`` for one that already exists, and so on).
"""

from __future__ import annotations

import json


class GatewayError(Exception):
    """Base of every error raised by this package."""

    default_code = "error"

    def __init__(self, message: str, *, code: str | None = None, status: int | None = None):
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.status = status

    def __str__(self) -> str:
        where = f"HTTP {self.status}, " if self.status is not None else ""
        return f"{self.message} ({where}{self.code})"


class Unauthenticated(GatewayError):
    """No token, or one the cluster does not accept (401)."""

    default_code = "unauthenticated"


class Forbidden(GatewayError):
    """The token's principal lacks a permission; the message names it (403)."""

    default_code = "forbidden"


class ApprovalRequired(GatewayError):
    """The tool's policy is always_ask and no valid approval came with the call (403)."""

    default_code = "approval_required"


class NotFound(GatewayError):
    default_code = "not_found"


class Invalid(GatewayError):
    default_code = "invalid"


class Conflict(GatewayError):
    """A call id in use, or (Kubernetes) an object that already exists (409)."""

    default_code = "conflict"


class TooManyRequests(GatewayError):
    """Rate limited (429); ``retry_after`` is the server's hint in seconds, if any."""

    default_code = "too_many_requests"

    def __init__(self, message: str, *, retry_after: float | None = None, **kw):
        super().__init__(message, **kw)
        self.retry_after = retry_after


class Unavailable(GatewayError):
    """The session is not running, or its runner cannot be reached (503)."""

    default_code = "unavailable"


class Internal(GatewayError):
    default_code = "internal"


class Timeout(GatewayError):
    """The request's total time ran out (or the runner's deadline passed)."""

    default_code = "timeout"


class ConnectionFailed(GatewayError):
    """No HTTP answer: refused, reset, or a TLS failure."""

    default_code = "connection"


class ProtocolError(GatewayError):
    """An answer this client cannot read: not JSON, not the expected shape."""

    default_code = "protocol"


class ResponseTooLarge(ProtocolError):
    """An answer (or one server-sent-events line) over this client's bound."""


class StreamInterrupted(GatewayError):
    """A stream ended before its result. The call goes on in the sandbox:
    ``SessionHandle.attach(id, stdout_offset, stderr_offset)`` picks it up."""

    default_code = "interrupted"

    def __init__(self, message: str, *, id: str, stdout_offset: int, stderr_offset: int, **kw):
        super().__init__(message, **kw)
        self.id = id
        self.stdout_offset = stdout_offset
        self.stderr_offset = stderr_offset


class StreamTimedOut(StreamInterrupted, Timeout):
    """A stream's total time ran out before its result; the call goes on."""

    default_code = "timeout"


class SessionNotReady(GatewayError):
    """A session did not become Ready: it ended, is invalid, or time ran out.
    ``phase`` and ``conditions`` are its status when this was decided."""

    default_code = "not_ready"

    def __init__(self, message: str, *, phase=None, conditions=(), timed_out=False, **kw):
        super().__init__(message, **kw)
        self.phase = phase
        self.conditions = list(conditions)
        self.timed_out = timed_out


BY_CODE: dict[str, type[GatewayError]] = {
    "unauthenticated": Unauthenticated,
    "forbidden": Forbidden,
    "approval_required": ApprovalRequired,
    "not_found": NotFound,
    "invalid": Invalid,
    "conflict": Conflict,
    "too_many_requests": TooManyRequests,
    "unavailable": Unavailable,
    "internal": Internal,
    "timeout": Timeout,
}

# Used when an answer carries no code this client knows (a proxy's page, say).
BY_STATUS: dict[int, type[GatewayError]] = {
    400: Invalid,
    401: Unauthenticated,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    422: Invalid,
    429: TooManyRequests,
    500: Internal,
    503: Unavailable,
    504: Timeout,
}

# The HTTP status each code comes with, for errors read from an event stream.
STATUS_OF_CODE = {
    "unauthenticated": 401,
    "forbidden": 403,
    "approval_required": 403,
    "refused": 403,
    "not_found": 404,
    "invalid": 400,
    "conflict": 409,
    "too_many_requests": 429,
    "cancelled": 499,
    "internal": 500,
    "runner_error": 502,
    "unavailable": 503,
    "timeout": 504,
}


def error_for(code: str | None, message: str, status: int | None,
              retry_after: float | None = None) -> GatewayError:
    """The exception for an error code (first) or an HTTP status."""
    cls = BY_CODE.get(code or "") or (BY_STATUS.get(status) if not code else None) or GatewayError
    if cls is TooManyRequests:
        return TooManyRequests(message, code=code, status=status, retry_after=retry_after)
    return cls(message, code=code or cls.default_code, status=status)


def from_gateway_body(status: int, body: bytes, retry_after: float | None = None) -> GatewayError:
    """The exception for a gateway's non-2xx answer: ``{"error": {"code", "message"}}``,
    or anything else (then the status decides and the body, cut short, is the message)."""
    code = message = None
    try:
        doc = json.loads(body)
        err = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(err, dict):
            code = err.get("code") if isinstance(err.get("code"), str) else None
            message = err.get("message") if isinstance(err.get("message"), str) else None
    except ValueError:
        pass
    if message is None:
        message = shown(body) or f"HTTP {status} with no body"
    return error_for(code, message, status, retry_after)


def from_event(data: dict) -> GatewayError:
    """The exception for an ``error`` event of a stream: ``{"code", "message"}``."""
    code = data.get("code") if isinstance(data.get("code"), str) else "internal"
    message = data.get("message") if isinstance(data.get("message"), str) else "stream error"
    return error_for(code, message, STATUS_OF_CODE.get(code))


# Kubernetes Status reasons -> this package's codes.
K8S_REASONS = {
    "Unauthorized": "unauthenticated",
    "Forbidden": "forbidden",
    "NotFound": "not_found",
    "AlreadyExists": "conflict",
    "Conflict": "conflict",
    "Invalid": "invalid",
    "BadRequest": "invalid",
    "TooManyRequests": "too_many_requests",
    "ServiceUnavailable": "unavailable",
    "InternalError": "internal",
    "Timeout": "timeout",
}


def from_kubernetes_body(status: int, body: bytes, retry_after: float | None = None) -> GatewayError:
    """The exception for a Kubernetes API error (a ``Status`` object, or anything else)."""
    code = message = None
    try:
        doc = json.loads(body)
        if isinstance(doc, dict) and doc.get("kind") == "Status":
            code = K8S_REASONS.get(doc.get("reason") or "")
            if isinstance(doc.get("message"), str):
                message = "Kubernetes API: " + doc["message"]
    except ValueError:
        pass
    if message is None:
        message = "Kubernetes API: " + (shown(body) or f"HTTP {status} with no body")
    return error_for(code, message, status, retry_after)


def shown(body: bytes, limit: int = 500) -> str:
    """A body as text for a message: decoded leniently and cut at ``limit`` characters."""
    text = body.decode("utf-8", "replace").strip()
    return text if len(text) <= limit else text[:limit] + "..."
