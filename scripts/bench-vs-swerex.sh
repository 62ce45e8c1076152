#!/usr/bin/env bash
# The runner against SWE-ReX 1.4.0's swerex-remote, in one run on this
# machine: builds the runner (release), makes sure the pinned Python
# environment has grpcio and swe-rex (scripts/python-env.sh), then runs
# tests/bench/vs_swerex.py, which starts both servers on loopback / a Unix
# socket with their files on tmpfs, times bash, read, write and edit in each
# with one Python process, prints p50/p99 per op and column with the ratios,
# and the bare `bash -c true` spawn time; it stops both servers at the end.
#   scripts/bench-vs-swerex.sh [--iterations N] [--warmup N] [--tmpfs DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release -p sidecar --bin agent-sidecar >&2
PY=${AGENTPLANE_PYTHON:-$(scripts/python-env.sh)}
exec "$PY" tests/bench/vs_swerex.py \
  --runner "$CARGO_TARGET_DIR/release/agent-sidecar" \
  --proto runner-api/proto/runner.proto "$@"
