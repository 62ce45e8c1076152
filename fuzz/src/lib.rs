//! What the fuzz targets share: the "every rejection names a path" check for
//! toolset errors, an independent reading of how a toolset entry resolves
//! (the oracle the resolution targets compare against), and a port of Go's
//! `time.ParseDuration` (the oracle of the duration target).
//!
//! A violated invariant panics; libFuzzer's panic hook turns that into an
//! abort, which it counts and saves as a crash.

use serde_json::Value;
use toolset::ToolsetError;

/// One step of a path as the toolset prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    Key(String),
    Index(usize),
}

/// Parses a path in the toolset's notation (`configs[2].permission_policy.type`,
/// `default_config["a.b"]`, `[""]`); `None` when it is not one.
pub fn parse_path(path: &str) -> Option<Vec<Seg>> {
    let mut out = Vec::new();
    let b = path.as_bytes();
    let mut i = 0;
    let plain = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'-';
    while i < b.len() {
        match b[i] {
            b'[' => {
                if b.get(i + 1) == Some(&b'"') {
                    // A JSON string, then `]`: let serde find where it ends.
                    let mut de =
                        serde_json::Deserializer::from_str(&path[i + 1..]).into_iter::<String>();
                    let key = de.next()?.ok()?;
                    let end = i + 1 + de.byte_offset();
                    if b.get(end) != Some(&b']') {
                        return None;
                    }
                    out.push(Seg::Key(key));
                    i = end + 1;
                } else {
                    let close = i + 1 + path[i + 1..].find(']')?;
                    let digits = &path[i + 1..close];
                    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
                        return None;
                    }
                    out.push(Seg::Index(digits.parse().ok()?));
                    i = close + 1;
                }
            }
            b'.' if !out.is_empty() && i + 1 < b.len() && plain(b[i + 1]) => i += 1,
            c if plain(c) && (out.is_empty() || b[i - 1] == b'.') => {
                let start = i;
                while i < b.len() && plain(b[i]) {
                    i += 1;
                }
                out.push(Seg::Key(path[start..i].to_owned()));
            }
            _ => return None,
        }
    }
    Some(out)
}

/// The value at `segs` inside `v`.
pub fn resolve<'a>(v: &'a Value, segs: &[Seg]) -> Option<&'a Value> {
    segs.iter().try_fold(v, |v, s| match s {
        Seg::Key(k) => v.as_object()?.get(k),
        Seg::Index(i) => v.as_array()?.get(*i),
    })
}

/// Asserts that a toolset rejection of `doc` names a path, that its message
/// starts with that path, and that the path is where the fault is: the value
/// it names exists in the document (for a missing key, its parent does).
pub fn check_toolset_rejection(doc: &[u8], e: &ToolsetError) {
    let msg = e.to_string();
    let Some(path) = e.path() else {
        panic!("a toolset-entry rejection without a path: {e:?}");
    };
    let shown = if path.is_empty() { "entry" } else { path };
    assert!(
        msg.starts_with(&format!("{shown}: ")),
        "message does not start with its path {shown:?}: {msg:?}"
    );
    let Some(segs) = parse_path(path) else {
        panic!("path {path:?} is not in the toolset's notation ({msg:?})");
    };
    if let ToolsetError::Syntax { .. } = e {
        return;
    }
    // A document whose numbers serde_json's Value cannot hold (1e999) is
    // still one the raw walk reads; only the notation is checked then.
    let Ok(v) = serde_json::from_slice::<Value>(doc) else {
        return;
    };
    let target = match e {
        ToolsetError::Missing { .. } => &segs[..segs.len().saturating_sub(1)],
        _ => &segs[..],
    };
    assert!(
        resolve(&v, target).is_some(),
        "path {path:?} names nothing in the entry ({msg:?})"
    );
    if let ToolsetError::Missing { .. } = e {
        assert!(
            resolve(&v, &segs).is_none(),
            "{path:?} is said to be missing but is present"
        );
    }
    // Re-rooted as the webhook does, the path is prefixed and stays first.
    let prefixed = e.clone().with_prefix("spec.tools[3]");
    let p = prefixed.path().unwrap_or_default().to_owned();
    assert!(p.starts_with("spec.tools[3]"), "{p:?}");
    assert!(prefixed.to_string().starts_with(&format!("{p}: ")));
}

/// How an entry resolves one tool, read independently of the toolset
/// crate from a decoded `Value`: `None` when disabled, else the policy's
/// `type` string. The per-tool config is the first `configs[]` entry of that
/// name; enable and policy each fall back to `default_config`, then to on and
/// `kind_default`. Only meaningful for an entry the crate accepted.
pub fn expected_policy(entry: &Value, tool: &str, kind_default: &str) -> Option<String> {
    let default = entry.get("default_config");
    let own = entry
        .get("configs")
        .and_then(Value::as_array)
        .and_then(|c| {
            c.iter()
                .find(|c| c.get("name").and_then(Value::as_str) == Some(tool))
        });
    let field = |k: &str| {
        own.and_then(|o| o.get(k))
            .or_else(|| default.and_then(|d| d.get(k)))
    };
    let enabled = field("enabled").and_then(Value::as_bool).unwrap_or(true);
    if !enabled {
        return None;
    }
    Some(
        field("permission_policy")
            .and_then(|p| p.get("type"))
            .and_then(Value::as_str)
            .unwrap_or(kind_default)
            .to_owned(),
    )
}

/// What Go's `time.ParseDuration` returns for a text it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoDuration {
    pub negative: bool,
    pub nanos: u64,
    /// Components with a fraction, each rounded through `float64`.
    pub fractions: u32,
    /// Go's sum wrapped around: two components of exactly 2^63 ns
    /// (`9223372036854775808ns9223372036854775808ns`) add up to 2^64, which
    /// its `uint64` keeps as 0, under its `d > 1<<63` check. Go 1.26.8
    /// answers 0s, nil for that text; a Go bug this parser does not copy.
    pub wrapped: bool,
}

/// Go's `time.ParseDuration`, ported line for line (go/src/time/format.go,
/// Go 1.26.8, checked against it): `None` where Go returns an error.
/// Fractions go through `float64` as in Go; the sum wraps as Go's `uint64`
/// does.
pub fn go_parse_duration(s: &str) -> Option<GoDuration> {
    const MAX: u64 = 1 << 63;
    let mut s = s.as_bytes();
    let mut d: u64 = 0;
    let mut neg = false;
    let mut fractions = 0;
    let mut wrapped = false;
    if let Some(&c) = s.first()
        && (c == b'-' || c == b'+')
    {
        neg = c == b'-';
        s = &s[1..];
    }
    if s == b"0" {
        return Some(GoDuration {
            negative: neg,
            nanos: 0,
            fractions: 0,
            wrapped: false,
        });
    }
    if s.is_empty() {
        return None;
    }
    while !s.is_empty() {
        if !(s[0] == b'.' || s[0].is_ascii_digit()) {
            return None;
        }
        // leadingInt
        let pl = s.len();
        let mut v: u64 = 0;
        let mut i = 0;
        while i < s.len() && s[i].is_ascii_digit() {
            if v > MAX / 10 {
                return None;
            }
            v = v * 10 + u64::from(s[i] - b'0');
            if v > MAX {
                return None;
            }
            i += 1;
        }
        s = &s[i..];
        let pre = pl != s.len();
        // leadingFraction
        let mut post = false;
        let mut f: u64 = 0;
        let mut scale: f64 = 1.0;
        if !s.is_empty() && s[0] == b'.' {
            s = &s[1..];
            let pl = s.len();
            let mut overflow = false;
            let mut i = 0;
            while i < s.len() && s[i].is_ascii_digit() {
                let c = s[i];
                i += 1;
                if overflow {
                    continue;
                }
                if f > (MAX - 1) / 10 {
                    overflow = true;
                    continue;
                }
                let y = f * 10 + u64::from(c - b'0');
                if y > MAX {
                    overflow = true;
                    continue;
                }
                f = y;
                scale *= 10.0;
            }
            s = &s[i..];
            post = pl != s.len();
        }
        if !pre && !post {
            return None;
        }
        let mut i = 0;
        while i < s.len() && !(s[i] == b'.' || s[i].is_ascii_digit()) {
            i += 1;
        }
        if i == 0 {
            return None;
        }
        let u = &s[..i];
        s = &s[i..];
        let unit: u64 = match u {
            b"ns" => 1,
            b"us" | b"\xc2\xb5s" | b"\xce\xbcs" => 1_000,
            b"ms" => 1_000_000,
            b"s" => 1_000_000_000,
            b"m" => 60_000_000_000,
            b"h" => 3_600_000_000_000,
            _ => return None,
        };
        if v > MAX / unit {
            return None;
        }
        v *= unit;
        if f > 0 {
            fractions += 1;
            #[allow(
                clippy::cast_precision_loss,
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss
            )]
            {
                v += (f as f64 * (unit as f64 / scale)) as u64;
            }
            if v > MAX {
                return None;
            }
        }
        let (sum, carry) = d.overflowing_add(v);
        wrapped |= carry;
        d = sum;
        if d > MAX {
            return None;
        }
    }
    if !neg && d > MAX - 1 {
        return None;
    }
    Some(GoDuration {
        negative: neg,
        nanos: d,
        fractions,
        wrapped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_parse() {
        assert_eq!(
            parse_path("configs[2].permission_policy.type"),
            Some(vec![
                Seg::Key("configs".into()),
                Seg::Index(2),
                Seg::Key("permission_policy".into()),
                Seg::Key("type".into())
            ])
        );
        assert_eq!(
            parse_path(r#"default_config["a.b"]"#),
            Some(vec![
                Seg::Key("default_config".into()),
                Seg::Key("a.b".into())
            ])
        );
        assert_eq!(parse_path(r#"[""]"#), Some(vec![Seg::Key(String::new())]));
        assert_eq!(parse_path(""), Some(vec![]));
        assert_eq!(parse_path("a..b"), None);
        assert_eq!(parse_path("a[x]"), None);
    }

    fn go(s: &str) -> Option<(bool, u64, u32, bool)> {
        go_parse_duration(s).map(|d| (d.negative, d.nanos, d.fractions, d.wrapped))
    }

    /// Each as Go 1.26.8's time.ParseDuration answers.
    #[test]
    fn go_durations() {
        assert_eq!(go("1h30m"), Some((false, 5_400_000_000_000, 0, false)));
        assert_eq!(go("0.0000000000025h"), Some((false, 9, 1, false)));
        assert_eq!(go("0.000000000007h"), Some((false, 25, 1, false)));
        assert_eq!(
            go("-9223372036854775808ns"),
            Some((true, 1 << 63, 0, false))
        );
        assert_eq!(go("9223372036854775808ns"), None);
        assert_eq!(go("2562048h"), None);
        assert_eq!(go(".s"), None);
        assert_eq!(go("1.s"), Some((false, 1_000_000_000, 0, false)));
        assert_eq!(
            go("9223372036854775808ns9223372036854775808ns"),
            Some((false, 0, 0, true))
        );
    }
}
