"""A session spec made from a warm pool's template, and the benchmark's figures."""

import importlib.util
import os

from agentplane import spec_for_warm_pool

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench_first_result.py")

POOL = {
    "apiVersion": "agentplane.dev/v1alpha1", "kind": "AgentWarmPool",
    "metadata": {"name": "base", "namespace": "team-a"},
    "spec": {"replicas": 2, "template": {
        "image": "localhost/agentplane/sandbox-base:dev", "workdir": "/workspace",
        "resources": {"limits": {"memory": "1Gi"}}, "env": [{"name": "A", "value": "1"}],
        "nodeSelector": {}, "tolerations": [], "emptyDir": {"sizeLimit": "1Gi"}}},
}


def test_a_spec_repeats_what_the_pool_fixes_and_names_it():
    spec = spec_for_warm_pool(POOL)
    assert spec == {
        "image": "localhost/agentplane/sandbox-base:dev", "workdir": "/workspace",
        "resources": {"limits": {"memory": "1Gi"}}, "env": [{"name": "A", "value": "1"}],
        "workspace": {"emptyDir": {"sizeLimit": "1Gi"}}, "warmPool": "base",
        "tools": [{"type": "agent_toolset_20260401",
                   "default_config": {"permission_policy": {"type": "always_allow"}}}],
    }
    spec["env"].append({"name": "B"})
    assert len(POOL["spec"]["template"]["env"]) == 1


def test_own_tools():
    tools = [{"type": "agent_toolset_20260401"}]
    assert spec_for_warm_pool(POOL, tools)["tools"] == tools


def test_nearest_rank_percentiles():
    spec = importlib.util.spec_from_file_location("bench_first_result", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    values = sorted(float(v) for v in range(1, 11))
    assert (bench.percentile(values, 50), bench.percentile(values, 90), bench.percentile(values, 100)) == (5, 9, 10)
    assert bench.percentile([7.0], 50) == bench.percentile([7.0], 90) == 7.0
    assert bench.claimed_warm({"status": {"conditions": [{"type": "WarmPool", "status": "True"}]}})
    assert not bench.claimed_warm({"status": {"conditions": [{"type": "WarmPool", "status": "False"}]}})
