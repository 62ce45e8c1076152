//! The gRPC surface, the policy gate, the CLI, and the runner under load.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::process::Command;

use common::{BIN, Sidecar, next_id};
use runner_api::{Client, Error, Refusal, Target, exit};
use serde_json::json;
use toolset::{PermissionPolicy, ResolvedToolset};

fn write_toolset(
    dir: &std::path::Path,
    policies: &[(&str, PermissionPolicy)],
) -> std::path::PathBuf {
    let mut ts = ResolvedToolset::default_enabled();
    let policies: BTreeMap<String, PermissionPolicy> =
        policies.iter().map(|(n, p)| (n.to_string(), *p)).collect();
    ts.tools.retain(|t| policies.contains_key(&t.name));
    ts.policies = policies;
    let path = dir.join("toolset.json");
    std::fs::write(&path, serde_json::to_vec(&ts).unwrap()).unwrap();
    path
}

fn refusal(e: Error) -> (tonic::Code, Option<Refusal>) {
    match e {
        Error::Refused { code, refusal, .. } => (code, refusal),
        other => panic!("expected a status, got {other}"),
    }
}

#[tokio::test]
async fn policy_gate() {
    let dir = tempfile::tempdir().unwrap();
    let ts = write_toolset(
        dir.path(),
        &[
            ("bash", PermissionPolicy::AlwaysAsk),
            ("read", PermissionPolicy::AlwaysAllow),
        ],
    );
    let s = Sidecar::start_with(&["--toolset", ts.to_str().unwrap()]).await;
    let mut c = s.client().await;

    let e = c
        .run(&next_id(), "bash", r#"{"command":"touch asked"}"#, false)
        .await
        .unwrap_err();
    assert_eq!(
        refusal(e),
        (
            tonic::Code::FailedPrecondition,
            Some(Refusal::ConfirmationRequired)
        )
    );
    assert!(!s.path("asked").exists());
    let r = c
        .run(&next_id(), "bash", r#"{"command":"echo yes"}"#, true)
        .await
        .unwrap();
    assert_eq!(r.content, "yes\n");

    let e = c
        .run(&next_id(), "grep", r#"{"pattern":"x"}"#, true)
        .await
        .unwrap_err();
    assert_eq!(
        refusal(e),
        (tonic::Code::PermissionDenied, Some(Refusal::DisabledTool))
    );
    let e = c
        .run(&next_id(), "web_fetch", "{}", true)
        .await
        .unwrap_err();
    assert_eq!(
        refusal(e),
        (tonic::Code::InvalidArgument, Some(Refusal::NotSandboxTool))
    );
    let r = c.run(&next_id(), "teleport", "{}", true).await.unwrap();
    assert!(r.is_error && r.content.starts_with("unknown tool \"teleport\""));
    let e = c
        .run("../escape", "read", r#"{"file_path":"x"}"#, false)
        .await
        .unwrap_err();
    assert_eq!(
        refusal(e),
        (tonic::Code::InvalidArgument, Some(Refusal::InvalidCallId))
    );

    let tools = c.list_tools().await.unwrap();
    let names: Vec<_> = tools
        .iter()
        .map(|t| (t.name.as_str(), t.permission_policy.as_str()))
        .collect();
    assert_eq!(names, [("bash", "always_ask"), ("read", "always_allow")]);
    assert!(
        serde_json::from_str::<serde_json::Value>(&tools[0].input_schema_json)
            .unwrap()
            .is_object()
    );
}

#[tokio::test]
async fn socket_is_private_and_removed_on_sigterm() {
    let mut s = Sidecar::start().await;
    let meta = std::fs::symlink_metadata(&s.socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert!(s.stop().success());
    assert!(!s.socket.exists());
}

#[tokio::test]
async fn sigterm_drains_in_flight_calls() {
    let mut s = Sidecar::start().await;
    let mut c = s.client().await;
    let call = tokio::spawn(async move {
        c.run(
            &next_id(),
            "bash",
            r#"{"command":"sleep 1; echo drained"}"#,
            false,
        )
        .await
    });
    // Let the call reach the runner before the signal.
    assert!(
        common::eventually(|| std::fs::read_dir(s.state.join("calls"))
            .map(|d| d.count() > 0)
            .unwrap_or(false))
        .await
    );
    let status = tokio::task::spawn_blocking(move || s.stop()).await.unwrap();
    assert!(status.success());
    let r = call.await.unwrap().unwrap();
    assert_eq!(r.content, "drained\n");
}

#[tokio::test]
async fn fifty_concurrent_calls() {
    let s = Sidecar::start().await;
    let mut tasks = Vec::new();
    for i in 0..50 {
        let mut c = s.client().await;
        tasks.push(tokio::spawn(async move {
            let (tool, input, want) = match i % 5 {
                0 | 1 => (
                    "bash",
                    json!({"command": format!("echo {i}")}),
                    format!("{i}\n"),
                ),
                2 => (
                    "write",
                    json!({"file_path": format!("f{i}.txt"), "content": "v"}),
                    format!("wrote 1 bytes to f{i}.txt"),
                ),
                3 => (
                    "glob",
                    json!({"pattern": "nothing-*"}),
                    "no matches".to_string(),
                ),
                _ => (
                    "grep",
                    json!({"pattern": "nothing-here-at-all"}),
                    "no matches".to_string(),
                ),
            };
            let r = c
                .run(&next_id(), tool, &input.to_string(), false)
                .await
                .unwrap();
            assert!(!r.is_error, "{tool}: {}", r.content);
            assert_eq!(r.content, want);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test]
async fn cli_call_health_and_tcp() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let s = Sidecar::start_with(&["--listen", &addr]).await;
    let sock = s.socket.to_str().unwrap();

    let out = Command::new(BIN)
        .args([
            "call",
            "--socket",
            sock,
            "--id",
            "cli-1",
            "bash",
            r#"{"command":"exit 7"}"#,
        ])
        .output()
        .unwrap();
    // The call ran and the tool failed: the line is printed, and exit 1 says
    // so without parsing it.
    assert_eq!(out.status.code(), Some(i32::from(exit::TOOL_ERROR)));
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        line,
        json!({"content": "(no output)\nexit code: 7", "is_error": true})
    );

    let out = Command::new(BIN)
        .args(["call", "--addr", &addr, "read", r#"{"file_path":"nope"}"#])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(i32::from(exit::TOOL_ERROR)));
    assert_eq!(out.stdout.iter().filter(|&&b| b == b'\n').count(), 1);

    let out = Command::new(BIN)
        .args(["call", "--socket", sock, "web_search", "{}"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(i32::from(exit::REFUSED)));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a sandbox tool"));

    let out = Command::new(BIN)
        .args(["call", "--socket", sock, "bash", r#"{"command":"true"}"#])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(i32::from(exit::OK)));
    let absent = s.root.join("absent.sock");
    for sub in [
        &["health"][..],
        &["tools"],
        &["call", "--id", "x", "read", "{}"],
    ] {
        let out = Command::new(BIN)
            .args(sub)
            .arg("--socket")
            .arg(&absent)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(i32::from(exit::COULD_NOT_CALL)),
            "{sub:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("cannot connect to the runner"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    for target in [["--socket", sock], ["--addr", addr.as_str()]] {
        let out = Command::new(BIN)
            .arg("health")
            .args(target)
            .output()
            .unwrap();
        assert!(out.status.success());
        assert_eq!(String::from_utf8_lossy(&out.stdout), "SERVING\n");
    }
    let mut c = Client::connect(&Target::Tcp(addr.parse().unwrap()))
        .await
        .unwrap();
    assert_eq!(
        c.run(&next_id(), "bash", r#"{"command":"echo tcp"}"#, false)
            .await
            .unwrap()
            .content,
        "tcp\n"
    );

    // Host names and non-loopback listeners are refused up front.
    let out = Command::new(BIN)
        .args(["health", "--addr", "localhost:1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(i32::from(exit::REFUSED)));
    let out = Command::new(BIN)
        .args([
            "serve",
            "--socket",
            "/tmp/x.sock",
            "--workdir",
            "/tmp",
            "--listen",
            "0.0.0.0:7070",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a loopback address"));
}

#[tokio::test]
async fn bad_toolset_file_fails_startup() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("ts.json");
    std::fs::write(&bad, "{\"tools\": 3}").unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--socket"])
        .arg(dir.path().join("s.sock"))
        .arg("--workdir")
        .arg(dir.path())
        .arg("--toolset")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("toolset file"));
}
