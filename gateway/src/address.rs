//! A session's address as callers give it: namespace and name. Both are
//! checked as Kubernetes names before they reach a cache key, a log line or
//! a SubjectAccessReview, so a path such as `../x` or `a%2Fb` names nothing.

use crate::error::{Error, Result};

/// A session, by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionAddr {
    pub namespace: String,
    pub name: String,
}

impl SessionAddr {
    /// The address, if both parts are valid names.
    pub fn new(namespace: &str, name: &str) -> Result<Self> {
        dns_label(namespace, "namespace", 63)?;
        dns_subdomain(name, "session name")?;
        Ok(Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }
}

impl std::fmt::Display for SessionAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

fn shown(s: &str) -> String {
    let mut out: String = s.chars().take(64).collect();
    if s.chars().count() > 64 {
        out.push('…');
    }
    format!("{out:?}")
}

/// RFC 1123 label: lower-case alphanumerics and '-', alphanumeric at both
/// ends, at most `max` characters.
fn dns_label(s: &str, what: &str, max: usize) -> Result<()> {
    let ok = !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "{what} {} is not a valid Kubernetes name (lower-case letters, digits and '-', at most {max} characters)",
            shown(s)
        )))
    }
}

/// RFC 1123 subdomain: labels joined by '.', at most 253 characters.
fn dns_subdomain(s: &str, what: &str) -> Result<()> {
    if s.is_empty() || s.len() > 253 || s.split('.').any(|l| dns_label(l, what, 63).is_err()) {
        return Err(Error::Invalid(format!(
            "{what} {} is not a valid Kubernetes name (lower-case letters, digits, '-' and '.', at most 253 characters)",
            shown(s)
        )));
    }
    Ok(())
}

/// A call id as the runner accepts it: what names a spill file.
pub fn call_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && !id.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "call id {} must be 1-128 characters of letters, digits, '-', '_' and '.', not starting with '.'",
            shown(id)
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_could_reach_elsewhere_are_refused() {
        assert!(SessionAddr::new("team-a", "demo").is_ok());
        assert!(SessionAddr::new("team-a", "demo.v2").is_ok());
        for (ns, name) in [
            ("team-a", "../x"),
            ("team-a", "a/b"),
            ("team-a", "a%2Fb"),
            ("../kube-system", "x"),
            ("Team", "x"),
            ("", "x"),
            ("team-a", ""),
            ("team-a", "x\n"),
            ("team-a", &"a".repeat(254)),
            (&"a".repeat(64), "x"),
        ] {
            let e = SessionAddr::new(ns, name).expect_err(name);
            assert!(matches!(e, Error::Invalid(_)), "{e}");
        }
        let long = SessionAddr::new("team-a", &"a".repeat(10_000)).expect_err("long");
        assert!(long.to_string().len() < 300, "the message is bounded");
    }

    #[test]
    fn call_ids_name_files_safely() {
        assert!(call_id("toolu_01AbC-9.x").is_ok());
        for bad in ["", ".hidden", "a/b", "a b", &"x".repeat(129)] {
            assert!(call_id(bad).is_err(), "{bad}");
        }
    }
}
