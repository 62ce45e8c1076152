//! JSON paths as the messages print them: `configs[2].permission_policy.type`.
//!
//! Paths are plain strings built as the walk descends, rather than a segment
//! list, because the only thing anyone does with them is read them.

/// The path of `key` inside the object at `base`. A key that is not a plain
/// identifier is quoted, so that `{"a.b": ..}` cannot read as a nested path.
pub(crate) fn key(base: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    match (base.is_empty(), plain) {
        (true, true) => key.to_owned(),
        (false, true) => format!("{base}.{key}"),
        (_, false) => format!("{base}[{}]", quote(key)),
    }
}

/// The path of element `i` of the array at `base`.
pub(crate) fn index(base: &str, i: usize) -> String {
    format!("{base}[{i}]")
}

/// `rel` re-rooted under `prefix`.
pub(crate) fn join(prefix: &str, rel: &str) -> String {
    if prefix.is_empty() {
        rel.to_owned()
    } else if rel.is_empty() || rel.starts_with('[') {
        format!("{prefix}{rel}")
    } else {
        format!("{prefix}.{rel}")
    }
}

fn quote(key: &str) -> String {
    serde_json::to_string(key).unwrap_or_else(|_| format!("{key:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_dotted_and_indexed_paths() {
        let p = key(&index(&key("", "configs"), 2), "permission_policy");
        assert_eq!(key(&p, "type"), "configs[2].permission_policy.type");
    }

    #[test]
    fn quotes_keys_that_are_not_identifiers() {
        assert_eq!(key("default_config", "a.b"), r#"default_config["a.b"]"#);
        assert_eq!(key("", ""), r#"[""]"#);
        assert_eq!(key("", "x\"y"), r#"["x\"y"]"#);
    }

    #[test]
    fn joins_under_a_prefix() {
        assert_eq!(
            join("spec.tools[0]", "configs[1].name"),
            "spec.tools[0].configs[1].name"
        );
        assert_eq!(join("spec.tools[0]", ""), "spec.tools[0]");
        assert_eq!(join("spec.tools[0]", "[\"a.b\"]"), "spec.tools[0][\"a.b\"]");
        assert_eq!(join("", "configs"), "configs");
    }
}
