//! Files into and out of a session's sandbox, through the gateway's tool
//! calls only: the platform's authorised path into a sandbox (there is no
//! file RPC). Files go in as `bash` calls that decode base64 chunks
//! (`printf '%s' 'B64' | base64 -d >> 'FILE'`), or, when the session has
//! bash disabled, as `write` calls for UTF-8 files (binary files are then
//! skipped). Files come out as `bash` calls that print base64 slices of a
//! file, each small enough for the runner's 100 KiB output cap.
//!
//! Every command runs in a subshell that first changes to the workdir, so
//! the session's own shell state (its cwd) is neither used nor changed.
//! Paths handed in are relative to the workdir (or absolute) and are
//! single-quoted; the callers check them (no `..`, no absolute archive
//! entries) before they get here.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use base64::Engine;
use serde_json::json;

use crate::ledger::ToolCall;
use crate::tools::{Gateway, Outcome};

/// Base64 text per bash call (the command stays well inside the runner's
/// input and the gateway's message limits).
pub const PUT_CHUNK: usize = 48 << 10;
/// Raw bytes read back per bash call: their base64 (80 KiB) stays under
/// the runner's 100 KiB output cap.
pub const GET_CHUNK: usize = 60 << 10;
/// How long one internal call may take.
const CALL_LIMIT: Duration = Duration::from_secs(90);
/// The largest file the `write` fallback sends (the runner's write cap,
/// `toolset::MAX_FILE_BYTES`).
pub const MAX_WRITE_BYTES: usize = 256 << 10;
/// Printed by a script that finished.
const DONE: &str = "agentplane-dispatcher:done";
/// Brackets the data a script prints.
const BEGIN: &str = "agentplane-dispatcher:begin";
const END: &str = "agentplane-dispatcher:end";

/// What runs the dispatcher's own calls: the gateway, or in tests a
/// stand-in that runs them on the test's host.
pub trait Tools: Sync {
    /// Runs one call (see [`Gateway::call`]).
    fn call(
        &self,
        namespace: &str,
        session: &str,
        call: &ToolCall,
        approve: bool,
        resume: bool,
    ) -> impl Future<Output = Outcome> + Send;
}

impl Tools for Gateway {
    fn call(
        &self,
        namespace: &str,
        session: &str,
        call: &ToolCall,
        approve: bool,
        resume: bool,
    ) -> impl Future<Output = Outcome> + Send {
        Gateway::call(self, namespace, session, call, approve, resume)
    }
}

/// A file to put into the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutFile {
    /// Relative to the directory it is put under; checked by the caller.
    pub path: String,
    /// Its bytes.
    pub data: Vec<u8>,
    /// Mode 0755 rather than 0644.
    pub executable: bool,
}

/// `s` as one single-quoted shell word.
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// `dir/rel` (or `rel` when `dir` is empty).
pub fn join(dir: &str, rel: &str) -> String {
    if dir.is_empty() {
        rel.to_owned()
    } else {
        format!("{}/{rel}", dir.trim_end_matches('/'))
    }
}

/// The bash scripts that write `files` under `dir`, each carrying at most
/// [`PUT_CHUNK`] bytes of base64: a file larger than that spans calls
/// (the first truncates, the rest append), small files share one. Every
/// script ends by printing the done marker, so a cut or failed one shows.
pub fn put_scripts(dir: &str, files: &[PutFile]) -> Vec<String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut scripts = Vec::new();
    let mut cur: Vec<String> = Vec::new();
    let mut load = 0usize;
    let flush = |cur: &mut Vec<String>, load: &mut usize, scripts: &mut Vec<String>| {
        if !cur.is_empty() {
            cur.push(format!("echo {DONE}"));
            scripts.push(cur.join("\n"));
            cur.clear();
        }
        *load = 0;
    };
    for f in files {
        let target = quote(&join(dir, &f.path));
        let parent = match join(dir, &f.path).rsplit_once('/') {
            Some((p, _)) if !p.is_empty() => p.to_owned(),
            _ => ".".to_owned(),
        };
        cur.push(format!("mkdir -p -- {} && : > {target}", quote(&parent)));
        // Raw bytes per chunk so that the base64 is at most PUT_CHUNK.
        let raw = PUT_CHUNK / 4 * 3;
        for chunk in f.data.chunks(raw) {
            let text = b64.encode(chunk);
            if load + text.len() > PUT_CHUNK {
                flush(&mut cur, &mut load, &mut scripts);
            }
            load += text.len();
            cur.push(format!("printf '%s' '{text}' | base64 -d >> {target}"));
        }
        let mode = if f.executable { "0755" } else { "0644" };
        cur.push(format!("chmod {mode} -- {target}"));
    }
    flush(&mut cur, &mut load, &mut scripts);
    scripts
}

/// The text between the begin and end markers of a script's output, or
/// `None` when the output does not hold both (a failed or cut call).
pub fn between_markers(out: &str) -> Option<&str> {
    let start = out.find(BEGIN)? + BEGIN.len();
    let rest = out[start..].strip_prefix('\n').unwrap_or(&out[start..]);
    let end = rest.find(END)?;
    Some(rest[..end].trim_end_matches('\n'))
}

/// A session's sandbox, for the dispatcher's own calls.
#[derive(Debug)]
pub struct Sandbox {
    /// The AgentSession's namespace.
    pub namespace: String,
    /// The AgentSession's name.
    pub name: String,
    /// The sandbox's workdir (absolute).
    pub workdir: String,
    /// Tool name -> policy, for every enabled tool (the session's status).
    pub policies: BTreeMap<String, String>,
    /// Call ids: `dispatcher-<what>-<nonce>-<n>`.
    nonce: String,
    counter: AtomicU32,
}

impl Sandbox {
    /// The sandbox `name` in `namespace`.
    pub fn new(
        namespace: &str,
        name: &str,
        workdir: &str,
        policies: BTreeMap<String, String>,
    ) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            workdir: workdir.to_owned(),
            policies,
            nonce: format!("{:08x}", fastrand::u32(..)),
            counter: AtomicU32::new(0),
        }
    }

    /// Whether the session has `tool` enabled.
    pub fn has(&self, tool: &str) -> bool {
        self.policies.contains_key(tool)
    }

    /// One call of `tool` under an id of the dispatcher's own, approved at
    /// the gateway when the session's policy for the tool is always_ask
    /// (these calls are the platform's, not the agent's).
    pub async fn call(
        &self,
        gateway: &impl Tools,
        what: &str,
        tool: &str,
        input: serde_json::Value,
    ) -> Outcome {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let call = ToolCall {
            id: format!("dispatcher-{what}-{}-{n}", self.nonce),
            name: tool.to_owned(),
            input,
            custom: false,
            thread: None,
        };
        let approve = self.policies.get(tool).map(String::as_str) == Some("always_ask");
        match tokio::time::timeout(
            CALL_LIMIT,
            gateway.call(&self.namespace, &self.name, &call, approve, false),
        )
        .await
        {
            Ok(o) => o,
            Err(_) => Outcome {
                content: format!("no answer within {}s", CALL_LIMIT.as_secs()),
                is_error: true,
            },
        }
    }

    /// Runs `script` under `set -e` in a subshell in the workdir; its
    /// output when it printed the done marker, else why not.
    pub async fn bash(
        &self,
        gateway: &impl Tools,
        what: &str,
        script: &str,
    ) -> Result<String, String> {
        let command = format!("(\nset -e\ncd -- {}\n{script}\n)", quote(&self.workdir));
        let o = self
            .call(
                gateway,
                what,
                "bash",
                json!({"command": command, "timeout_ms": 60_000}),
            )
            .await;
        if o.is_error || !o.content.contains(DONE) {
            return Err(short(&o.content));
        }
        Ok(o.content)
    }

    /// Puts `files` under `dir` (relative to the workdir, or absolute).
    /// With bash: every file. Without: UTF-8 files up to the write cap
    /// through `write`, the rest skipped and named in the error list.
    /// Returns the files that could not be put, with why.
    pub async fn put(
        &self,
        gateway: &impl Tools,
        what: &str,
        dir: &str,
        files: &[PutFile],
    ) -> Result<Vec<String>, String> {
        if self.has("bash") {
            for s in put_scripts(dir, files) {
                self.bash(gateway, what, &s).await?;
            }
            return Ok(Vec::new());
        }
        if !self.has("write") {
            return Err("the session has neither bash nor write enabled".into());
        }
        let mut skipped = Vec::new();
        for f in files {
            let Ok(text) = std::str::from_utf8(&f.data) else {
                skipped.push(format!(
                    "{}: binary, and bash (needed for binary files) is disabled",
                    f.path
                ));
                continue;
            };
            if f.data.len() > MAX_WRITE_BYTES {
                skipped.push(format!(
                    "{}: {} bytes, over the write tool's {MAX_WRITE_BYTES}",
                    f.path,
                    f.data.len()
                ));
                continue;
            }
            let path = if dir.starts_with('/') {
                join(dir, &f.path)
            } else {
                join(&self.workdir, &join(dir, &f.path))
            };
            let o = self
                .call(
                    gateway,
                    what,
                    "write",
                    json!({"file_path": path, "content": text}),
                )
                .await;
            if o.is_error {
                return Err(format!("writing {}: {}", f.path, short(&o.content)));
            }
        }
        Ok(skipped)
    }

    /// Reads `size` bytes of the file at `path` (relative to the workdir,
    /// or absolute), [`GET_CHUNK`] bytes per call.
    pub async fn get(
        &self,
        gateway: &impl Tools,
        what: &str,
        path: &str,
        size: usize,
    ) -> Result<Vec<u8>, String> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut out = Vec::with_capacity(size);
        while out.len() < size {
            let len = GET_CHUNK.min(size - out.len());
            let script = format!(
                "echo {BEGIN}\ntail -c +{} -- {} | head -c {len} | base64 -w0\necho\necho {END}\necho {DONE}",
                out.len() + 1,
                quote(path)
            );
            let text = self.bash(gateway, what, &script).await?;
            let data = between_markers(&text)
                .ok_or_else(|| "the read's output has no data markers".to_owned())?;
            let bytes = b64
                .decode(data.trim())
                .map_err(|e| format!("the read's output is not base64: {e}"))?;
            if bytes.is_empty() {
                return Err(format!("{path} ended after {} of {size} bytes", out.len()));
            }
            out.extend_from_slice(&bytes);
        }
        out.truncate(size);
        Ok(out)
    }
}

fn short(s: &str) -> String {
    let mut t: String = s.chars().take(400).collect();
    if t.len() < s.len() {
        t.push('…');
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_keeps_every_byte_literal() {
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote("$(rm -rf /)`x`"), "'$(rm -rf /)`x`'");
        // The shell reads the quoted word back as the original.
        for s in ["plain", "it's", "a'b'c", "$HOME", "new\nline", "*?[]"] {
            let out = std::process::Command::new("bash")
                .arg("-c")
                .arg(format!("printf '%s' {}", quote(s)))
                .output()
                .expect("bash");
            assert_eq!(String::from_utf8(out.stdout).unwrap(), s);
        }
    }

    fn run(scripts: &[String], dir: &std::path::Path) {
        for s in scripts {
            let out = std::process::Command::new("bash")
                .arg("-c")
                .arg(format!(
                    "(\nset -e\ncd -- {}\n{s}\n)",
                    quote(dir.to_str().unwrap())
                ))
                .output()
                .expect("bash");
            assert!(
                String::from_utf8_lossy(&out.stdout).contains(DONE),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    #[test]
    fn large_files_span_calls_and_small_ones_share_one() {
        let big: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let files = vec![
            PutFile {
                path: "a.txt".into(),
                data: b"hello\n".to_vec(),
                executable: false,
            },
            PutFile {
                path: "deep/er/it's.bin".into(),
                data: big.clone(),
                executable: true,
            },
            PutFile {
                path: "empty".into(),
                data: Vec::new(),
                executable: false,
            },
        ];
        let scripts = put_scripts("skills/x", &files);
        assert!(scripts.len() >= 5, "{}", scripts.len());
        for s in &scripts {
            let payload: usize = s
                .lines()
                .filter_map(|l| l.strip_prefix("printf '%s' '"))
                .map(|l| l.split('\'').next().unwrap().len())
                .sum();
            assert!(payload <= PUT_CHUNK, "{payload}");
        }
        let tmp = std::env::temp_dir().join(format!("dispatcher-put-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&tmp).unwrap();
        run(&scripts, &tmp);
        let base = tmp.join("skills/x");
        assert_eq!(std::fs::read(base.join("a.txt")).unwrap(), b"hello\n");
        assert_eq!(std::fs::read(base.join("deep/er/it's.bin")).unwrap(), big);
        assert_eq!(std::fs::read(base.join("empty")).unwrap(), b"");
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &str| {
            std::fs::metadata(base.join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("deep/er/it's.bin"), 0o755);
        assert_eq!(mode("a.txt"), 0o644);
        // Put again: files are replaced, not appended to.
        run(&put_scripts("skills/x", &files[..1]), &tmp);
        assert_eq!(std::fs::read(base.join("a.txt")).unwrap(), b"hello\n");
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn data_is_taken_from_between_the_markers() {
        let out = format!("noise\n{BEGIN}\nQUJD\n{END}\n{DONE}\n");
        assert_eq!(between_markers(&out), Some("QUJD"));
        assert_eq!(between_markers(&format!("{BEGIN}\nQUJD")), None);
        assert_eq!(between_markers("exit code: 1"), None);
    }
}
