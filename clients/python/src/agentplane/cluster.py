"""AgentSessions through the Kubernetes API server: create, get, delete, and
wait until one is Ready. (The gateway neither creates nor deletes sessions.)"""

from __future__ import annotations

import copy
import json
import ssl
import time
from urllib.parse import quote

from .errors import (ConnectionFailed, GatewayError, NotFound, ProtocolError, SessionNotReady, Timeout,
                     from_kubernetes_body)
from .transport import MiB, Deadline, Endpoint, Response, tls_context

GROUP = "agentplane.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "AgentSession"
PLURAL = "agentsessions"
POOL_PLURAL = "agentwarmpools"

# The template fields of an AgentWarmPool that a claiming session's spec repeats.
POOL_TEMPLATE_FIELDS = ("image", "workdir", "resources", "env", "runtimeClassName", "nodeSelector", "tolerations")

# Phases a session does not leave by itself for Ready.
SETTLED_PHASES = {"Invalid", "Failed", "Succeeded", "Finished", "Suspended"}


class Cluster:
    """The Kubernetes API server at ``api_server``, as the holder of bearer
    ``token`` or of a client certificate (``cert_file``, ``key_file``), the
    server checked against ``ca_file`` (or ``context``). Each request takes
    at most ``timeout`` seconds and its answer at most ``max_body_bytes``."""

    def __init__(self, api_server: str, token: str | None = None, ca_file: str | None = None, *,
                 cert_file: str | None = None, key_file: str | None = None,
                 context: ssl.SSLContext | None = None, timeout: float = 30.0, max_body_bytes: int = 16 * MiB):
        headers = {"User-Agent": "agentplane-python", "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if context is None and api_server.startswith("https:"):
            context = tls_context(ca_file, cert_file=cert_file, key_file=key_file)
        self.endpoint = Endpoint(api_server, context=context, headers=headers)
        self.timeout = timeout
        self.max_body_bytes = max_body_bytes

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, context: str | None = None, **kw) -> Cluster:
        """The cluster of a kubeconfig's context (the current one by default;
        ``path`` defaults to $KUBECONFIG's first file or ~/.kube/config).
        Needs PyYAML."""
        from .kubeconfig import load

        server, token, ssl_context = load(path, context)
        return cls(server, token, context=ssl_context, **kw)

    # -- AgentSessions ------------------------------------------------------

    @staticmethod
    def sessions_path(namespace: str, name: str | None = None) -> str:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace, safe='')}/{PLURAL}"
        return path + (f"/{quote(name, safe='')}" if name else "")

    def create_session(self, namespace: str, name: str, spec: dict, warm_pool: str | None = None, *,
                       labels: dict | None = None, annotations: dict | None = None) -> dict:
        """Create an AgentSession; ``warm_pool`` names an AgentWarmPool of the
        namespace to claim a running sandbox from (``spec.warmPool``)."""
        spec = copy.deepcopy(spec)
        if warm_pool is not None:
            spec["warmPool"] = warm_pool
        metadata = {"name": name, "namespace": namespace}
        if labels:
            metadata["labels"] = dict(labels)
        if annotations:
            metadata["annotations"] = dict(annotations)
        body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}
        return self._json("POST", self.sessions_path(namespace), body=body)

    def get_session(self, namespace: str, name: str) -> dict:
        return self._json("GET", self.sessions_path(namespace, name))

    def delete_session(self, namespace: str, name: str, *, missing_ok: bool = True) -> bool:
        """Delete an AgentSession (its pod and objects go with it); whether it existed."""
        try:
            self._json("DELETE", self.sessions_path(namespace, name), body={"propagationPolicy": "Background"})
        except NotFound:
            if missing_ok:
                return False
            raise
        return True

    def wait_ready(self, namespace: str, name: str, timeout: float = 180.0) -> dict:
        """Wait until the session's Ready condition is True and return it.
        Raises ``SessionNotReady`` (with its phase and conditions) if it
        settles in another phase (Failed, Invalid, ...), is deleted, or
        ``timeout`` seconds pass. Watches the object, polling if the watch
        breaks."""
        deadline = Deadline(timeout)
        obj = self.get_session(namespace, name)
        while True:
            if _verdict(obj, namespace, name):
                return obj
            if deadline.passed():
                raise _not_ready(obj, namespace, name, f"not Ready within {timeout:g} s", timed_out=True)
            try:
                obj = self._watch_until_settled(namespace, name, obj, deadline)
                if obj is not None:
                    return obj
            except (ConnectionFailed, ProtocolError, Timeout):
                time.sleep(min(0.2, max(deadline.left(), 0)))
            except GatewayError as e:
                if e.status not in (403, 405, 410):
                    raise
                time.sleep(min(0.5, max(deadline.left(), 0)))
            obj = self.get_session(namespace, name)

    def _watch_until_settled(self, namespace: str, name: str, obj: dict, deadline: Deadline) -> dict | None:
        """Follow the session's changes; it once Ready, ``None`` if the watch ended first."""
        version = (obj.get("metadata") or {}).get("resourceVersion") or ""
        query = {"watch": "true", "fieldSelector": f"metadata.name={name}",
                 "resourceVersion": version, "timeoutSeconds": max(1, int(deadline.left()))}
        resp = self._open("GET", self.sessions_path(namespace), query=query, deadline=deadline)
        try:
            for line in resp.lines(self.max_body_bytes):
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except ValueError as e:
                    raise ProtocolError(f"{resp.what}: a watch event is not JSON: {e}") from e
                kind, current = event.get("type"), event.get("object")
                if kind == "ERROR" or not isinstance(current, dict):
                    return None  # too old a resourceVersion, say: read it afresh
                if kind == "DELETED":
                    raise _not_ready(current, namespace, name, "deleted while waiting for it to be Ready")
                if kind in ("ADDED", "MODIFIED") and _verdict(current, namespace, name):
                    return current
        finally:
            resp.close()
        return None

    # -- AgentWarmPools -----------------------------------------------------

    def get_warm_pool(self, namespace: str, name: str) -> dict:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace, safe='')}/{POOL_PLURAL}/{quote(name, safe='')}"
        return self._json("GET", path)

    def wait_pool_ready(self, namespace: str, name: str, replicas: int = 1, timeout: float = 180.0) -> dict:
        """Wait until the pool has at least ``replicas`` ready unclaimed pods (polling)."""
        deadline = Deadline(timeout)
        while True:
            pool = self.get_warm_pool(namespace, name)
            ready = (pool.get("status") or {}).get("readyReplicas") or 0
            if ready >= replicas:
                return pool
            if deadline.passed():
                raise Timeout(f"warm pool {namespace}/{name} has {ready} ready pods, not {replicas}, "
                              f"after {timeout:g} s ({describe_conditions(conditions_of(pool))})")
            time.sleep(min(0.2, max(deadline.left(), 0)))

    # -- plumbing -----------------------------------------------------------

    def _open(self, method: str, path: str, *, body=None, query=None, deadline: Deadline) -> Response:
        resp = self.endpoint.request(method, path, body=body, query=query, deadline=deadline)
        if not 200 <= resp.status < 300:
            raw = resp.read_all(1 * MiB, truncate=True)
            raise from_kubernetes_body(resp.status, raw, resp.retry_after())
        return resp

    def _json(self, method: str, path: str, *, body=None) -> dict:
        resp = self._open(method, path, body=body, deadline=Deadline(self.timeout))
        raw = resp.read_all(self.max_body_bytes)
        try:
            doc = json.loads(raw)
        except ValueError as e:
            raise ProtocolError(f"{resp.what}: the answer is not JSON: {e}", status=resp.status) from e
        if not isinstance(doc, dict):
            raise ProtocolError(f"{resp.what}: the answer is not a JSON object", status=resp.status)
        return doc

    def __repr__(self):
        return f"Cluster({self.endpoint.url!r})"


def spec_for_warm_pool(pool: dict, tools: list | None = None) -> dict:
    """A session spec that a pod of ``pool`` can serve: what the pool's
    template fixes, repeated, ``warmPool`` naming it, and ``tools`` (by
    default the six sandbox tools, all allowed)."""
    template = (pool.get("spec") or {}).get("template") or {}
    spec = {k: copy.deepcopy(template[k]) for k in POOL_TEMPLATE_FIELDS if template.get(k) not in (None, [], {})}
    if template.get("emptyDir") is not None:
        spec["workspace"] = {"emptyDir": copy.deepcopy(template["emptyDir"])}
    spec["warmPool"] = (pool.get("metadata") or {}).get("name")
    spec["tools"] = tools if tools is not None else [
        {"type": "agent_toolset_20260401", "default_config": {"permission_policy": {"type": "always_allow"}}}]
    return spec


def conditions_of(obj: dict) -> list[dict]:
    status = obj.get("status") or {}
    conds = status.get("conditions") or []
    return [c for c in conds if isinstance(c, dict)]


def is_ready(obj: dict) -> bool:
    """Whether a session's Ready condition is True."""
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions_of(obj))


def describe_conditions(conditions: list[dict]) -> str:
    """``Ready=False PodCreating: the sandbox pod is being created; ...``"""
    parts = []
    for c in conditions:
        text = f"{c.get('type')}={c.get('status')}"
        if c.get("reason"):
            text += f" {c['reason']}"
        if c.get("message"):
            text += f": {c['message']}"
        parts.append(text)
    return "; ".join(parts) or "no conditions yet"


def _verdict(obj: dict, namespace: str, name: str) -> bool:
    """True when Ready; raises when settled elsewhere; False while pending."""
    if is_ready(obj):
        return True
    phase = (obj.get("status") or {}).get("phase")
    if phase in SETTLED_PHASES:
        raise _not_ready(obj, namespace, name, f"phase {phase}")
    return False


def _not_ready(obj: dict, namespace: str, name: str, why: str, *, timed_out: bool = False) -> SessionNotReady:
    phase = (obj.get("status") or {}).get("phase")
    conds = conditions_of(obj)
    return SessionNotReady(
        f"session {namespace}/{name} {why} (phase {phase or 'unset'}; {describe_conditions(conds)})",
        phase=phase, conditions=conds, timed_out=timed_out)
