#!/usr/bin/env bash
# Conformance suite: the runner against the reference implementation
# (anthropic-sdk-go v2.17.0 tools/agenttoolset), call by call.
#
#   tests/conformance/run.sh [RUNNER_BINARY] [driver options...]
#   tests/conformance/run.sh --bench [RUNNER_BINARY]    # per-tool p50 latency
#
# RUNNER_BINARY defaults to target/debug/agent-sidecar. The reference program
# is built once per content of reference/ (go.mod, go.sum, main.go) into
# ~/.cache/agentplane/conformance-<hash>/ and reused. Prints one line per
# case and closes with exactly "N passed, N failed"; exits non-zero when a
# difference is not listed in divergences.json. Bounded: every call has a
# 20 s (or the case's) deadline, every sequence a process timeout, the whole
# run CONFORMANCE_DEADLINE seconds (default 1200) and an outer timeout.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
mode=run
if [[ "${1:-}" == "--bench" ]]; then mode=bench; shift; fi
runner="${1:-$repo/target/debug/agent-sidecar}"
[[ $# -gt 0 ]] && shift

export PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "run.sh: go not found (Go 1.26 is needed for the reference program)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "run.sh: python3 not found" >&2; exit 2; }
[[ -x "$runner" ]] || { echo "run.sh: runner binary not found: $runner (build it with cargo build -p sidecar)" >&2; exit 2; }

hash="$(cat "$here/reference/go.mod" "$here/reference/go.sum" "$here/reference/main.go" | sha256sum | cut -c1-16)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/agentplane/conformance-$hash"
ref="$cache/reference"
if [[ ! -x "$ref" ]]; then
  echo "building the reference program into $cache" >&2
  mkdir -p "$cache"
  (cd "$here/reference" && GOFLAGS=-mod=readonly timeout 900 go build -trimpath -o "$ref.tmp" .)
  mv "$ref.tmp" "$ref"
fi

if [[ "$mode" == bench ]]; then
  exec timeout 900 python3 "$here/driver.py" bench --ref "$ref" --runner "$runner" "$@"
fi
deadline="${CONFORMANCE_DEADLINE:-1200}"
exec timeout --kill-after=30 "$((deadline + 120))" \
  python3 "$here/driver.py" run --ref "$ref" --runner "$runner" --deadline "$deadline" "$@"
