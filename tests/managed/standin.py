#!/usr/bin/env python3
"""A stand-in for the Claude Managed Agents API's side of a `self_hosted` environment.

It serves the environment work queue, the session endpoints a worker uses
(retrieve, events list / stream / send), the skill-version endpoints and the
memory-store endpoints the SDK's `EnvironmentWorker` calls, plus a small
control API under `/_standin/` for tests.  Every response body is built from
the anthropic SDK's own published pydantic types (`model_validate(...)` then
`model_dump(mode="json")`), and request bodies are checked against the SDK's
params TypedDicts where one exists.  See README.md next to this file for what
is covered and which behaviour is assumed where the SDK is silent.

Written against anthropic 2.10.0 (read, not copied).  Run:

    python standin.py --listen 127.0.0.1:0 --key envkey-1
"""

from __future__ import annotations

import io
import os
import sys
import json
import time
import uuid
import base64
import asyncio
import hashlib
import secrets
import zipfile
import argparse
import itertools
from typing import Any, Optional
from collections import deque
from datetime import datetime, timezone

from aiohttp import web

from anthropic.types.beta import BetaManagedAgentsSession
from anthropic.types.beta.skills import BetaSkillVersion
from anthropic.types.beta.environments import (
    BetaWorkLeaseState,
    BetaSelfHostedWork,
    BetaSelfHostedWorkQueueStats,
    BetaSelfHostedWorkListResponse,
    BetaSelfHostedWorkHeartbeatResponse,
    BetaHeartbeatPreconditionFailedErrorDetails,
)
from anthropic.types.beta.sessions import (
    BetaManagedAgentsSendSessionEvents,
    BetaManagedAgentsAgentToolUseEvent,
    BetaManagedAgentsSessionStatusIdleEvent,
    BetaManagedAgentsAgentCustomToolUseEvent,
    BetaManagedAgentsSessionStatusRunningEvent,
    BetaManagedAgentsUserToolConfirmationEvent,
    BetaManagedAgentsUserCustomToolResultEvent,
    BetaManagedAgentsSessionStatusTerminatedEvent,
)
from anthropic.types.beta.beta_managed_agents_user_tool_result_event import BetaManagedAgentsUserToolResultEvent
from anthropic.types.beta.sessions.beta_managed_agents_user_tool_result_event_params import (
    BetaManagedAgentsUserToolResultEventParams,
)
from anthropic.types.beta.sessions.beta_managed_agents_user_custom_tool_result_event_params import (
    BetaManagedAgentsUserCustomToolResultEventParams,
)
from anthropic.types.beta.sessions.beta_managed_agents_user_tool_confirmation_event_params import (
    BetaManagedAgentsUserToolConfirmationEventParams,
)
from anthropic.types.beta.memory_stores import (
    BetaManagedAgentsMemory,
    BetaManagedAgentsDeletedMemory,
)
from anthropic.types.beta.memory_stores.memory_create_params import MemoryCreateParams
from anthropic.types.shared import ErrorResponse

MAX_BODY = 32 * 1024 * 1024
MANAGED_AGENTS_BETA = "managed-agents-2026-04-01"
MEMORY_BETA = "agent-memory-2026-07-22"
NO_HEARTBEAT = "NO_HEARTBEAT"
# The SDK's poll comment says the API caps block_ms at 999.
POLL_BLOCK_CAP_MS = 999
# `reclaim_older_than_ms` default named in `Work.poll`'s docstring.
RECLAIM_DEFAULT_MS = 5000
# `workers_polling` counts workers that polled within this window (docstring: "last 30 s").
WORKERS_POLLING_WINDOW_S = 30.0
REQUEST_LOG_LIMIT = 10_000
SSE_KEEPALIVE_S = 10.0
EVENTS_LIST_MAX_LIMIT = 1000
EVENTS_LIST_DEFAULT_LIMIT = 20
# An ask-gated step gets its scripted human verdict this long after the tool_use.
CONFIRM_DELAY_S = 0.2
CUSTOM_SETTLE_DEFAULT_S = 5.0
# How long an allowed tool_use waits for its result before the stand-in records it unanswered and moves on.
TOOL_SETTLE_DEFAULT_S = 300.0
RESULT_REQUIRED = {
    "user.tool_result": BetaManagedAgentsUserToolResultEventParams.__required_keys__,
    "user.custom_tool_result": BetaManagedAgentsUserCustomToolResultEventParams.__required_keys__,
    "user.tool_confirmation": BetaManagedAgentsUserToolConfirmationEventParams.__required_keys__,
}


# --------------------------------------------------------------------------- helpers


_last_ts = [0.0]


def now_dt() -> datetime:
    """UTC now, strictly increasing (so heartbeat values and event order never tie)."""
    t = time.time()
    if t <= _last_ts[0]:
        t = _last_ts[0] + 1e-6
    _last_ts[0] = t
    return datetime.fromtimestamp(t, tz=timezone.utc)


def rfc3339(dt: datetime) -> str:
    return dt.isoformat(timespec="microseconds").replace("+00:00", "Z")


def now_str() -> str:
    return rfc3339(now_dt())


def gen_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def dump(model_cls: Any, data: dict[str, Any]) -> dict[str, Any]:
    """Validate `data` with the SDK's published model and return its JSON form."""
    return model_cls.model_validate(data).model_dump(mode="json")


def error_body(err_type: str, message: str, details: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    err: dict[str, Any] = {"type": err_type, "message": message}
    if details is not None:
        err["details"] = details
    body = {"type": "error", "error": err, "request_id": gen_id("req")}
    if details is None and err_type in {
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "rate_limit_error",
        "api_error",
        "overloaded_error",
    }:
        # Shapes the SDK models as `ErrorResponse`: check them against it.
        ErrorResponse.model_validate(body)
    return body


class ApiError(Exception):
    def __init__(self, status: int, err_type: str, message: str, details: Optional[dict[str, Any]] = None):
        super().__init__(message)
        self.status = status
        self.body = error_body(err_type, message, details)


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        status=status, body=json.dumps(data).encode(), content_type="application/json", headers={"request-id": gen_id("req")}
    )


# --------------------------------------------------------------------------- state


class Work:
    def __init__(self, work_id: str, env_id: str, session_id: str) -> None:
        self.id = work_id
        self.env_id = env_id
        self.session_id = session_id
        self.state = "queued"
        self.created_at = now_str()
        self.created_mono = time.monotonic()
        self.acknowledged_at: Optional[str] = None
        self.started_at: Optional[str] = None
        self.latest_heartbeat_at: Optional[str] = None
        self.stop_requested_at: Optional[str] = None
        self.stopped_at: Optional[str] = None
        self.last_heartbeat: Optional[str] = None
        self.lease_deadline: Optional[float] = None
        self.polled_at: Optional[float] = None  # monotonic; set while polled but not acked ("pending")
        self.polled_by: Optional[str] = None
        self.acked_by: Optional[str] = None
        self.metadata: dict[str, str] = {}
        self.sessions_token = "sesstok_" + secrets.token_urlsafe(24)
        self.heartbeats = 0
        self.polls = 0
        self.requeues = 0
        self.stops = 0
        self.stop_force: Optional[bool] = None

    def secret(self) -> str:
        # The SDK reads the secret as url-safe base64 JSON and takes `sessions_token`; its
        # docstring says the real payload also bundles ingress / source tokens the worker
        # does not use, so the stand-in puts placeholders for those too.
        payload = {
            "sessions_token": self.sessions_token,
            "ingress_token": "ingtok_" + secrets.token_urlsafe(12),
            "source_token": "srctok_" + secrets.token_urlsafe(12),
        }
        return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")

    def model(self, *, with_secret: bool = False) -> dict[str, Any]:
        return dump(
            BetaSelfHostedWork,
            {
                "id": self.id,
                "type": "work",
                "environment_id": self.env_id,
                "state": self.state,
                "data": {"type": "session", "id": self.session_id},
                "metadata": self.metadata,
                "secret": self.secret() if with_secret else None,
                "created_at": self.created_at,
                "acknowledged_at": self.acknowledged_at,
                "started_at": self.started_at,
                "latest_heartbeat_at": self.latest_heartbeat_at,
                "stop_requested_at": self.stop_requested_at,
                "stopped_at": self.stopped_at,
            },
        )

    def lease_state(self, ttl: int) -> dict[str, Any]:
        return dump(
            BetaWorkLeaseState,
            {"state": self.state, "last_heartbeat": self.last_heartbeat, "ttl_seconds": ttl, "lease_extended": False},
        )

    def record(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "state": self.state,
            "created_at": self.created_at,
            "acknowledged_at": self.acknowledged_at,
            "started_at": self.started_at,
            "latest_heartbeat_at": self.latest_heartbeat_at,
            "stop_requested_at": self.stop_requested_at,
            "stopped_at": self.stopped_at,
            "polled_by": self.polled_by,
            "acked_by": self.acked_by,
            "heartbeats": self.heartbeats,
            "polls": self.polls,
            "requeues": self.requeues,
            "stops": self.stops,
            "stop_force": self.stop_force,
        }


class Session:
    def __init__(self, session_id: str, env_id: str, script: dict[str, Any]) -> None:
        self.id = session_id
        self.env_id = env_id
        self.script = script
        self.steps: list[dict[str, Any]] = list(script.get("steps", []))
        self.status = "idle"
        self.created_at = now_str()
        self.enqueued_at = time.monotonic()
        self.first_result_at: Optional[float] = None
        self.done_at: Optional[float] = None
        self.done = False
        self.work_id: Optional[str] = None
        self.events: list[dict[str, Any]] = []
        self.subscribers: list[asyncio.Queue[Optional[dict[str, Any]]]] = []
        self.steps_settled = 0
        self.started = False
        self.unanswered: list[str] = []
        # tool_use event id -> step index
        self.tool_use_ids: dict[str, int] = {}
        # step index -> tool_use event id
        self.step_event_ids: dict[int, str] = {}
        # tool_use id -> result record (posting order kept by dict order)
        self.results: dict[str, dict[str, Any]] = {}
        # When each agent.tool_use was emitted (monotonic), for latency figures.
        self.emitted_at: dict[str, float] = {}
        self.answered: dict[str, asyncio.Event] = {}
        self.driver: Optional[asyncio.Task[None]] = None
        self.memory_store_ids = [m["memory_store_id"] for m in script.get("memory_stores", [])]

    def agent(self) -> dict[str, Any]:
        agent = self.script.get("agent", {})
        skills = [
            {"type": s.get("type", "custom"), "skill_id": s["skill_id"], "version": s.get("version", "latest")}
            for s in self.script.get("skills", [])
        ]
        return {
            "id": agent.get("id", "agent_standin"),
            "type": "agent",
            "name": agent.get("name", "stand-in agent"),
            "description": agent.get("description"),
            "system": agent.get("system"),
            "version": agent.get("version", 1),
            "model": agent.get("model", {"id": "claude-sonnet-4-5"}),
            "execution_identity": {"type": "service_account"},
            "mcp_servers": [],
            "skills": skills,
            "tools": [resolve_tool(t) for t in agent.get("tools", [])],
        }

    def model(self) -> dict[str, Any]:
        resources = []
        for m in self.script.get("memory_stores", []):
            res = {"type": "memory_store", "memory_store_id": m["memory_store_id"]}
            for k in ("name", "access", "description", "instructions", "mount_path"):
                if k in m:
                    res[k] = m[k]
            resources.append(res)
        now = now_str()
        return dump(
            BetaManagedAgentsSession,
            {
                "id": self.id,
                "type": "session",
                "agent": self.agent(),
                "environment_id": self.env_id,
                "status": self.status,
                "created_at": self.created_at,
                "updated_at": now,
                "metadata": {},
                "outcome_evaluations": [],
                "resources": resources,
                "stats": {},
                "usage": {},
                "vault_ids": [],
                "title": self.script.get("title"),
            },
        )

    def record(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "work_id": self.work_id,
            "steps_total": len(self.steps),
            "steps_settled": self.steps_settled,
            "enqueued_at": self.enqueued_at,
            "first_result_at": self.first_result_at,
            "done_at": self.done_at,
            "done": self.done,
            "unanswered": list(self.unanswered),
            "events": len(self.events),
        }


def resolve_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """An agent tool as Managed Agents takes it -> the resolved form a session carries.

    The agent's tools[] may leave out `enabled` and each config's `type`; the
    session object (`BetaManagedAgentsAgentToolset20260401`) has them resolved.
    """
    if tool.get("type") != "agent_toolset_20260401":
        return tool
    default = {"enabled": True, "permission_policy": {"type": "always_allow"}, **tool.get("default_config", {})}
    configs = []
    for c in tool.get("configs", []):
        configs.append(
            {
                "type": c["name"],
                "enabled": default["enabled"],
                "permission_policy": default["permission_policy"],
                **c,
            }
        )
    return {"type": tool["type"], "default_config": default, "configs": configs}


class State:
    def __init__(self, env_id: str, keys: list[str], lease_ttl: int, latency_ms: int) -> None:
        self.env_id = env_id
        self.keys = list(keys)
        self.lease_ttl = lease_ttl
        self.latency_s = latency_ms / 1000.0
        self.work: dict[str, Work] = {}
        self.sessions: dict[str, Session] = {}
        self.tokens: dict[str, str] = {}  # sessions_token -> work id
        self.workers: dict[str, float] = {}
        self.requests: deque[dict[str, Any]] = deque(maxlen=REQUEST_LOG_LIMIT)
        self.poll_faults: deque[int] = deque()
        self.queue_changed = asyncio.Condition()
        self.prefix_counters: dict[str, itertools.count[int]] = {}
        self.skills: dict[str, dict[str, Any]] = {}
        self.memory: dict[str, dict[str, dict[str, Any]]] = {}  # store id -> memory id -> memory
        self.memory_synced: list[dict[str, Any]] = []
        self.started = time.monotonic()

    # -- queue

    async def notify(self) -> None:
        async with self.queue_changed:
            self.queue_changed.notify_all()

    def take_work(self, reclaim_ms: int, worker_id: Optional[str]) -> Optional[Work]:
        now = time.monotonic()
        for w in self.work.values():
            if w.state != "queued":
                continue
            if w.polled_at is not None and (now - w.polled_at) * 1000.0 < reclaim_ms:
                continue  # pending: polled by someone, not yet acknowledged
            w.polled_at = now
            w.polled_by = worker_id
            w.polls += 1
            return w
        return None

    def expire_leases(self) -> None:
        # Stand-in assumption (the SDK does not say): a started item whose lease runs out
        # without a heartbeat goes back to `queued` with no heartbeat recorded, so the next
        # worker claims it with NO_HEARTBEAT and the old holder's next beat meets a 412.
        now = time.monotonic()
        changed = False
        for w in self.work.values():
            if w.lease_deadline is None or now < w.lease_deadline:
                continue
            if w.state in ("starting", "active"):
                w.state = "queued"
                w.last_heartbeat = None
                w.lease_deadline = None
                w.polled_at = None
                w.requeues += 1
                changed = True
            elif w.state == "stopping":
                w.state = "stopped"
                w.stopped_at = now_str()
                w.lease_deadline = None
        if changed:
            asyncio.get_running_loop().create_task(self.notify())


# --------------------------------------------------------------------------- session driver


class Driver:
    """Plays a session's script: one step at a time, each settled before the next."""

    def __init__(self, state: State, session: Session) -> None:
        self.state = state
        self.s = session

    def emit(self, model_cls: Any, data: dict[str, Any]) -> dict[str, Any]:
        data = {"id": gen_id("sevt"), "processed_at": now_str(), **data}
        ev = dump(model_cls, data)
        self.s.events.append(ev)
        for q in list(self.s.subscribers):
            q.put_nowait(ev)
        return ev

    async def run(self) -> None:
        try:
            await self._run()
        except Exception as e:  # a bad script: make it visible in the record and on stderr
            print(f"stand-in: session {self.s.id} driver failed: {e!r}", file=sys.stderr, flush=True)
            self.s.status = "terminated"
            self.s.unanswered.append(f"driver failed: {e!r}")
            raise

    async def _run(self) -> None:
        s = self.s
        s.status = "running"
        self.emit(BetaManagedAgentsSessionStatusRunningEvent, {"type": "session.status_running"})
        for idx, step in enumerate(s.steps):
            if idx > 0:
                s.status = "running"
                self.emit(BetaManagedAgentsSessionStatusRunningEvent, {"type": "session.status_running"})
            kind = step.get("type", "tool_use")
            if kind == "tool_use":
                await self.tool_use(idx, step)
            elif kind == "custom_tool_use":
                await self.custom_tool_use(idx, step)
            else:
                raise ValueError(f"unknown step type {kind!r}")
            s.steps_settled += 1
        if s.script.get("terminate"):
            s.status = "terminated"
            self.emit(BetaManagedAgentsSessionStatusTerminatedEvent, {"type": "session.status_terminated"})
        else:
            s.status = "idle"
            self.emit(
                BetaManagedAgentsSessionStatusIdleEvent,
                {"type": "session.status_idle", "stop_reason": {"type": "end_turn"}},
            )
        s.done = True
        s.done_at = time.monotonic()

    def idle_requires_action(self, event_id: str) -> None:
        self.s.status = "idle"
        self.emit(
            BetaManagedAgentsSessionStatusIdleEvent,
            {"type": "session.status_idle", "stop_reason": {"type": "requires_action", "event_ids": [event_id]}},
        )

    async def wait_answer(self, event_id: str, idx: int, step: dict[str, Any], default: float) -> None:
        ev = self.s.answered.setdefault(event_id, asyncio.Event())
        try:
            await asyncio.wait_for(ev.wait(), timeout=float(step.get("settle_timeout_s", default)))
        except asyncio.TimeoutError:
            self.s.unanswered.append(step.get("id", str(idx)))

    async def tool_use(self, idx: int, step: dict[str, Any]) -> None:
        permission = step.get("evaluated_permission", "allow")
        evaluation = step.get("evaluation")
        if evaluation is None:
            evaluation = {"allow": {"type": "always_allow"}, "ask": {"type": "always_ask"}}.get(
                permission, {"type": "auto", "evaluated_permission": {"type": "deny", "reason_code": "high_risk"}}
            )
        ev = self.emit(
            BetaManagedAgentsAgentToolUseEvent,
            {
                "type": "agent.tool_use",
                "name": step["name"],
                "input": step.get("input", {}),
                "evaluated_permission": permission,
                "evaluation": evaluation,
                "session_thread_id": None,
            },
        )
        self.s.tool_use_ids[ev["id"]] = idx
        self.s.emitted_at[ev["id"]] = time.monotonic()
        self.s.step_event_ids[idx] = ev["id"]
        self.s.answered.setdefault(ev["id"], asyncio.Event())
        if permission == "deny":
            # The server itself denied the call: nothing is awaited from any client
            # (stand-in assumption: no requires_action idle for it).
            return
        self.idle_requires_action(ev["id"])
        if permission == "ask":
            confirm = step.get("confirm", {"result": "allow"})
            await asyncio.sleep(CONFIRM_DELAY_S)
            data: dict[str, Any] = {
                "type": "user.tool_confirmation",
                "tool_use_id": ev["id"],
                "result": confirm.get("result", "allow"),
                "session_thread_id": None,
            }
            if confirm.get("deny_message") is not None:
                data["deny_message"] = confirm["deny_message"]
            self.emit(BetaManagedAgentsUserToolConfirmationEvent, data)
            if data["result"] != "allow":
                return
        await self.wait_answer(ev["id"], idx, step, TOOL_SETTLE_DEFAULT_S)

    async def custom_tool_use(self, idx: int, step: dict[str, Any]) -> None:
        ev = self.emit(
            BetaManagedAgentsAgentCustomToolUseEvent,
            {"type": "agent.custom_tool_use", "name": step["name"], "input": step.get("input", {}), "session_thread_id": None},
        )
        self.s.tool_use_ids[ev["id"]] = idx
        self.s.step_event_ids[idx] = ev["id"]
        self.s.answered.setdefault(ev["id"], asyncio.Event())
        self.idle_requires_action(ev["id"])
        await self.wait_answer(ev["id"], idx, step, CUSTOM_SETTLE_DEFAULT_S)


# --------------------------------------------------------------------------- server


class StandIn:
    def __init__(self, state: State) -> None:
        self.st = state

    # ---- plumbing

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self.middleware])
        r = app.router
        env = "/v1/environments/{env}/work"
        r.add_get(env + "/poll", self.poll)
        r.add_get(env + "/stats", self.stats)
        r.add_get(env, self.work_list)
        r.add_get(env + "/{work}", self.work_retrieve)
        r.add_post(env + "/{work}/ack", self.ack)
        r.add_post(env + "/{work}/heartbeat", self.heartbeat)
        r.add_post(env + "/{work}/stop", self.stop)
        r.add_get("/v1/sessions/{sid}", self.session_retrieve)
        r.add_get("/v1/sessions/{sid}/events", self.events_list)
        r.add_post("/v1/sessions/{sid}/events", self.events_send)
        r.add_get("/v1/sessions/{sid}/events/stream", self.events_stream)
        r.add_get("/v1/skills/{skill}/versions/{version}", self.skill_version)
        r.add_get("/v1/skills/{skill}/versions/{version}/content", self.skill_content)
        r.add_get("/v1/memory_stores/{store}/memories", self.mem_list)
        r.add_post("/v1/memory_stores/{store}/memories", self.mem_create)
        r.add_get("/v1/memory_stores/{store}/memories/{mem}", self.mem_retrieve)
        r.add_post("/v1/memory_stores/{store}/memories/{mem}", self.mem_update)
        r.add_delete("/v1/memory_stores/{store}/memories/{mem}", self.mem_delete)
        r.add_post("/_standin/enqueue", self.c_enqueue)
        r.add_put("/_standin/keys", self.c_keys)
        r.add_get("/_standin/record", self.c_record)
        r.add_get("/_standin/healthz", self.c_healthz)
        r.add_post("/_standin/faults", self.c_faults)
        app.on_startup.append(self._start_reaper)
        return app

    async def _start_reaper(self, app: web.Application) -> None:
        async def reaper() -> None:
            while True:
                await asyncio.sleep(0.25)
                self.st.expire_leases()

        app["reaper"] = asyncio.get_running_loop().create_task(reaper())

    def credential(self, request: web.Request) -> tuple[str, Optional[str]]:
        """(label, work id of a sessions token or None); raises 401."""
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("Bearer "):
            raise ApiError(401, "authentication_error", "missing bearer credential")
        tok = auth[len("Bearer ") :].strip()
        for i, k in enumerate(self.st.keys):
            if tok and secrets.compare_digest(tok, k):
                return f"env_key:{i}", None
        wid = self.st.tokens.get(tok)
        if wid is not None:
            return f"sessions_token:{wid}", wid
        raise ApiError(401, "authentication_error", "invalid bearer credential")

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        path = request.path
        entry: dict[str, Any] = {
            "method": request.method,
            "path": path,
            "credential": None,
            "worker_id": request.headers.get("Anthropic-Worker-ID"),
            "beta": request.headers.get("anthropic-beta"),
            "t": time.monotonic(),
            "status": None,
        }
        control = path.startswith("/_standin/")
        if not control:
            self.st.requests.append(entry)
        request["log"] = entry
        try:
            if request.content_length is not None and request.content_length > MAX_BODY:
                raise ApiError(413, "invalid_request_error", f"request body exceeds {MAX_BODY} bytes")
            if not control:
                if self.st.latency_s:
                    await asyncio.sleep(self.st.latency_s)
                betas = {b.strip() for b in request.headers.get("anthropic-beta", "").split(",") if b.strip()}
                # The SDK sends managed-agents-2026-04-01 on work and session calls,
                # agent-memory-2026-07-22 (only) on memory calls, and no beta at all on
                # skill-version calls; the stand-in requires exactly what the SDK sends.
                if path.startswith("/v1/memory_stores/"):
                    needed: Optional[str] = MEMORY_BETA
                elif path.startswith("/v1/skills/"):
                    needed = None
                else:
                    needed = MANAGED_AGENTS_BETA
                if needed is not None and needed not in betas:
                    raise ApiError(400, "invalid_request_error", f"anthropic-beta must include {needed}")
                label, wid = self.credential(request)
                entry["credential"] = label
                request["cred"] = (label, wid)
            resp = await handler(request)
            entry["status"] = resp.status
            return resp
        except ApiError as e:
            entry["status"] = e.status
            return json_response(e.body, e.status)
        except asyncio.CancelledError:
            # The client went away mid-request (a long poll or a stream at shutdown).
            if entry["status"] is None:
                entry["status"] = 499
            raise
        except web.HTTPRequestEntityTooLarge:
            entry["status"] = 413
            return json_response(error_body("invalid_request_error", f"request body exceeds {MAX_BODY} bytes"), 413)
        except web.HTTPException as e:
            entry["status"] = e.status
            kind = "not_found_error" if e.status == 404 else "invalid_request_error"
            return json_response(error_body(kind, e.reason or "error"), e.status)

    async def body(self, request: web.Request) -> Any:
        raw = await request.read()
        if len(raw) > MAX_BODY:
            raise ApiError(413, "invalid_request_error", f"request body exceeds {MAX_BODY} bytes")
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiError(400, "invalid_request_error", "request body is not valid JSON")

    def env_only(self, request: web.Request) -> None:
        if request["cred"][1] is not None:
            raise ApiError(401, "authentication_error", "this endpoint takes an environment key")

    def check_env(self, request: web.Request) -> None:
        if request.match_info["env"] != self.st.env_id:
            raise ApiError(404, "not_found_error", f"environment {request.match_info['env']} not found")

    def get_work(self, request: web.Request, *, token_ok: bool) -> Work:
        self.check_env(request)
        wid = request.match_info["work"]
        w = self.st.work.get(wid)
        if w is None:
            raise ApiError(404, "not_found_error", f"work item {wid} not found")
        _, tok_wid = request["cred"]
        if tok_wid is not None and (not token_ok or tok_wid != wid):
            raise ApiError(401, "authentication_error", "the sessions token does not cover this call")
        return w

    def get_session(self, request: web.Request) -> Session:
        sid = request.match_info["sid"]
        s = self.st.sessions.get(sid)
        if s is None:
            raise ApiError(404, "not_found_error", f"session {sid} not found")
        _, tok_wid = request["cred"]
        if tok_wid is not None and s.work_id != tok_wid:
            raise ApiError(401, "authentication_error", "the sessions token does not cover this session")
        return s

    @staticmethod
    def int_q(request: web.Request, name: str, default: Optional[int]) -> Optional[int]:
        v = request.query.get(name)
        if v is None or v == "":
            return default
        try:
            return int(v)
        except ValueError:
            raise ApiError(400, "invalid_request_error", f"{name} must be an integer")

    # ---- work queue

    async def poll(self, request: web.Request) -> web.Response:
        self.check_env(request)
        self.env_only(request)
        st = self.st
        worker = request.headers.get("Anthropic-Worker-ID")
        if worker:
            st.workers[worker] = time.monotonic()
        if st.poll_faults:
            status = st.poll_faults.popleft()
            kinds = {429: "rate_limit_error", 529: "overloaded_error", 401: "authentication_error", 404: "not_found_error"}
            kind = kinds.get(status, "api_error" if status >= 500 else "invalid_request_error")
            raise ApiError(status, kind, f"injected fault {status}")
        block = self.int_q(request, "block_ms", None)
        if block is not None and not (1 <= block <= POLL_BLOCK_CAP_MS):
            raise ApiError(400, "invalid_request_error", "block_ms must be 1-999")
        reclaim = self.int_q(request, "reclaim_older_than_ms", RECLAIM_DEFAULT_MS) or RECLAIM_DEFAULT_MS
        deadline = time.monotonic() + (block or 0) / 1000.0
        while True:
            w = st.take_work(reclaim, worker)
            if w is not None:
                return json_response(w.model(with_secret=True))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                # The SDK's poll returns None for a JSON `null` body (its response
                # processing maps a null payload to None before any model parsing).
                return json_response(None)
            async with st.queue_changed:
                try:
                    await asyncio.wait_for(st.queue_changed.wait(), timeout=min(remaining, 0.25))
                except asyncio.TimeoutError:
                    pass

    async def ack(self, request: web.Request) -> web.Response:
        w = self.get_work(request, token_ok=False)
        if w.state != "queued" or w.polled_at is None:
            raise ApiError(409, "conflict_error", f"work item {w.id} is {w.state}, not a polled queued item")
        w.state = "starting"
        w.acknowledged_at = now_str()
        w.polled_at = None
        w.acked_by = request.headers.get("Anthropic-Worker-ID") or w.polled_by
        w.last_heartbeat = None
        # Stand-in assumption: the lease starts at the ack, with the configured TTL.
        w.lease_deadline = time.monotonic() + self.st.lease_ttl
        s = self.st.sessions[w.session_id]
        if not s.started:
            s.started = True
            s.driver = asyncio.get_running_loop().create_task(Driver(self.st, s).run())
        return json_response(w.model())

    async def heartbeat(self, request: web.Request) -> web.Response:
        w = self.get_work(request, token_ok=True)
        expected = request.query.get("expected_last_heartbeat")
        ttl = self.st.lease_ttl
        if w.state not in ("stopping", "stopped"):
            current = w.last_heartbeat if w.last_heartbeat is not None else NO_HEARTBEAT
            if expected is not None and expected != current:
                details = dump(
                    BetaHeartbeatPreconditionFailedErrorDetails,
                    {"error_code": "heartbeat_precondition_failed", "current_state": w.lease_state(ttl)},
                )
                raise ApiError(
                    412, "invalid_request_error", "expected_last_heartbeat does not match the stored heartbeat", details
                )
            if w.state == "queued":
                raise ApiError(409, "conflict_error", f"work item {w.id} is queued and holds no lease")
        w.heartbeats += 1
        extended = w.state in ("starting", "active")
        if extended:
            # Stand-in assumption: the first heartbeat after the ack makes the item `active`.
            w.state = "active"
            stamp = now_str()
            w.last_heartbeat = stamp
            w.latest_heartbeat_at = stamp
            if w.started_at is None:
                w.started_at = stamp
            w.lease_deadline = time.monotonic() + ttl
        return json_response(
            dump(
                BetaSelfHostedWorkHeartbeatResponse,
                {
                    "type": "work_heartbeat",
                    "last_heartbeat": w.last_heartbeat or "",
                    "lease_extended": extended,
                    "state": w.state,
                    "ttl_seconds": ttl,
                },
            )
        )

    async def stop(self, request: web.Request) -> web.Response:
        w = self.get_work(request, token_ok=True)
        body = await self.body(request)
        if not isinstance(body, dict) or not isinstance(body.get("force", False), bool):
            raise ApiError(400, "invalid_request_error", "body must be {\"force\": bool}")
        force = body.get("force", False)
        if w.state == "stopped":
            raise ApiError(409, "conflict_error", f"work item {w.id} is already stopped")
        w.stops += 1
        w.stop_force = force
        stamp = now_str()
        if w.stop_requested_at is None:
            w.stop_requested_at = stamp
        # Stand-in assumption: a forced stop, or a stop of an item nobody holds, ends it at
        # once; a graceful stop of a held item leaves it `stopping` until its holder's
        # heartbeat sees that and force-stops (or the lease runs out).
        if force or w.state == "queued" or w.state == "stopping":
            w.state = "stopped"
            w.stopped_at = stamp
            w.lease_deadline = None
            w.polled_at = None
        else:
            w.state = "stopping"
        return json_response(w.model())

    async def stats(self, request: web.Request) -> web.Response:
        self.check_env(request)
        now = time.monotonic()
        queued = [w for w in self.st.work.values() if w.state == "queued"]
        pending = [w for w in queued if w.polled_at is not None]
        oldest = min((w.created_at for w in queued), default=None)
        polling = sum(1 for t in self.st.workers.values() if now - t <= WORKERS_POLLING_WINDOW_S)
        return json_response(
            dump(
                BetaSelfHostedWorkQueueStats,
                {
                    "type": "work_queue_stats",
                    "depth": len(queued) - len(pending),
                    "pending": len(pending),
                    "oldest_queued_at": oldest,
                    "workers_polling": polling,
                },
            )
        )

    async def work_retrieve(self, request: web.Request) -> web.Response:
        return json_response(self.get_work(request, token_ok=False).model())

    async def work_list(self, request: web.Request) -> web.Response:
        self.check_env(request)
        self.env_only(request)
        limit = max(1, min(self.int_q(request, "limit", 20) or 20, 1000))
        items = list(self.st.work.values())
        start = decode_cursor(request.query.get("page"))
        page = items[start : start + limit]
        nxt = encode_cursor(start + limit) if start + limit < len(items) else None
        return json_response(
            dump(BetaSelfHostedWorkListResponse, {"data": [w.model() for w in page], "next_page": nxt})
        )

    # ---- sessions

    async def session_retrieve(self, request: web.Request) -> web.Response:
        return json_response(self.get_session(request).model())

    async def events_list(self, request: web.Request) -> web.Response:
        s = self.get_session(request)
        limit = self.int_q(request, "limit", EVENTS_LIST_DEFAULT_LIMIT) or EVENTS_LIST_DEFAULT_LIMIT
        if not 1 <= limit <= EVENTS_LIST_MAX_LIMIT:
            raise ApiError(400, "invalid_request_error", f"limit must be 1-{EVENTS_LIST_MAX_LIMIT}")
        order = request.query.get("order", "asc")
        if order not in ("asc", "desc"):
            raise ApiError(400, "invalid_request_error", "order must be asc or desc")
        types = set(request.query.getall("types[]", [])) | set(request.query.getall("types", []))
        events = [e for e in s.events if not types or e["type"] in types]
        for key, op in (("gt", "__gt__"), ("gte", "__ge__"), ("lt", "__lt__"), ("lte", "__le__")):
            bound = request.query.get(f"created_at[{key}]")
            if bound:
                events = [e for e in events if getattr(e["processed_at"], op)(bound)]
        if order == "desc":
            events = events[::-1]
        start = decode_cursor(request.query.get("page"))
        page = events[start : start + limit]
        nxt = encode_cursor(start + limit) if start + limit < len(events) else None
        # The SDK's `AsyncPageCursor` reads `data` and follows `next_page` as `?page=`.
        return json_response({"data": page, "next_page": nxt})

    async def events_send(self, request: web.Request) -> web.Response:
        s = self.get_session(request)
        body = await self.body(request)
        if not isinstance(body, dict) or not isinstance(body.get("events"), list) or not body["events"]:
            raise ApiError(400, "invalid_request_error", "body must be {\"events\": [...]} with at least one event")
        accepted: list[tuple[dict[str, Any], Any]] = []
        for ev in body["events"]:
            if not isinstance(ev, dict) or ev.get("type") not in RESULT_REQUIRED:
                raise ApiError(
                    400, "invalid_request_error", f"unsupported event type {ev.get('type') if isinstance(ev, dict) else ev!r}"
                )
            missing = [k for k in RESULT_REQUIRED[ev["type"]] if k not in ev]
            if missing:
                raise ApiError(400, "invalid_request_error", f"{ev['type']}: missing {', '.join(sorted(missing))}")
            ref = ev.get("tool_use_id") if ev["type"] != "user.custom_tool_result" else ev.get("custom_tool_use_id")
            idx = s.tool_use_ids.get(ref)
            if idx is None:
                raise ApiError(400, "invalid_request_error", f"{ref} names no tool call of this session")
            step_kind = s.steps[idx].get("type", "tool_use")
            if (ev["type"] == "user.custom_tool_result") != (step_kind == "custom_tool_use"):
                raise ApiError(400, "invalid_request_error", f"{ev['type']} does not answer a {step_kind}")
            if not isinstance(ev.get("content", []), list):
                raise ApiError(400, "invalid_request_error", "content must be a list of blocks")
            model_cls = {
                "user.tool_result": BetaManagedAgentsUserToolResultEvent,
                "user.custom_tool_result": BetaManagedAgentsUserCustomToolResultEvent,
                "user.tool_confirmation": BetaManagedAgentsUserToolConfirmationEvent,
            }[ev["type"]]
            try:
                full = dump(model_cls, {**ev, "id": gen_id("sevt"), "processed_at": now_str()})
            except Exception as e:  # pydantic.ValidationError
                raise ApiError(400, "invalid_request_error", f"invalid {ev['type']}: {e}")
            accepted.append((full, ev))
        posted_at = time.monotonic()
        for full, ev in accepted:
            s.events.append(full)
            for q in list(s.subscribers):
                q.put_nowait(full)
            if ev["type"] == "user.tool_confirmation":
                continue
            ref = ev.get("tool_use_id") or ev.get("custom_tool_use_id")
            idx = s.tool_use_ids[ref]
            rec = s.results.get(ref)
            if rec is None:
                s.results[ref] = {
                    "tool_use_id": ref,
                    "step": s.steps[idx].get("id", str(idx)),
                    "name": s.steps[idx].get("name"),
                    "type": ev["type"],
                    "content": ev.get("content"),
                    "is_error": ev.get("is_error"),
                    "posted_at": posted_at,
                    "emitted_at": s.emitted_at.get(ref),
                    "count": 1,
                }
            else:
                rec["count"] += 1
            if s.first_result_at is None:
                s.first_result_at = posted_at
            s.answered.setdefault(ref, asyncio.Event()).set()
        return json_response(dump(BetaManagedAgentsSendSessionEvents, {"data": [f for f, _ in accepted]}))

    async def events_stream(self, request: web.Request) -> web.StreamResponse:
        s = self.get_session(request)
        q: asyncio.Queue[Optional[dict[str, Any]]] = asyncio.Queue()
        s.subscribers.append(q)
        resp = web.StreamResponse(
            status=200,
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "request-id": gen_id("req")},
        )
        try:
            await resp.prepare(request)
            request["log"]["status"] = 200
            while True:
                try:
                    ev = await asyncio.wait_for(q.get(), timeout=SSE_KEEPALIVE_S)
                except asyncio.TimeoutError:
                    # The SDK's stream parser skips `event: ping`.
                    await resp.write(b'event: ping\ndata: {"type": "ping"}\n\n')
                    continue
                if ev is None:
                    break
                # The SDK skips SSE messages without an `event:` field; the data is the event JSON.
                await resp.write(f"event: {ev['type']}\ndata: {json.dumps(ev)}\n\n".encode())
        except ConnectionResetError:
            pass
        finally:
            if q in s.subscribers:
                s.subscribers.remove(q)
        return resp

    # ---- skills

    def find_skill(self, request: web.Request) -> tuple[dict[str, Any], str]:
        sk = self.st.skills.get(request.match_info["skill"])
        if sk is None:
            raise ApiError(404, "not_found_error", f"skill {request.match_info['skill']} not found")
        version = request.match_info["version"]
        if version not in ("latest", sk["version_id"]):
            raise ApiError(404, "not_found_error", f"skill version {version} not found")
        return sk, sk["version_id"]

    async def skill_version(self, request: web.Request) -> web.Response:
        sk, vid = self.find_skill(request)
        return json_response(
            dump(
                BetaSkillVersion,
                {
                    "id": vid,
                    "type": "skill_version",
                    "skill_id": sk["skill_id"],
                    "name": sk["name"],
                    "description": sk.get("description", ""),
                    "created_at": sk["created_at"],
                },
            )
        )

    async def skill_content(self, request: web.Request) -> web.Response:
        sk, _ = self.find_skill(request)
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            # Wrapped in one directory named after the skill, as the SDK's extractor expects.
            for rel, text in sorted(sk.get("files", {}).items()):
                zf.writestr(f"{sk['name']}/{rel}", text)
        return web.Response(body=buf.getvalue(), content_type="application/zip")

    # ---- memory stores (sessions token only)

    def mem_store(self, request: web.Request) -> dict[str, dict[str, Any]]:
        store = request.match_info["store"]
        _, wid = request["cred"]
        if wid is None:
            raise ApiError(401, "authentication_error", "memory store endpoints take a sessions token")
        s = self.st.sessions.get(self.st.work[wid].session_id)
        if s is None or store not in s.memory_store_ids:
            raise ApiError(401, "authentication_error", "the sessions token does not cover this memory store")
        if store not in self.st.memory:
            raise ApiError(404, "not_found_error", f"memory store {store} not found")
        return self.st.memory[store]

    @staticmethod
    def mem_model(m: dict[str, Any], full: bool) -> dict[str, Any]:
        data = {k: v for k, v in m.items() if k != "content"}
        if full:
            data["content"] = m["content"]
        return dump(BetaManagedAgentsMemory, data)

    async def mem_list(self, request: web.Request) -> web.Response:
        mems = self.mem_store(request)
        view = request.query.get("view", "basic")
        limit = max(1, min(self.int_q(request, "limit", 20) or 20, 100))
        prefix = request.query.get("path_prefix")
        items = sorted((m for m in mems.values() if not prefix or m["path"].startswith(prefix)), key=lambda m: m["path"])
        start = decode_cursor(request.query.get("page"))
        page = items[start : start + limit]
        nxt = encode_cursor(start + limit) if start + limit < len(items) else None
        return json_response({"data": [self.mem_model(m, view == "full") for m in page], "next_page": nxt})

    async def mem_retrieve(self, request: web.Request) -> web.Response:
        mems = self.mem_store(request)
        m = mems.get(request.match_info["mem"])
        if m is None:
            raise ApiError(404, "not_found_error", "memory not found")
        return json_response(self.mem_model(m, request.query.get("view", "basic") == "full"))

    def _mem_new(self, store: str, path: str, content: str) -> dict[str, Any]:
        stamp = now_str()
        return {
            "id": gen_id("mem"),
            "type": "memory",
            "memory_store_id": store,
            "memory_version_id": gen_id("memver"),
            "path": path,
            "content": content,
            "content_sha256": hashlib.sha256(content.encode()).hexdigest(),
            "content_size_bytes": len(content.encode()),
            "created_at": stamp,
            "updated_at": stamp,
        }

    def _synced(self, request: web.Request, op: str, m: dict[str, Any]) -> None:
        self.st.memory_synced.append(
            {
                "op": op,
                "memory_store_id": m["memory_store_id"],
                "path": m["path"],
                "content": m.get("content"),
                "content_sha256": m.get("content_sha256"),
                "credential": request["cred"][0],
                "t": time.monotonic(),
            }
        )

    async def mem_create(self, request: web.Request) -> web.Response:
        mems = self.mem_store(request)
        body = await self.body(request)
        missing = [k for k in MemoryCreateParams.__required_keys__ if k not in body]
        if not isinstance(body, dict) or missing:
            raise ApiError(400, "invalid_request_error", f"missing {', '.join(sorted(missing))}")
        path, content = body["path"], body["content"] or ""
        if not isinstance(path, str) or not path.startswith("/") or ".." in path.split("/"):
            raise ApiError(400, "invalid_request_error", "path must be absolute with no '..'")
        if any(m["path"] == path for m in mems.values()):
            raise ApiError(409, "conflict_error", f"a memory already exists at {path}")
        m = self._mem_new(request.match_info["store"], path, content)
        mems[m["id"]] = m
        self._synced(request, "create", m)
        return json_response(self.mem_model(m, request.query.get("view", "basic") == "full"))

    async def mem_update(self, request: web.Request) -> web.Response:
        mems = self.mem_store(request)
        m = mems.get(request.match_info["mem"])
        if m is None:
            raise ApiError(404, "not_found_error", "memory not found")
        body = await self.body(request)
        pre = body.get("precondition")
        if pre and pre.get("type") == "content_sha256" and pre.get("content_sha256") != m["content_sha256"]:
            raise ApiError(409, "memory_precondition_failed_error", "content_sha256 precondition failed")
        if body.get("content") is not None:
            m["content"] = body["content"]
            m["content_sha256"] = hashlib.sha256(m["content"].encode()).hexdigest()
            m["content_size_bytes"] = len(m["content"].encode())
        if body.get("path"):
            m["path"] = body["path"]
        m["memory_version_id"] = gen_id("memver")
        m["updated_at"] = now_str()
        self._synced(request, "update", m)
        return json_response(self.mem_model(m, request.query.get("view", "basic") == "full"))

    async def mem_delete(self, request: web.Request) -> web.Response:
        mems = self.mem_store(request)
        m = mems.get(request.match_info["mem"])
        if m is None:
            raise ApiError(404, "not_found_error", "memory not found")
        expected = request.query.get("expected_content_sha256")
        if expected and expected != m["content_sha256"]:
            raise ApiError(409, "memory_precondition_failed_error", "content_sha256 precondition failed")
        del mems[m["id"]]
        self._synced(request, "delete", m)
        return json_response(dump(BetaManagedAgentsDeletedMemory, {"id": m["id"], "type": "memory_deleted"}))

    # ---- control API

    async def c_enqueue(self, request: web.Request) -> web.Response:
        body = await self.body(request)
        script = body.get("session") if isinstance(body, dict) else None
        if not isinstance(script, dict) or not isinstance(script.get("steps", []), list):
            raise ApiError(400, "invalid_request_error", "body must be {\"session\": {...script...}, \"count\": N}")
        count = int(body.get("count", 1))
        if not 1 <= count <= 10_000:
            raise ApiError(400, "invalid_request_error", "count must be 1-10000")
        st = self.st
        prefix = body.get("prefix") or script.get("id_prefix")
        for sk in script.get("skills", []):
            st.skills.setdefault(
                sk["skill_id"],
                {
                    "skill_id": sk["skill_id"],
                    "version_id": sk.get("version_id", "1759276800000000"),
                    "name": sk.get("name", sk["skill_id"]),
                    "description": sk.get("description", ""),
                    "files": sk.get("files", {}),
                    "created_at": now_str(),
                },
            )
        for ms in script.get("memory_stores", []):
            if ms["memory_store_id"] not in st.memory:
                mems = {}
                for path, content in ms.get("memories", {}).items():
                    m = self._mem_new(ms["memory_store_id"], path, content)
                    mems[m["id"]] = m
                st.memory[ms["memory_store_id"]] = mems
        try:
            validate_script(script)
        except Exception as e:
            raise ApiError(400, "invalid_request_error", f"invalid session script: {e}")
        items = []
        for _ in range(count):
            if prefix:
                counter = st.prefix_counters.setdefault(prefix, itertools.count(1))
                sid = f"sesn_{prefix}_{next(counter)}"
                while sid in st.sessions:
                    sid = f"sesn_{prefix}_{next(counter)}"
            else:
                sid = gen_id("sesn")
            s = Session(sid, st.env_id, script)
            w = Work(gen_id("work"), st.env_id, sid)
            s.work_id = w.id
            st.sessions[sid] = s
            st.work[w.id] = w
            st.tokens[w.sessions_token] = w.id
            items.append({"work_id": w.id, "session_id": sid})
        await st.notify()
        return json_response({"items": items})

    async def c_keys(self, request: web.Request) -> web.Response:
        body = await self.body(request)
        keys = body.get("keys") if isinstance(body, dict) else None
        if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
            raise ApiError(400, "invalid_request_error", "body must be {\"keys\": [non-empty strings]}")
        self.st.keys = list(keys)
        return json_response({"keys": len(keys)})

    async def c_faults(self, request: web.Request) -> web.Response:
        body = await self.body(request)
        poll = body.get("poll", []) if isinstance(body, dict) else None
        if not isinstance(poll, list) or not all(isinstance(c, int) and 400 <= c <= 599 for c in poll):
            raise ApiError(400, "invalid_request_error", "body must be {\"poll\": [status codes 400-599]}")
        self.st.poll_faults.extend(poll)
        return json_response({"poll": list(self.st.poll_faults)})

    async def c_healthz(self, request: web.Request) -> web.Response:
        return json_response({"ok": True, "environment_id": self.st.env_id})

    async def c_record(self, request: web.Request) -> web.Response:
        st = self.st
        return json_response(
            {
                "environment_id": st.env_id,
                "lease_ttl": st.lease_ttl,
                "now": time.monotonic(),
                "results": {sid: list(s.results.values()) for sid, s in st.sessions.items()},
                "requests": list(st.requests),
                "work": {wid: w.record() for wid, w in st.work.items()},
                "sessions": {sid: s.record() for sid, s in st.sessions.items()},
                "memory_synced": st.memory_synced,
                "memory_stores": {
                    store: {m["path"]: m["content"] for m in mems.values()} for store, mems in st.memory.items()
                },
            }
        )


def validate_script(script: dict[str, Any]) -> None:
    """Build every event and the session object a script would produce, so a bad script fails at enqueue."""
    probe = Session("sesn_probe", "env_probe", script)
    probe.model()
    stamp = now_str()
    for i, step in enumerate(probe.steps):
        kind = step.get("type", "tool_use")
        if kind == "tool_use":
            perm = step.get("evaluated_permission", "allow")
            if perm not in ("allow", "ask", "deny"):
                raise ValueError(f"step {i}: evaluated_permission must be allow, ask or deny")
            data = {"id": "sevt_probe", "processed_at": stamp, "type": "agent.tool_use", "name": step["name"],
                    "input": step.get("input", {}), "evaluated_permission": perm}
            if step.get("evaluation") is not None:
                data["evaluation"] = step["evaluation"]
            BetaManagedAgentsAgentToolUseEvent.model_validate(data)
            if perm == "ask":
                confirm = step.get("confirm", {"result": "allow"})
                BetaManagedAgentsUserToolConfirmationEvent.model_validate(
                    {"id": "sevt_probe", "type": "user.tool_confirmation", "tool_use_id": "sevt_probe", **confirm}
                )
        elif kind == "custom_tool_use":
            BetaManagedAgentsAgentCustomToolUseEvent.model_validate(
                {"id": "sevt_probe", "processed_at": stamp, "type": "agent.custom_tool_use", "name": step["name"],
                 "input": step.get("input", {})}
            )
        else:
            raise ValueError(f"step {i}: unknown type {kind!r}")


def encode_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"o": offset}).encode()).decode().rstrip("=")


def decode_cursor(cursor: Optional[str]) -> int:
    if not cursor:
        return 0
    try:
        off = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))["o"]
        if isinstance(off, int) and off >= 0:
            return off
    except Exception:
        pass
    raise ApiError(400, "invalid_request_error", "invalid page cursor")


async def main_async(args: argparse.Namespace) -> None:
    host, _, port = args.listen.rpartition(":")
    state = State(args.environment_id, args.key or [], args.lease_ttl, args.latency_ms)
    app = StandIn(state).app()
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host or "127.0.0.1", int(port), backlog=1024)
    await site.start()
    sock = site._server.sockets[0]  # type: ignore[union-attr]
    bound_host, bound_port = sock.getsockname()[:2]
    print(f"LISTENING http://{bound_host}:{bound_port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (default 127.0.0.1:0)")
    p.add_argument("--environment-id", default="env_standin")
    p.add_argument("--key", action="append", help="an accepted environment key (repeatable)")
    p.add_argument("--lease-ttl", type=int, default=30, help="ttl_seconds reported by heartbeats (default 30)")
    p.add_argument("--latency-ms", type=int, default=0, help="artificial delay per API response")
    args = p.parse_args()
    try:
        asyncio.run(main_async(args))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
