"""The gateway client against a real local HTTP server playing the gateway."""

import base64
import json
import time

import pytest

import agentplane as ap
from agentplane import Chunk, Gateway, ToolResult

SESSION_PATH = "/v1/namespaces/team-a/sessions/demo"


def gw(server, **kw):
    return Gateway(server.url, "tok", namespace="team-a", **kw)


def b64(s: bytes) -> str:
    return base64.b64encode(s).decode()


def test_tools_sends_the_token_and_reads_the_list(server):
    server.answer = lambda h: h.json(200, {"tools": [
        {"name": "bash", "description": "d", "input_schema": {"type": "object"}, "permission_policy": "always_ask"}]})
    tools = gw(server).session("demo").tools()
    assert tools == [ap.Tool("bash", "d", {"type": "object"}, "always_ask")]
    req = server.requests[0]
    assert (req.command, req.path) == ("GET", SESSION_PATH + "/tools")
    assert req.headers["Authorization"] == "Bearer tok"


def test_no_token_sends_no_authorization(server):
    server.answer = lambda h: h.json(401, {"error": {"code": "unauthenticated", "message": "no token"}})
    with pytest.raises(ap.Unauthenticated, match="no token"):
        Gateway(server.url, None).session("demo").tools()
    assert "Authorization" not in server.requests[0].headers


def test_call_posts_name_input_id_and_approval(server):
    server.answer = lambda h: h.json(200, {"id": "c1", "content": "hi", "is_error": False})
    s = gw(server).session("demo")
    assert s.call("read", {"file_path": "a"}) == ToolResult("c1", "hi", False)
    assert s.call("bash", {"command": "x"}, id="c1", approval="tok2").content == "hi"
    first, second = (json.loads(r.body) for r in server.requests)
    assert first == {"name": "read", "input": {"file_path": "a"}}
    assert second == {"name": "bash", "input": {"command": "x"}, "id": "c1", "approval": "tok2"}
    assert server.requests[0].headers["Content-Type"] == "application/json"
    assert server.requests[0].headers["Accept"] == "application/json"


def test_errors_raise_their_class(server):
    server.answer = lambda h: h.json(403, {"error": {"code": "approval_required", "message": "bash is always_ask"}})
    with pytest.raises(ap.ApprovalRequired) as e:
        gw(server).session("demo").call("bash", {"command": "ls"})
    assert e.value.status == 403 and "always_ask" in e.value.message


def test_too_many_requests_carries_retry_after(server):
    server.answer = lambda h: h.json(429, {"error": {"code": "too_many_requests", "message": "slow down"}},
                                     {"Retry-After": "3"})
    with pytest.raises(ap.TooManyRequests) as e:
        gw(server).session("demo").tools()
    assert e.value.retry_after == 3.0


def test_a_huge_error_body_is_not_read_whole(server):
    def answer(h):
        h.start_chunked("application/json", status=500)
        h.chunk(b'{"error": {"code": "internal", "message": "')
        for _ in range(40):
            h.chunk(b"x" * 65536, delay=0.1)
        h.end_chunked()
    server.answer = answer
    t0 = time.monotonic()
    with pytest.raises(ap.Internal) as e:
        gw(server, max_error_bytes=1000).session("demo").tools()
    # Cut at the bound, the body is no longer JSON: the status decides, and
    # the client left before the server had sent it all (4 s).
    assert e.value.status == 500 and len(e.value.message) < 600
    assert time.monotonic() - t0 < 3.0


def test_a_result_over_the_bound_raises(server):
    server.answer = lambda h: h.json(200, {"id": "c", "content": "x" * 5000, "is_error": False})
    with pytest.raises(ap.ResponseTooLarge):
        gw(server, max_result_bytes=1000).session("demo").call("read", {})


def test_an_answer_that_is_not_json(server):
    def answer(h):
        h.send_response(200)
        h.send_header("Content-Length", "5")
        h.end_headers()
        h.wfile.write(b"hello")
    server.answer = answer
    with pytest.raises(ap.ProtocolError):
        gw(server).session("demo").call("read", {})


def test_the_total_timeout_holds_against_a_trickling_server(server):
    def answer(h):
        h.start_chunked("application/json")
        for _ in range(100):
            h.chunk(b" ", delay=0.05)  # always something, never the end (5 s)
        h.end_chunked()
    server.answer = answer
    t0 = time.monotonic()
    with pytest.raises(ap.Timeout):
        gw(server, call_timeout=0.5).session("demo").call("bash", {})
    assert time.monotonic() - t0 < 3.0


def test_the_total_timeout_holds_against_headers_sent_a_byte_at_a_time(server):
    def answer(h):
        h.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        for _ in range(100):  # 5 s of one header, a byte at a time
            h.wfile.write(b"x")
            h.wfile.flush()
            time.sleep(0.05)
    server.answer = answer
    t0 = time.monotonic()
    with pytest.raises(ap.Timeout):
        gw(server, timeout=0.5).session("demo").tools()
    assert time.monotonic() - t0 < 3.0


def test_a_server_that_never_answers_times_out(server):
    server.answer = lambda h: time.sleep(5)
    t0 = time.monotonic()
    with pytest.raises(ap.Timeout):
        gw(server, timeout=0.3).session("demo").tools()
    assert time.monotonic() - t0 < 3.0


def test_nothing_listening_is_a_connection_failure():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(ap.ConnectionFailed):
        Gateway(f"http://127.0.0.1:{port}", "t").session("x").tools()


def stream_answer(h, events, delay=0.0):
    h.start_chunked()
    h.chunk(b": keep-alive\n\n")
    for name, doc in events:
        h.event(name, doc, delay)
    h.end_chunked()


def test_stream_gives_chunks_then_the_result(server):
    server.answer = lambda h: stream_answer(h, [
        ("stdout", {"offset": 0, "data": b64(b"1\n")}),
        ("stderr", {"offset": 0, "data": b64(b"warn\n")}),
        ("stdout", {"offset": 2, "data": b64(b"2\n")}),
        ("result", {"id": "c9", "content": "1\n2\n", "is_error": False}),
    ], delay=0.02)
    s = gw(server).session("demo")
    items = list(s.stream("bash", {"command": "x"}, id="c9", approval="a"))
    assert items == [Chunk("stdout", 0, b"1\n"), Chunk("stderr", 0, b"warn\n"), Chunk("stdout", 2, b"2\n"),
                     ToolResult("c9", "1\n2\n", False)]
    req = server.requests[0]
    assert req.headers["Accept"] == "text/event-stream"
    assert json.loads(req.body) == {"name": "bash", "input": {"command": "x"}, "id": "c9", "approval": "a"}


def test_stream_makes_an_id_when_none_is_given(server):
    server.answer = lambda h: stream_answer(h, [("result", {"id": "x", "content": "", "is_error": False})])
    st = gw(server).session("demo").stream("read", {})
    assert st.id.startswith("py-") and json.loads(server.requests[0].body)["id"] == st.id
    assert st.wait().id == "x"


def test_stream_output_collects_both_streams(server):
    server.answer = lambda h: stream_answer(h, [
        ("stdout", {"offset": 0, "data": b64(b"a")}), ("stderr", {"offset": 0, "data": b64(b"b")}),
        ("stdout", {"offset": 1, "data": b64(b"c")}),
        ("result", {"id": "x", "content": "ac", "is_error": True})])
    out, err, res = gw(server).session("demo").stream("bash", {}).output()
    assert (out, err, res.is_error) == (b"ac", b"b", True)


def test_an_error_event_raises_its_class(server):
    server.answer = lambda h: stream_answer(h, [
        ("stdout", {"offset": 0, "data": b64(b"a")}), ("error", {"code": "unavailable", "message": "runner gone"})])
    st = gw(server).session("demo").stream("bash", {})
    assert next(st) == Chunk("stdout", 0, b"a")
    with pytest.raises(ap.Unavailable, match="runner gone"):
        next(st)


def test_a_refused_stream_raises_before_any_event(server):
    server.answer = lambda h: h.json(403, {"error": {"code": "forbidden", "message": "may not create calls"}})
    with pytest.raises(ap.Forbidden, match="may not create"):
        gw(server).session("demo").stream("bash", {})


def test_a_stream_that_ends_early_says_how_to_attach(server):
    server.answer = lambda h: stream_answer(h, [
        ("stdout", {"offset": 0, "data": b64(b"abc")}), ("stderr", {"offset": 0, "data": b64(b"e")})])
    st = gw(server).session("demo").stream("bash", {}, id="c1")
    assert next(st) == Chunk("stdout", 0, b"abc")
    assert next(st) == Chunk("stderr", 0, b"e")
    with pytest.raises(ap.StreamInterrupted) as e:
        next(st)
    assert (e.value.id, e.value.stdout_offset, e.value.stderr_offset) == ("c1", 3, 1)


def test_a_stream_that_runs_out_of_time_is_interrupted_and_a_timeout(server):
    server.answer = lambda h: stream_answer(h, [("stdout", {"offset": i, "data": b64(b"x")}) for i in range(50)],
                                            delay=0.05)
    st = gw(server, call_timeout=0.4).session("demo").stream("bash", {}, id="c1")
    with pytest.raises(ap.StreamTimedOut) as e:
        for _ in st:
            pass
    assert isinstance(e.value, ap.Timeout) and isinstance(e.value, ap.StreamInterrupted)
    assert e.value.stdout_offset > 0


def test_attach_sends_offsets_and_drops_what_was_seen(server):
    server.answer = lambda h: stream_answer(h, [
        ("stdout", {"offset": 0, "data": b64(b"hello")}),   # all seen
        ("stdout", {"offset": 3, "data": b64(b"lo world")}),  # "lo" seen
        ("stderr", {"offset": 4, "data": b64(b"ee")}),
        ("result", {"id": "c1", "content": "done", "is_error": False})])
    st = gw(server).session("demo").attach("c1", stdout_offset=5, stderr_offset=4)
    assert list(st) == [Chunk("stdout", 5, b" world"), Chunk("stderr", 4, b"ee"), ToolResult("c1", "done", False)]
    req = server.requests[0]
    assert req.command == "GET"
    assert req.path == SESSION_PATH + "/calls/c1/events?stdout_offset=5&stderr_offset=4"
    assert (st.stdout_offset, st.stderr_offset) == (11, 6)


def test_an_oversize_event_line_raises(server):
    server.answer = lambda h: stream_answer(h, [("stdout", {"offset": 0, "data": b64(b"x" * 3000)})])
    with pytest.raises(ap.ResponseTooLarge):
        list(gw(server, max_event_bytes=1000).session("demo").stream("bash", {}))


def test_a_stream_answer_that_is_not_an_event_stream(server):
    server.answer = lambda h: h.json(200, {"id": "c", "content": "", "is_error": False})
    with pytest.raises(ap.ProtocolError, match="text/event-stream"):
        gw(server).session("demo").stream("bash", {})


def test_unknown_event_kinds_are_skipped(server):
    server.answer = lambda h: stream_answer(h, [("progress", {"x": 1}),
                                                ("result", {"id": "c", "content": "", "is_error": False})])
    assert [type(i) for i in gw(server).session("demo").stream("bash", {})] == [ToolResult]


def test_cancel(server):
    server.answer = lambda h: h.json(200, {"was_running": True})
    assert gw(server).session("demo").cancel("c 1") is True
    req = server.requests[0]
    assert (req.command, req.path) == ("DELETE", SESSION_PATH + "/calls/c%201")


def test_approve(server):
    server.answer = lambda h: h.json(200, {"approval": "ap1", "expires_at": "2026-01-01T00:00:00Z"})
    a = gw(server).session("demo").approve("bash", {"command": "ls"}, id="c1")
    assert a == ap.Approval("ap1", "2026-01-01T00:00:00Z")
    req = server.requests[0]
    assert (req.command, req.path) == ("POST", SESSION_PATH + "/approvals")
    assert json.loads(req.body) == {"name": "bash", "input": {"command": "ls"}, "id": "c1"}


def test_names_are_escaped_into_the_path(server):
    server.answer = lambda h: h.json(200, {"tools": []})
    Gateway(server.url + "/prefix/", "t", namespace="a/b").session("../x").tools()
    assert server.requests[0].path == "/prefix/v1/namespaces/a%2Fb/sessions/..%2Fx/tools"
