"""The gateway's HTTP/JSON API: list a session's tools, call them (whole or
streamed), attach to a call, cancel it, and approve an always_ask call."""

from __future__ import annotations

import json
import os
import ssl
import uuid
from dataclasses import dataclass, field
from urllib.parse import quote

from .errors import ProtocolError, from_gateway_body
from .results import Approval, ToolResult
from .stream import CallStream
from .transport import MiB, Deadline, Endpoint, Response

# The runner's longest call (10 minutes) and a minute to spare.
DEFAULT_CALL_TIMEOUT = 660.0


@dataclass(frozen=True)
class Tool:
    """A tool as the gateway lists it."""

    name: str
    description: str
    input_schema: dict = field(default_factory=dict)
    permission_policy: str = "always_allow"

    @classmethod
    def from_json(cls, doc) -> Tool:
        if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
            raise ProtocolError(f"a tool is an object with a name: {str(doc)[:200]}")
        schema = doc.get("input_schema")
        return cls(
            name=doc["name"],
            description=doc.get("description") if isinstance(doc.get("description"), str) else "",
            input_schema=schema if isinstance(schema, dict) else {"type": "object"},
            permission_policy=doc.get("permission_policy") or "always_allow",
        )


class Gateway:
    """A client of the gateway at ``url`` (``https://host:port``), calling as
    the holder of Kubernetes bearer ``token`` (``None`` sends none).

    ``ca_file`` is the PEM file the gateway's certificate is checked against
    (the system's roots when ``None``; ``context`` replaces both). Every
    request is bounded in time: ``timeout`` seconds in all for listing,
    approving and cancelling, ``call_timeout`` for a call (a streamed one
    included), both per request; and in size: a result's body at most
    ``max_result_bytes``, an error's at most ``max_error_bytes`` (the rest
    is not read), one event of a stream at most ``max_event_bytes``.
    """

    def __init__(self, url: str, token: str | None, ca_file: str | None = None, namespace: str = "default",
                 timeout: float = 30.0, *, call_timeout: float = DEFAULT_CALL_TIMEOUT,
                 context: ssl.SSLContext | None = None, max_result_bytes: int = 64 * MiB,
                 max_error_bytes: int = 1 * MiB, max_event_bytes: int = 64 * MiB,
                 connect_to: str | None = None):
        headers = {"User-Agent": "agentplane-python"}
        # Where to connect instead of resolving the URL's host ("ip:port");
        # AGENTPLANE_GATEWAY_ADDR when not given.
        if connect_to is None:
            connect_to = os.environ.get("AGENTPLANE_GATEWAY_ADDR") or None
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        self.endpoint = Endpoint(url, ca_file=ca_file, context=context, headers=headers,
                                 connect_to=connect_to)
        self.namespace = namespace
        self.timeout = timeout
        self.call_timeout = call_timeout
        self.max_result_bytes = max_result_bytes
        self.max_error_bytes = max_error_bytes
        self.max_event_bytes = max_event_bytes

    def session(self, name: str, namespace: str | None = None) -> SessionHandle:
        return SessionHandle(self, namespace or self.namespace, name)

    def open(self, method: str, path: str, *, body=None, query=None, accept: str = "application/json",
             timeout: float) -> Response:
        """A request whose answer is 2xx (others raise their error)."""
        resp = self.endpoint.request(method, path, body=body, query=query, headers={"Accept": accept},
                                     deadline=Deadline(timeout))
        if not 200 <= resp.status < 300:
            retry = resp.retry_after()
            raise from_gateway_body(resp.status, resp.read_all(self.max_error_bytes, truncate=True), retry)
        return resp

    def json(self, method: str, path: str, *, body=None, timeout: float, limit: int | None = None) -> dict:
        """A request answered with a JSON object."""
        resp = self.open(method, path, body=body, timeout=timeout)
        raw = resp.read_all(limit or self.max_result_bytes)
        try:
            doc = json.loads(raw)
        except ValueError as e:
            raise ProtocolError(f"{resp.what}: the answer is not JSON: {e}", status=resp.status) from e
        if not isinstance(doc, dict):
            raise ProtocolError(f"{resp.what}: the answer is not a JSON object", status=resp.status)
        return doc

    def __repr__(self):
        return f"Gateway({self.endpoint.url!r}, namespace={self.namespace!r})"


def new_call_id() -> str:
    """A fresh call id (letters, digits and '-', as the gateway takes them)."""
    return "py-" + uuid.uuid4().hex


class SessionHandle:
    """One session behind the gateway."""

    def __init__(self, gateway: Gateway, namespace: str, name: str):
        self.gateway = gateway
        self.namespace = namespace
        self.name = name
        self.path = f"/v1/namespaces/{quote(namespace, safe='')}/sessions/{quote(name, safe='')}"

    def tools(self, *, timeout: float | None = None) -> list[Tool]:
        """The session's tools with their permission policies."""
        doc = self.gateway.json("GET", self.path + "/tools", timeout=timeout or self.gateway.timeout)
        tools = doc.get("tools")
        if not isinstance(tools, list):
            raise ProtocolError(f"GET {self.path}/tools: no tools list in the answer")
        return [Tool.from_json(t) for t in tools]

    def call(self, tool: str, input: dict, *, id: str | None = None, approval: str | None = None,
             timeout: float | None = None) -> ToolResult:
        """Run a tool and wait for its result. A failed tool is a result with
        ``is_error``; a refused call raises (``ApprovalRequired``, ``Forbidden``, ...)."""
        doc = self.gateway.json("POST", self.path + "/calls", body=_call_body(tool, input, id, approval),
                                timeout=timeout or self.gateway.call_timeout)
        return ToolResult.from_json(doc)

    def stream(self, tool: str, input: dict, *, id: str | None = None, approval: str | None = None,
               timeout: float | None = None) -> CallStream:
        """Run a tool, its output arriving as it is written: iterate the
        returned stream for ``Chunk`` s and then a ``ToolResult``. Without an
        ``id`` one is made, so the call can be cancelled or attached to."""
        call_id = id or new_call_id()
        resp = self.gateway.open("POST", self.path + "/calls", body=_call_body(tool, input, call_id, approval),
                                 accept="text/event-stream", timeout=timeout or self.gateway.call_timeout)
        return self._events(resp, call_id, 0, 0)

    def attach(self, id: str, stdout_offset: int = 0, stderr_offset: int = 0, *,
               timeout: float | None = None) -> CallStream:
        """Follow a running or finished call from the given byte offsets of
        its output (a finished call gives its result)."""
        resp = self.gateway.open(
            "GET", f"{self.path}/calls/{quote(id, safe='')}/events",
            query={"stdout_offset": int(stdout_offset), "stderr_offset": int(stderr_offset)},
            accept="text/event-stream", timeout=timeout or self.gateway.call_timeout)
        return self._events(resp, id, stdout_offset, stderr_offset)

    def cancel(self, id: str, *, timeout: float | None = None) -> bool:
        """Cancel a call; whether it was still running."""
        doc = self.gateway.json("DELETE", f"{self.path}/calls/{quote(id, safe='')}",
                                timeout=timeout or self.gateway.timeout, limit=self.gateway.max_error_bytes)
        was = doc.get("was_running")
        if not isinstance(was, bool):
            raise ProtocolError(f"DELETE {self.path}/calls/{id}: no was_running in the answer")
        return was

    def approve(self, tool: str, input: dict, *, id: str | None = None,
                timeout: float | None = None) -> Approval:
        """Approve one call of an always_ask tool with exactly this input (and
        this call id, if given). Needs the approving permission, not the
        calling one: usually a different token, so a different ``Gateway``."""
        body = {"name": tool, "input": input}
        if id is not None:
            body["id"] = id
        doc = self.gateway.json("POST", self.path + "/approvals", body=body,
                                timeout=timeout or self.gateway.timeout, limit=self.gateway.max_error_bytes)
        token, expires = doc.get("approval"), doc.get("expires_at")
        if not isinstance(token, str) or not isinstance(expires, str):
            raise ProtocolError(f"POST {self.path}/approvals: no approval and expires_at in the answer")
        return Approval(token, expires)

    def _events(self, resp: Response, call_id: str, stdout_offset: int, stderr_offset: int) -> CallStream:
        kind = (resp.header("Content-Type") or "").split(";")[0].strip()
        if kind != "text/event-stream":
            resp.close()
            raise ProtocolError(f"{resp.what}: expected text/event-stream, got {kind or 'no content type'}",
                                status=resp.status)
        limit = self.gateway.max_event_bytes
        return CallStream(resp, call_id, stdout_offset=stdout_offset, stderr_offset=stderr_offset,
                          max_line=limit, max_event=limit)

    def __repr__(self):
        return f"SessionHandle({self.namespace}/{self.name} via {self.gateway.endpoint.url})"


def _call_body(tool: str, input: dict, id: str | None, approval: str | None) -> dict:
    body = {"name": tool, "input": input}
    if id is not None:
        body["id"] = id
    if approval is not None:
        body["approval"] = approval
    return body
