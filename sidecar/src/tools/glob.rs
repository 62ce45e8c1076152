//! glob: paths matching a pattern (`**` spans directories), newest first.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use globset::GlobBuilder;
use walkdir::WalkDir;

use crate::fsutil::{describe, lexical_clean};
use crate::output::Output;
use crate::tools::ctx::Ctx;
use crate::tools::input::{parse, required};

/// Most paths returned (the reference's limit).
pub use toolset::GLOB_RESULT_LIMIT as RESULT_LIMIT;
/// Most entries visited, so a pattern over a huge tree cannot stall the call.
pub const WALK_LIMIT: usize = 50_000;
/// Longest a walk may take, so a tree on a slow filesystem cannot hold a
/// worker for the length of a bash call. A walk cut short says so.
pub const WALK_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// A glob as its input asks for it, checked before anything is walked.
struct Request {
    pattern: String,
    path: Option<String>,
}

fn request(input: &[u8]) -> Result<Request, Output> {
    let input = parse("glob", input)?;
    let pattern = input.string("pattern")?;
    let path = input.string("path")?;
    let pattern = required("glob", "pattern", &pattern)?.to_owned();
    Ok(Request { pattern, path })
}

/// An absolute pattern's part below `/`.
fn absolute(pattern: &str) -> Option<&str> {
    pattern
        .strip_prefix('/')
        .map(|rest| rest.trim_start_matches('/'))
}

fn invalid_pattern(pattern: &str, e: &globset::Error) -> Output {
    Output::error(format!("glob: invalid pattern {pattern:?}: {e}"))
}

/// [`request`]'s refusal, or the pattern's, if any (for the fuzz targets).
/// The pattern is compiled against a fixed base: the base only decides
/// where the walk starts, not whether the pattern is one.
pub(crate) fn check(input: &[u8]) -> Result<(), Output> {
    let req = request(input)?;
    let rel = absolute(&req.pattern).unwrap_or(&req.pattern);
    Plan::new(Path::new("/"), rel)
        .map(drop)
        .map_err(|e| invalid_pattern(&req.pattern, &e))
}

pub fn run(ctx: &Ctx, input: &[u8]) -> Output {
    let input = match request(input) {
        Ok(r) => r,
        Err(out) => return out,
    };
    let pattern = input.pattern.as_str();
    let (base, rel_pattern) = if let Some(rest) = absolute(pattern) {
        (PathBuf::from("/"), rest)
    } else {
        let base = match input.path.as_deref().filter(|p| !p.is_empty()) {
            Some(p) => {
                let base = ctx.resolve(p);
                match std::fs::metadata(&base) {
                    Ok(m) if m.is_dir() => base,
                    Ok(_) => return Output::error(format!("glob: {p} is not a directory")),
                    Err(e) => return Output::error(format!("glob {p}: {}", describe(&e))),
                }
            }
            None => ctx.workdir.clone(),
        };
        (base, pattern)
    };
    let plan = match Plan::new(&base, rel_pattern) {
        Ok(p) => p,
        Err(e) => return invalid_pattern(pattern, &e),
    };
    let (mut hits, timed_out) = plan.walk(std::time::Instant::now() + WALK_DEADLINE);
    let notice = if timed_out {
        format!(
            "\n[glob stopped after {} s of walking; the matches are from the part of the tree it reached]",
            WALK_DEADLINE.as_secs()
        )
    } else {
        String::new()
    };
    if hits.is_empty() {
        return Output::ok(format!("no matches{notice}"));
    }
    // Newest first; equal times by path so the answer is deterministic.
    hits.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    hits.truncate(RESULT_LIMIT);
    let lines: Vec<String> = hits.iter().map(|(p, _)| p.display().to_string()).collect();
    Output::ok(lines.join("\n") + &notice)
}

/// A pattern split into the literal directory it starts from and the glob
/// that remains, so `src/**/*.rs` walks `src` and `/etc/*.conf` walks `/etc`
/// one level deep instead of the whole filesystem.
///
/// `**` matches zero segments as well as many, as in the reference: a
/// trailing `/**` also matches what comes before it (`src/**` lists `src`
/// itself, `*/**` every top-level entry), which globset's `/**` does not.
#[derive(Debug)]
struct Plan {
    root: PathBuf,
    matcher: Option<globset::GlobMatcher>,
    /// The pattern without its trailing `**` segments, when that leaves
    /// some: what those segments match as zero.
    without_trailing: Option<globset::GlobMatcher>,
    /// The pattern's literal directory itself is a match (the rest is only
    /// `**`, and there was a literal part to name it).
    root_matches: bool,
    max_depth: usize,
}

fn is_literal(segment: &str) -> bool {
    !segment.contains(['*', '?', '[', ']', '{', '}', '\\'])
}

/// One glob of path segments, `*` not crossing `/`.
fn compile(segments: &[&str]) -> Result<globset::GlobMatcher, globset::Error> {
    Ok(GlobBuilder::new(&segments.join("/"))
        .literal_separator(true)
        .backslash_escape(true)
        .build()?
        .compile_matcher())
}

impl Plan {
    fn new(base: &Path, pattern: &str) -> Result<Plan, globset::Error> {
        let segments: Vec<&str> = pattern.split('/').filter(|s| !s.is_empty()).collect();
        let literal = segments.iter().take_while(|s| is_literal(s)).count();
        let mut root = base.to_path_buf();
        for s in &segments[..literal] {
            if *s != "." {
                root.push(s);
            }
        }
        let root = lexical_clean(&root);
        let rest = &segments[literal..];
        if rest.is_empty() {
            return Ok(Plan {
                root,
                matcher: None,
                without_trailing: None,
                root_matches: false,
                max_depth: 0,
            });
        }
        let max_depth = if rest.iter().any(|s| s.contains("**")) {
            usize::MAX
        } else {
            rest.len()
        };
        let trimmed = rest.len() - rest.iter().rev().take_while(|s| **s == "**").count();
        let without_trailing = if trimmed > 0 && trimmed < rest.len() {
            Some(compile(&rest[..trimmed])?)
        } else {
            None
        };
        // The walk's own root is never a match (the reference skips it too):
        // `**` alone lists what is under the base, not the base.
        let root_matches = trimmed == 0 && root != lexical_clean(base);
        Ok(Plan {
            root,
            matcher: Some(compile(rest)?),
            without_trailing,
            root_matches,
            max_depth,
        })
    }

    /// The matches, and whether the deadline cut the walk short.
    fn walk(&self, deadline: std::time::Instant) -> (Vec<(PathBuf, SystemTime)>, bool) {
        let Some(matcher) = &self.matcher else {
            // A fully literal pattern names one path: it matches if it exists.
            let hit = match std::fs::symlink_metadata(&self.root) {
                Ok(m) => vec![(
                    self.root.clone(),
                    m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                )],
                Err(_) => Vec::new(),
            };
            return (hit, false);
        };
        let mut hits = Vec::new();
        if self.root_matches
            && let Ok(m) = std::fs::symlink_metadata(&self.root)
        {
            hits.push((
                self.root.clone(),
                m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            ));
        }
        let walker = WalkDir::new(&self.root)
            .follow_links(false)
            .min_depth(1)
            .max_depth(self.max_depth);
        for entry in walker.into_iter().take(WALK_LIMIT) {
            if std::time::Instant::now() > deadline {
                return (hits, true);
            }
            let Ok(entry) = entry else { continue };
            let Ok(rel) = entry.path().strip_prefix(&self.root) else {
                continue;
            };
            if matcher.is_match(rel)
                || self
                    .without_trailing
                    .as_ref()
                    .is_some_and(|m| m.is_match(rel))
            {
                let mtime = entry
                    .metadata()
                    .ok()
                    .and_then(|m| m.modified().ok())
                    .unwrap_or(SystemTime::UNIX_EPOCH);
                hits.push((entry.into_path(), mtime));
            }
        }
        (hits, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_splits_literal_prefix() {
        let p = Plan::new(Path::new("/w"), "src/**/*.rs").unwrap();
        assert_eq!(p.root, PathBuf::from("/w/src"));
        assert_eq!(p.max_depth, usize::MAX);
        let p = Plan::new(Path::new("/"), "etc/*.conf").unwrap();
        assert_eq!(p.root, PathBuf::from("/etc"));
        assert_eq!(p.max_depth, 1);
        let p = Plan::new(Path::new("/w"), "../x/*").unwrap();
        assert_eq!(p.root, PathBuf::from("/x"));
        let p = Plan::new(Path::new("/w"), "a/b.txt").unwrap();
        assert!(p.matcher.is_none());
    }

    #[test]
    fn a_trailing_doublestar_also_matches_zero_segments() {
        let p = Plan::new(Path::new("/w"), "src/**").unwrap();
        assert_eq!(p.root, PathBuf::from("/w/src"));
        assert!(p.root_matches);
        let p = Plan::new(Path::new("/w"), "src/**/**").unwrap();
        assert!(p.root_matches);
        // The base itself is never a match, whatever names it.
        for pattern in ["**", "./**", "**/**"] {
            let p = Plan::new(Path::new("/w"), pattern).unwrap();
            assert!(!p.root_matches, "{pattern}");
            assert!(p.without_trailing.is_none(), "{pattern}");
        }
        let p = Plan::new(Path::new("/w"), "*/**").unwrap();
        assert!(!p.root_matches);
        let zero = p.without_trailing.expect("`*` for the zero-segment case");
        assert!(zero.is_match("f.txt"));
        assert!(!zero.is_match("d/f.txt"));
        let p = Plan::new(Path::new("/w"), "src/*.rs").unwrap();
        assert!(!p.root_matches);
        assert!(p.without_trailing.is_none());
    }

    #[test]
    fn star_does_not_cross_directories() {
        let p = Plan::new(Path::new("/w"), "*.rs").unwrap();
        let m = p.matcher.unwrap();
        assert!(m.is_match("a.rs"));
        assert!(!m.is_match("d/a.rs"));
        let p = Plan::new(Path::new("/w"), "**/*.rs").unwrap();
        let m = p.matcher.unwrap();
        assert!(m.is_match("a.rs"));
        assert!(m.is_match("d/e/a.rs"));
    }
}
