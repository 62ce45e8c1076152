//! bash's state as it travels in an export or import: read out of the
//! session's snapshot, and written back as a snapshot.
//!
//! The snapshot is shell code (`export -p`, `declare -f`, a `cd` line and
//! an `OLDPWD` line, as the wrapper in [`crate::tools::shell`] writes it).
//! It is parsed here rather than evaluated by a helper shell: evaluating it
//! would run the session's functions (one named `builtin` would run at the
//! `cd` line) at a moment nobody approved a call. What is parsed is only
//! what bash itself prints: `declare` lines with quoted values, and the two
//! `%q`-quoted lines the wrapper adds; the functions are kept as text.
//!
//! On the way out, the variables the runner's own environment gave (the
//! pod's env, a warm pool's binding) are left out when unchanged, so a
//! checkpoint carries no secrets from env and the importing runner's own
//! values stand; the working directory becomes relative to the exported
//! directory, so the state can be imported under another path.

use std::collections::HashMap;

use runner_api::proto::{ShellState, ShellVariable};

use crate::tools::shell::{is_identifier, passed_on};

/// Variables bash keeps itself, carried (as `cwd`, `oldpwd`) or not at all.
const SHELL_OWN: [&str; 4] = ["PWD", "OLDPWD", "SHLVL", "_"];

/// The wrapper's own function, which every snapshot holds and every shell
/// defines afresh: not the session's.
const WRAPPER_FUNCTION: &[u8] = b"__agent_save () \n{ \n";

/// Most bytes of state that travel (variables and functions together):
/// under gRPC's 4 MiB message limit, with room for the header around it.
pub const MAX_STATE_BYTES: usize = 3 << 20;

/// Attribute letters a variable may carry back in (`declare -x` plus
/// these): integer, lower, readonly, trace, upper. Never arrays (bash
/// does not export them) nor name references.
const ATTRIBUTES: &str = "ilrtu";

/// A `declare` line as read: name, attribute letters, value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declared {
    pub name: String,
    pub attributes: String,
    pub value: Option<Vec<u8>>,
}

/// Reads the session's state out of `snapshot`, given the runner's initial
/// state (`declare -x` lines) and where the export is rooted (`roots`: the
/// exported directory as the shell may spell it, canonical and as given).
pub fn export(snapshot: &[u8], initial: &[u8], roots: &[&[u8]]) -> Result<ShellState, String> {
    let (inherited, _) = declarations(initial)?;
    let inherited: HashMap<String, Option<Vec<u8>>> =
        inherited.into_iter().map(|d| (d.name, d.value)).collect();
    let (declared, rest) = declarations(snapshot)?;
    let tail = rest
        .windows(b"builtin cd -- ".len())
        .enumerate()
        .rev()
        .find(|(i, w)| *w == b"builtin cd -- " && (*i == 0 || rest[i - 1] == b'\n'))
        .map(|(i, _)| i)
        .ok_or("the saved state has no working directory line")?;
    let functions = without_wrapper(&rest[..tail]);
    let (cwd, oldpwd) = tail_lines(&rest[tail..])?;
    let mut state = ShellState {
        functions,
        cwd: relative(&cwd, roots),
        oldpwd: oldpwd.map(|o| relative(&o, roots)).unwrap_or_default(),
        ..ShellState::default()
    };
    for d in &declared {
        if SHELL_OWN.contains(&d.name.as_str()) || !passed_on(&d.name) {
            continue;
        }
        if inherited.get(&d.name) == Some(&d.value) && d.attributes.is_empty() {
            continue;
        }
        state.variables.push(ShellVariable {
            name: d.name.clone(),
            value: d.value.clone(),
            attributes: d.attributes.clone(),
        });
    }
    let mut unset: Vec<String> = inherited
        .keys()
        .filter(|n| !SHELL_OWN.contains(&n.as_str()) && passed_on(n))
        .filter(|n| !declared.iter().any(|d| &d.name == *n))
        .cloned()
        .collect();
    unset.sort();
    state.unset = unset;
    let size = state.functions.len()
        + state
            .variables
            .iter()
            .map(|v| v.name.len() + v.value.as_ref().map_or(0, Vec::len))
            .sum::<usize>();
    if size > MAX_STATE_BYTES {
        return Err(format!(
            "bash's state is {size} bytes; at most {MAX_STATE_BYTES} travel with an export"
        ));
    }
    Ok(state)
}

/// The snapshot that gives a shell `state`: the runner's `initial` state,
/// then the state's unsets, variables, functions, and the `cd` (a relative
/// `cwd` is taken from `dest`, where the import put the files).
pub fn import(state: &ShellState, initial: &[u8], dest: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = initial.to_vec();
    for name in &state.unset {
        check_name(name)?;
        out.extend_from_slice(format!("builtin unset {name}\n").as_bytes());
    }
    for v in &state.variables {
        check_name(&v.name)?;
        let mut attrs = String::from("x");
        for a in v.attributes.chars() {
            if !ATTRIBUTES.contains(a) {
                return Err(format!(
                    "variable {}: attribute {a:?} is not one that travels ({ATTRIBUTES})",
                    v.name
                ));
            }
            if !attrs.contains(a) {
                attrs.push(a);
            }
        }
        out.extend_from_slice(format!("declare -{attrs} {}", v.name).as_bytes());
        if let Some(value) = &v.value {
            if value.contains(&0) {
                return Err(format!("variable {}: the value holds a NUL byte", v.name));
            }
            out.push(b'=');
            quote(&mut out, value);
        }
        out.push(b'\n');
    }
    if state.functions.contains(&0) {
        return Err("the functions hold a NUL byte".into());
    }
    out.extend_from_slice(&state.functions);
    if !state.functions.is_empty() && !state.functions.ends_with(b"\n") {
        out.push(b'\n');
    }
    for (what, path) in [("cwd", &state.cwd), ("oldpwd", &state.oldpwd)] {
        if path.contains(&0) {
            return Err(format!("{what} holds a NUL byte"));
        }
    }
    let place = |p: &[u8]| -> Vec<u8> {
        if p.first() == Some(&b'/') {
            return p.to_vec();
        }
        let mut full = dest.to_vec();
        if p != b"." && !p.is_empty() {
            full.push(b'/');
            full.extend_from_slice(p);
        }
        full
    };
    if !state.cwd.is_empty() {
        out.extend_from_slice(b"builtin cd -- ");
        quote(&mut out, &place(&state.cwd));
        out.extend_from_slice(b" 2>/dev/null\n");
    }
    if !state.oldpwd.is_empty() {
        out.extend_from_slice(b"declare -x OLDPWD=");
        quote(&mut out, &place(&state.oldpwd));
        out.push(b'\n');
    }
    if out.len() as u64 > crate::snapshot::MAX_SNAPSHOT_BYTES {
        return Err(format!(
            "the state would be {} bytes, over the {} MiB a shell state may hold",
            out.len(),
            crate::snapshot::MAX_SNAPSHOT_BYTES >> 20
        ));
    }
    Ok(out)
}

fn check_name(name: &str) -> Result<(), String> {
    if !is_identifier(name) {
        return Err(format!("{name:?} is not a shell variable name"));
    }
    if !passed_on(name) || SHELL_OWN.contains(&name) {
        return Err(format!(
            "{name} is a variable the runner or the shell sets itself"
        ));
    }
    Ok(())
}

/// `'value'`, each `'` written `'\''`.
fn quote(out: &mut Vec<u8>, value: &[u8]) {
    out.push(b'\'');
    for &b in value {
        if b == b'\'' {
            out.extend_from_slice(b"'\\''");
        } else {
            out.push(b);
        }
    }
    out.push(b'\'');
}

/// The leading `declare -ATTRS NAME[=WORD]` lines, and what follows them.
pub fn declarations(text: &[u8]) -> Result<(Vec<Declared>, &[u8]), String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(line) = rest.strip_prefix(b"declare -") {
        let sp = line
            .iter()
            .position(|&b| b == b' ')
            .ok_or("a declare line without a name")?;
        let attributes: String = String::from_utf8_lossy(&line[..sp])
            .chars()
            .filter(|&c| c != 'x' && c != '-')
            .collect();
        if attributes.chars().any(|c| !ATTRIBUTES.contains(c)) {
            return Err(format!("a declare line with attributes -{attributes}"));
        }
        let after = &line[sp + 1..];
        let end = after
            .iter()
            .position(|&b| b == b'=' || b == b'\n')
            .ok_or("a declare line that does not end")?;
        let name = std::str::from_utf8(&after[..end])
            .ok()
            .filter(|n| is_identifier(n))
            .ok_or("a declare line whose name is not an identifier")?
            .to_owned();
        let (value, tail) = if after[end] == b'=' {
            let (v, t) = word(&after[end + 1..]).map_err(|e| format!("variable {name}: {e}"))?;
            (Some(v), t)
        } else {
            (None, &after[end..])
        };
        rest = tail
            .strip_prefix(b"\n")
            .ok_or_else(|| format!("variable {name}: text after the value"))?;
        out.push(Declared {
            name,
            attributes,
            value,
        });
    }
    Ok((out, rest))
}

/// One shell word as bash prints values (`"..."`, `'...'`, `$'...'`,
/// backslash escapes, bare characters), up to an unquoted blank or
/// newline; the decoded bytes and what follows.
pub fn word(mut s: &[u8]) -> Result<(Vec<u8>, &[u8]), String> {
    let mut out = Vec::new();
    loop {
        match s {
            [] | [b' ' | b'\t' | b'\n', ..] => return Ok((out, s)),
            [b'\'', rest @ ..] => {
                let end = rest
                    .iter()
                    .position(|&b| b == b'\'')
                    .ok_or("an unclosed '")?;
                out.extend_from_slice(&rest[..end]);
                s = &rest[end + 1..];
            }
            [b'$', b'\'', rest @ ..] => s = ansi_c(rest, &mut out)?,
            [b'"', rest @ ..] => s = double(rest, &mut out)?,
            [b'\\', b'\n', rest @ ..] => s = rest,
            [b'\\', c, rest @ ..] => {
                out.push(*c);
                s = rest;
            }
            [b'\\'] => return Err("a trailing backslash".into()),
            [c, rest @ ..] => {
                out.push(*c);
                s = rest;
            }
        }
    }
}

fn double<'a>(mut s: &'a [u8], out: &mut Vec<u8>) -> Result<&'a [u8], String> {
    loop {
        match s {
            [] => return Err("an unclosed \"".into()),
            [b'"', rest @ ..] => return Ok(rest),
            [b'\\', b'\n', rest @ ..] => s = rest,
            [b'\\', c @ (b'$' | b'`' | b'"' | b'\\'), rest @ ..] => {
                out.push(*c);
                s = rest;
            }
            [c, rest @ ..] => {
                out.push(*c);
                s = rest;
            }
        }
    }
}

fn ansi_c<'a>(mut s: &'a [u8], out: &mut Vec<u8>) -> Result<&'a [u8], String> {
    loop {
        let (c, rest) = match s {
            [] => return Err("an unclosed $'".into()),
            [b'\'', rest @ ..] => return Ok(rest),
            [b'\\', e, rest @ ..] => (*e, rest),
            [c, rest @ ..] => {
                out.push(*c);
                s = rest;
                continue;
            }
        };
        s = rest;
        let simple = match c {
            b'a' => Some(7),
            b'b' => Some(8),
            b'e' | b'E' => Some(27),
            b'f' => Some(12),
            b'n' => Some(b'\n'),
            b'r' => Some(b'\r'),
            b't' => Some(b'\t'),
            b'v' => Some(11),
            b'\\' | b'\'' | b'"' | b'?' => Some(c),
            _ => None,
        };
        if let Some(b) = simple {
            out.push(b);
            continue;
        }
        match c {
            b'0'..=b'7' => {
                let mut v = u32::from(c - b'0');
                let mut n = 1;
                while n < 3 && matches!(s.first(), Some(b'0'..=b'7')) {
                    v = v * 8 + u32::from(s[0] - b'0');
                    s = &s[1..];
                    n += 1;
                }
                out.push((v & 0xff) as u8);
            }
            b'x' | b'u' | b'U' => {
                let max = match c {
                    b'x' => 2,
                    b'u' => 4,
                    _ => 8,
                };
                let digits = s
                    .iter()
                    .take(max)
                    .take_while(|b| b.is_ascii_hexdigit())
                    .count();
                let v = u32::from_str_radix(std::str::from_utf8(&s[..digits]).unwrap_or("0"), 16)
                    .unwrap_or(0);
                s = &s[digits..];
                if c == b'x' {
                    out.push(v as u8);
                } else {
                    let ch = char::from_u32(v).unwrap_or(char::REPLACEMENT_CHARACTER);
                    out.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes());
                }
            }
            b'c' => {
                let Some((&x, rest)) = s.split_first() else {
                    return Err("an unfinished \\c escape".into());
                };
                out.push(x & 0x1f);
                s = rest;
            }
            other => {
                out.push(b'\\');
                out.push(other);
            }
        }
    }
}

/// The function text without the wrapper's own function.
fn without_wrapper(text: &[u8]) -> Vec<u8> {
    let start = text
        .windows(WRAPPER_FUNCTION.len())
        .enumerate()
        .find(|(i, w)| *w == WRAPPER_FUNCTION && (*i == 0 || text[i - 1] == b'\n'))
        .map(|(i, _)| i);
    let Some(start) = start else {
        return text.to_vec();
    };
    let after = &text[start..];
    let Some(end) = after.windows(3).position(|w| w == b"\n}\n") else {
        return text.to_vec();
    };
    let mut out = text[..start].to_vec();
    out.extend_from_slice(&after[end + 3..]);
    out
}

/// `builtin cd -- WORD 2>/dev/null` and an optional `OLDPWD=WORD`.
fn tail_lines(tail: &[u8]) -> Result<(Vec<u8>, Option<Vec<u8>>), String> {
    let bad = || "the saved state's last lines are not the ones the runner writes".to_owned();
    let rest = tail.strip_prefix(b"builtin cd -- ").ok_or_else(bad)?;
    let (cwd, rest) = word(rest).map_err(|e| format!("the working directory: {e}"))?;
    let rest = rest.strip_prefix(b" 2>/dev/null\n").ok_or_else(bad)?;
    if rest.is_empty() {
        return Ok((cwd, None));
    }
    let rest = rest.strip_prefix(b"OLDPWD=").ok_or_else(bad)?;
    let (old, rest) = word(rest).map_err(|e| format!("OLDPWD: {e}"))?;
    if rest != b"\n" {
        return Err(bad());
    }
    Ok((cwd, Some(old)))
}

/// `path` relative to the first root it lies in (`.` for the root itself),
/// or unchanged.
fn relative(path: &[u8], roots: &[&[u8]]) -> Vec<u8> {
    for root in roots {
        let root = root.strip_suffix(b"/").unwrap_or(root);
        if path == root {
            return b".".to_vec();
        }
        if let Some(rest) = path.strip_prefix(root)
            && let Some(rest) = rest.strip_prefix(b"/")
        {
            return rest.to_vec();
        }
    }
    path.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bash_quoting_is_read_back() {
        for (text, want) in [
            (&br#""a\"b\$c\\d`e""#[..], &b"a\"b$c\\d`e"[..]),
            (b"$'a\"b$c\\nl\\tx'", b"a\"b$c\nl\tx"),
            (b"'it'\\''s'", b"it's"),
            (b"/w/sub\\ dir", b"/w/sub dir"),
            (b"$'\\E[0m\\001\\x41\\u00e9'", b"\x1b[0m\x01A\xc3\xa9"),
            (b"''", b""),
        ] {
            let (got, rest) = word(text).unwrap();
            assert_eq!(got, want, "{}", String::from_utf8_lossy(text));
            assert!(rest.is_empty());
        }
        assert!(word(b"\"open").is_err());
        assert!(word(b"$'open").is_err());
    }

    #[test]
    fn the_session_part_is_kept_and_placed() {
        let initial = b"declare -x HOME='/root'\ndeclare -x TOKEN='s3cret'\ndeclare -x GONE='x'\n";
        let snapshot = b"declare -x FOO=$'a\\nb'\ndeclare -x HOME=\"/root\"\ndeclare -x OLDPWD=\"/w\"\ndeclare -x PWD=\"/w/sub dir\"\ndeclare -rx RO=\"1\"\ndeclare -x TOKEN=\"s3cret\"\n__agent_save () \n{ \n    builtin true\n}\nf () \n{ \n    echo hi\n}\ndeclare -fx f\nbuiltin cd -- /w/sub\\ dir 2>/dev/null\nOLDPWD=/w\n";
        let s = export(snapshot, initial, &[b"/w"]).unwrap();
        let names: Vec<_> = s.variables.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["FOO", "RO"]);
        assert_eq!(s.variables[0].value.as_deref(), Some(&b"a\nb"[..]));
        assert_eq!(s.variables[1].attributes, "r");
        assert_eq!(s.unset, ["GONE"]);
        assert_eq!(s.functions, b"f () \n{ \n    echo hi\n}\ndeclare -fx f\n");
        assert_eq!(s.cwd, b"sub dir");
        assert_eq!(s.oldpwd, b".");

        let snap = import(&s, b"declare -x HOME='/home/u'\n", b"/new").unwrap();
        let text = String::from_utf8(snap).unwrap();
        assert!(
            text.starts_with("declare -x HOME='/home/u'\nbuiltin unset GONE\n"),
            "{text}"
        );
        assert!(
            text.contains("declare -x FOO='a\nb'\ndeclare -xr RO='1'\n"),
            "{text}"
        );
        assert!(
            text.contains("builtin cd -- '/new/sub dir' 2>/dev/null\ndeclare -x OLDPWD='/new'\n"),
            "{text}"
        );
        assert!(!text.contains("__agent_save"), "{text}");

        let bad = ShellState {
            variables: vec![ShellVariable {
                name: "AGENTPLANE_CALL".into(),
                value: None,
                attributes: String::new(),
            }],
            ..ShellState::default()
        };
        assert!(import(&bad, b"", b"/new").is_err());
    }
}
