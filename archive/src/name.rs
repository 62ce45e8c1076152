//! Entry names and link targets as an unpacker may trust them.

use std::path::PathBuf;

use crate::MAX_NAME_BYTES;
use crate::error::Problem;

/// An entry's name as shown in an error: lossy UTF-8, cut at 256 bytes.
pub fn shown(name: &[u8]) -> String {
    let cut = &name[..name.len().min(256)];
    let mut s = String::from_utf8_lossy(cut).into_owned();
    if name.len() > cut.len() {
        s.push_str("...");
    }
    s
}

/// The components of an entry name, checked: relative, no `..`, no NUL,
/// within [`MAX_NAME_BYTES`]. `.` components and repeated or trailing
/// slashes are dropped; an empty result names the top directory itself.
pub fn components(name: &[u8]) -> Result<Vec<&[u8]>, Problem> {
    if name.is_empty() {
        return Err(Problem::BadName("empty"));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(Problem::BadName("longer than 4096 bytes"));
    }
    if name.contains(&0) {
        return Err(Problem::BadName("holds a NUL byte"));
    }
    if name[0] == b'/' {
        return Err(Problem::Absolute);
    }
    let mut out = Vec::new();
    for c in name.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err(Problem::Traversal),
            c => out.push(c),
        }
    }
    Ok(out)
}

/// The path of checked components below a root, as an `OsStr` path.
pub fn join(parts: &[&[u8]]) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    parts
        .iter()
        .map(|c| std::ffi::OsStr::from_bytes(c))
        .collect()
}

/// Whether a symbolic link at `link` (checked components) pointing at
/// `target` stays inside the tree: relative, and never `..` above the top
/// on the way (resolved lexically, as the kernel would with every
/// component inside the tree a directory or a link that itself stays in).
pub fn link_stays_inside(link: &[&[u8]], target: &[u8]) -> bool {
    if target.is_empty() || target[0] == b'/' {
        return false;
    }
    let mut depth = link.len().saturating_sub(1) as i64;
    for c in target.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            _ => depth += 1,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert_eq!(
            components(b"a/./b//c/").unwrap(),
            vec![&b"a"[..], b"b", b"c"]
        );
        assert!(components(b"./").unwrap().is_empty());
        assert_eq!(components(b"/etc/passwd"), Err(Problem::Absolute));
        assert_eq!(components(b"a/../../x"), Err(Problem::Traversal));
        assert_eq!(components(b"a/.."), Err(Problem::Traversal));
        assert!(matches!(components(b"a\0b"), Err(Problem::BadName(_))));
        assert!(matches!(components(b""), Err(Problem::BadName(_))));
    }

    #[test]
    fn link_targets_are_resolved_lexically() {
        let at = |n: &'static [u8]| components(n).unwrap();
        assert!(link_stays_inside(&at(b"a/l"), b"../b"));
        assert!(link_stays_inside(&at(b"l"), b"b/c"));
        assert!(link_stays_inside(&at(b"a/b/l"), b"../../x"));
        assert!(!link_stays_inside(&at(b"l"), b"../x"));
        assert!(!link_stays_inside(&at(b"a/l"), b"../../x"));
        assert!(!link_stays_inside(&at(b"a/l"), b"b/../../../x"));
        assert!(!link_stays_inside(&at(b"l"), b"/etc"));
        assert!(!link_stays_inside(&at(b"l"), b""));
    }
}
