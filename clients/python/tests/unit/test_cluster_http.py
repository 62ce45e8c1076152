"""Sessions through a real local HTTP server playing the Kubernetes API."""

import json
import time
from urllib.parse import parse_qs, urlsplit

import pytest

import agentplane as ap
from agentplane import Cluster

BASE = "/apis/agentplane.dev/v1alpha1/namespaces/team-a/agentsessions"


def session(phase=None, ready=None, rv="1", reason="RunnerReady", message="m"):
    status = {}
    if phase:
        status["phase"] = phase
    if ready is not None:
        status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False", "reason": reason,
                                 "message": message, "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    return {"apiVersion": "agentplane.dev/v1alpha1", "kind": "AgentSession",
            "metadata": {"name": "s1", "namespace": "team-a", "resourceVersion": rv}, "status": status}


def not_found(h):
    h.json(404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404,
                 "message": 'agentsessions.agentplane.dev "s1" not found'})


def test_create_posts_the_object_with_the_warm_pool(server):
    server.answer = lambda h: h.json(201, json.loads(h.body))
    spec = {"image": "img", "tools": [{"type": "agent_toolset_20260401"}]}
    obj = Cluster(server.url, "tok").create_session("team-a", "s1", spec, warm_pool="base", labels={"a": "b"})
    req = server.requests[0]
    assert (req.command, req.path) == ("POST", BASE)
    assert req.headers["Authorization"] == "Bearer tok"
    assert obj == {"apiVersion": "agentplane.dev/v1alpha1", "kind": "AgentSession",
                   "metadata": {"name": "s1", "namespace": "team-a", "labels": {"a": "b"}},
                   "spec": {**spec, "warmPool": "base"}}
    assert "warmPool" not in spec


def test_create_of_an_existing_session_is_a_conflict(server):
    server.answer = lambda h: h.json(409, {"kind": "Status", "reason": "AlreadyExists", "code": 409,
                                           "message": "already exists"})
    with pytest.raises(ap.Conflict, match="already exists"):
        Cluster(server.url, "tok").create_session("team-a", "s1", {"image": "i"})


def test_get_and_delete(server):
    server.answer = lambda h: h.json(200, session("Ready", True)) if h.command == "GET" else h.json(
        200, {"kind": "Status", "status": "Success"})
    c = Cluster(server.url, "tok")
    assert c.get_session("team-a", "s1")["status"]["phase"] == "Ready"
    assert c.delete_session("team-a", "s1") is True
    assert [(r.command, r.path) for r in server.requests] == [("GET", BASE + "/s1"), ("DELETE", BASE + "/s1")]
    assert json.loads(server.requests[1].body) == {"propagationPolicy": "Background"}


def test_delete_of_a_missing_session(server):
    server.answer = not_found
    c = Cluster(server.url, "tok")
    assert c.delete_session("team-a", "s1") is False
    with pytest.raises(ap.NotFound):
        c.delete_session("team-a", "s1", missing_ok=False)


def watch_server(server, first, events, delay=0.05):
    def answer(h):
        q = parse_qs(urlsplit(h.path).query)
        if "watch" not in q:
            return h.json(200, first)
        assert q["fieldSelector"] == ["metadata.name=s1"] and q["resourceVersion"] == ["1"]
        h.start_chunked("application/json")
        for kind, obj in events:
            h.chunk(json.dumps({"type": kind, "object": obj}).encode() + b"\n", delay)
        h.end_chunked()
    server.answer = answer


def test_wait_ready_follows_the_watch(server):
    watch_server(server, session(), [("MODIFIED", session("Pending", False, "2", "PodCreating")),
                                     ("MODIFIED", session("Ready", True, "3"))])
    obj = Cluster(server.url, "tok").wait_ready("team-a", "s1", timeout=5)
    assert obj["metadata"]["resourceVersion"] == "3"


def test_wait_ready_returns_at_once_when_ready(server):
    server.answer = lambda h: h.json(200, session("Ready", True))
    Cluster(server.url, "tok").wait_ready("team-a", "s1", timeout=5)
    assert len(server.requests) == 1


def test_wait_ready_raises_with_the_conditions_when_the_session_fails(server):
    watch_server(server, session(), [("MODIFIED", session("Failed", False, "2", "ErrImagePull", "no such image"))])
    with pytest.raises(ap.SessionNotReady) as e:
        Cluster(server.url, "tok").wait_ready("team-a", "s1", timeout=5)
    err = e.value
    assert err.phase == "Failed" and not err.timed_out
    assert err.conditions[0]["reason"] == "ErrImagePull"
    assert "Ready=False ErrImagePull: no such image" in str(err)


def test_wait_ready_raises_when_the_session_is_deleted(server):
    watch_server(server, session(), [("DELETED", session("Pending", False, "2"))])
    with pytest.raises(ap.SessionNotReady, match="deleted"):
        Cluster(server.url, "tok").wait_ready("team-a", "s1", timeout=5)


def test_wait_ready_times_out_with_the_last_status(server):
    watch_server(server, session("Pending", False, reason="PodCreating"),
                 [("MODIFIED", session("Pending", False, "1", "PodCreating"))] * 100, delay=0.1)
    t0 = time.monotonic()
    with pytest.raises(ap.SessionNotReady) as e:
        Cluster(server.url, "tok").wait_ready("team-a", "s1", timeout=0.5)
    assert e.value.timed_out and "PodCreating" in str(e.value)
    assert time.monotonic() - t0 < 3


def test_wait_ready_rereads_after_a_watch_error(server):
    reads = []

    def answer(h):
        q = parse_qs(urlsplit(h.path).query)
        if "watch" not in q:
            reads.append(1)
            return h.json(200, session("Ready", True) if len(reads) > 1 else session())
        h.start_chunked("application/json")
        h.chunk(json.dumps({"type": "ERROR", "object": {"kind": "Status", "code": 410}}).encode() + b"\n")
        h.end_chunked()
    server.answer = answer
    Cluster(server.url, "tok").wait_ready("team-a", "s1", timeout=5)
    assert len(reads) == 2


def test_a_missing_session_is_not_found(server):
    server.answer = not_found
    with pytest.raises(ap.NotFound):
        Cluster(server.url, "tok").wait_ready("team-a", "s1", timeout=1)
