#!/usr/bin/env bash
# Builds (once) grpcurl, a stock grpc-go client that learns every service
# from server reflection (v1), from the Go module proxy at a pinned version,
# into ~/.cache/agentplane/bin. Prints the binary's path.
set -euo pipefail
VERSION=v1.9.3
BIN_DIR=${AGENTPLANE_CACHE:-$HOME/.cache/agentplane}/bin
OUT=$BIN_DIR/grpcurl-$VERSION
if [ ! -x "$OUT" ]; then
  mkdir -p "$BIN_DIR"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  GOBIN=$tmp go install "github.com/fullstorydev/grpcurl/cmd/grpcurl@$VERSION" >&2
  mv "$tmp/grpcurl" "$OUT"
fi
echo "$OUT"
