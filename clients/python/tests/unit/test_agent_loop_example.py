"""examples/agent_loop.py's scripted run against a local stand-in gateway
whose tools work on an in-memory file tree (the live test runs it against
the real one)."""

import base64
import fnmatch
import importlib.util
import json
import os
import re

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
EXAMPLE = os.path.join(ROOT, "examples", "agent_loop.py")
SCRIPT = os.path.join(ROOT, "examples", "agent_loop.scripted.json")


def load_example():
    spec = importlib.util.spec_from_file_location("agent_loop_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class StandIn:
    """Tools over a dict of files; bash is always_ask and only counts lines and echoes."""

    def __init__(self):
        self.files = {}
        self.approvals = {}

    def answer(self, h):
        who = h.headers.get("Authorization")
        if h.path.endswith("/tools"):
            return h.json(200, {"tools": [{"name": n, "description": n, "input_schema": {"type": "object"},
                                           "permission_policy": "always_ask" if n == "bash" else "always_allow"}
                                          for n in ("bash", "read", "write", "edit", "glob", "grep")]})
        body = json.loads(h.body)
        if h.path.endswith("/approvals"):
            if who != "Bearer approver":
                return h.json(403, {"error": {"code": "forbidden", "message": "may not approve"}})
            self.approvals["ap-" + body["id"]] = (body["name"], body["input"], body["id"])
            return h.json(200, {"approval": "ap-" + body["id"], "expires_at": "2030-01-01T00:00:00Z"})
        name, args, call_id = body["name"], body["input"], body["id"]
        if name == "bash":
            if self.approvals.pop(body.get("approval"), None) != (name, args, call_id):
                return h.json(403, {"error": {"code": "approval_required", "message": "bash is always_ask"}})
            path = re.search(r"< ([^\s;]+)", args["command"]).group(1)
            out = f"{self.files[path].count(chr(10))}\nstep 1\nstep 2\n".encode()
            h.start_chunked()
            for i, line in enumerate(out.splitlines(keepends=True)):
                offset = len(b"".join(out.splitlines(keepends=True)[:i]))
                h.event("stdout", {"offset": offset, "data": base64.b64encode(line).decode()})
            h.event("result", {"id": call_id, "content": out.decode(), "is_error": False})
            return h.end_chunked()
        content, is_error = self.tool(name, args)
        h.json(200, {"id": call_id, "content": content, "is_error": is_error})

    def tool(self, name, a):
        f = self.files
        if name == "write":
            f[a["file_path"]] = a["content"]
            return f"wrote {len(a['content'])} bytes to {a['file_path']}", False
        if name == "read":
            return (f[a["file_path"]], False) if a["file_path"] in f else ("no such file", True)
        if name == "edit":
            f[a["file_path"]] = f[a["file_path"]].replace(a["old_string"], a["new_string"])
            return "edited", False
        if name == "glob":
            return "\n".join(p for p in f if fnmatch.fnmatch(p, a["pattern"])) or "no matches", False
        if name == "grep":
            return "\n".join(f"{p}:{i}:{line}" for p, text in f.items() for i, line in
                             enumerate(text.splitlines(), 1) if re.search(a["pattern"], line)), False
        return "unknown tool", True


@pytest.fixture
def env(server, monkeypatch):
    stand_in = StandIn()
    server.answer = stand_in.answer
    for k, v in {"AGENTPLANE_GATEWAY_URL": server.url, "AGENTPLANE_CALLER_TOKEN": "caller",
                 "AGENTPLANE_APPROVER_TOKEN": "approver", "AGENTPLANE_SESSION": "demo"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AGENTPLANE_GATEWAY_CA", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    return stand_in


def test_scripted_run_with_approvals(env, capsys):
    assert load_example().main(["--scripted", SCRIPT, "--approve"]) == 0
    out = capsys.readouterr().out
    assert "model: scripted (ANTHROPIC_API_KEY is unset)" in out
    assert "script mismatch" not in out
    assert "approved bash" in out and "  | step 2" in out and "tool_result bash ok" in out
    assert "done after 5 model turn(s)" in out
    assert env.files == {"agent-loop-demo/notes.md": "# Notes\n\nTODO: test the sandbox\n"}


def test_scripted_run_without_approvals_tells_the_model(env, capsys):
    assert load_example().main(["--scripted", SCRIPT]) == 0
    out = capsys.readouterr().out
    assert "tool_result bash error: Not run: bash is always_ask" in out
    assert "approved bash" not in out


def test_a_script_whose_expectations_fail_exits_1(env, capsys, tmp_path):
    script = json.load(open(SCRIPT))
    script["turns"][1]["expect"][0]["contains"] = "something else"
    (tmp_path / "s.json").write_text(json.dumps(script))
    assert load_example().main(["--scripted", str(tmp_path / "s.json")]) == 1
    assert "script mismatch: result #1 lacks 'something else'" in capsys.readouterr().out


def test_without_a_model_or_a_script_it_says_what_to_set(env, capsys):
    with pytest.raises(SystemExit) as e:
        load_example().main([])
    assert e.value.code == 2
    assert "ANTHROPIC_API_KEY" in capsys.readouterr().err
