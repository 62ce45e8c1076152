"""A small real MCP server for the operator's tests, on the official SDK.

Serves Streamable HTTP at http://127.0.0.1:PORT/mcp with three tools. Run:
    python mcp_server.py PORT
"""

import sys

from mcp.server.fastmcp import FastMCP

port = int(sys.argv[1])
server = FastMCP("docs", host="127.0.0.1", port=port, log_level="WARNING")


@server.tool()
def search(query: str) -> str:
    """Search the documentation for a query."""
    return f"results for {query}"


@server.tool()
def fetch_page(url: str) -> str:
    """Fetch one documentation page."""
    return f"page {url}"


@server.tool()
def delete_page(url: str) -> str:
    """Delete a documentation page."""
    return f"deleted {url}"


if __name__ == "__main__":
    server.run(transport="streamable-http")
