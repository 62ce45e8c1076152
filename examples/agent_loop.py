#!/usr/bin/env python3
"""An agent loop: a Claude model decides, an agentplane session's sandbox
runs its tool calls through the gateway.

The tools handed to the model are the session's own (`anthropic_tools` of
what the gateway lists); every tool_use block the model sends is run in the
sandbox and answered with a tool_result. A tool whose policy is always_ask
is run only with `--approve` and an approver's token
(AGENTPLANE_APPROVER_TOKEN): the approval is asked for, then the call made
with it. Without them the model is told, in an is_error tool_result, that
the call needs an approval.

With ANTHROPIC_API_KEY set, the model is Claude through the `anthropic`
package (`pip install anthropic`). Without it, `--scripted FILE` drives the
same loop with a scripted model that replays the tool_use blocks written in
FILE (see agent_loop.scripted.json) and says so; no model is asked.

    export AGENTPLANE_GATEWAY_URL=https://... AGENTPLANE_GATEWAY_CA=ca.pem \\
           AGENTPLANE_CALLER_TOKEN=... AGENTPLANE_NAMESPACE=default
    python3 examples/agent_loop.py --session demo "Count the lines of /etc/os-release"
    python3 examples/agent_loop.py --session demo --scripted examples/agent_loop.scripted.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "clients", "python", "src"))

from agentplane import (ApprovalRequired, Chunk, Gateway, GatewayError,  # noqa: E402
                        anthropic_tools)

SYSTEM = ("You work in a Linux sandbox through the tools you are given. Relative paths are in the "
          "session's working directory. Be brief; say what you did when you are done.")


def shown(text: str, limit: int = 300) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[:limit] + "..."


class ScriptedModel:
    """Stands in for the Messages API: each turn replays the next turn of
    the script. A turn may state what the previous turn's tool results must
    hold (`expect`, one entry per result, null to not check one); a result
    that does not is a mismatch, counted and reported."""

    def __init__(self, path: str):
        with open(path, encoding="utf-8") as f:
            self.script = json.load(f)
        self.path = path
        self.turns = list(self.script["turns"])
        self.nonce = uuid.uuid4().hex[:8]
        self.count = 0
        self.mismatches: list[str] = []

    def create(self, messages: list[dict], **_ignored) -> dict:
        turn = self.turns.pop(0) if self.turns else {"text": "(the script has no more turns)"}
        self._check(turn.get("expect") or [], messages[-1])
        content = []
        if turn.get("text"):
            content.append({"type": "text", "text": turn["text"]})
        for use in turn.get("tool_use") or []:
            self.count += 1
            # Fresh ids every run: a call id names one call in the sandbox.
            content.append({"type": "tool_use", "id": f"toolu_scripted_{self.nonce}_{self.count}",
                            "name": use["name"], "input": use.get("input", {})})
        stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
        return {"content": content, "stop_reason": stop}

    def _check(self, expects: list, last: dict) -> None:
        results = [b for b in last.get("content") or [] if isinstance(b, dict) and b.get("type") == "tool_result"]
        for i, want in enumerate(expects):
            if want is None:
                continue
            if i >= len(results):
                self.mismatches.append(f"expected a tool result #{i + 1}, got {len(results)}")
                continue
            got = results[i]
            if "is_error" in want and bool(got.get("is_error")) != want["is_error"]:
                self.mismatches.append(f"result #{i + 1}: is_error {got.get('is_error')}, expected {want['is_error']}")
            if want.get("contains") and want["contains"] not in got["content"]:
                self.mismatches.append(f"result #{i + 1} lacks {want['contains']!r}: {shown(got['content'])}")


class ClaudeModel:
    """The Messages API through the `anthropic` package."""

    def __init__(self, model: str):
        import anthropic  # only here: the scripted run needs no SDK

        self.client = anthropic.Anthropic()
        self.model = model

    def create(self, messages: list[dict], tools: list[dict]) -> dict:
        resp = self.client.messages.create(model=self.model, max_tokens=4096, system=SYSTEM,
                                           messages=messages, tools=tools)
        content = []
        for b in resp.content:
            if b.type == "text":
                content.append({"type": "text", "text": b.text})
            elif b.type == "tool_use":
                content.append({"type": "tool_use", "id": b.id, "name": b.name, "input": b.input})
        return {"content": content, "stop_reason": resp.stop_reason}


class ToolRunner:
    """Runs tool_use blocks in the session; always a tool_result back. A
    call the gateway refuses for want of an approval is approved (when an
    approver is given) and made again with the approval."""

    def __init__(self, session, approver):
        self.session = session
        self.approver = approver

    def run(self, block: dict) -> dict:
        name, args, call_id = block["name"], block["input"], block["id"]
        print(f"tool_use {name} {shown(json.dumps(args), 200)}")
        try:
            try:
                result = self._call(name, args, call_id, None)
            except ApprovalRequired:
                if self.approver is None:
                    raise
                # The approval is for this call id and input only.
                approval = self.approver.approve(name, args, id=call_id).token
                print(f"  approved {name} (as the approver)")
                result = self._call(name, args, call_id, approval)
            content, is_error = result.content, result.is_error
        except ApprovalRequired as e:
            content = (f"Not run: {e.message}. A person must approve this call (run the agent with --approve "
                       "and AGENTPLANE_APPROVER_TOKEN); try another way or stop.")
            is_error = True
        except GatewayError as e:
            content, is_error = f"Not run: the gateway refused the call: {e}", True
        print(f"tool_result {name} {'error' if is_error else 'ok'}: {shown(content)}")
        return {"type": "tool_result", "tool_use_id": call_id, "content": content, "is_error": is_error}

    def _call(self, name, args, call_id, approval):
        if name != "bash":
            return self.session.call(name, args, id=call_id, approval=approval)
        # bash's output is shown while it runs, line by line.
        stream = self.session.stream(name, args, id=call_id, approval=approval)
        pending = b""
        for item in stream:
            if isinstance(item, Chunk):
                *lines, pending = (pending + item.data).split(b"\n")
                for line in lines:
                    print(f"  | {line.decode('utf-8', 'replace')}")
        if pending:
            print(f"  | {pending.decode('utf-8', 'replace')}")
        return stream.result


def agent_loop(model, runner: ToolRunner, tools: list[dict], prompt: str, max_turns: int) -> int:
    """Model turn, tool results, model turn, ... until the model stops; the turns taken."""
    print(f"user: {prompt}")
    messages = [{"role": "user", "content": prompt}]
    for turn in range(1, max_turns + 1):
        reply = model.create(messages=messages, tools=tools)
        messages.append({"role": "assistant", "content": reply["content"]})
        for b in reply["content"]:
            if b["type"] == "text":
                print(f"assistant: {b['text']}")
        uses = [b for b in reply["content"] if b["type"] == "tool_use"]
        if reply["stop_reason"] != "tool_use" or not uses:
            return turn
        messages.append({"role": "user", "content": [runner.run(b) for b in uses]})
    print(f"stopped after {max_turns} turns")
    return max_turns


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("prompt", nargs="?", help="the task (default: the script's prompt)")
    p.add_argument("--session", default=os.environ.get("AGENTPLANE_SESSION"), help="AgentSession name")
    p.add_argument("--namespace", default=os.environ.get("AGENTPLANE_NAMESPACE", "default"))
    p.add_argument("--scripted", metavar="FILE", help="replay the tool_use blocks of FILE instead of a model")
    p.add_argument("--approve", action="store_true",
                   help="approve always_ask calls with AGENTPLANE_APPROVER_TOKEN")
    p.add_argument("--model", default=os.environ.get("ANTHROPIC_MODEL", "claude-sonnet-4-5"))
    p.add_argument("--max-turns", type=int, default=20)
    a = p.parse_args(argv)

    url, token = os.environ.get("AGENTPLANE_GATEWAY_URL"), os.environ.get("AGENTPLANE_CALLER_TOKEN")
    if not (url and token and a.session):
        p.error("set AGENTPLANE_GATEWAY_URL, AGENTPLANE_CALLER_TOKEN (and AGENTPLANE_GATEWAY_CA) "
                "and name the session (--session or AGENTPLANE_SESSION)")
    ca = os.environ.get("AGENTPLANE_GATEWAY_CA") or None
    session = Gateway(url, token, ca_file=ca, namespace=a.namespace).session(a.session)
    approver = None
    if a.approve:
        approver_token = os.environ.get("AGENTPLANE_APPROVER_TOKEN")
        if not approver_token:
            p.error("--approve needs AGENTPLANE_APPROVER_TOKEN")
        approver = Gateway(url, approver_token, ca_file=ca, namespace=a.namespace).session(a.session)

    if a.scripted:
        model = ScriptedModel(a.scripted)
        why = "--scripted given" if os.environ.get("ANTHROPIC_API_KEY") else "ANTHROPIC_API_KEY is unset"
        print(f"model: scripted ({why}): replaying the tool_use blocks of {a.scripted}; no model is asked")
        prompt = a.prompt or model.script.get("prompt", "")
    elif os.environ.get("ANTHROPIC_API_KEY"):
        model = ClaudeModel(a.model)
        print(f"model: {a.model}")
        prompt = a.prompt
        if not prompt:
            p.error("give the task as an argument")
    else:
        p.error("set ANTHROPIC_API_KEY for a real model, or give --scripted FILE")

    listed = session.tools()
    tools = anthropic_tools(listed)
    policies = {t.name: t.permission_policy for t in listed}
    print(f"session {a.namespace}/{a.session}: tools " +
          ", ".join(f"{n} ({policies[n]})" for n in sorted(policies)))
    turns = agent_loop(model, ToolRunner(session, approver), tools, prompt, a.max_turns)
    print(f"done after {turns} model turn(s)")
    if isinstance(model, ScriptedModel) and model.mismatches:
        for m in model.mismatches:
            print(f"script mismatch: {m}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
