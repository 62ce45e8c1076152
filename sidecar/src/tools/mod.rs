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
    /// invariant requires. Before, serde's message for a field of the wrong
    /// type named no field (`invalid bash input: invalid type: string "5",
    /// expected i64 ...`), where the reference's decoder names it.
    #[test]
    fn refusals_name_the_field_at_fault() {
        assert_eq!(
            refusal("bash", r#"{"command":"x","timeout_ms":"5"}"#),
            "invalid bash input: timeout_ms: invalid type: string \"5\", expected i64 at line 1 column 31"
        );
        assert!(
            refusal("read", r#"{"file_path":"a","view_range":[1.5,2]}"#)
                .starts_with("invalid read input: view_range[0]: invalid type: floating point")
        );
        assert!(
            refusal(
                "edit",
                r#"{"file_path":"a","old_string":"x","new_string":"y","replace_all":"yes"}"#
            )
            .starts_with("invalid edit input: replace_all: invalid type")
        );
        // Not an object, or not JSON: only the tool's input as a whole.
        assert!(refusal("bash", "null").starts_with("invalid bash input: invalid type: null"));
        assert!(
            refusal("bash", r#"{"command":"x"} x"#)
                .starts_with("invalid bash input: trailing characters")
        );
        assert_eq!(
            refusal("grep", " "),
            "invalid grep input: unexpected end of JSON input"
        );
        // The checks after decoding.
        assert_eq!(refusal("bash", "{}"), "bash: command is required");
        assert_eq!(check_input("bash", br#"{"restart":true}"#), Ok(()));
        assert!(
            refusal("glob", r#"{"pattern":"a["}"#).starts_with("glob: invalid pattern \"a[\": ")
        );
        assert!(
            refusal("write", r#"{"file_path":"d/","content":""}"#)
                .starts_with("write d/: the path ends in")
        );
        assert_eq!(
            refusal("read", r#"{"file_path":"a","view_range":[1]}"#),
            "read: view_range must be [start_line, end_line]"
        );
    }
}
