#!/usr/bin/env bash
# The scale benchmark (tests/e2e/benches/scale.rs) from a cluster that is down:
# builds first (release operator, the bench), then under the shared cluster
# lock: cluster up with the scheduler's and controller-manager's client QPS
# raised, N fake nodes (tests/cluster/kwok.sh), the bench, cluster down.
#
#   scripts/bench-scale.sh [BENCH_SCALE_* settings in the environment]
#
# BENCH_SCALE_BASELINE=FILE: first a ramp to BENCH_SCALE_BASELINE_STEPS (default
# 1000; idle for BENCH_SCALE_BASELINE_IDLE_SECONDS, default 5, after it; its
# flags BENCH_SCALE_BASELINE_OPERATOR_ARGS, not BENCH_SCALE_OPERATOR_ARGS) with
# the operator binary FILE (e.g. one built from main), then the run
# with this tree's, on the same cluster (namespaces base-* then scale-*): the
# before/after figures of an operator change.
# BENCH_SCALE_NODES (default 100) fake nodes; BENCH_SCALE_SCHEDULER_QPS
# (default 500) and BENCH_SCALE_CM_QPS (default 200); the bench's own knobs
# are described at the top of tests/e2e/benches/scale.rs. Output goes to
# stdout; the operators' logs to BENCH_SCALE_LOG_DIR (default a new
# /tmp/agentplane-scale.XXXXXX).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_INCREMENTAL=0
target=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --locked --release -p operator
# The shared target dir may be rebuilt from another tree while we run.
bin=$(mktemp -d /tmp/agentplane-scale-bin.XXXXXX)
cp "$target/release/agent-operator" "$bin/agent-operator"
export AGENTPLANE_OPERATOR_BIN="$bin/agent-operator"
cargo bench --locked -p e2e --bench scale --no-run
export BENCH_SCALE_LOG_DIR=${BENCH_SCALE_LOG_DIR:-$(mktemp -d /tmp/agentplane-scale.XXXXXX)}
mkdir -p "$BENCH_SCALE_LOG_DIR"
echo "scale: operator logs in $BENCH_SCALE_LOG_DIR" >&2

exec 9>/tmp/agentplane-cluster.lock
timeout 7200 flock 9 || { echo "scale: the cluster lock was not free within 2 h" >&2; exit 1; }
trap 'tests/cluster/cluster.sh down >/dev/null 2>&1 || true; rm -rf "$bin"' EXIT
# A cluster left up by someone else has the default client limits: restart it.
tests/cluster/cluster.sh down >/dev/null 2>&1 || true
AGENTPLANE_SCHEDULER_QPS=${BENCH_SCALE_SCHEDULER_QPS:-500} \
	AGENTPLANE_CONTROLLER_MANAGER_QPS=${BENCH_SCALE_CM_QPS:-200} \
	tests/cluster/cluster.sh up >/dev/null
eval "$(tests/cluster/cluster.sh env)"
tests/cluster/kwok.sh up "${BENCH_SCALE_NODES:-100}"
if [[ -n "${BENCH_SCALE_BASELINE:-}" ]]; then
	echo "scale: baseline with $BENCH_SCALE_BASELINE" >&2
	AGENTPLANE_OPERATOR_BIN=$BENCH_SCALE_BASELINE BENCH_SCALE_PREFIX=base- BENCH_SCALE_PHASES=ramp \
		BENCH_SCALE_OPERATOR_ARGS=${BENCH_SCALE_BASELINE_OPERATOR_ARGS:-} \
		BENCH_SCALE_STEPS=${BENCH_SCALE_BASELINE_STEPS:-1000} BENCH_SCALE_IDLE_SECONDS=${BENCH_SCALE_BASELINE_IDLE_SECONDS:-5} \
		timeout 1800 cargo bench --locked -p e2e --bench scale
	# Its sessions go with their namespaces before the measured run starts:
	# their deletion would be reconciled (and counted) by the next operator.
	kubectl delete namespaces -l agentplane.dev/scale=true --wait=true --timeout=900s >/dev/null ||
		echo "scale: the baseline's namespaces were not gone within 900 s" >&2
	echo "scale: this tree's operator" >&2
fi
timeout "${BENCH_SCALE_TIMEOUT:-5400}" cargo bench --locked -p e2e --bench scale
