#!/usr/bin/env python3
"""Time from applying an AgentSession that claims a warm-pool pod to its
first tool result through the gateway, n times.

Each sample: wait (untimed) until the pool has a ready pod; then, timed,
create the session naming the pool, wait for Ready=True (watching it), and
call ``read`` of /etc/hostname through the gateway until the first result comes (a gateway that
does not know the session yet answers not_found or unavailable: retried,
and counted); then delete the session (untimed). The session's spec is the
pool's template repeated, with every tool allowed.

Prints one figure per line, e.g. ``first_result_p50_ms 123.4``, on
standard output; each sample on standard error.

Environment: AGENTPLANE_GATEWAY_URL, AGENTPLANE_GATEWAY_CA,
AGENTPLANE_CALLER_TOKEN (calls through the gateway, and creates and deletes
sessions unless AGENTPLANE_CLUSTER_TOKEN is set), AGENTPLANE_NAMESPACE,
AGENTPLANE_API_SERVER, AGENTPLANE_API_CA.

    python3 clients/python/bench_first_result.py -n 10 --warm-pool base
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "src"))

from agentplane import Cluster, Gateway, NotFound, Unavailable, spec_for_warm_pool  # noqa: E402

ENV = ("AGENTPLANE_GATEWAY_URL", "AGENTPLANE_GATEWAY_CA", "AGENTPLANE_CALLER_TOKEN", "AGENTPLANE_NAMESPACE",
       "AGENTPLANE_API_SERVER", "AGENTPLANE_API_CA")


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of sorted values."""
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def claimed_warm(obj: dict) -> bool:
    conds = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "WarmPool" and c.get("status") == "True" for c in conds)


def first_result(session, deadline: float) -> tuple[str, int]:
    """The first result, retrying while the gateway does not know the session yet; (content, retries)."""
    retries = 0
    while True:
        try:
            r = session.call("read", {"file_path": "/etc/hostname"}, timeout=max(deadline - time.monotonic(), 1))
            if r.is_error or not r.content.strip():
                raise RuntimeError(f"the first call failed: {r.content[:300]}")
            return r.content, retries
        except (NotFound, Unavailable):
            if time.monotonic() >= deadline:
                raise
            retries += 1
            time.sleep(0.05)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=5, help="samples (default 5)")
    p.add_argument("--warm-pool", required=True, metavar="NAME", help="AgentWarmPool in the namespace")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds a sample (or a pool refill) may take")
    a = p.parse_args()
    missing = [k for k in ENV if not os.environ.get(k)]
    if missing:
        p.error("set " + ", ".join(missing))
    e = os.environ
    ns = e["AGENTPLANE_NAMESPACE"]
    cluster = Cluster(e["AGENTPLANE_API_SERVER"], e.get("AGENTPLANE_CLUSTER_TOKEN") or e["AGENTPLANE_CALLER_TOKEN"],
                      ca_file=e["AGENTPLANE_API_CA"])
    gateway = Gateway(e["AGENTPLANE_GATEWAY_URL"], e["AGENTPLANE_CALLER_TOKEN"], ca_file=e["AGENTPLANE_GATEWAY_CA"],
                      namespace=ns)
    spec = spec_for_warm_pool(cluster.get_warm_pool(ns, a.warm_pool))
    run = uuid.uuid4().hex[:6]
    samples, warm, retries = [], 0, 0
    for i in range(a.n):
        cluster.wait_pool_ready(ns, a.warm_pool, 1, a.timeout)
        name = f"bench-{run}-{i}"
        t0 = time.monotonic()
        try:
            cluster.create_session(ns, name, spec)
            obj = cluster.wait_ready(ns, name, timeout=a.timeout)
            _, tries = first_result(gateway.session(name), t0 + a.timeout)
            ms = (time.monotonic() - t0) * 1000
        finally:
            cluster.delete_session(ns, name)
        samples.append(ms)
        warm += claimed_warm(obj)
        retries += tries
        kind = "warm" if claimed_warm(obj) else "cold (the pool's pod was not claimed)"
        print(f"sample {i + 1}/{a.n}: {ms:.1f} ms, {kind}, {tries} retries", file=sys.stderr)
    s = sorted(samples)
    print(f"first_result_p50_ms {percentile(s, 50):.1f}")
    print(f"first_result_p90_ms {percentile(s, 90):.1f}")
    print(f"first_result_max_ms {s[-1]:.1f}")
    print(f"first_result_samples {len(s)}")
    print(f"first_result_warm_claims {warm}")
    print(f"first_result_gateway_retries {retries}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
