#!/usr/bin/env bash
# Creates (once) the Python environment the tests use for a real MCP server:
# the official `mcp` SDK from PyPI, pinned. Prints the interpreter's path.
set -euo pipefail
VENV=${AGENTPLANE_VENV:-$HOME/.cache/agentplane/venv}
MCP_VERSION=1.26.0
if ! "$VENV/bin/python" -c "import mcp.server.fastmcp" >/dev/null 2>&1; then
  python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install -q "mcp==$MCP_VERSION" >&2
fi
echo "$VENV/bin/python"
