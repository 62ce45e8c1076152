//! The six tools. Each parses its own input (the reference's field names and
//! requiredness) and answers with an [`Output`]: a tool error is an `Output`
//! with `is_error`, a fault of the runner is an `Err`.
//!
//! The files here import one way: each tool uses [`ctx`], [`input`] and the
//! helpers below them, `bash` also [`shell`]; nothing below a tool uses a
//! tool, and no file uses this one, which only declares them and dispatches
//! the input checks.

pub mod bash;
pub mod callfiles;
pub mod ctx;
pub mod edit;
pub mod glob;
pub mod grep;
pub mod input;
pub mod late;
pub mod links;
pub mod programs;
pub mod read;
pub mod shell;
pub mod sorted_walk;
pub mod write;

pub use ctx::{CallLimits, Ctx, DEFAULT_MAX_CALL_OUTPUT_BYTES};
pub use programs::BASH;

use crate::output::Output;

/// Checks a call's input as the tool named `tool` would before it touches
/// anything: decoding, required fields, the shape of each field (and glob's
/// pattern). `Err` carries the tool error the call would answer with. For
/// the fuzz targets; [`crate::Runner::run`] goes through each tool's `run`,
/// which uses the same checks.
#[doc(hidden)]
pub fn check_input(tool: &str, input: &[u8]) -> Result<(), String> {
    let checked = match tool {
        "bash" => bash::check(input),
        "read" => read::check(input),
        "write" => write::check(input),
        "edit" => edit::check(input),
        "glob" => glob::check(input),
        "grep" => grep::check(input),
        other => Err(Output::error(format!("unknown tool {other:?}"))),
    };
    checked.map_err(|out| match out.body {
        crate::output::Body::Text(text) => text,
        _ => String::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::check_input;

    fn refusal(tool: &str, input: &str) -> String {
        check_input(tool, input.as_bytes()).expect_err(input)
    }

    /// What the runner_input fuzz target's "every refusal names a path"
    /// invariant requires, in the tool's terms: serde's messages named the
    /// runner's Rust types (`invalid length 2, expected struct Input with
    /// 3 elements`, `expected i64`), which say nothing to a model (issue 21).
    #[test]
    fn refusals_name_the_field_at_fault() {
        for (tool, input, want) in [
            (
                "bash",
                r#"{"command":"x","timeout_ms":"5"}"#,
                "bash: timeout_ms must be a whole number of milliseconds, not a string",
            ),
            (
                "bash",
                r#"{"command":5}"#,
                "bash: command must be a string, not the number 5",
            ),
            (
                "bash",
                r#"{"command":"x","restart":"yes"}"#,
                "bash: restart must be true or false, not a string",
            ),
            (
                "bash",
                r#"["x",1]"#,
                "invalid bash input: must be a JSON object, not an array",
            ),
            (
                "read",
                r#"{"file_path":"a","view_range":[1.5,2]}"#,
                "read: view_range must be [start_line, end_line]",
            ),
            (
                "read",
                r#"{"file_path":"a","view_range":"1-2"}"#,
                "read: view_range must be [start_line, end_line]",
            ),
            (
                "read",
                r#"{"file_path":"a","view_range":[1]}"#,
                "read: view_range must be [start_line, end_line]",
            ),
            (
                "edit",
                r#"{"file_path":"a","old_string":"x","new_string":"y","replace_all":"yes"}"#,
                "edit: replace_all must be true or false, not a string",
            ),
            (
                "write",
                r#"{"file_path":3,"content":"x"}"#,
                "write: file_path must be a string, not the number 3",
            ),
            (
                "glob",
                r#"{"pattern":["*"]}"#,
                "glob: pattern must be a string, not an array",
            ),
            (
                "grep",
                r#"{"pattern":"x","path":{}}"#,
                "grep: path must be a string, not an object",
            ),
            // Not JSON: the reference's decoder's words.
            (
                "bash",
                r#"{"command":"x"} x"#,
                "invalid bash input: invalid character 'x' after top-level value",
            ),
            (
                "grep",
                " ",
                "invalid grep input: unexpected end of JSON input",
            ),
            // The checks after decoding; null is nothing given.
            ("bash", "{}", "bash: command is required"),
            ("bash", "null", "bash: command is required"),
            ("bash", r#"{"command":null}"#, "bash: command is required"),
            (
                "read",
                r#"{"file_path":"a","file_path":"b"}"#,
                "read: file_path is given more than once; give it once",
            ),
        ] {
            assert_eq!(refusal(tool, input), want, "{tool} {input}");
        }
        assert_eq!(check_input("bash", br#"{"restart":true}"#), Ok(()));
        assert_eq!(
            check_input("bash", br#"{"command":"x","other":[1,{"a":2}]}"#),
            Ok(())
        );
        assert!(
            refusal("glob", r#"{"pattern":"a["}"#).starts_with("glob: invalid pattern \"a[\": ")
        );
        assert!(
            refusal("write", r#"{"file_path":"d/","content":""}"#)
                .starts_with("write d/: the path ends in")
        );
    }
}
