#!/usr/bin/env bash
# Builds the project's images without Docker and imports them into the test
# cluster's containerd:
#   localhost/agentplane/runner:dev      the static agent-sidecar at /agent-sidecar
#   localhost/agentplane/operator:dev    the static agent-operator at /agent-operator
#   localhost/agentplane/gateway:dev     the static agent-gateway at /agent-gateway
#   localhost/agentplane/dispatcher:dev  the static agent-dispatcher at /agent-dispatcher
#   localhost/agentplane/sandbox-base:dev  bash, GNU grep, coreutils (tests/cluster)
# The binaries are statically linked (glibc, crt-static) so they run in any image.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=x86_64-unknown-linux-gnu
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}

echo "==> building static agent-sidecar, agent-operator, agent-gateway and agent-dispatcher (release)"
RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --locked --target "$TARGET" \
  -p sidecar --bin agent-sidecar -p operator --bin agent-operator -p gateway --bin agent-gateway \
  -p dispatcher --bin agent-dispatcher
bin="$CARGO_TARGET_DIR/$TARGET/release"

echo "==> packing and importing images"
tests/cluster/image.sh load localhost/agentplane/runner:dev "$bin/agent-sidecar"
tests/cluster/image.sh load localhost/agentplane/operator:dev "$bin/agent-operator"
tests/cluster/image.sh load localhost/agentplane/gateway:dev "$bin/agent-gateway"
tests/cluster/image.sh load localhost/agentplane/dispatcher:dev "$bin/agent-dispatcher"
tests/cluster/image.sh sandbox-base
tests/cluster/image.sh list
