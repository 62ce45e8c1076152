//! Decoding a tool's input: the reference's field names and requiredness,
//! and refusals that say what is wrong in the tool's terms.

use serde::de::DeserializeOwned;

use crate::output::Output;

/// Decodes a tool's input the way the reference does (unknown fields are
/// ignored), answering a malformed one with `invalid <tool> input: ...`,
/// naming the field when the fault is inside one (`invalid bash input:
/// timeout_ms: invalid type: ...`), as the reference's decoder does.
/// Empty input (nothing, or only JSON whitespace) is not JSON: it gets the
/// reference's own words for it rather than serde's position report.
pub(crate) fn parse<T: DeserializeOwned>(tool: &str, input: &[u8]) -> Result<T, Output> {
    if input
        .iter()
        .all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
    {
        return Err(Output::error(format!(
            "invalid {tool} input: unexpected end of JSON input"
        )));
    }
    let mut de = serde_json::Deserializer::from_slice(input);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match path.as_str() {
            "." => Output::error(format!("invalid {tool} input: {inner}")),
            _ => Output::error(format!("invalid {tool} input: {path}: {inner}")),
        }
    })?;
    // Trailing characters after the object, as serde_json::from_slice checks.
    de.end()
        .map_err(|e| Output::error(format!("invalid {tool} input: {e}")))?;
    Ok(value)
}

/// A required, non-empty string field.
pub(crate) fn required<'a>(
    tool: &str,
    field: &str,
    v: &'a Option<String>,
) -> Result<&'a str, Output> {
    match v.as_deref() {
        Some(s) if !s.is_empty() => Ok(s),
        _ => Err(Output::error(format!("{tool}: {field} is required"))),
    }
}
