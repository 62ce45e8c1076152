"""Tool definitions for the Anthropic Messages API from a session's tools."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .gateway import Tool


def anthropic_tools(source) -> list[dict]:
    """``[{"name", "description", "input_schema"}, ...]`` for the Messages API's ``tools``.

    ``source`` is any of: an AgentSession object (its ``status.tools``), a
    session's status, the gateway's ``{"tools": [...]}`` answer, or a list
    of tools -- ``Tool`` s from ``SessionHandle.tools()``, status entries
    (``inputSchema``) or gateway entries (``input_schema``).
    """
    return [_definition(t) for t in _tool_list(source)]


def _tool_list(source) -> Iterable:
    if isinstance(source, Mapping):
        if isinstance(source.get("status"), Mapping):
            source = source["status"]
        tools = source.get("tools")
        if tools is None:
            return []
        if not isinstance(tools, list):
            raise TypeError("tools must be a list")
        return tools
    if isinstance(source, (list, tuple)):
        return source
    raise TypeError(f"cannot read tools from {type(source).__name__}")


def _definition(tool) -> dict:
    if isinstance(tool, Tool):
        name, description, schema = tool.name, tool.description, tool.input_schema
    elif isinstance(tool, Mapping):
        name = tool.get("name")
        description = tool.get("description") or ""
        schema = tool.get("input_schema", tool.get("inputSchema"))
    else:
        raise TypeError(f"a tool is a Tool or a mapping, not {type(tool).__name__}")
    if not isinstance(name, str) or not name:
        raise ValueError(f"a tool without a name: {tool!r}"[:300])
    if not isinstance(schema, Mapping):
        schema = {"type": "object", "properties": {}}
    return {"name": name, "description": str(description), "input_schema": dict(schema)}


def policies(source) -> dict[str, str]:
    """Tool name -> permission policy, from the same sources as ``anthropic_tools``
    (a status entry's ``policy``, else the status's ``policies`` map, else always_allow)."""
    status_policies = {}
    if isinstance(source, Mapping):
        status = source.get("status") if isinstance(source.get("status"), Mapping) else source
        if isinstance(status.get("policies"), Mapping):
            status_policies = dict(status["policies"])
    out = {}
    for t in _tool_list(source):
        if isinstance(t, Tool):
            out[t.name] = t.permission_policy
        elif isinstance(t, Mapping) and isinstance(t.get("name"), str):
            out[t["name"]] = (t.get("permission_policy") or t.get("policy")
                              or status_policies.get(t["name"]) or "always_allow")
    return out
