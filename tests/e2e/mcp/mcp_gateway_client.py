"""The gateway's MCP endpoint, driven by the official MCP Python SDK.

An e2e check that a stock MCP client (mcp 1.26, Streamable HTTP) works
against /mcp/v1/namespaces/{ns}/sessions/{name}:
  - initialize names the server agentplane-gateway and offers tools;
  - tools/list gives bash, read, write, edit, glob and grep, each with an
    inputSchema and _meta["agentplane.dev/permission_policy"] (bash is
    always_ask and its description says "(needs approval)");
  - write then read of a file round-trips;
  - bash without an approval is an isError result that speaks of approval;
  - a request without a token is HTTP 401;
  - a caller without create on agentsessions/call gets a JSON-RPC error
    naming agentsessions/call.

The gateway's certificate is for $AGENTPLANE_GATEWAY_HOST (a DNS name the
test runner may not resolve) while it is reached at $AGENTPLANE_GATEWAY_ADDR
(ip:port): requests go to https://HOST:PORT/..., and the transport connects
to the IP with TLS checking the name HOST (SNI and certificate) against
$AGENTPLANE_GATEWAY_CA.

Environment: AGENTPLANE_GATEWAY_HOST, AGENTPLANE_GATEWAY_ADDR,
AGENTPLANE_GATEWAY_CA, AGENTPLANE_CALLER_TOKEN, AGENTPLANE_DENIED_TOKEN,
AGENTPLANE_NAMESPACE, AGENTPLANE_SESSION (AGENTPLANE_APPROVER_TOKEN is not
used). Exits 0 when every check holds, 1 with the failed check on stderr.
Run with the interpreter scripts/python-env.sh prints.
"""

import asyncio
import os
import ssl
import sys
import uuid

import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.exceptions import McpError

TOOLS = {"bash", "read", "write", "edit", "glob", "grep"}
POLICY = "agentplane.dev/permission_policy"
TIMEOUT = 120


class Failed(Exception):
    pass


def check(ok, what):
    if not ok:
        raise Failed(what)
    print(f"ok: {what.split(':')[0]}", flush=True)


def env(name):
    v = os.environ.get(name, "")
    if not v:
        raise Failed(f"environment: {name} is not set")
    return v


def split_addr(addr):
    """ip:port, [v6]:port -> (ip, port)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise Failed(f"environment: AGENTPLANE_GATEWAY_ADDR {addr!r} is not ip:port")
    return host.strip("[]"), int(port)


class PinnedTransport(httpx.AsyncBaseTransport):
    """Sends requests for `name` to `ip:port`, verifying the certificate for `name`.

    The request keeps its URL's Host header; only the connection's target
    changes, and httpcore's `sni_hostname` extension makes TLS send and
    check `name` instead of the IP.
    """

    def __init__(self, name, ip, port, ca_file):
        self._name = name
        self._ip = ip
        self._port = port
        ctx = ssl.create_default_context(cafile=ca_file)
        self._inner = httpx.AsyncHTTPTransport(verify=ctx, trust_env=False)

    async def handle_async_request(self, request):
        if request.url.host != self._name:
            raise httpx.ConnectError(f"refusing to send a request to {request.url.host}", request=request)
        request.url = request.url.copy_with(host=self._ip, port=self._port)
        request.extensions = {**request.extensions, "sni_hostname": self._name}
        return await self._inner.handle_async_request(request)

    async def aclose(self):
        await self._inner.aclose()


def client_factory(name, ip, port, ca_file):
    """An McpHttpClientFactory (headers, timeout, auth) over the pinned transport."""

    def make(headers=None, timeout=None, auth=None):
        return httpx.AsyncClient(
            headers=headers,
            timeout=timeout if timeout is not None else httpx.Timeout(30, read=300),
            auth=auth,
            follow_redirects=False,
            transport=PinnedTransport(name, ip, port, ca_file),
        )

    return make


def text_of(result):
    return "\n".join(getattr(c, "text", "") for c in result.content)


def flatten(e):
    """The leaf exceptions of an exception group (anyio task groups wrap)."""
    if isinstance(e, BaseExceptionGroup):
        return [leaf for sub in e.exceptions for leaf in flatten(sub)]
    return [e]


def failure(e, where):
    """The Failed among an exception's leaves, or one describing them."""
    leaves = flatten(e)
    for leaf in leaves:
        if isinstance(leaf, Failed):
            return leaf
    return Failed(f"{where}: {'; '.join(repr(x) for x in leaves)}")


async def as_caller(url, token, factory, marker_path):
    headers = {"Authorization": f"Bearer {token}"}
    async with streamablehttp_client(url, headers=headers, httpx_client_factory=factory) as (read, write, _):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            check(
                init.serverInfo.name == "agentplane-gateway" and init.capabilities.tools is not None,
                f"initialize: server {init.serverInfo.name!r}, tools capability {init.capabilities.tools!r}",
            )

            listed = (await s.list_tools()).tools
            by_name = {t.name: t for t in listed}
            check(set(by_name) == TOOLS, f"tools/list: the six tools, got {sorted(by_name)}")
            for t in listed:
                schema = t.inputSchema
                check(
                    isinstance(schema, dict) and schema.get("type") == "object",
                    f"tools/list {t.name} inputSchema: an object schema, got {schema!r}",
                )
                policy = (t.meta or {}).get(POLICY)
                want = "always_ask" if t.name == "bash" else "always_allow"
                check(policy == want, f"tools/list {t.name} _meta: {POLICY} {want}, got {t.meta!r}")
                asks = (t.description or "").endswith("(needs approval)")
                check(asks == (want == "always_ask"), f"tools/list {t.name} description: {t.description!r}")

            content = f"written over MCP {uuid.uuid4().hex}\n"
            w = await s.call_tool("write", {"file_path": marker_path, "content": content})
            check(not w.isError, f"tools/call write: not an error, got {text_of(w)!r}")
            r = await s.call_tool("read", {"file_path": marker_path})
            check(
                not r.isError and content.strip() in text_of(r),
                f"tools/call read: what write wrote, got isError={r.isError} {text_of(r)!r}",
            )

            b = await s.call_tool("bash", {"command": "echo should-not-run"})
            t = text_of(b)
            check(
                b.isError and "approval" in t.lower() and "should-not-run" not in t,
                f"tools/call bash without approval: isError speaking of approval, got isError={b.isError} {t!r}",
            )


async def without_token(url, factory):
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "e2e", "version": "0"}},
    }
    async with factory(headers={"Accept": "application/json, text/event-stream"}) as c:
        resp = await c.post(url, json=init)
    check(resp.status_code == 401, f"no token: HTTP 401, got {resp.status_code} {resp.text[:200]!r}")


async def as_denied(url, token, factory, marker_path):
    headers = {"Authorization": f"Bearer {token}"}
    try:
        async with streamablehttp_client(url, headers=headers, httpx_client_factory=factory) as (read, write, _):
            async with ClientSession(read, write) as s:
                await s.initialize()
                try:
                    r = await s.call_tool("read", {"file_path": marker_path})
                except McpError as e:
                    msg = e.error.message
                    check("agentsessions/call" in msg, f"denied tools/call: error naming agentsessions/call, got {msg!r}")
                    return
                raise Failed(f"denied tools/call: should fail, got a result {text_of(r)!r}")
    except Exception as e:
        for leaf in flatten(e):
            if isinstance(leaf, httpx.HTTPStatusError) and leaf.response.status_code == 401:
                raise Failed(
                    "denied tools/call: the denied token was refused outright (HTTP 401); "
                    "it should be a valid token without create on agentsessions/call"
                ) from e
        raise failure(e, "denied tools/call") from e


async def main():
    name = env("AGENTPLANE_GATEWAY_HOST")
    ip, port = split_addr(env("AGENTPLANE_GATEWAY_ADDR"))
    ca = env("AGENTPLANE_GATEWAY_CA")
    caller = env("AGENTPLANE_CALLER_TOKEN")
    denied = env("AGENTPLANE_DENIED_TOKEN")
    ns = env("AGENTPLANE_NAMESPACE")
    session = env("AGENTPLANE_SESSION")
    url = f"https://{name}:{port}/mcp/v1/namespaces/{ns}/sessions/{session}"
    factory = client_factory(name, ip, port, ca)
    marker = f"/tmp/agentplane-mcp-e2e-{uuid.uuid4().hex}.txt"
    print(f"MCP endpoint {url} (connecting to {ip}:{port})", flush=True)
    try:
        await as_caller(url, caller, factory, marker)
    except Exception as e:
        raise failure(e, "caller") from e
    try:
        await without_token(url, factory)
    except Exception as e:
        raise failure(e, "no token") from e
    await as_denied(url, denied, factory, marker)


def run():
    try:
        asyncio.run(asyncio.wait_for(main(), TIMEOUT))
    except Failed as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    except (TimeoutError, asyncio.TimeoutError):
        print(f"FAIL: no answer within {TIMEOUT} s", file=sys.stderr)
        return 1
    print("PASS: the MCP endpoint works with the official Python SDK")
    return 0


if __name__ == "__main__":
    sys.exit(run())
