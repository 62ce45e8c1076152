//! A walk over raw JSON that keeps what a typed decode throws away.
//!
//! The toolset rules need three things `serde` derives cannot give: an
//! explicit `null` told apart from an absent key, a duplicate key noticed
//! rather than silently overwritten, and every value's original bytes so that
//! materialisation can echo a stored value exactly as it was stored. So each
//! level is read as an ordered list of `(key, raw value)` pairs and only the
//! leaves a rule needs are decoded.

use std::collections::HashSet;
use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::error::ToolsetError;
use crate::path;

/// The JSON type of a raw value, named as messages print it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

impl Kind {
    pub(crate) fn of(v: &RawValue) -> Self {
        match v.get().trim_start().as_bytes().first() {
            Some(b'n') => Self::Null,
            Some(b't' | b'f') => Self::Bool,
            Some(b'"') => Self::String,
            Some(b'[') => Self::Array,
            Some(b'{') => Self::Object,
            _ => Self::Number,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Null => "null",
            Self::Bool => "a boolean",
            Self::Number => "a number",
            Self::String => "a string",
            Self::Array => "an array",
            Self::Object => "an object",
        }
    }
}

/// An object's members in document order, duplicates included.
#[derive(Debug)]
pub(crate) struct Members<'a>(pub(crate) Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(pair) = map.next_entry::<String, &'de RawValue>()? {
                    out.push(pair);
                }
                Ok(Members(out))
            }
        }
        d.deserialize_map(V)
    }
}

impl<'a> Members<'a> {
    /// The value of `key`, if present. Only meaningful after
    /// [`object`] has refused duplicates.
    pub(crate) fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }

    /// Refuses any key outside `allowed`, naming the first offender's path.
    pub(crate) fn only(&self, base: &str, allowed: &[&str]) -> Result<(), ToolsetError> {
        match self.0.iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
            Some((k, _)) => Err(ToolsetError::UnknownKey {
                path: path::key(base, k),
                allowed: allowed.join(", "),
            }),
            None => Ok(()),
        }
    }
}

/// Parses one entry's bytes. Invalid UTF-8 and invalid JSON are both syntax
/// errors at the entry's root.
pub(crate) fn parse(raw: &[u8]) -> Result<&RawValue, ToolsetError> {
    serde_json::from_slice::<&RawValue>(raw).map_err(|e| ToolsetError::Syntax {
        path: String::new(),
        message: e.to_string(),
    })
}

fn wrong(path: &str, expected: &'static str, v: &RawValue) -> ToolsetError {
    ToolsetError::WrongType {
        path: path.to_owned(),
        expected,
        found: Kind::of(v).name(),
    }
}

/// The members of the object `v` at `path`, refusing a non-object and a
/// repeated key.
pub(crate) fn object<'a>(v: &'a RawValue, path: &str) -> Result<Members<'a>, ToolsetError> {
    if Kind::of(v) != Kind::Object {
        return Err(wrong(path, "an object", v));
    }
    let members: Members<'a> = serde_json::from_str(v.get()).map_err(|e| ToolsetError::Syntax {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    let mut seen = HashSet::with_capacity(members.0.len());
    for (k, _) in &members.0 {
        if !seen.insert(k.as_str()) {
            return Err(ToolsetError::DuplicateKey {
                path: path::key(path, k),
            });
        }
    }
    Ok(members)
}

/// The members of the object `v`, or `None` when it is not an object or not
/// well formed. For materialisation, which validates nothing.
pub(crate) fn object_lenient(v: &RawValue) -> Option<Members<'_>> {
    if Kind::of(v) != Kind::Object {
        return None;
    }
    serde_json::from_str(v.get()).ok()
}

/// The elements of the array `v` at `path`.
pub(crate) fn array<'a>(v: &'a RawValue, path: &str) -> Result<Vec<&'a RawValue>, ToolsetError> {
    if Kind::of(v) != Kind::Array {
        return Err(wrong(path, "an array", v));
    }
    serde_json::from_str(v.get()).map_err(|e| ToolsetError::Syntax {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

/// The boolean `v` at `path`.
pub(crate) fn boolean(v: &RawValue, path: &str) -> Result<bool, ToolsetError> {
    match v.get().trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(wrong(path, "a boolean", v)),
    }
}

/// The string `v` at `path`.
pub(crate) fn string(v: &RawValue, path: &str) -> Result<String, ToolsetError> {
    if Kind::of(v) != Kind::String {
        return Err(wrong(path, "a string", v));
    }
    serde_json::from_str(v.get()).map_err(|e| ToolsetError::Syntax {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

/// The string `v`, or `None` when it is not one.
pub(crate) fn string_lenient(v: &RawValue) -> Option<String> {
    serde_json::from_str(v.get()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> &RawValue {
        parse(s.as_bytes()).expect("test JSON parses")
    }

    #[test]
    fn kinds_are_read_from_the_first_byte() {
        for (text, kind) in [
            ("null", Kind::Null),
            ("true", Kind::Bool),
            ("false", Kind::Bool),
            ("-1.5e3", Kind::Number),
            ("\"x\"", Kind::String),
            ("[]", Kind::Array),
            ("{}", Kind::Object),
        ] {
            assert_eq!(Kind::of(raw(text)), kind, "{text}");
        }
    }

    #[test]
    fn objects_keep_order_and_refuse_duplicates() {
        let m = object(raw(r#"{"b":1,"a":{"x":2}}"#), "").expect("object");
        let keys: Vec<_> = m.0.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["b", "a"]);
        assert_eq!(m.get("a").map(RawValue::get), Some(r#"{"x":2}"#));

        let err = object(raw(r#"{"a":1,"b":2,"a":3}"#), "default_config").unwrap_err();
        assert_eq!(
            err,
            ToolsetError::DuplicateKey {
                path: "default_config.a".into()
            }
        );
    }

    #[test]
    fn null_is_a_type_not_an_absence() {
        let err = boolean(raw("null"), "enabled").unwrap_err();
        assert_eq!(err.to_string(), "enabled: expected a boolean, found null");
        let err = object(raw("null"), "default_config").unwrap_err();
        assert_eq!(
            err.to_string(),
            "default_config: expected an object, found null"
        );
    }

    #[test]
    fn syntax_errors_are_reported_at_the_root() {
        let err = parse(b"{\"type\":").unwrap_err();
        assert!(matches!(err, ToolsetError::Syntax { ref path, .. } if path.is_empty()));
        assert!(err.to_string().starts_with("entry: not valid JSON"));
        assert!(parse(b"\xff").is_err());
    }
}
