//! Checks on the shape of the project's own sources, run as tests so that a
//! change which breaks the layout fails CI instead of waiting for a reviewer:
//!
//! - no import circle among the files of a crate ([`cycles`]): a file that
//!   (through any chain) imports itself cannot be read, moved or tested on
//!   its own;
//! - the operator's wings import only through their doors ([`Doors`]);
//! - no function longer than a reader can hold ([`long_functions`]).
//!
//! Imports are read with `syn`, not grepped: a `use crate::a::b` line, an
//! inline `crate::a::f()` in an expression and a `super::` path all count,
//! and comments or strings that merely mention a path do not.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

mod graph;
mod visit;

pub use graph::cycles;

/// Why a crate's sources could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot parse {path}: {message} (line {line})")]
    Parse {
        path: PathBuf,
        message: String,
        line: usize,
    },
}

/// A module's path from the crate root: `[]` is `lib.rs`, `["session",
/// "plan"]` is `session/plan.rs`.
pub type ModPath = Vec<String>;

/// One reference from a file to a module of its own crate.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Import {
    /// The file module the path resolves to (the deepest one it names).
    pub target: ModPath,
    /// Where the path is written.
    pub line: usize,
}

/// A function and how many lines it spans, from its doc comment (or
/// signature) to its closing brace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Function {
    pub name: String,
    pub line: usize,
    pub lines: usize,
}

/// One source file of a crate, as the checks see it.
#[derive(Debug, Clone)]
pub struct File {
    /// Relative to the crate's `src`.
    pub path: PathBuf,
    pub imports: Vec<Import>,
    pub functions: Vec<Function>,
}

/// Every file module of one crate's library, keyed by module path.
#[derive(Debug, Clone)]
pub struct Crate {
    pub src: PathBuf,
    pub files: BTreeMap<ModPath, File>,
}

/// Files bigger than this are not source a person wrote.
const MAX_SOURCE_BYTES: u64 = 4 << 20;
/// Deeper folders than this are not a module tree.
const MAX_DEPTH: usize = 8;

impl Crate {
    /// Reads the library under `src` (`lib.rs` and the modules under it;
    /// `main.rs` and `src/bin` are binaries that use the library by name).
    pub fn read(src: &Path) -> Result<Self, Error> {
        let mut paths = Vec::new();
        collect(src, src, 0, &mut paths)?;
        let modules: BTreeMap<ModPath, PathBuf> = paths
            .into_iter()
            .filter_map(|rel| module_path(&rel).map(|m| (m, rel)))
            .collect();
        let known: BTreeSet<ModPath> = modules.keys().cloned().collect();
        let mut parsed = BTreeMap::new();
        for (module, rel) in &modules {
            let full = src.join(rel);
            let text = std::fs::read_to_string(&full).map_err(|source| Error::Io {
                path: full.clone(),
                source,
            })?;
            let file = syn::parse_file(&text).map_err(|e| Error::Parse {
                path: full.clone(),
                message: e.to_string(),
                line: e.span().start().line,
            })?;
            parsed.insert(module.clone(), file);
        }
        // A path through a re-export (`crate::Error` for `crate::error::
        // Error`) depends on the module the name comes from, not on the one
        // re-exporting it.
        let reexports: visit::Reexports = parsed
            .iter()
            .map(|(m, f)| (m.clone(), visit::reexports(f, m, &known)))
            .collect();
        let mut files = BTreeMap::new();
        for (module, rel) in modules {
            let (imports, functions) = visit::read(&parsed[&module], &module, &known, &reexports);
            files.insert(
                module,
                File {
                    path: rel,
                    imports,
                    functions,
                },
            );
        }
        Ok(Self {
            src: src.to_owned(),
            files,
        })
    }

    /// The file `module` lives in, for messages.
    pub fn path_of(&self, module: &ModPath) -> String {
        self.files
            .get(module)
            .map(|f| f.path.display().to_string())
            .unwrap_or_else(|| module.join("::"))
    }
}

fn collect(src: &Path, dir: &Path, depth: usize, out: &mut Vec<PathBuf>) -> Result<(), Error> {
    if depth > MAX_DEPTH {
        return Ok(());
    }
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| Error::Io { path, source }
    };
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .collect::<Result<_, _>>()
        .map_err(io(dir))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let kind = entry.file_type().map_err(io(&path))?;
        if kind.is_dir() {
            if depth == 0 && entry.file_name() == "bin" {
                continue;
            }
            collect(src, &path, depth + 1, out)?;
        } else if kind.is_file()
            && path.extension().is_some_and(|e| e == "rs")
            && entry.metadata().map_err(io(&path))?.len() <= MAX_SOURCE_BYTES
            && let Ok(rel) = path.strip_prefix(src)
        {
            out.push(rel.to_owned());
        }
    }
    Ok(())
}

/// `lib.rs` -> `[]`, `a.rs` -> `[a]`, `a/mod.rs` -> `[a]`, `a/b.rs` ->
/// `[a, b]`; `main.rs` is a binary of its own (none).
fn module_path(rel: &Path) -> Option<ModPath> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    match (parts.is_empty(), stem) {
        (true, "lib") => Some(Vec::new()),
        (true, "main") => None,
        (_, "mod") => Some(parts),
        _ => {
            parts.push(stem.to_owned());
            Some(parts)
        }
    }
}

/// The operator's wings and the doors between them.
#[derive(Debug, Clone)]
pub struct Doors<'a> {
    /// Top-level module folders that are wings; every other module is the
    /// shared base.
    pub wings: &'a [&'a str],
    /// For each wing (and `"base"`), the wings it may import besides
    /// itself and the base. The base may import only itself.
    pub allowed: &'a [(&'a str, &'a [&'a str])],
    /// Top-level modules that wire the wings together and may import any
    /// (the crate root is always one).
    pub wiring: &'a [&'a str],
}

impl Doors<'_> {
    /// The wing `module` belongs to (`"base"` for the shared base).
    pub fn wing_of<'m>(&self, module: &'m ModPath) -> &'m str {
        match module.first() {
            Some(w) if self.wings.contains(&w.as_str()) => w,
            _ => "base",
        }
    }

    fn may(&self, from: &str, to: &str) -> bool {
        from == to
            || to == "base"
            || self
                .allowed
                .iter()
                .any(|(w, doors)| *w == from && doors.contains(&to))
    }

    /// Every import that goes through a door it may not, as
    /// `file:line: wing imports wing (module)`.
    pub fn violations(&self, krate: &Crate) -> Vec<String> {
        let mut out = Vec::new();
        for (module, file) in &krate.files {
            let wiring = module.is_empty()
                || (module.len() == 1 && self.wiring.contains(&module[0].as_str()));
            if wiring {
                continue;
            }
            let from = self.wing_of(module);
            for import in &file.imports {
                let to = self.wing_of(&import.target);
                if !self.may(from, to) {
                    out.push(format!(
                        "{}:{}: the {from} wing imports the {to} wing (crate::{}), which it may not",
                        file.path.display(),
                        import.line,
                        import.target.join("::"),
                    ));
                }
            }
        }
        out
    }
}

/// Every function in `krate` longer than `max` lines, as
/// `file:line: name is N lines`.
pub fn long_functions(krate: &Crate, max: usize) -> Vec<String> {
    krate
        .files
        .values()
        .flat_map(|file| {
            file.functions
                .iter()
                .filter(move |f| f.lines > max)
                .map(move |f| {
                    format!(
                        "{}:{}: {} is {} lines (at most {max})",
                        file.path.display(),
                        f.line,
                        f.name,
                        f.lines
                    )
                })
        })
        .collect()
}

/// The operator's wings and doors (docs/architecture.md draws them):
/// `pool` may use `session`'s builders, `session` may list MCP servers
/// through `mcp` and mount a fork's checkpoint through `checkpoint`;
/// `admission`, `mcp` and `checkpoint` stand on the base alone, and the
/// base imports no wing. `cli` wires them together.
pub const OPERATOR_DOORS: Doors<'static> = Doors {
    wings: &["session", "pool", "admission", "mcp", "checkpoint"],
    allowed: &[("session", &["mcp", "checkpoint"]), ("pool", &["session"])],
    wiring: &["cli"],
};

/// The longest function the operator may have.
pub const MAX_OPERATOR_FUNCTION_LINES: usize = 80;
