//! A warm pool's sandbox, bound to its session late.
//!
//! A warm pod runs before any session exists, so its runner starts with
//! nothing to enforce: `serve --await-binding PATH` starts *unbound*, with a
//! toolset that enables nothing, and refuses every call
//! ([`runner_api::Refusal::Unbound`]) while health stays SERVING (the pool
//! needs the pod Ready). When a session claims the pod, the operator writes
//! the session's toolset file and its binding file ([`runner_api::Binding`])
//! into the pod's ConfigMap; the runner binds once both parse, on the first
//! call that finds them (so that call is served, not refused) or on a poll,
//! and stays bound for its life.
//!
//! Both files are read bounded and checked before anything of them is used:
//! the sandbox user can write into the mount's directory only if the pod
//! lets it, but a broken operator or a hostile template must at worst keep
//! the sandbox unbound, never grow or crash the runner.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use runner_api::Binding;
use runner_api::binding::{MAX_BINDING_BYTES, MAX_BINDING_ENV};
use toolset::ResolvedToolset;

use crate::fsutil::{ConfigReadError, read_config_file};
use crate::tools::shell::is_identifier;

/// The two files a warm sandbox waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwaitBinding {
    /// The binding file (`--await-binding`).
    pub binding: PathBuf,
    /// The session's toolset file (`--toolset`).
    pub toolset: PathBuf,
}

/// Both files, read and checked: what binding applies.
#[derive(Debug)]
pub struct Found {
    pub binding: Binding,
    pub toolset: ResolvedToolset,
    /// The files' bytes as bound, so that later changes can be told apart.
    pub binding_bytes: Vec<u8>,
    pub toolset_bytes: Vec<u8>,
}

/// Why the sandbox is not bound yet.
#[derive(Debug, PartialEq, Eq)]
pub enum Pending {
    /// A file is not there yet: the normal state of a warm pod.
    Missing(PathBuf),
    /// A file is there but unusable; the message names the file and what is
    /// wrong with it (never a value of the binding's environment).
    Unusable(String),
}

/// Reads the binding file, then the toolset file, and checks both. The
/// binding is read first because it is the smaller and the last the
/// operator needs to be right about: a broken one costs no toolset parse.
pub fn read(paths: &AwaitBinding) -> Result<Found, Pending> {
    let binding_bytes = read_file(&paths.binding, MAX_BINDING_BYTES)?;
    let binding = parse(&paths.binding, &binding_bytes)?;
    let toolset_bytes = read_file(&paths.toolset, crate::toolset_file::MAX_TOOLSET_BYTES)?;
    let toolset = crate::toolset_file::parse_toolset(&paths.toolset, &toolset_bytes)
        .map_err(|e| Pending::Unusable(e.to_string()))?;
    Ok(Found {
        binding,
        toolset,
        binding_bytes,
        toolset_bytes,
    })
}

fn read_file(path: &Path, cap: u64) -> Result<Vec<u8>, Pending> {
    read_config_file(path, cap).map_err(|e| match e {
        ConfigReadError::Missing => Pending::Missing(path.to_path_buf()),
        ConfigReadError::Unusable(m) => Pending::Unusable(format!("{}: {m}", path.display())),
    })
}

/// The binding file's bytes as a checked [`Binding`].
pub fn parse(path: &Path, bytes: &[u8]) -> Result<Binding, Pending> {
    let binding: Binding = serde_json::from_slice(bytes).map_err(|e| {
        Pending::Unusable(format!(
            "{}: not a binding ({{\"session\": ..., \"env\": [{{\"name\": ..., \"value\": ...}}]}}): {e}",
            path.display()
        ))
    })?;
    check(&binding).map_err(|m| Pending::Unusable(format!("{}: {m}", path.display())))?;
    Ok(binding)
}

/// What the runner requires of a binding beyond its shape: at most
/// [`MAX_BINDING_ENV`] variables, each named as a shell variable must be
/// (bash could not hold another name, and the name is written unquoted into
/// the shell's state), each value free of NUL (which would end the state in
/// the shell's input). A fault names its entry, never its value.
pub fn check(binding: &Binding) -> Result<(), String> {
    if binding.env.len() > MAX_BINDING_ENV {
        return Err(format!(
            "env has {} entries, more than the {MAX_BINDING_ENV} a binding may carry",
            binding.env.len()
        ));
    }
    for (i, e) in binding.env.iter().enumerate() {
        if !is_identifier(&e.name) {
            return Err(format!(
                "env[{i}].name {:?} is not a shell variable name ([A-Za-z_][A-Za-z0-9_]*)",
                toolset::truncate_runes(&e.name, 64)
            ));
        }
        if e.value.contains('\0') {
            return Err(format!(
                "env[{i}].value (of {}) contains a NUL byte, which no environment variable can hold",
                toolset::truncate_runes(&e.name, 64)
            ));
        }
    }
    Ok(())
}

/// The binding as it was applied.
#[derive(Debug)]
pub struct Bound {
    pub session: String,
    pub binding_bytes: Vec<u8>,
    pub toolset_bytes: Vec<u8>,
}

/// The runner's side of the wait: the files to read, the binding once made,
/// and a lock that lets one caller at a time try, so two calls arriving
/// together bind once.
#[derive(Debug)]
pub struct Gate {
    pub paths: AwaitBinding,
    bound: OnceLock<Bound>,
    /// Held while trying; holds the last fault reported, so a file that
    /// stays broken is warned about once, not on every poll and call.
    attempt: Mutex<Option<String>>,
}

impl Gate {
    pub fn new(paths: AwaitBinding) -> Gate {
        Gate {
            paths,
            bound: OnceLock::new(),
            attempt: Mutex::new(None),
        }
    }

    /// The binding, once made.
    pub fn bound(&self) -> Option<&Bound> {
        self.bound.get()
    }

    /// Binds if it can: `apply` runs at most once in the gate's life, with
    /// the files found, before any caller sees the gate bound (so a call
    /// that sees it bound sees the session's toolset and environment).
    /// `None` while it cannot bind yet (the reason is logged once).
    pub fn try_bind(&self, apply: impl FnOnce(&Found)) -> Option<&Bound> {
        if let Some(b) = self.bound.get() {
            return Some(b);
        }
        let mut last = self
            .attempt
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Another caller may have bound while this one waited for the lock.
        if let Some(b) = self.bound.get() {
            return Some(b);
        }
        match read(&self.paths) {
            Ok(found) => {
                apply(&found);
                *last = None;
                Some(self.bound.get_or_init(|| Bound {
                    session: found.binding.session,
                    binding_bytes: found.binding_bytes,
                    toolset_bytes: found.toolset_bytes,
                }))
            }
            Err(Pending::Missing(path)) => {
                tracing::debug!(file = %path.display(), "not bound yet: waiting for the file");
                None
            }
            Err(Pending::Unusable(why)) => {
                if last.as_deref() != Some(why.as_str()) {
                    tracing::warn!(
                        binding = %self.paths.binding.display(),
                        max_binding_bytes = MAX_BINDING_BYTES,
                        max_toolset_bytes = crate::toolset_file::MAX_TOOLSET_BYTES,
                        "cannot bind this warm sandbox to its session, staying unbound: {why}"
                    );
                    *last = Some(why);
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use runner_api::BoundEnv;

    use super::*;

    fn binding(env: &[(&str, &str)]) -> Binding {
        Binding {
            session: "demo".into(),
            env: env
                .iter()
                .map(|(n, v)| BoundEnv {
                    name: (*n).into(),
                    value: (*v).into(),
                })
                .collect(),
        }
    }

    #[test]
    fn faults_name_the_entry_and_never_the_value() {
        assert_eq!(check(&binding(&[("A", "1"), ("_b2", "it's")])), Ok(()));
        let e = check(&binding(&[
            ("A", "1"),
            ("B", "2"),
            ("C", "3"),
            ("1BAD", "x"),
        ]))
        .unwrap_err();
        assert!(e.starts_with("env[3].name \"1BAD\""), "{e}");
        let e = check(&binding(&[("A", "sec\0ret")])).unwrap_err();
        assert!(e.starts_with("env[0].value (of A)"), "{e}");
        assert!(!e.contains("sec"), "{e}");
        let many: Vec<(String, String)> = (0..=MAX_BINDING_ENV)
            .map(|i| (format!("V{i}"), String::new()))
            .collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        assert!(check(&binding(&many)).unwrap_err().contains("129 entries"));
    }

    #[test]
    fn files_bind_only_when_both_parse() {
        let dir = tempfile::tempdir().unwrap();
        let paths = AwaitBinding {
            binding: dir.path().join("binding.json"),
            toolset: dir.path().join("toolset.json"),
        };
        assert_eq!(
            read(&paths).unwrap_err(),
            Pending::Missing(paths.binding.clone())
        );
        std::fs::write(
            &paths.binding,
            br#"{"session":"s","env":[{"name":"A","value":"1"}]}"#,
        )
        .unwrap();
        assert_eq!(
            read(&paths).unwrap_err(),
            Pending::Missing(paths.toolset.clone())
        );
        std::fs::write(&paths.toolset, b"{").unwrap();
        assert!(matches!(read(&paths), Err(Pending::Unusable(m)) if m.contains("toolset.json")));
        let ts = ResolvedToolset::default_enabled();
        std::fs::write(&paths.toolset, serde_json::to_vec(&ts).unwrap()).unwrap();
        let found = read(&paths).unwrap();
        let mut want = binding(&[("A", "1")]);
        want.session = "s".into();
        assert_eq!(found.binding, want);
        assert_eq!(found.toolset, ts);
        // Unknown fields are refused (the contract denies them).
        std::fs::write(&paths.binding, br#"{"session":"s","extra":1}"#).unwrap();
        assert!(matches!(read(&paths), Err(Pending::Unusable(m)) if m.contains("binding.json")));
        // Over the limit: refused from its size, whatever it holds.
        std::fs::write(&paths.binding, vec![b' '; MAX_BINDING_BYTES as usize + 1]).unwrap();
        assert!(
            matches!(read(&paths), Err(Pending::Unusable(m)) if m.contains(&MAX_BINDING_BYTES.to_string()))
        );
    }

    #[test]
    fn a_gate_binds_once() {
        let dir = tempfile::tempdir().unwrap();
        let paths = AwaitBinding {
            binding: dir.path().join("binding.json"),
            toolset: dir.path().join("toolset.json"),
        };
        std::fs::write(&paths.binding, br#"{"session":"s"}"#).unwrap();
        std::fs::write(
            &paths.toolset,
            serde_json::to_vec(&ResolvedToolset::default_enabled()).unwrap(),
        )
        .unwrap();
        let gate = std::sync::Arc::new(Gate::new(paths));
        let applied = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (gate, applied) = (gate.clone(), applied.clone());
                std::thread::spawn(move || {
                    gate.try_bind(|_| {
                        applied.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    })
                    .map(|b| b.session.clone())
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), Some("s".to_owned()));
        }
        assert_eq!(applied.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
