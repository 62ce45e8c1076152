#!/usr/bin/env bash
# Runs every test tier of the project, cheapest first:
#   1. formatting and lints
#   2. Rust unit, property and process-level tests (toolset, runner over its
#      socket, operator pure parts, the operator's MCP client against a real
#      MCP server), a one-minute run of each fuzz target (needs the nightly
#      toolchain; cargo-fuzz is installed on first use), then the conformance suite (the runner against the Go
#      reference implementation, 333 call sequences)
#   3. the cluster harness smoke tests (real etcd, kube-apiserver, kubelet,
#      containerd) -- they bring a cluster up and down themselves
#   4. end to end on a fresh cluster: the operator and webhook against the
#      API server, sandbox pods from the project's own images, tool calls
#      through kubectl agent after helm install, and the telemetry contract
#      (operator spans and the runner's tool.execution.duration reaching a
#      real OpenTelemetry Collector)
# Needs root (the cluster). The first run builds Kubernetes from the Go
# module proxy into ~/.cache/agentplane (about 20 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}

# Each step names the free space where the build writes, so a run that fills
# the disk says where it stood. AGENTPLANE_LEAN_DISK=1 (set by .ci/run) also
# drops what later steps no longer need: the test executables once they ran,
# the fuzz build once it fuzzed, and Go's build cache once a Go tool is built
# (the binaries themselves are cached under ~/.cache/agentplane).
step() {
    printf '\n==> %s\n' "$*"
    mkdir -p "$CARGO_TARGET_DIR"
    df -h --output=avail,target "$CARGO_TARGET_DIR" | tail -1 | awk '{print "    (free: " $1 " on " $2 ")"}'
}
lean() { [[ ${AGENTPLANE_LEAN_DISK:-0} == 1 ]]; }
drop_go_build_cache() { if lean && command -v go >/dev/null; then go clean -cache || true; fi; }
drop_test_executables() {
    # Test executables sit in deps/ without an extension and are not hard
    # links of the binaries cargo build places in debug/ (those stay).
    lean || return 0
    find "$CARGO_TARGET_DIR/debug/deps" -maxdepth 1 -type f -perm -u+x ! -name '*.*' -links 1 -delete
}

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "Python environment: the MCP SDK (a real MCP server), grpcio (stock gRPC clients of the runner)"
AGENTPLANE_PYTHON=$(scripts/python-env.sh)
export AGENTPLANE_PYTHON

step "grpcurl, a stock grpc-go client of the runner (Go module proxy, cached)"
AGENTPLANE_GRPCURL=$(sidecar/tests/interop/grpcurl.sh)
export AGENTPLANE_GRPCURL
drop_go_build_cache

step "cargo test: unit, property and process-level tests"
cargo test --workspace --locked --exclude e2e
drop_test_executables

step "the Python client's unit tests (clients/python; its live tests run in the gateway's end-to-end test)"
"$AGENTPLANE_PYTHON" -m pytest -q -p no:cacheprovider clients/python/tests/unit

step "the Managed Agents stand-in against the official EnvironmentWorker (anthropic 2.10.0; tests/managed)"
"$AGENTPLANE_PYTHON" -m pytest -q -p no:cacheprovider tests/managed

step "fuzz: every fuzz target for 60 s (libFuzzer via cargo-fuzz, nightly; fuzz/, docs/reliability.md)"
scripts/fuzz.sh --time 60
if lean; then rm -rf fuzz/target; fi

step "conformance: the runner against the reference (anthropic-sdk-go v2.17.0 tools/agenttoolset), call by call"
tests/conformance/run.sh "$CARGO_TARGET_DIR/debug/agent-sidecar"

step "cluster harness smoke tests"
tests/cluster/smoke.sh
drop_go_build_cache

step "end to end on a real cluster"
cleanup() { tests/cluster/cluster.sh down >/dev/null 2>&1 || true; }
trap cleanup EXIT
tests/cluster/cluster.sh up
eval "$(tests/cluster/cluster.sh env)"   # KUBECONFIG, and PATH with the matching kubectl and helm
KUBECTL=$(command -v kubectl)
HELM=$(command -v helm)
export KUBECTL HELM
scripts/images.sh
tests/telemetry/collector.sh build   # a real OpenTelemetry Collector, from the Go module proxy (cached)
drop_go_build_cache
cargo build --locked -p operator -p kubectl-agent -p sidecar
cargo test --locked -p e2e -- --test-threads=1
