//! Call ids for calls nobody named.

/// A call id for a call the user did not name: unique per process and
/// time, and made only of characters the runner accepts in a call id (it
/// names the call's files in the sandbox).
pub fn generate_call_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("call-{nanos}-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_valid_call_ids() {
        let id = generate_call_id();
        assert!(id.len() <= 128, "{id}");
        assert!(!id.starts_with('.'), "{id}");
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)),
            "{id}"
        );
    }
}
