//! A warm pool's sandbox: a runner started `--await-binding`, before its
//! session exists, refuses every call as unbound until the operator writes
//! the binding and toolset files, then serves that session.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{HOSTILE_AS_LIMIT, Sidecar, alive, next_id};
use runner_api::{Binding, BoundEnv, Error, Refusal};
use serde_json::json;
use toolset::{PermissionPolicy, ResolvedToolset};

/// The mounted ConfigMap's directory, empty before the claim.
struct Mount {
    _dir: tempfile::TempDir,
    dir: PathBuf,
}

impl Mount {
    fn new() -> Mount {
        let dir = tempfile::tempdir().expect("tempdir");
        Mount {
            dir: dir.path().to_path_buf(),
            _dir: dir,
        }
    }

    fn toolset(&self) -> PathBuf {
        self.dir.join("toolset.json")
    }

    fn binding(&self) -> PathBuf {
        self.dir.join(runner_api::BINDING_FILE)
    }

    /// `--toolset ... --await-binding ...` on this directory.
    fn args(&self) -> Vec<String> {
        vec![
            "--toolset".into(),
            self.toolset().display().to_string(),
            "--await-binding".into(),
            self.binding().display().to_string(),
        ]
    }

    /// Writes `bytes` whole under a temporary name and renames it into
    /// place, as the kubelet's atomic writer swaps a ConfigMap's files.
    fn put(&self, path: &Path, bytes: &[u8]) {
        let tmp = self.dir.join(".incoming.tmp");
        std::fs::write(&tmp, bytes).expect("write");
        std::fs::rename(&tmp, path).expect("rename");
    }

    /// A resolved toolset enabling bash and read, always allowed.
    fn put_toolset(&self) {
        let mut ts = ResolvedToolset::default_enabled();
        ts.tools.retain(|t| t.name == "bash" || t.name == "read");
        ts.policies = [
            ("bash".to_owned(), PermissionPolicy::AlwaysAllow),
            ("read".to_owned(), PermissionPolicy::AlwaysAllow),
        ]
        .into_iter()
        .collect();
        self.put(&self.toolset(), &serde_json::to_vec(&ts).expect("toolset"));
    }

    fn put_binding(&self, env: &[(&str, &str)]) {
        let b = Binding {
            session: "warm-demo".into(),
            env: env
                .iter()
                .map(|(n, v)| BoundEnv {
                    name: (*n).into(),
                    value: (*v).into(),
                })
                .collect(),
        };
        self.put(&self.binding(), &serde_json::to_vec(&b).expect("binding"));
    }
}

async fn start(m: &Mount, more: &[&str], limit_as: Option<u64>) -> Sidecar {
    let mut args = m.args();
    args.extend(more.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Sidecar::start_limited(&args, limit_as).await
}

/// The status a refused call ended with, checked to be the unbound refusal.
fn assert_unbound(res: Result<impl std::fmt::Debug, Error>, what: &str) {
    match res {
        Err(Error::Refused { code, refusal, .. }) => {
            assert_eq!(code, tonic::Code::Unavailable, "{what}");
            assert_eq!(refusal, Some(Refusal::Unbound), "{what}");
        }
        other => panic!("{what}: expected the unbound refusal, got {other:?}"),
    }
}

async fn bash_unbound(s: &Sidecar, what: &str) {
    let res = s
        .try_call(&next_id(), "bash", json!({"command": "echo ran"}))
        .await;
    assert_unbound(res, what);
}

#[tokio::test]
async fn a_warm_sandbox_refuses_until_bound_then_serves_its_session() {
    let m = Mount::new();
    // The directory is empty: the runner starts anyway and is healthy.
    let s = start(&m, &[], None).await;
    assert!(s.client().await.health().await.expect("health"));

    bash_unbound(&s, "bash").await;
    assert_unbound(
        s.try_call(&next_id(), "read", json!({"file_path": "/etc/hostname"}))
            .await,
        "read",
    );
    assert_unbound(s.client().await.list_tools().await, "list tools");
    let streamed = s
        .client()
        .await
        .run_stream(&next_id(), "bash", r#"{"command":"echo ran"}"#, false)
        .await
        .map(|_| ());
    assert_unbound(streamed, "streamed bash");
    // The unary refusal is also what the raw status says.
    let status = s
        .client()
        .await
        .run(&next_id(), "bash", r#"{"command":"echo ran"}"#, false)
        .await
        .expect_err("refused");
    assert!(
        status.to_string().contains("not bound to a session yet"),
        "{status}"
    );

    // The operator claims the pod: both files appear, and the very next
    // call binds and runs (no wait for the poll).
    m.put_toolset();
    m.put_binding(&[("GREETING", "it's warm")]);
    let r = s
        .call("bash", json!({"command": "echo \"$GREETING\""}))
        .await;
    assert!(!r.is_error, "{}", r.content);
    assert_eq!(r.content, "it's warm\n");

    // The late toolset is the one enforced.
    let e = s
        .try_call(&next_id(), "grep", json!({"pattern": "x"}))
        .await
        .expect_err("grep is disabled");
    assert_eq!(e.refusal(), Some(Refusal::DisabledTool), "{e}");
    let tools: Vec<String> = s
        .client()
        .await
        .list_tools()
        .await
        .expect("list tools")
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(tools, ["bash", "read"]);

    // The binding file is the runner's own.
    let binding = m.binding().display().to_string();
    let e = s.err("read", json!({"file_path": binding})).await;
    assert!(e.contains("the runner depends on"), "{e}");

    // Bound for life: a changed binding is not applied.
    m.put_binding(&[("GREETING", "someone else's")]);
    let r = s.ok("bash", json!({"command": "echo \"$GREETING\""})).await;
    assert_eq!(r, "it's warm\n");
}

/// Files that are there but wrong keep the sandbox unbound and the runner
/// small and answering; the first good binding binds it.
#[tokio::test]
async fn broken_bindings_keep_it_unbound_and_the_runner_bounded() {
    let m = Mount::new();
    let s = start(&m, &[], Some(HOSTILE_AS_LIMIT)).await;
    m.put_toolset();

    // Larger than a ConfigMap can hold (and, spaces around an object, valid
    // JSON if it were read whole).
    let mut big = vec![b' '; 2 << 20];
    big.extend_from_slice(br#"{"session":"big"}"#);
    m.put(&m.binding(), &big);
    let before = s.status_kib("VmHWM");
    for _ in 0..20 {
        bash_unbound(&s, "2 MiB binding").await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await; // some polls too
    let after = s.status_kib("VmHWM");
    assert!(
        after <= before + 1024,
        "peak RSS grew from {before} to {after} KiB"
    );

    // A FIFO in its place must not block the runner.
    std::fs::remove_file(m.binding()).expect("remove");
    nix::unistd::mkfifo(
        &m.binding(),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .expect("mkfifo");
    bash_unbound(&s, "a FIFO binding").await;
    std::fs::remove_file(m.binding()).expect("remove");

    m.put_binding(&[("GOOD", "1"), ("1BAD", "x")]);
    bash_unbound(&s, "env name 1BAD").await;
    m.put(&m.binding(), b"{\"session\": \"garbage\", \"env\": [");
    bash_unbound(&s, "garbage JSON").await;
    m.put(
        &m.binding(),
        br#"{"session":"s","env":[{"name":"A","value":"x\u0000y"}]}"#,
    );
    bash_unbound(&s, "a NUL in a value").await;
    let too_many: Vec<(String, String)> = (0..=runner_api::binding::MAX_BINDING_ENV)
        .map(|i| (format!("V{i}"), "v".to_owned()))
        .collect();
    let too_many: Vec<(&str, &str)> = too_many
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    m.put_binding(&too_many);
    bash_unbound(&s, "129 env entries").await;
    assert!(s.client().await.health().await.expect("health"));

    // Scrubbed names are left out, as from the runner's own environment.
    m.put_binding(&[("GOOD", "1"), ("ANTHROPIC_API_KEY", "secret")]);
    let r = s
        .ok(
            "bash",
            json!({"command": "echo \"$GOOD/${ANTHROPIC_API_KEY-unset}\""}),
        )
        .await;
    assert_eq!(r, "1/unset\n");
}

/// A warm pod waiting for its session is not idle: the idle timeout counts
/// from the binding.
#[tokio::test]
async fn the_idle_timeout_starts_at_binding() {
    let m = Mount::new();
    let mut s = start(&m, &["--idle-timeout-seconds", "1"], None).await;
    let pid = s.pid();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(alive(pid), "the unbound runner exited idle");
    assert!(s.client().await.health().await.expect("health"));

    // Bound by the poll, with no call at all; then idle for its second.
    m.put_toolset();
    m.put_binding(&[]);
    let mut child = s.child.take().expect("running");
    let mut exited = None;
    for _ in 0..100 {
        if let Some(status) = child.try_wait().expect("wait") {
            exited = Some(status);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = exited.unwrap_or_else(|| {
        let _ = child.kill();
        panic!("the bound runner did not exit after 1 s idle");
    });
    assert!(status.success(), "{status}");
}
