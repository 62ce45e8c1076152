#!/usr/bin/env bash
# Creates (once) the Python environment the tests and benchmarks use, every
# package from PyPI and pinned:
#   - the official `mcp` SDK, for a real MCP server;
#   - `grpcio`, `grpcio-tools`, `grpcio-reflection`, `grpcio-health-checking`:
#     a stock gRPC client (and stub generator) for the runner's interop tests;
#   - `swe-rex`, whose `swerex-remote` the runner is benchmarked against
#     (scripts/bench-vs-swerex.sh), and `aiohttp`, which its client
#     (swerex.runtime.remote) imports but swe-rex 1.4.0 does not declare;
#   - `pytest`, which runs the Python client's tests (clients/python), and
#     `pyyaml`, which its Cluster.from_kubeconfig reads a kubeconfig with;
#   - `anthropic`, whose EnvironmentWorker (the official Managed Agents
#     self-hosted worker) checks the work-queue stand-in (tests/managed).
# Idempotent: it installs only when an import (or a version) is missing, and
# re-running after the pins change brings the venv to the new pins.
# Prints the interpreter's path.
set -euo pipefail
VENV=${AGENTPLANE_VENV:-$HOME/.cache/agentplane/venv}
MCP_VERSION=1.26.0
GRPC_VERSION=1.85.1
SWEREX_VERSION=1.4.0
AIOHTTP_VERSION=3.14.5
PYTEST_VERSION=9.2.0
PYYAML_VERSION=6.0.3
ANTHROPIC_VERSION=2.10.0
PINS=(
  "mcp==$MCP_VERSION"
  "grpcio==$GRPC_VERSION"
  "grpcio-tools==$GRPC_VERSION"
  "grpcio-reflection==$GRPC_VERSION"
  "grpcio-health-checking==$GRPC_VERSION"
  "swe-rex==$SWEREX_VERSION"
  "aiohttp==$AIOHTTP_VERSION"
  "pytest==$PYTEST_VERSION"
  "pyyaml==$PYYAML_VERSION"
  "anthropic==$ANTHROPIC_VERSION"
)
# The pins, one a line: the venv is current when its stamp holds exactly these.
STAMP="$VENV/.agentplane-pins"
want=$(printf '%s\n' "${PINS[@]}")
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ] ||
  ! "$VENV/bin/python" -c "import mcp.server.fastmcp, grpc, grpc_tools.protoc, grpc_reflection, grpc_health, swerex.runtime.remote, pytest, yaml, anthropic.lib.environments" >/dev/null 2>&1; then
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install -q --disable-pip-version-check "${PINS[@]}" >&2
  printf '%s\n' "$want" >"$STAMP"
fi
echo "$VENV/bin/python"
