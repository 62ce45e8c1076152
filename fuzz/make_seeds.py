#!/usr/bin/env python3
"""Writes the committed seed corpora under fuzz/corpus/<target>/.

Hand-picked valid and invalid examples, most taken from the repository's
tests (toolset/tests, operator/tests, sidecar/tests) and examples/. Run from
anywhere; it rewrites only the files it names. libFuzzer adds what it finds
to a separate working corpus (fuzz/corpus-work, not committed).
"""
import glob, json, os, re, struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(HERE, "corpus")


def write(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# Toolset entries from the toolset crate's own tests (raw strings).
entries = set()
for path in glob.glob(os.path.join(ROOT, "toolset/tests/*.rs")) + glob.glob(
    os.path.join(ROOT, "toolset/src/*.rs")
):
    for m in re.finditer(r'r#"(\{.*?\})"#', open(path).read()):
        entries.add(m.group(1))
entries |= {
    '{"type":"agent_toolset_20260401","default_config":{"enabled":true,"permission_policy":{"type":"always_ask"}},"configs":[{"name":"bash","enabled":true,"permission_policy":{"type":"always_allow"}},{"name":"read","enabled":false},{"name":"web_search","enabled":true}]}',
    '{"type":"agent_toolset_20260401","configs":[{"name":"write","permission_policy":{"type":"always_ask"}}],"default_config":{"permission_policy":{"type":"always_allow"}}}',
    '{"type":"agent_toolset_20260401","default_config":{"a.b":1}}',
    '{"type":"agent_toolset_20260401","configs":[{"name":"grep","":{}}]}',
    '{"type":"mcp_toolset","mcp_server_name":"docs","default_config":{"permission_policy":{"type":"always_allow"}},"configs":[{"name":"search","enabled":false},{"name":"fetch","permission_policy":{"type":"always_ask"}}]}',
    '{"type":"mcp_toolset","mcp_server_name":"","configs":[]}',
    '{"type":"mcp_toolset","mcp_server_name":"s","configs":[{"name":"t","permission_policy":{"type":"always_deny"}}]}',
    '{"type":"mcp_toolset","mcp_server_name":"s","configs":[{"name":"t"},{"name":"t","enabled":false}]}',
    '{"type":"mcp_toolset","mcp_server_name":"s","unknown":true}',
    '{"type":"mcp_toolset","mcp_server_name":7}',
    '{"type":"custom","name":"lookup","input_schema":{"type":"object"}}',
    '[]', 'null', '"agent_toolset_20260401"', '{', '{"type":"agent_toolset_20260401","configs":[1e999]}',
}
entries = sorted(entries)
agent = [e for e in entries if "mcp_toolset" not in e]
mcp = [e for e in entries if "agent_toolset" not in e]
for i, e in enumerate(agent):
    write("validate", f"agent-{i:02}.json", e)
    write("policies_tools", f"agent-{i:02}.json", e)
for i, e in enumerate(mcp):
    write("validate_mcp_toolset", f"mcp-{i:02}.json", e)
for i, e in enumerate(entries):
    write("materialize", f"entry-{i:02}.json", e)
for i, e in enumerate(mcp):
    names = ["search", "fetch", "t", "", "search", "whatever"][: 1 + i % 6]
    write("resolve_mcp", f"mcp-{i:02}", e.encode() + b"".join(b"\0" + n.encode() for n in names))

# Admission reviews: the webhook tests' envelope around specs from the
# operator's tests, fixtures and examples.
def review(op, spec, obj=True):
    req = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "agentplane.dev", "version": "v1alpha1", "kind": "AgentSession"},
        "resource": {"group": "agentplane.dev", "version": "v1alpha1", "resource": "agentsessions"},
        "name": "demo", "namespace": "team-a", "operation": op,
        "userInfo": {"username": "alice"},
    }
    if obj:
        req["object"] = {"apiVersion": "agentplane.dev/v1alpha1", "kind": "AgentSession",
                         "metadata": {"name": "demo", "namespace": "team-a"}, "spec": spec}
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req})

import yaml
specs = []
for path in [os.path.join(ROOT, "examples/session.yaml"), os.path.join(ROOT, "operator/tests/fixtures/invalid-sessions.yaml")]:
    for doc in yaml.safe_load_all(open(path)):
        if doc and doc.get("kind") == "AgentSession":
            specs.append(doc["spec"])
specs += [
    {"image": "busybox", "tools": [{"type": "agent_toolset_20260401"}]},
    {"tools": "nope"},
    {"image": "busybox", "tools": [{"type": "agent_toolset_20260401", "configs": [{"name": "web_fetch", "enabled": True}]}]},
    {"image": "busybox", "tools": [{"type": "mcp_toolset", "mcp_server_name": "docs"}],
     "mcpServers": [{"name": "docs", "type": "url", "url": "http://docs.example/mcp"}]},
    {"image": "busybox", "tools": [{"type": "mcp_toolset", "mcp_server_name": "a"}, {"type": "mcp_toolset", "mcp_server_name": "a"}],
     "mcpServers": [{"name": "a", "type": "sse", "url": "ftp://x"}, {"name": "b", "type": "url"}]},
    {"image": "busybox", "tools": [{"type": "custom", "name": "bash", "input_schema": {}}, {"type": "custom", "name": "x y"}, {"type": "agent_toolset_20260401"}, {"type": "agent_toolset_20260401"}]},
    {"image": "busybox", "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
     "runtimeClassName": "gvisor", "nodeSelector": {"a.b/c": "d"}, "tolerations": [{"operator": "Exists"}],
     "workspace": {"persistentVolumeClaim": {"storageClassName": "fast", "size": "1Gi"}}},
]
for i, s in enumerate(specs):
    write("admission_review", f"create-{i:02}.json", review("CREATE", s))
write("admission_review", "update.json", review("UPDATE", specs[0]))
write("admission_review", "delete.json", review("DELETE", specs[0]))
write("admission_review", "no-object.json", review("CREATE", None, obj=False))
write("admission_review", "no-spec.json", review("CREATE", None).replace(',"spec": null', ''))
write("admission_review", "no-request.json", '{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}')
write("admission_review", "not-json", "{\"apiVersion\":")

# Tool inputs: first byte picks the tool (bash read write edit glob grep).
TOOLS = ["bash", "read", "write", "edit", "glob", "grep"]
inputs = {
    "bash": ['{"command":"echo hi"}', '{"restart":true}', '{"command":"true","timeout_ms":600001}',
             '{"command":"x","timeout_ms":-5}', '{"command":5}', '{"command":"a\\u0000b"}', '{}', '',
             '{not json', 'null', '[]', '{"command":"x","command":"y"}', '{"command":"sleep 1","timeout_ms":"x"}'],
    "read": ['{"file_path":"a.txt"}', '{"file_path":"a.txt","view_range":[1,20]}', '{"file_path":"a","view_range":[1]}',
             '{"file_path":""}', '{"view_range":[1,-1]}', '{"file_path":"a","view_range":[1.5,2]}'],
    "write": ['{"file_path":"a.txt","content":"x"}', '{"file_path":"dir/","content":""}', '{"file_path":"a"}',
              '{"content":"x"}', '{"file_path":"a","content":null}'],
    "edit": ['{"file_path":"a","old_string":"x","new_string":"y"}', '{"file_path":"a","old_string":"","new_string":"y"}',
             '{"file_path":"a","old_string":"x"}', '{"file_path":"a","old_string":"x","new_string":"y","replace_all":"yes"}'],
    "glob": ['{"pattern":"**/*.rs"}', '{"pattern":"/etc/*.conf","path":"x"}', '{"pattern":"a[","path":""}',
             '{"pattern":"{a,b"}', '{"pattern":""}', '{"pattern":"\\\\"}'],
    "grep": ['{"pattern":"fn main","path":"src"}', '{"pattern":""}', '{"path":"x"}', '{"pattern":["a"]}'],
}
for tool, xs in inputs.items():
    for i, x in enumerate(xs):
        write("runner_input", f"{tool}-{i:02}", bytes([TOOLS.index(tool)]) + x.encode())

# Output budget: u16 bound, mode byte, text.
texts = ["hello", "héllo wörld", "日本語のテキスト", "emoji 😀😀", "nul\0byte", "", "a" * 200, "abc-123.txt", ".hidden", "a/b"]
for i, t in enumerate(texts):
    for n, mode in [(3, 0), (7, 1), (100, 3), (65535, 0x81)]:
        write("output_cap", f"text-{i:02}-{n}-{mode}", struct.pack("<H", n) + bytes([mode]) + t.encode())
write("output_cap", "cut-utf8", struct.pack("<H", 4) + bytes([2]) + "ab".encode() + "é".encode()[:1])
write("output_cap", "bad-utf8", struct.pack("<H", 4) + bytes([3]) + b"\xff\xfeab\xc3")

# Durations, from toolset's duration and stall tests and Go's own table.
durations = ["30m", "1h30m", "+90s", "-30m", "0", "-0", "1.5h", ".5s", "1.s", "250ms", "3us", "3\u00b5s", "3\u03bcs",
             "7ns", "1h1m1s1ms", "", "-", "+", "30", "30mm", "m", "1x", ".s", "1h 30m", " 30m", "--30m", "1e3s",
             "99999999999999999999999h", "2562047h47m16.854775807s", "9223372036854775807ns", "-9223372036854775808ns",
             "9223372036854775808ns", "0.0000000000025h", "0.000000000007h", "1.0000000000000000000001s",
             "45m", "41m0s", "3h", "0.3333333333333333333h", "1.004s", "100.00100s", "52763797000ns",
             # Go's uint64 sum wraps to 0s (found by the duration target against the port).
             "9223372036854775808ns9223372036854775808ns"]
for i, d in enumerate(durations):
    write("duration", f"d-{i:02}", d)
print("seeds written to", OUT)
