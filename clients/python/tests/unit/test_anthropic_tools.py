"""Session tools as Anthropic tool definitions."""

import pytest

from agentplane import Tool, anthropic_tools, policies

SCHEMA = {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}

SESSION = {
    "apiVersion": "agentplane.dev/v1alpha1",
    "kind": "AgentSession",
    "metadata": {"name": "demo"},
    "status": {
        "phase": "Ready",
        "tools": [
            {"name": "bash", "description": "Run a command", "inputSchema": {"type": "object"},
             "policy": "always_ask", "source": "agent_toolset_20260401"},
            {"name": "read", "description": "Read a file", "inputSchema": SCHEMA, "source": "agent_toolset_20260401"},
        ],
        "policies": {"bash": "always_ask", "read": "always_allow"},
    },
}

EXPECTED = [
    {"name": "bash", "description": "Run a command", "input_schema": {"type": "object"}},
    {"name": "read", "description": "Read a file", "input_schema": SCHEMA},
]


def test_from_a_session_object_its_status_and_its_tools_list():
    assert anthropic_tools(SESSION) == EXPECTED
    assert anthropic_tools(SESSION["status"]) == EXPECTED
    assert anthropic_tools(SESSION["status"]["tools"]) == EXPECTED


def test_from_the_gateways_answer_and_tool_objects():
    answer = {"tools": [
        {"name": "bash", "description": "Run a command", "input_schema": {"type": "object"},
         "permission_policy": "always_ask"},
        {"name": "read", "description": "Read a file", "input_schema": SCHEMA, "permission_policy": "always_allow"},
    ]}
    assert anthropic_tools(answer) == EXPECTED
    assert anthropic_tools([Tool.from_json(t) for t in answer["tools"]]) == EXPECTED


def test_only_the_three_fields_and_a_copy_of_the_schema():
    out = anthropic_tools(SESSION)
    assert all(set(d) == {"name", "description", "input_schema"} for d in out)
    out[1]["input_schema"]["x"] = 1
    assert "x" not in SCHEMA


def test_a_missing_description_or_schema_is_filled_in():
    assert anthropic_tools([{"name": "t"}]) == [
        {"name": "t", "description": "", "input_schema": {"type": "object", "properties": {}}}]


def test_a_status_without_tools_yet():
    assert anthropic_tools({"status": {"phase": "Pending"}}) == []
    assert anthropic_tools({"metadata": {}}) == []


def test_bad_input():
    with pytest.raises(ValueError):
        anthropic_tools([{"description": "no name"}])
    with pytest.raises(TypeError):
        anthropic_tools("bash")


def test_policies_from_each_source():
    want = {"bash": "always_ask", "read": "always_allow"}
    assert policies(SESSION) == want
    assert policies([Tool("bash", "", {}, "always_ask"), Tool("read", "", {}, "always_allow")]) == want
    assert policies({"tools": [{"name": "bash", "permission_policy": "always_ask"}, {"name": "read"}]}) == want
