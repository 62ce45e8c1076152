"""The Python client against a real gateway, session and API server (see
liveenv.py for the environment). Run by the Rust e2e test."""

import time
import uuid

import pytest

import agentplane as ap
from agentplane import Chunk, ToolResult, anthropic_tools

from liveenv import live

SIX = {"bash", "read", "write", "edit", "glob", "grep"}


def test_the_six_tools_with_their_policies():
    env = live()
    tools = env.caller.tools()
    assert {t.name for t in tools} == SIX
    assert {t.name: t.permission_policy for t in tools} == {
        n: ("always_ask" if n == "bash" else "always_allow") for n in SIX}
    for t in tools:
        assert t.input_schema.get("type") == "object" and t.description, t
    defs = anthropic_tools(tools)
    assert sorted(d["name"] for d in defs) == sorted(SIX)
    assert all(set(d) == {"name", "description", "input_schema"} for d in defs)


def test_write_read_edit_glob_grep_round_trip():
    s = live().caller
    d = f"py-live-{uuid.uuid4().hex[:8]}"
    path = f"{d}/notes.txt"
    w = s.call("write", {"file_path": path, "content": "alpha\nbeta\n"})
    assert not w.is_error, w
    r = s.call("read", {"file_path": path})
    assert not r.is_error and r.content == "alpha\nbeta\n", r
    e = s.call("edit", {"file_path": path, "old_string": "beta", "new_string": "gamma"})
    assert not e.is_error, e
    assert s.call("read", {"file_path": path}).content == "alpha\ngamma\n"
    g = s.call("glob", {"pattern": f"{d}/*.txt"})
    assert not g.is_error and "notes.txt" in g.content, g
    gr = s.call("grep", {"pattern": "gam+a", "path": d})
    assert not gr.is_error and "notes.txt" in gr.content and "gamma" in gr.content, gr
    missing = s.call("read", {"file_path": f"{d}/absent.txt"})
    assert missing.is_error, missing


def test_bash_needs_an_approval_from_an_approver():
    env = live()
    cmd = {"command": f"echo approved-{uuid.uuid4().hex[:6]}"}
    with pytest.raises(ap.ApprovalRequired) as refused:
        env.caller.call("bash", cmd)
    assert refused.value.status == 403
    approval = env.approver.approve("bash", cmd)
    assert approval.token and approval.expires_at
    out = env.caller.call("bash", cmd, approval=approval.token)
    assert not out.is_error and cmd["command"].split()[1] in out.content, out
    # The approval is for that input only.
    with pytest.raises((ap.Invalid, ap.ApprovalRequired, ap.Forbidden)):
        env.caller.call("bash", {"command": "echo other"}, approval=approval.token)


def test_a_token_without_permissions_is_forbidden():
    env = live()
    denied = env.gateway(env.denied_token).session(env.session)
    with pytest.raises(ap.Forbidden) as e:
        denied.call("read", {"file_path": "/etc/hostname"})
    assert e.value.status == 403 and e.value.message
    with pytest.raises(ap.Forbidden):
        denied.tools()


def test_a_caller_may_not_approve():
    with pytest.raises(ap.Forbidden) as e:
        live().caller.approve("bash", {"command": "true"})
    assert "approve" in e.value.message


def test_no_token_or_a_bad_one_is_unauthenticated():
    env = live()
    with pytest.raises(ap.Unauthenticated):
        env.gateway(None).session(env.session).tools()
    with pytest.raises(ap.Unauthenticated):
        env.gateway("not-a-token").session(env.session).call("read", {"file_path": "/etc/hostname"})


def test_a_stream_gives_chunks_as_they_are_written_then_the_result():
    env = live()
    cmd = {"command": "for i in 1 2 3; do echo $i; sleep 0.2; done"}
    approval = env.approver.approve("bash", cmd).token
    items, times = [], []
    for item in env.caller.stream("bash", cmd, approval=approval):
        items.append(item)
        times.append(time.monotonic())
    chunks = [i for i in items if isinstance(i, Chunk)]
    result = items[-1]
    assert isinstance(result, ToolResult) and not result.is_error, result
    assert all(isinstance(i, Chunk) for i in items[:-1])
    assert b"".join(c.data for c in chunks if c.stream == "stdout") == b"1\n2\n3\n"
    assert len(chunks) >= 2, chunks
    # The first line came while the command still slept.
    assert times[-1] - times[0] >= 0.25, times
    assert "1\n2\n3" in result.content


def test_cancel_ends_a_streamed_call():
    env = live()
    cmd = {"command": "sleep 30"}
    approval = env.approver.approve("bash", cmd).token
    t0 = time.monotonic()
    with env.caller.stream("bash", cmd, approval=approval) as st:
        was_running = False
        for _ in range(25):
            was_running = env.caller.cancel(st.id)
            if was_running:
                break
            time.sleep(0.2)
        assert was_running
        try:
            result = st.wait()
            assert result.is_error, result
        except ap.GatewayError as e:
            assert e.code in ("cancelled", "interrupted"), e
    assert time.monotonic() - t0 < 20
    assert env.caller.cancel(st.id) is False


def test_attach_to_a_finished_call_gives_its_result():
    # The runner keeps streamed calls for attaching (a unary call is not).
    env = live()
    call_id = f"py-attach-{uuid.uuid4().hex[:8]}"
    first = env.caller.stream("read", {"file_path": "/etc/hostname"}, id=call_id).wait()
    again = env.caller.attach(call_id).wait()
    assert again.id == call_id and again.content == first.content


def first_call(session, tool, args, within=30.0):
    """A call to a session just Ready, retried while the gateway has not seen it yet."""
    deadline = time.monotonic() + within
    while True:
        try:
            return session.call(tool, args)
        except (ap.NotFound, ap.Unavailable):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_a_second_session_created_through_the_api_server():
    env = live()
    cluster = env.cluster()
    first = cluster.get_session(env.namespace, env.session)
    # The status's definitions are the ones the gateway hands out.
    by_name = lambda defs: sorted(defs, key=lambda d: d["name"])  # noqa: E731
    assert by_name(anthropic_tools(first)) == by_name(anthropic_tools(env.caller.tools()))
    spec = first["spec"]
    name = f"py-live-{uuid.uuid4().hex[:8]}"
    cluster.create_session(env.namespace, name, spec)
    try:
        obj = cluster.wait_ready(env.namespace, name, timeout=240)
        assert obj["status"]["phase"] == "Ready"
        assert {t["name"] for t in obj["status"]["tools"]} == SIX
        out = first_call(env.gateway(env.caller_token).session(name), "read", {"file_path": "/etc/hostname"})
        assert not out.is_error and out.content.strip(), out
    finally:
        assert cluster.delete_session(env.namespace, name)
    # A name in use cannot be created again.
    with pytest.raises(ap.Conflict):
        cluster.create_session(env.namespace, env.session, spec)
