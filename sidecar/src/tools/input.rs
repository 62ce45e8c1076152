//! Decoding a tool's input: the reference's field names and requiredness,
//! and refusals that say what is wrong in the tool's terms.
//!
//! The input is decoded as a JSON object of loose values, and each tool asks
//! for its fields by name and kind, so that what the model reads is about
//! its call (`bash: command must be a string, not a number`), never about
//! the decoder (`invalid length 2, expected struct Input with 3 elements`,
//! `expected i64`, which named the runner's own Rust types). Text that is
//! not JSON at all gets the words the reference's decoder (Go's
//! `encoding/json`) uses for it, so a model that has learnt them reads the
//! same sentence here.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::Value;

use crate::output::Output;

/// A tool's input: its top-level members, in order, repeats kept so that a
/// field given twice can be refused rather than resolved by reading order.
#[derive(Debug)]
pub(crate) struct Fields {
    tool: &'static str,
    members: Vec<(String, Value)>,
}

/// The top-level object, or `null` (which the reference's decoder reads as
/// an empty object: nothing given).
struct Members(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Members {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Members, E> {
                Ok(Members(Vec::new()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members, A::Error> {
                let mut members = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Value>()? {
                    members.push((k, v));
                }
                Ok(Members(members))
            }
        }
        d.deserialize_any(V)
    }
}

/// Decodes a tool's input. Unknown fields are ignored, as the reference's
/// decoder ignores them; `null` is an empty input, as there.
pub(crate) fn parse(tool: &'static str, input: &[u8]) -> Result<Fields, Output> {
    match serde_json::from_slice::<Members>(input) {
        Ok(Members(members)) => Ok(Fields { tool, members }),
        Err(e) => Err(Output::error(format!(
            "invalid {tool} input: {}",
            not_an_object(input, &e)
        ))),
    }
}

/// Why `input` is no tool input: Go's words for text that is not JSON, or
/// the kind of JSON value it is instead of an object.
fn not_an_object(input: &[u8], e: &serde_json::Error) -> String {
    use serde_json::error::Category;
    // Go checks the whole text before it decodes anything, so a syntax
    // error anywhere is the answer even for `[` or `"x`.
    if let Some(syntax) = syntax_error(input) {
        return syntax;
    }
    match e.classify() {
        // What Go accepts and serde does not (a lone UTF-16 surrogate
        // escape, nesting past serde's 128 levels) keeps serde's account,
        // which names no Rust type.
        Category::Syntax | Category::Eof | Category::Io => e.to_string(),
        Category::Data => {
            let first = input
                .iter()
                .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
            let kind = match first {
                Some(b'[') => "an array",
                Some(b'"') => "a string",
                Some(b't' | b'f') => "a boolean",
                _ => "a number",
            };
            format!("must be a JSON object, not {kind}")
        }
    }
}

/// The kind of a value that is not the one a field needs, for its refusal.
fn kind(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(_) => "a boolean".into(),
        Value::Number(n) => format!("the number {}", toolset::truncate_runes(&n.to_string(), 32)),
        Value::String(_) => "a string".into(),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

impl Fields {
    /// The field's value; `None` when absent or `null` (the reference's
    /// decoder leaves a field it is given `null` for unset).
    pub(crate) fn get(&self, name: &str) -> Result<Option<&Value>, Output> {
        let mut found = self.members.iter().filter(|(k, _)| k == name);
        let first = found.next().map(|(_, v)| v);
        if found.next().is_some() {
            return Err(self.refuse(format!("{name} is given more than once; give it once")));
        }
        Ok(first.filter(|v| !v.is_null()))
    }

    /// A string field.
    pub(crate) fn string(&self, name: &str) -> Result<Option<String>, Output> {
        match self.get(name)? {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(self.refuse(format!("{name} must be a string, not {}", kind(v)))),
        }
    }

    /// A boolean field.
    pub(crate) fn boolean(&self, name: &str) -> Result<Option<bool>, Output> {
        match self.get(name)? {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.refuse(format!("{name} must be true or false, not {}", kind(v)))),
        }
    }

    /// An integer field; `what` says what it counts, for the refusal
    /// (`a whole number of milliseconds`). JSON integers past i64 still
    /// arrive, so a range rule can name them.
    pub(crate) fn integer(&self, name: &str, what: &str) -> Result<Option<i128>, Output> {
        let refuse = |v: &Value| self.refuse(format!("{name} must be {what}, not {}", kind(v)));
        match self.get(name)? {
            None => Ok(None),
            Some(Value::Number(n)) => match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => Ok(Some(i128::from(i))),
                (None, Some(u)) => Ok(Some(i128::from(u))),
                (None, None) => Err(refuse(&Value::Number(n.clone()))),
            },
            Some(v) => Err(refuse(v)),
        }
    }

    /// `<tool>: <what is wrong>`.
    pub(crate) fn refuse(&self, what: String) -> Output {
        Output::error(format!("{}: {what}", self.tool))
    }
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

/// Go's `encoding/json` account of the first thing in `input` that is not
/// JSON (its `checkValid`), or `None` when Go would accept the text.
///
/// The same state machine Go's scanner runs, written out here: a value,
/// then the container it is in decides what may follow. Go reports the
/// offending byte as a character (`'x'`, with escapes for what does not
/// print), and running out of input as `unexpected end of JSON input`.
fn syntax_error(input: &[u8]) -> Option<String> {
    /// Go's nesting bound.
    const MAX_DEPTH: usize = 10_000;

    #[derive(Clone, Copy, PartialEq)]
    enum Frame {
        Key,
        Value,
        Array,
    }
    #[derive(Clone, Copy)]
    enum State {
        BeginValue,
        BeginValueOrEmpty,
        BeginKeyOrEmpty,
        BeginKey,
        InString,
        Escape,
        Hex(u8),
        Neg,
        Zero,
        Digits,
        Dot,
        Fraction,
        Exp,
        ExpSign,
        ExpDigits,
        Literal(&'static [u8], usize),
        EndValue,
        EndTop,
    }
    let bad = |c: u8, context: &str| Some(format!("invalid character {} {context}", quote(c)));
    let ws = |c: u8| matches!(c, b' ' | b'\t' | b'\n' | b'\r');
    let mut stack: Vec<Frame> = Vec::new();
    let mut state = State::BeginValue;
    for &c in input {
        // Some states end a number or a literal on a byte that belongs to
        // what follows; they hand it on by looping.
        let mut c_state = state;
        loop {
            match c_state {
                State::BeginValue | State::BeginValueOrEmpty => {
                    if ws(c) {
                        break;
                    }
                    if matches!(c_state, State::BeginValueOrEmpty) && c == b']' {
                        stack.pop();
                        c_state = State::EndValue;
                        break;
                    }
                    c_state = match c {
                        b'{' | b'[' => {
                            if stack.len() >= MAX_DEPTH {
                                return Some("exceeded max depth".into());
                            }
                            if c == b'{' {
                                stack.push(Frame::Key);
                                State::BeginKeyOrEmpty
                            } else {
                                stack.push(Frame::Array);
                                State::BeginValueOrEmpty
                            }
                        }
                        b'"' => State::InString,
                        b'-' => State::Neg,
                        b'0' => State::Zero,
                        b'1'..=b'9' => State::Digits,
                        b't' => State::Literal(b"true", 1),
                        b'f' => State::Literal(b"false", 1),
                        b'n' => State::Literal(b"null", 1),
                        _ => return bad(c, "looking for beginning of value"),
                    };
                    break;
                }
                State::BeginKeyOrEmpty | State::BeginKey => {
                    if ws(c) {
                        break;
                    }
                    if matches!(c_state, State::BeginKeyOrEmpty) && c == b'}' {
                        stack.pop();
                        c_state = State::EndValue;
                        break;
                    }
                    if c != b'"' {
                        return bad(c, "looking for beginning of object key string");
                    }
                    c_state = State::InString;
                    break;
                }
                State::InString => {
                    c_state = match c {
                        b'"' => State::EndValue,
                        b'\\' => State::Escape,
                        0..0x20 => return bad(c, "in string literal"),
                        _ => State::InString,
                    };
                    break;
                }
                State::Escape => {
                    c_state = match c {
                        b'b' | b'f' | b'n' | b'r' | b't' | b'\\' | b'/' | b'"' => State::InString,
                        b'u' => State::Hex(0),
                        _ => return bad(c, "in string escape code"),
                    };
                    break;
                }
                State::Hex(n) => {
                    if !c.is_ascii_hexdigit() {
                        return bad(c, "in \\u hexadecimal character escape");
                    }
                    c_state = if n == 3 {
                        State::InString
                    } else {
                        State::Hex(n + 1)
                    };
                    break;
                }
                State::Neg => {
                    c_state = match c {
                        b'0' => State::Zero,
                        b'1'..=b'9' => State::Digits,
                        _ => return bad(c, "in numeric literal"),
                    };
                    break;
                }
                State::Digits if c.is_ascii_digit() => break,
                State::Digits | State::Zero => match c {
                    b'.' => {
                        c_state = State::Dot;
                        break;
                    }
                    b'e' | b'E' => {
                        c_state = State::Exp;
                        break;
                    }
                    _ => c_state = State::EndValue,
                },
                State::Dot => {
                    if !c.is_ascii_digit() {
                        return bad(c, "after decimal point in numeric literal");
                    }
                    c_state = State::Fraction;
                    break;
                }
                State::Fraction if c.is_ascii_digit() => break,
                State::Fraction => {
                    if matches!(c, b'e' | b'E') {
                        c_state = State::Exp;
                        break;
                    }
                    c_state = State::EndValue;
                }
                State::Exp => {
                    if matches!(c, b'+' | b'-') {
                        c_state = State::ExpSign;
                        break;
                    }
                    c_state = State::ExpSign;
                }
                State::ExpSign => {
                    if !c.is_ascii_digit() {
                        return bad(c, "in exponent of numeric literal");
                    }
                    c_state = State::ExpDigits;
                    break;
                }
                State::ExpDigits if c.is_ascii_digit() => break,
                State::ExpDigits => c_state = State::EndValue,
                State::Literal(word, i) => {
                    if c != word[i] {
                        let name = std::str::from_utf8(word).unwrap_or("literal");
                        return bad(
                            c,
                            &format!("in literal {name} (expecting {})", quote(word[i])),
                        );
                    }
                    c_state = if i + 1 == word.len() {
                        State::EndValue
                    } else {
                        State::Literal(word, i + 1)
                    };
                    break;
                }
                State::EndValue => {
                    let Some(&top) = stack.last() else {
                        c_state = State::EndTop;
                        continue;
                    };
                    if ws(c) {
                        break;
                    }
                    c_state = match (top, c) {
                        (Frame::Key, b':') => {
                            if let Some(t) = stack.last_mut() {
                                *t = Frame::Value;
                            }
                            State::BeginValue
                        }
                        (Frame::Key, _) => return bad(c, "after object key"),
                        (Frame::Value, b',') => {
                            if let Some(t) = stack.last_mut() {
                                *t = Frame::Key;
                            }
                            State::BeginKey
                        }
                        (Frame::Value, b'}') => {
                            stack.pop();
                            State::EndValue
                        }
                        (Frame::Value, _) => return bad(c, "after object key:value pair"),
                        (Frame::Array, b',') => State::BeginValue,
                        (Frame::Array, b']') => {
                            stack.pop();
                            State::EndValue
                        }
                        (Frame::Array, _) => return bad(c, "after array element"),
                    };
                    break;
                }
                State::EndTop => {
                    if !ws(c) {
                        return bad(c, "after top-level value");
                    }
                    break;
                }
            }
        }
        state = c_state;
    }
    // A number ends with the input; anything else unfinished is Go's EOF.
    let complete = stack.is_empty()
        && matches!(
            state,
            State::EndValue
                | State::EndTop
                | State::Zero
                | State::Digits
                | State::Fraction
                | State::ExpDigits
        );
    (!complete).then(|| "unexpected end of JSON input".to_owned())
}

/// A byte as Go's scanner quotes it in an error: the character it would be
/// as a code point (so a UTF-8 lead byte shows as Latin-1), between single
/// quotes, escaped where it does not print.
fn quote(c: u8) -> String {
    match c {
        b'\'' => r"'\''".into(),
        b'"' => "'\"'".into(),
        b'\\' => r"'\\'".into(),
        0x07 => r"'\a'".into(),
        0x08 => r"'\b'".into(),
        0x0c => r"'\f'".into(),
        b'\n' => r"'\n'".into(),
        b'\r' => r"'\r'".into(),
        b'\t' => r"'\t'".into(),
        0x0b => r"'\v'".into(),
        0x20..=0x7e => format!("'{}'", c as char),
        0..0x20 | 0x7f => format!("'\\x{c:02x}'"),
        // C1 controls, the no-break space and the soft hyphen do not print.
        0x80..=0xa0 | 0xad => format!("'\\u{c:04x}'"),
        _ => format!("'{}'", char::from(c)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn syntax(s: &str) -> Option<String> {
        syntax_error(s.as_bytes())
    }

    /// Go's own messages, as the reference program printed them for these
    /// inputs (anthropic-sdk-go v2.17.0, `invalid bash input: ...`).
    #[test]
    fn not_json_reads_as_gos_decoder_words_it() {
        for (input, want) in [
            ("", "unexpected end of JSON input"),
            ("  ", "unexpected end of JSON input"),
            ("{", "unexpected end of JSON input"),
            (r#"{"file_path": "a.txt""#, "unexpected end of JSON input"),
            (
                "echo hi",
                "invalid character 'e' looking for beginning of value",
            ),
            (
                "a.txt",
                "invalid character 'a' looking for beginning of value",
            ),
            (
                "{file_path: a.txt}",
                "invalid character 'f' looking for beginning of object key string",
            ),
            (
                "file_path=a.txt",
                "invalid character 'i' in literal false (expecting 'a')",
            ),
            (
                r#"{"command":"x",}"#,
                "invalid character '}' looking for beginning of object key string",
            ),
            (
                r#"{"command" "x"}"#,
                "invalid character '\"' after object key",
            ),
            (
                r#"{"command":"x"}}"#,
                "invalid character '}' after top-level value",
            ),
            (
                r#"{"a":tru}"#,
                "invalid character '}' in literal true (expecting 'e')",
            ),
            (
                r#"{"command":"x"} x"#,
                "invalid character 'x' after top-level value",
            ),
            (
                r#"{"a":"\s"}"#,
                "invalid character 's' in string escape code",
            ),
            (
                r#"{"a":1 "b":2}"#,
                "invalid character '\"' after object key:value pair",
            ),
            ("[1 2]", "invalid character '2' after array element"),
            (
                "[1,]",
                "invalid character ']' looking for beginning of value",
            ),
            ("01", "invalid character '1' after top-level value"),
            ("-x", "invalid character 'x' in numeric literal"),
            (
                "1.x",
                "invalid character 'x' after decimal point in numeric literal",
            ),
            (
                "1ex",
                "invalid character 'x' in exponent of numeric literal",
            ),
            (
                r#"{"a":"\u12g4"}"#,
                "invalid character 'g' in \\u hexadecimal character escape",
            ),
            (
                "{\"a\":\"\t\"}",
                r"invalid character '\t' in string literal",
            ),
            ("é", "invalid character 'Ã' looking for beginning of value"),
            (
                "\u{7f}",
                r"invalid character '\x7f' looking for beginning of value",
            ),
        ] {
            assert_eq!(syntax(input).as_deref(), Some(want), "{input:?}");
        }
        for valid in [
            "{}",
            "null",
            "[]",
            r#"{"a":[1,-2.5e+3,true,false,null,{"b":"\u00e9\n"}]}"#,
            " 12 ",
            "0",
            "-0.0E-0",
        ] {
            assert_eq!(syntax(valid), None, "{valid:?}");
        }
        let deep = "[".repeat(10_001);
        assert_eq!(syntax(&deep).as_deref(), Some("exceeded max depth"));
    }

    fn refusal(tool: &'static str, input: &str) -> String {
        match parse(tool, input.as_bytes()) {
            Ok(f) => panic!("{input}: parsed as {f:?}"),
            Err(out) => match out.body {
                crate::output::Body::Text(t) => t,
                other => panic!("{other:?}"),
            },
        }
    }

    #[test]
    fn what_is_not_an_object_is_named_by_kind() {
        assert_eq!(
            refusal("bash", r#"["x",1]"#),
            "invalid bash input: must be a JSON object, not an array"
        );
        assert_eq!(
            refusal("read", r#""a.txt""#),
            "invalid read input: must be a JSON object, not a string"
        );
        assert_eq!(
            refusal("grep", "5"),
            "invalid grep input: must be a JSON object, not a number"
        );
        assert_eq!(
            refusal("glob", " true"),
            "invalid glob input: must be a JSON object, not a boolean"
        );
        // null is nothing given, as in the reference.
        assert!(parse("bash", b"null").unwrap().members.is_empty());
    }

    #[test]
    fn fields_are_refused_in_the_tools_terms() {
        let f = parse(
            "bash",
            br#"{"command":5,"restart":"yes","timeout_ms":1.5,"big":18446744073709551615,"n":null,"x":{}}"#,
        )
        .unwrap();
        let text = |o: Output| match o.body {
            crate::output::Body::Text(t) => t,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            text(f.string("command").unwrap_err()),
            "bash: command must be a string, not the number 5"
        );
        assert_eq!(
            text(f.boolean("restart").unwrap_err()),
            "bash: restart must be true or false, not a string"
        );
        assert_eq!(
            text(
                f.integer("timeout_ms", "a whole number of milliseconds")
                    .unwrap_err()
            ),
            "bash: timeout_ms must be a whole number of milliseconds, not the number 1.5"
        );
        assert_eq!(
            f.integer("big", "a count").unwrap(),
            Some(18_446_744_073_709_551_615)
        );
        assert_eq!(f.string("n").unwrap(), None);
        assert_eq!(f.string("absent").unwrap(), None);
        assert_eq!(
            text(f.string("x").unwrap_err()),
            "bash: x must be a string, not an object"
        );
        let twice = parse("bash", br#"{"command":"ls","command":"rm -rf ~"}"#).unwrap();
        assert_eq!(
            text(twice.string("command").unwrap_err()),
            "bash: command is given more than once; give it once"
        );
    }
}
