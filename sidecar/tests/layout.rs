//! The files of `sidecar/src` import one way: no file reaches, through the
//! paths it names, a file that reaches it back. A loop between two files
//! means neither can be read, changed or tested without the other, which is
//! how the runner's toolset parsing once lived in its command line and its
//! command line in the runner (issue 28).
//!
//! Read from the source text, not from the compiler: every `crate::`,
//! `super::` and `self::` path (in `use` lines, `use` groups and inline
//! paths alike) and every path through a child module (`shell::spawn` in
//! `tools/mod.rs`) counts, resolved to the deepest module file it names.
//! `#[cfg(test)]` modules are left out: a unit test may reach anything.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path (`tools::shell`; `""` for lib.rs) -> source file.
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let rel = path
                .strip_prefix(src)
                .expect("under src")
                .with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if parts.last().map(String::as_str) == Some("mod") {
                parts.pop();
            }
            // main.rs is the binary's crate, which names the library as
            // `sidecar::`, never as `crate::`.
            if parts == ["main"] {
                continue;
            }
            if parts == ["lib"] {
                parts.clear();
            }
            out.insert(parts.join("::"), path);
        }
    }
    out
}

/// The source without comments and without its `#[cfg(test)]` modules.
fn code(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut skip_test_module = false;
    let mut depth_at_skip = 0usize;
    let mut depth = 0usize;
    let mut pending_cfg_test = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let line = match trimmed.find("//") {
            Some(i) if !trimmed[..i].contains('"') => &trimmed[..i],
            _ => trimmed,
        };
        if skip_test_module {
            depth += line.matches('{').count();
            depth = depth.saturating_sub(line.matches('}').count());
            if depth <= depth_at_skip {
                skip_test_module = false;
            }
            continue;
        }
        if line.starts_with("#[cfg(test)]") {
            pending_cfg_test = true;
            continue;
        }
        if pending_cfg_test && line.starts_with("mod ") && line.contains('{') {
            depth_at_skip = depth;
            depth += line.matches('{').count();
            depth = depth.saturating_sub(line.matches('}').count());
            skip_test_module = depth > depth_at_skip;
            pending_cfg_test = false;
            continue;
        }
        pending_cfg_test = false;
        depth += line.matches('{').count();
        depth = depth.saturating_sub(line.matches('}').count());
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path in `code` that starts with `head` (a keyword or a child
/// module's name) as a list of segments, `use` groups expanded.
fn paths_from(code: &str, head: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let needle = format!("{head}::");
    let mut from = 0;
    while let Some(i) = code[from..].find(&needle) {
        let at = from + i;
        from = at + needle.len();
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| is_ident(c) || c == ':') {
            continue;
        }
        let mut segs = vec![head.to_owned()];
        expand(code, at + needle.len(), &mut segs, &mut out);
    }
    out
}

/// Reads path segments from `at`, pushing each complete path (a group
/// `{a, b::c}` yields one per member).
fn expand(code: &str, mut at: usize, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let rest = &code[at..];
    if rest.starts_with('{') {
        at += 1;
        let mut depth = 0usize;
        let mut start = at;
        for (i, c) in code[at..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    member(code, start, prefix, out);
                    return;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    member(code, start, prefix, out);
                    start = at + i + 1;
                }
                _ => {}
            }
        }
        return;
    }
    let seg: String = rest.chars().take_while(|&c| is_ident(c)).collect();
    if seg.is_empty() {
        out.push(prefix.clone());
        return;
    }
    let after = at + seg.len();
    prefix.push(seg);
    if code[after..].starts_with("::") {
        expand(code, after + 2, prefix, out);
    } else {
        out.push(prefix.clone());
    }
    prefix.pop();
}

fn member(code: &str, start: usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let skip = code[start..].len() - code[start..].trim_start().len();
    let mut p = prefix.to_vec();
    expand(code, start + skip, &mut p, out);
}

/// The deepest module a path from module `from` names.
fn resolve(from: &str, path: &[String], mods: &BTreeMap<String, PathBuf>) -> Option<String> {
    let mut base: Vec<String> = if from.is_empty() {
        Vec::new()
    } else {
        from.split("::").map(str::to_owned).collect()
    };
    let mut segs = path;
    match segs.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            segs = &segs[1..];
        }
        Some("self" | "super") => {
            while let Some(s) = segs.first() {
                match s.as_str() {
                    "self" => {}
                    "super" => {
                        base.pop()?;
                    }
                    _ => break,
                }
                segs = &segs[1..];
            }
        }
        // A child module's name: relative to `from`.
        _ => {}
    }
    let mut best = None;
    let mut cur = base;
    if mods.contains_key(&cur.join("::")) {
        best = Some(cur.join("::"));
    }
    for s in segs {
        cur.push(s.clone());
        let key = cur.join("::");
        if mods.contains_key(&key) {
            best = Some(key);
        } else {
            break;
        }
    }
    best
}

fn edges(mods: &BTreeMap<String, PathBuf>) -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    for (m, file) in mods {
        let code = code(&std::fs::read_to_string(file).expect("read source"));
        let prefix = if m.is_empty() {
            String::new()
        } else {
            format!("{m}::")
        };
        let children: Vec<String> = mods
            .keys()
            .filter_map(|k| k.strip_prefix(&prefix))
            .filter(|rest| !rest.is_empty() && !rest.contains("::"))
            .map(str::to_owned)
            .collect();
        let mut heads = vec!["crate".to_owned(), "super".to_owned(), "self".to_owned()];
        heads.extend(children);
        let mut deps = BTreeSet::new();
        for head in &heads {
            for path in paths_from(&code, head) {
                if let Some(to) = resolve(m, &path, mods)
                    && to != *m
                {
                    deps.insert(to);
                }
            }
        }
        out.insert(m.clone(), deps);
    }
    out
}

/// One loop, as the files it runs through, if there is any.
fn find_loop(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        marks.insert(n.to_owned(), Mark::Open);
        stack.push(n.to_owned());
        for next in graph.get(n).into_iter().flatten() {
            match marks.get(next.as_str()) {
                Some(Mark::Open) => {
                    let start = stack.iter().position(|s| s == next).unwrap_or(0);
                    let mut cycle = stack[start..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Some(Mark::Done) => {}
                None => {
                    if let Some(c) = visit(next, graph, marks, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        marks.insert(n.to_owned(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for n in graph.keys() {
        if !marks.contains_key(n.as_str())
            && let Some(c) = visit(n, graph, &mut marks, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

fn name(m: &str) -> &str {
    if m.is_empty() { "lib" } else { m }
}

#[test]
fn no_file_of_the_runner_imports_one_that_imports_it_back() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mods = modules(&src);
    let graph = edges(&mods);
    // The reader must see the imports at all, or an empty graph would pass.
    assert!(
        graph
            .get("tools::bash")
            .is_some_and(|d| d.contains("tools::shell")),
        "the reader found no edge bash -> shell: {graph:?}"
    );
    assert!(
        graph
            .get("tools")
            .is_some_and(|d| d.contains("tools::bash")),
        "the reader found no child-relative edge tools -> bash: {graph:?}"
    );
    if let Some(cycle) = find_loop(&graph) {
        let shown: Vec<&str> = cycle.iter().map(|m| name(m)).collect();
        panic!("an import loop in sidecar/src: {}", shown.join(" -> "));
    }
}

#[test]
fn the_reader_finds_a_loop_when_there_is_one() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir(src.join("tools")).unwrap();
    std::fs::write(
        src.join("lib.rs"),
        "pub mod a;\npub mod b;\npub mod tools;\n",
    )
    .unwrap();
    std::fs::write(src.join("a.rs"), "use crate::{b::{Thing, other}, tools};\n").unwrap();
    std::fs::write(
        src.join("b.rs"),
        "fn f() { crate::tools::shell::spawn(); }\n",
    )
    .unwrap();
    std::fs::write(src.join("tools/mod.rs"), "pub mod shell;\n").unwrap();
    std::fs::write(
        src.join("tools/shell.rs"),
        "// use crate::b; in a comment is no import\nfn g() { super::super::a::x(); }\n#[cfg(test)]\nmod tests {\n    use crate::b;\n}\n",
    )
    .unwrap();
    let graph = edges(&modules(src));
    assert_eq!(
        graph["a"],
        BTreeSet::from(["b".to_owned(), "tools".to_owned()])
    );
    assert_eq!(graph["tools::shell"], BTreeSet::from(["a".to_owned()]));
    let cycle = find_loop(&graph).expect("a -> b -> tools::shell -> a");
    assert!(
        cycle.contains(&"a".to_owned()) && cycle.contains(&"tools::shell".to_owned()),
        "{cycle:?}"
    );
}
