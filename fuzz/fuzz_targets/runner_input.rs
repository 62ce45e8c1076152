//! The runner's per-tool input parsing (Go `Runner.Run`'s decode of each
//! tool's input): `sidecar::fuzzing::check_input`, every check a tool makes
//! before it touches anything. The first byte picks the tool, the rest is
//! the input.
//!
//! Invariants: no panic; deterministic; every refusal names the tool and,
//! for an input that is a JSON object, the field at fault: `<tool>: <field>
//! ...` (`bash: command must be a string, not the number 5`), or `write
//! <file_path>: ...`. A refusal of an input that is not an object, or not
//! JSON (`invalid <tool> input: ...`), may name only the tool.
#![no_main]

use libfuzzer_sys::fuzz_target;

const TOOLS: [(&str, &[&str]); 6] = [
    ("bash", &["command", "restart", "timeout_ms"]),
    ("read", &["file_path", "view_range"]),
    ("write", &["file_path", "content"]),
    (
        "edit",
        &["file_path", "old_string", "new_string", "replace_all"],
    ),
    ("glob", &["pattern", "path"]),
    ("grep", &["pattern", "path"]),
];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, input)) = data.split_first() else {
        return;
    };
    let (tool, fields) = TOOLS[usize::from(pick) % TOOLS.len()];
    let verdict = sidecar::fuzzing::check_input(tool, input);
    assert_eq!(verdict, sidecar::fuzzing::check_input(tool, input));
    let Err(msg) = verdict else { return };
    let invalid = format!("invalid {tool} input: ");
    let rest = msg
        .strip_prefix(&invalid)
        .or_else(|| msg.strip_prefix(&format!("{tool}: ")));
    let object = serde_json::from_slice::<serde_json::Value>(input)
        .ok()
        .and_then(|v| v.as_object().cloned());
    let Some(object) = object else {
        assert!(
            rest.is_some() || msg.starts_with(&format!("{tool} ")),
            "a refusal that does not name its tool: {msg:?}"
        );
        return;
    };
    if let Some(file_path) = object.get("file_path").and_then(|p| p.as_str())
        && msg.starts_with(&format!("{tool} {file_path}: "))
    {
        return;
    }
    let Some(rest) = rest else {
        panic!("a refusal that names neither tool nor field: {msg:?}");
    };
    let named = fields.iter().any(|f| {
        rest.strip_prefix(f)
            .is_some_and(|r| r.starts_with([':', ' ', '[']))
    }) || (tool == "glob" && rest.starts_with("invalid pattern "));
    // Syntax is checked before fields (as the reference's decoder does), so
    // an object with trailing text is refused as text, naming no field.
    let not_json = msg.starts_with(&invalid);
    assert!(
        named || not_json,
        "a refusal of an object that names no field: {msg:?}"
    );
});
