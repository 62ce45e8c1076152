"""A real local HTTP server for tests about HTTP behaviour: each test sets
its ``answer``, a function that answers every request."""

import http.server
import json
import time


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _serve(self):
        n = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(n) if n else b""
        self.server.requests.append(self)
        try:
            self.server.answer(self)
        except OSError:
            pass  # the client left (as the bound and deadline tests make it)
        self.close_connection = True

    do_GET = do_POST = do_DELETE = _serve

    # -- answers --------------------------------------------------------

    def json(self, status, doc, headers=None):
        raw = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(raw)

    def start_chunked(self, content_type="text/event-stream", status=200):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def chunk(self, data: bytes, delay=0.0):
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        if delay:
            time.sleep(delay)

    def end_chunked(self):
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def event(self, name, doc, delay=0.0):
        self.chunk(f"event: {name}\ndata: {json.dumps(doc)}\n\n".encode(), delay)


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a client that left mid-handshake, say: not the test's failure

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.requests = []
        self.answer = lambda h: h.json(500, {"error": {"code": "internal", "message": "no answer set"}})

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"
