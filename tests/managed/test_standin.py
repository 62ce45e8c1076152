"""Tests of the Managed Agents stand-in, and of the official SDK worker against it.

Run: ~/.cache/agentplane/venv/bin/python -m pytest tests/managed -q

Every stand-in runs as a subprocess under `prlimit --as=2000000000`; every HTTP
call and subprocess wait has a timeout, so nothing hangs.
"""

from __future__ import annotations

import os
import sys
import json
import time
import base64
import shutil
import subprocess
import urllib.error
import urllib.request
from typing import Any, Iterator, Optional

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable
MEM_LIMIT = "2000000000"
KEY = "envkey-test-0"
ENV = "env_standin"
BETA = "managed-agents-2026-04-01"
HTTP_TIMEOUT = 15.0


def load(name: str) -> dict[str, Any]:
    with open(os.path.join(HERE, name)) as f:
        return json.load(f)


class StandIn:
    def __init__(self, *extra: str) -> None:
        cmd = [PY, os.path.join(HERE, "standin.py"), "--listen", "127.0.0.1:0", "--key", KEY, *extra]
        if shutil.which("prlimit"):
            cmd = ["prlimit", f"--as={MEM_LIMIT}", "--"] + cmd
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line.startswith("LISTENING ") or not line:
                break
        if not line.startswith("LISTENING "):
            self.close()
            raise RuntimeError("stand-in did not start")
        self.url = line.split()[1].rstrip("/")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def call(
        self,
        method: str,
        path: str,
        *,
        key: Optional[str] = KEY,
        body: Any = None,
        raw: Optional[bytes] = None,
        beta: Optional[str] = BETA,
        headers: Optional[dict[str, str]] = None,
    ) -> tuple[int, Any]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        h = {"Content-Type": "application/json", **(headers or {})}
        if key is not None:
            h["Authorization"] = f"Bearer {key}"
        if beta is not None:
            h["anthropic-beta"] = beta
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            payload = e.read()
            try:
                return e.code, json.loads(payload)
            except ValueError:
                return e.code, payload.decode(errors="replace")

    def control(self, method: str, path: str, body: Any = None) -> Any:
        status, data = self.call(method, "/_standin/" + path, key=None, beta=None, body=body)
        assert status == 200, (status, data)
        return data

    def enqueue(self, script: dict[str, Any], count: int = 1) -> list[dict[str, str]]:
        return self.control("POST", "enqueue", {"session": script, "count": count})["items"]

    def poll(self, key: str = KEY, **params: Any) -> tuple[int, Any]:
        q = "&".join(f"{k}={v}" for k, v in params.items())
        return self.call("GET", f"/v1/environments/{ENV}/work/poll" + (f"?{q}" if q else ""), key=key,
                         headers={"Anthropic-Worker-ID": "pytest-worker"})


@pytest.fixture()
def standin() -> Iterator[StandIn]:
    s = StandIn()
    try:
        yield s
    finally:
        s.close()


# --------------------------------------------------------------------------- the official worker


@pytest.fixture(scope="module")
def official(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Run the SDK's EnvironmentWorker over script.json and script-extras.json; return the record."""
    s = StandIn()
    out = tmp_path_factory.mktemp("official") / "record.json"
    try:
        cmd = [PY, os.path.join(HERE, "run_official.py"), "--standin", s.url, "--key", KEY,
               "--script", os.path.join(HERE, "script.json"), "--script", os.path.join(HERE, "script-extras.json"),
               "--timeout", "120", "--out", str(out)]
        subprocess.run(cmd, check=True, timeout=180)
        with open(out) as f:
            yield json.load(f)
    finally:
        s.close()


def session_of(record: dict[str, Any], prefix: str) -> str:
    ids = [sid for sid in record["sessions"] if sid.startswith(f"sesn_{prefix}_")]
    assert len(ids) == 1, ids
    return ids[0]


def results_by_step(record: dict[str, Any], sid: str) -> dict[str, dict[str, Any]]:
    return {r["step"]: r for r in record["results"][sid]}


def text_of(result: dict[str, Any]) -> str:
    return "\n".join(b.get("text", "") for b in result["content"] or [] if b.get("type") == "text")


@pytest.mark.parametrize("script_name,prefix", [("script.json", "script"), ("script-extras.json", "extras")])
def test_expect_blocks(official: dict[str, Any], script_name: str, prefix: str) -> None:
    script = load(script_name)
    sid = session_of(official, prefix)
    got = results_by_step(official, sid)
    for step in script["steps"]:
        exp = step.get("expect")
        if not exp:
            continue
        res = got.get(step["id"])
        if exp.get("no_result"):
            assert res is None, (step["id"], res)
            continue
        assert res is not None, f"{step['id']}: no result posted"
        if "is_error" in exp:
            assert bool(res["is_error"]) == exp["is_error"], (step["id"], res)
        text = text_of(res)
        for needle in exp.get("contains", []):
            assert needle in text, (step["id"], needle, text[:300])
        if "max_text_chars" in exp:
            assert len(text) <= exp["max_text_chars"], (step["id"], len(text))


def test_each_allowed_call_answered_exactly_once(official: dict[str, Any]) -> None:
    script = load("script.json")
    sid = session_of(official, "script")
    got = results_by_step(official, sid)
    for step in script["steps"]:
        if step.get("type", "tool_use") != "tool_use":
            continue
        allowed = step["evaluated_permission"] == "allow" or (
            step["evaluated_permission"] == "ask" and step["confirm"]["result"] == "allow"
        )
        if allowed:
            assert step["id"] in got, step["id"]
            assert got[step["id"]]["count"] == 1, got[step["id"]]
            assert got[step["id"]]["type"] == "user.tool_result"
    assert all(r["count"] == 1 for r in official["results"][sid])


def test_denied_calls_never_ran(official: dict[str, Any]) -> None:
    sid = session_of(official, "script")
    got = results_by_step(official, sid)
    assert "s08-ask-denied" not in got
    assert "s09-server-denied" not in got
    # The step after them checks on disk that their side effects are absent.
    assert "denied-calls-never-ran" in text_of(got["s10-denied-never-ran"])
    assert not got["s10-denied-never-ran"]["is_error"]


def test_large_output_truncated_and_timeout_is_error(official: dict[str, Any]) -> None:
    got = results_by_step(official, session_of(official, "script"))
    big = text_of(got["s13-bash-200k"])
    assert 1000 < len(big) < 200 * 1024
    assert got["s11-bash-timeout"]["is_error"] is True
    assert "after-timeout" in text_of(got["s12-bash-after-timeout"])


def test_custom_tool_left_pending(official: dict[str, Any]) -> None:
    sid = session_of(official, "script")
    assert "s16-custom-unowned" not in results_by_step(official, sid)
    assert official["sessions"][sid]["unanswered"] == ["s16-custom-unowned"]


def test_work_items_stopped_and_sessions_done(official: dict[str, Any]) -> None:
    assert len(official["work"]) == 2
    for wid, w in official["work"].items():
        assert w["state"] == "stopped", (wid, w)
        assert w["stop_force"] is True
        assert w["heartbeats"] >= 1
        assert w["acked_by"] == "official-worker-0"
    for sid, s in official["sessions"].items():
        assert s["done"] and s["steps_settled"] == s["steps_total"], (sid, s)


def test_worker_headers_and_credentials(official: dict[str, Any]) -> None:
    reqs = official["requests"]
    # A long poll may still be open on the server when the record is read (the worker was just cancelled).
    assert reqs and all(r["status"] is not None or r["path"].endswith("/work/poll") for r in reqs)
    work_ids = set(official["work"])
    for r in reqs:
        path = r["path"]
        if path.startswith("/v1/environments/") or path.startswith("/v1/sessions/"):
            assert BETA in (r["beta"] or ""), r
        if path.startswith("/v1/memory_stores/"):
            assert "agent-memory-2026-07-22" in (r["beta"] or ""), r
            assert r["credential"].startswith("sessions_token:"), r
        if path.endswith("/work/poll"):
            assert r["worker_id"] == "official-worker-0", r
            assert r["credential"] == "env_key:0", r
        if path.endswith("/ack"):
            assert r["credential"] == "env_key:0", r
        if path.endswith("/heartbeat") or path.endswith("/stop"):
            # The poll carried a secret, so the worker uses its sessions token for these.
            wid = path.split("/")[-2]
            assert r["credential"] == f"sessions_token:{wid}", r
            assert wid in work_ids
    paths = {(r["method"], r["path"].split("/")[-1]) for r in reqs}
    for want in [("GET", "poll"), ("POST", "ack"), ("POST", "heartbeat"), ("POST", "stop"), ("GET", "stream"),
                 ("GET", "events"), ("POST", "events")]:
        assert want in paths, want
    bad = [r for r in reqs if r["status"] is not None and r["status"] >= 400 and r["status"] != 499]
    assert not bad, bad


def test_skills_placed_and_memory_synced(official: dict[str, Any]) -> None:
    got = results_by_step(official, session_of(official, "extras"))
    assert "hello skill body" in text_of(got["x1-read-skill"])
    assert "colour: blue" in text_of(got["x2-read-memory"])
    synced = {(m["op"], m["path"]): m for m in official["memory_synced"]}
    assert synced[("create", "/learned.md")]["content"] == "the user likes tea\n"
    assert synced[("update", "/preferences.md")]["content"] == "colour: green\n"
    assert official["memory_stores"]["memstore_standin_notes"] == {
        "/learned.md": "the user likes tea\n",
        "/preferences.md": "colour: green\n",
    }


# --------------------------------------------------------------------------- the stand-in's own protocol


def test_auth_errors(standin: StandIn) -> None:
    for key in ("wrong-key", None):
        status, body = standin.poll(key=key) if key else standin.call("GET", f"/v1/environments/{ENV}/work/poll", key=None)
        assert status == 401
        assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
        assert isinstance(body["error"]["message"], str)
    status, body = standin.call("GET", f"/v1/environments/{ENV}/work/poll", beta=None)
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    status, body = standin.call("GET", f"/v1/environments/{ENV}/work/poll", beta="some-other-beta")
    assert status == 400


def test_key_rotation(standin: StandIn) -> None:
    assert standin.poll(block_ms=1)[0] == 200
    standin.control("PUT", "keys", {"keys": ["envkey-rotated"]})
    status, body = standin.poll(key="envkey-rotated", block_ms=1)
    assert status == 200 and body is None
    assert standin.poll(block_ms=1)[0] == 401
    rec = standin.control("GET", "record")
    assert [r["credential"] for r in rec["requests"]] == ["env_key:0", "env_key:0", None]


def claim(standin: StandIn, script: str = "script-bench.json") -> tuple[dict[str, Any], str]:
    items = standin.enqueue(load(script))
    status, work = standin.poll(block_ms=500)
    assert status == 200 and work["id"] == items[0]["work_id"]
    assert work["state"] == "queued" and work["data"] == {"type": "session", "id": items[0]["session_id"]}
    secret = json.loads(base64.urlsafe_b64decode(work["secret"] + "=" * (-len(work["secret"]) % 4)))
    status, acked = standin.call("POST", f"/v1/environments/{ENV}/work/{work['id']}/ack")
    assert status == 200 and acked["state"] == "starting" and acked["secret"] is None
    return work, secret["sessions_token"]


def test_stale_heartbeat_412(standin: StandIn) -> None:
    work, token = claim(standin)
    hb = f"/v1/environments/{ENV}/work/{work['id']}/heartbeat"
    status, body = standin.call("POST", hb + "?expected_last_heartbeat=NO_HEARTBEAT&desired_ttl_seconds=30", key=token)
    assert status == 200, body
    assert body["type"] == "work_heartbeat" and body["state"] == "active" and body["lease_extended"] is True
    assert body["ttl_seconds"] == 30
    last = body["last_heartbeat"]
    status, body = standin.call("POST", hb + "?expected_last_heartbeat=NO_HEARTBEAT", key=token)
    assert status == 412
    details = body["error"]["details"]
    assert details["error_code"] == "heartbeat_precondition_failed"
    assert details["current_state"]["state"] == "active"
    assert details["current_state"]["last_heartbeat"] == last
    assert details["current_state"]["lease_extended"] is False
    # Once the item is stopping / stopped, the comparison is skipped.
    status, _ = standin.call("POST", f"/v1/environments/{ENV}/work/{work['id']}/stop", body={"force": False})
    assert status == 200
    status, body = standin.call("POST", hb + "?expected_last_heartbeat=stale", key=token)
    assert status == 200 and body["state"] == "stopping" and body["lease_extended"] is False


def test_second_stop_409(standin: StandIn) -> None:
    work, token = claim(standin)
    stop = f"/v1/environments/{ENV}/work/{work['id']}/stop"
    status, body = standin.call("POST", stop, key=token, body={"force": True})
    assert status == 200 and body["state"] == "stopped" and body["stopped_at"]
    status, body = standin.call("POST", stop, key=token, body={"force": True})
    assert status == 409 and body["type"] == "error"
    # Another item's sessions token does not cover this one.
    other, _ = claim(standin)
    status, _ = standin.call("POST", f"/v1/environments/{ENV}/work/{other['id']}/stop", key=token, body={"force": True})
    assert status == 401


def test_poll_faults_in_order(standin: StandIn) -> None:
    standin.control("POST", "faults", {"poll": [503, 429, 500]})
    assert [standin.poll(block_ms=1)[0] for _ in range(4)] == [503, 429, 500, 200]


def test_body_limit_413(standin: StandIn) -> None:
    work, token = claim(standin)
    sid = work["data"]["id"]
    status, body = standin.call("POST", f"/v1/sessions/{sid}/events", key=token, raw=b"x" * (33 * 1024 * 1024))
    assert status == 413, body


def test_lease_expiry_requeues(tmp_path: Any) -> None:
    s = StandIn("--lease-ttl", "1")
    try:
        work, token = claim(s)
        time.sleep(2.0)
        status, body = s.call("GET", f"/v1/environments/{ENV}/work/{work['id']}")
        assert status == 200 and body["state"] == "queued"
        status, body = s.call(
            "POST", f"/v1/environments/{ENV}/work/{work['id']}/heartbeat?expected_last_heartbeat=NO_HEARTBEAT", key=token
        )
        assert status == 409
        status, again = s.poll(block_ms=100)
        assert status == 200 and again["id"] == work["id"]
    finally:
        s.close()


def test_sdk_reads_empty_poll_stats_and_event_pages(standin: StandIn) -> None:
    from anthropic import Anthropic

    client = Anthropic(base_url=standin.url, auth_token=KEY, api_key=None, max_retries=0, timeout=10)
    assert client.beta.environments.work.poll(ENV, block_ms=5) is None
    work, token = claim(standin, "script.json")
    stats = client.beta.environments.work.stats(ENV)
    assert stats.depth == 0 and stats.pending == 0 and stats.oldest_queued_at is None
    sid = work["data"]["id"]
    sess = Anthropic(base_url=standin.url, auth_token=token, api_key=None, max_retries=0, timeout=10)
    session = sess.beta.sessions.retrieve(sid)
    assert session.agent.tools[0].type == "agent_toolset_20260401"
    # The script's first step waits for its result: post it, let a few events accumulate.
    deadline = time.monotonic() + 10
    first = None
    while first is None and time.monotonic() < deadline:
        first = next((e for e in sess.beta.sessions.events.list(sid) if e.type == "agent.tool_use"), None)
        time.sleep(0.05)
    assert first is not None
    sent = sess.beta.sessions.events.send(
        sid, events=[{"type": "user.tool_result", "tool_use_id": first.id, "content": [{"type": "text", "text": "ok"}]}]
    )
    assert sent.data and sent.data[0].type == "user.tool_result" and sent.data[0].id
    time.sleep(0.3)
    all_events = list(sess.beta.sessions.events.list(sid, limit=1000))
    paged = list(sess.beta.sessions.events.list(sid, limit=2))
    assert [e.id for e in paged] == [e.id for e in all_events] and len(all_events) >= 5
    desc = list(sess.beta.sessions.events.list(sid, limit=3, order="desc"))
    assert [e.id for e in desc] == [e.id for e in reversed(all_events)]
    rec = standin.control("GET", "record")
    assert rec["results"][sid][0]["tool_use_id"] == first.id
    # A result naming no tool call of the session is refused.
    status, _ = standin.call("POST", f"/v1/sessions/{sid}/events", key=token,
                             body={"events": [{"type": "user.tool_result", "tool_use_id": "sevt_nope"}]})
    assert status == 400
