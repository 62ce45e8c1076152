"""The live tests' setting, from the environment the Rust e2e test sets.

Missing variables FAIL a test (they do not skip it): the live tests are run
only where a gateway and a cluster are up, and a silent skip there would
hide that nothing was tested."""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(os.path.dirname(HERE)), "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)

from agentplane import Cluster, Gateway  # noqa: E402

VARS = {
    "AGENTPLANE_GATEWAY_URL": "the gateway's https:// URL",
    "AGENTPLANE_GATEWAY_CA": "PEM file of the CA the gateway's certificate is checked against",
    "AGENTPLANE_CALLER_TOKEN": "a Kubernetes token that may call tools (and create AgentSessions)",
    "AGENTPLANE_APPROVER_TOKEN": "a Kubernetes token that may approve always_ask calls",
    "AGENTPLANE_DENIED_TOKEN": "a Kubernetes token that may do neither",
    "AGENTPLANE_NAMESPACE": "the namespace of the session",
    "AGENTPLANE_SESSION": "a Ready AgentSession whose bash is always_ask and other tools always_allow",
    "AGENTPLANE_API_SERVER": "the Kubernetes API server's https:// URL",
    "AGENTPLANE_API_CA": "PEM file of the API server's CA",
}


@dataclass(frozen=True)
class Live:
    url: str
    ca: str
    caller_token: str
    approver_token: str
    denied_token: str
    namespace: str
    session: str
    api_server: str
    api_ca: str
    cluster_token: str

    def gateway(self, token: str | None, **kw) -> Gateway:
        return Gateway(self.url, token, ca_file=self.ca, namespace=self.namespace, **kw)

    @property
    def caller(self):
        return self.gateway(self.caller_token).session(self.session)

    @property
    def approver(self):
        return self.gateway(self.approver_token).session(self.session)

    def cluster(self) -> Cluster:
        return Cluster(self.api_server, self.cluster_token, ca_file=self.api_ca)


@functools.cache
def _read() -> Live | str:
    missing = [f"  {k}: {why}" for k, why in VARS.items() if not os.environ.get(k)]
    if missing:
        return ("the live tests run against a real gateway and cluster (the Rust e2e test starts them and "
                "sets these variables); unset:\n" + "\n".join(missing))
    e = os.environ
    return Live(e["AGENTPLANE_GATEWAY_URL"], e["AGENTPLANE_GATEWAY_CA"], e["AGENTPLANE_CALLER_TOKEN"],
                e["AGENTPLANE_APPROVER_TOKEN"], e["AGENTPLANE_DENIED_TOKEN"], e["AGENTPLANE_NAMESPACE"],
                e["AGENTPLANE_SESSION"], e["AGENTPLANE_API_SERVER"], e["AGENTPLANE_API_CA"],
                e.get("AGENTPLANE_CLUSTER_TOKEN") or e["AGENTPLANE_CALLER_TOKEN"])


def live() -> Live:
    """The setting, or this test fails saying what is missing."""
    got = _read()
    if isinstance(got, str):
        pytest.fail(got, pytrace=False)
    return got
