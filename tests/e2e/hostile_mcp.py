"""A hostile MCP server for the operator's end-to-end tests (stdlib only).

Each path misbehaves in one way an untrusted MCP server can:
  /redirect  307 to /trap, which counts the requests that reach it
  /huge      a 200 whose body streams 64 MiB of JSON-looking bytes, unlengthed
  /flaky     500 with a different random body every time
  /many      a well-behaved MCP server that lists 129 tools
  /hits      how many requests reached /trap (plain text)
Run: python hostile_mcp.py PORT
"""

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TRAP_HITS = 0
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(min(n, 1 << 20)) if n else b""

    def _send(self, code, body, ctype="application/json", extra=None):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/hits":
            with LOCK:
                self._send(200, str(TRAP_HITS).encode(), "text/plain")
        else:
            self._send(404, b"", "text/plain")

    def do_POST(self):
        global TRAP_HITS
        body = self._body()
        if self.path == "/trap":
            with LOCK:
                TRAP_HITS += 1
            self._send(200, b"{}")
        elif self.path == "/redirect":
            self._send(307, b"", "text/plain", {"Location": "/trap"})
        elif self.path == "/flaky":
            noise = os.urandom(16 + os.urandom(1)[0]).hex().encode()
            self._send(500, b"upstream exploded: " + noise, "text/plain")
        elif self.path == "/huge":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Connection", "close")
            self.end_headers()
            chunk = b'{"pad":"' + b"x" * (1 << 16) + b'"}'
            try:
                for _ in range(1024):  # 64 MiB, then stop
                    self.wfile.write(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass
            self.close_connection = True
        elif self.path == "/many":
            self._mcp(body)
        else:
            self._send(404, b"", "text/plain")

    def _mcp(self, body):
        try:
            msg = json.loads(body or b"{}")
        except ValueError:
            self._send(400, b"")
            return
        method, mid = msg.get("method"), msg.get("id")
        if mid is None:  # a notification
            self._send(202, b"")
            return
        if method == "initialize":
            result = {
                "protocolVersion": msg.get("params", {}).get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "many", "version": "1"},
            }
        elif method == "tools/list":
            result = {
                "tools": [
                    {"name": f"t{i}", "description": "", "inputSchema": {"type": "object"}}
                    for i in range(129)
                ]
            }
        else:
            result = {}
        out = json.dumps({"jsonrpc": "2.0", "id": mid, "result": result}).encode()
        self._send(200, out, extra={"Mcp-Session-Id": "s1"})


if __name__ == "__main__":
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
