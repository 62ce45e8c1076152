//! The model-facing definitions of the six sandbox tools.
//!
//! Input schemas are the reference implementation's, field for field, so a
//! model trained on that toolset calls these unchanged. Descriptions are this
//! implementation's own and say what it actually does: no workdir
//! confinement, GNU grep, where a cut output's full text goes.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The sandbox tools of `agent_toolset_20260401`, in the wire's order.
pub const BUILTIN_TOOLS: [&str; 6] = ["bash", "read", "write", "edit", "glob", "grep"];

/// The toolset's tools that run in the executor's process, not the sandbox.
pub const WEB_TOOLS: [&str; 2] = ["web_fetch", "web_search"];

/// Largest file `edit` loads (the reference's edit cap); a bigger one is
/// modified with bash.
pub const MAX_FILE_BYTES: u64 = 256 << 10;

/// Most bytes one `read` returns, a whole file or a `view_range` selection:
/// the reference's read cap, lower than [`MAX_FILE_BYTES`] because a longer
/// tool result is cut by the model API without saying how to read the rest.
pub const MAX_READ_BYTES: u64 = 110_000;

/// Most paths one `glob` call returns.
pub const GLOB_RESULT_LIMIT: usize = 200;

/// Whether `name` is a built-in tool that executes in the executor's process
/// rather than the sandbox. One predicate, so the runner's refusal and the
/// webhook's warning cannot drift apart.
pub fn is_web_tool(name: &str) -> bool {
    WEB_TOOLS.contains(&name)
}

/// Whether `name` is a tool the `agent_toolset_20260401` wire knows.
pub(crate) fn is_agent_tool(name: &str) -> bool {
    BUILTIN_TOOLS.contains(&name) || is_web_tool(name)
}

/// One tool as the model is handed it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDefinition {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

const OUTPUT_NOTE: &str = "Output is cut at 100 KiB; when it is, the complete output is saved to a file in the sandbox and the result ends with that file's path.";

/// The definition of built-in tool `name`, or `None` for any other name.
pub fn definition(name: &str) -> Option<ToolDefinition> {
    let (description, input_schema) = match name {
        "bash" => (
            format!(
                "Run a command with /bin/bash inside the session's sandbox container. The working directory and exported environment variables persist between calls (they are saved after every command, so they also survive a restart of the runner); set restart to start from a fresh shell state. Standard input is empty. A job left running in the background keeps running but does not hold the call open. timeout_ms defaults to 120000 (2 minutes) and is capped at 600000 (10 minutes); on timeout every process the command started is killed. A non-zero exit status is reported as an error showing the output and the exit code. stdout and stderr are combined. {OUTPUT_NOTE}"
            ),
            json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The bash command to run."},
                    "restart": {"type": "boolean", "description": "Reset the shell state (working directory, environment) before running; with no command, only reset."},
                    "timeout_ms": {"type": "integer", "description": "Timeout for this call in milliseconds (default 120000, at most 600000)."}
                }
            }),
        ),
        "read" => (
            format!(
                "Read a UTF-8 text file in the sandbox. A relative path resolves against the session's working directory; an absolute path may point anywhere in the container (the container, not the working directory, is the boundary). view_range [start_line, end_line] selects lines, 1-based and inclusive; an end_line of -1 reads to the end. A file over 110000 bytes is refused unless a view_range selects at most 110000 bytes of it; binary files are refused: read those with bash (xxd, strings). {OUTPUT_NOTE}"
            ),
            json!({
                "type": "object",
                "properties": {
                    "file_path": {"type": "string", "description": "Path of the file to read: relative to the working directory, or absolute."},
                    "view_range": {"type": "array", "items": {"type": "integer"}, "description": "[start_line, end_line], 1-based and inclusive; end_line -1 means the last line."}
                },
                "required": ["file_path"]
            }),
        ),
        "write" => (
            "Write a UTF-8 text file in the sandbox, replacing it whole. A relative path resolves against the session's working directory; an absolute path may point anywhere in the container. Missing parent directories are created. The file is replaced atomically (written to a temporary file in the same directory, then renamed); an existing regular file keeps its permission bits, a new file gets 0644. A symbolic link at file_path is replaced by the file, not written through.".to_owned(),
            json!({
                "type": "object",
                "properties": {
                    "file_path": {"type": "string", "description": "Path of the file to write: relative to the working directory, or absolute."},
                    "content": {"type": "string", "description": "The complete new contents of the file."}
                },
                "required": ["file_path", "content"]
            }),
        ),
        "edit" => (
            "Replace old_string with new_string in a UTF-8 text file in the sandbox. old_string must occur exactly once unless replace_all is true, in which case every occurrence is replaced. A relative path resolves against the session's working directory; an absolute path may point anywhere in the container. Files over 256 KiB are refused. The file is replaced atomically and keeps its permission bits; a symbolic link at file_path is replaced by the edited file, not written through.".to_owned(),
            json!({
                "type": "object",
                "properties": {
                    "file_path": {"type": "string", "description": "Path of the file to edit: relative to the working directory, or absolute."},
                    "old_string": {"type": "string", "description": "The exact text to find."},
                    "new_string": {"type": "string", "description": "The text to put in its place."},
                    "replace_all": {"type": "boolean", "description": "Replace every occurrence instead of requiring exactly one."}
                },
                "required": ["file_path", "old_string", "new_string"]
            }),
        ),
        "glob" => (
            "List paths in the sandbox that match a glob pattern, newest first, at most 200. * and ? match within one path segment, [abc] matches a set, and ** matches any number of directories (e.g. src/**/*.rs). A relative pattern is matched under path (default: the session's working directory); an absolute pattern is matched from the container's root. Symbolic links are listed but not followed.".to_owned(),
            json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "Glob pattern, e.g. **/*.py; ** matches any depth."},
                    "path": {"type": "string", "description": "Directory to search under. Defaults to the working directory."}
                },
                "required": ["pattern"]
            }),
        ),
        "grep" => (
            format!(
                "Search file contents in the sandbox with GNU grep, recursively under path (default: the session's working directory; a file path searches that file). pattern is a Perl-compatible regular expression when the image's grep supports -P, otherwise a POSIX extended regular expression. Binary files are skipped. Each match comes back as path:line:text; no match is reported as \"no matches\". {OUTPUT_NOTE}"
            ),
            json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "Regular expression to search for."},
                    "path": {"type": "string", "description": "File or directory to search. Defaults to the working directory."}
                },
                "required": ["pattern"]
            }),
        ),
        _ => return None,
    };
    Some(ToolDefinition {
        name: name.to_owned(),
        description,
        input_schema,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn properties(name: &str) -> Vec<String> {
        let def = definition(name).expect("built-in");
        def.input_schema["properties"]
            .as_object()
            .expect("object schema")
            .keys()
            .cloned()
            .collect()
    }

    fn required(name: &str) -> Vec<String> {
        let def = definition(name).expect("built-in");
        serde_json::from_value(def.input_schema["required"].clone()).unwrap_or_default()
    }

    /// The input schemas are the reference's, field for field.
    #[test]
    fn schemas_match_the_reference_fields() {
        assert_eq!(properties("bash"), ["command", "restart", "timeout_ms"]);
        assert_eq!(properties("read"), ["file_path", "view_range"]);
        assert_eq!(properties("write"), ["file_path", "content"]);
        assert_eq!(
            properties("edit"),
            ["file_path", "old_string", "new_string", "replace_all"]
        );
        assert_eq!(properties("glob"), ["pattern", "path"]);
        assert_eq!(properties("grep"), ["pattern", "path"]);
        assert!(required("bash").is_empty());
        assert_eq!(required("read"), ["file_path"]);
        assert_eq!(required("write"), ["file_path", "content"]);
        assert_eq!(required("edit"), ["file_path", "old_string", "new_string"]);
        assert_eq!(required("glob"), ["pattern"]);
        assert_eq!(required("grep"), ["pattern"]);
        for name in BUILTIN_TOOLS {
            let def = definition(name).expect("built-in");
            assert_eq!(def.input_schema["type"], "object", "{name}");
            assert_eq!(def.name, name);
        }
    }

    /// Descriptions tell the truth about this implementation.
    #[test]
    fn descriptions_state_what_this_implementation_does() {
        let d = |n: &str| definition(n).expect("built-in").description;
        assert!(d("grep").contains("GNU grep"));
        assert!(d("read").contains("anywhere in the container"));
        assert!(!d("read").to_lowercase().contains("rooted at the workdir"));
        for n in ["bash", "read", "grep"] {
            assert!(d(n).contains("100 KiB") && d(n).contains("path"), "{n}");
        }
        assert!(d("bash").contains("600000") && d("bash").contains("120000"));
        assert!(
            d("glob").contains("newest first")
                && d("glob").contains(&GLOB_RESULT_LIMIT.to_string())
        );
        assert_eq!(MAX_FILE_BYTES, 256 * 1024);
        assert!(d("edit").contains("256 KiB"));
        assert_eq!(MAX_READ_BYTES, 110_000);
        assert!(d("read").contains("110000 bytes") && !d("read").contains("256 KiB"));
    }

    #[test]
    fn web_tools_are_known_but_not_sandbox_tools() {
        assert!(is_web_tool("web_fetch") && is_web_tool("web_search"));
        for name in BUILTIN_TOOLS {
            assert!(!is_web_tool(name));
            assert!(is_agent_tool(name));
        }
        assert!(is_agent_tool("web_search"));
        assert!(!is_web_tool("bash ") && !is_web_tool("WEB_FETCH") && !is_web_tool(""));
        assert!(definition("web_fetch").is_none() && definition("nope").is_none());
    }
}
