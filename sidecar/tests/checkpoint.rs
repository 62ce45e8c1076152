//! Checkpoints and forks against the real binary: `checkpoint-sink` as a
//! process over its socket stores a runner's export as it came (and
//! refuses what it should, storing nothing), and `serve --restore-from`
//! starts a runner with the stored files and bash state, once -- a
//! restarted runner does not import again over its own changes.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{BIN, Sidecar};
use runner_api::proto::{ExportRequest, ImportHeader};
use runner_api::{Client, Target};
use serde_json::json;

/// An RPC that does not answer within this is a hang.
const HANG: Duration = Duration::from_secs(60);

struct Sink {
    child: Child,
    socket: PathBuf,
}

fn sink(dir: &Path, socket: &Path, max: u64, deadline: u64) -> Sink {
    let child = Command::new(BIN)
        .args(["checkpoint-sink", "--dir"])
        .arg(dir)
        .arg("--socket")
        .arg(socket)
        .args(["--max-archive-bytes", &max.to_string()])
        .args(["--deadline-seconds", &deadline.to_string()])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the sink");
    Sink {
        child,
        socket: socket.to_path_buf(),
    }
}

impl Sink {
    async fn client(&self) -> Client {
        for _ in 0..400 {
            if let Ok(c) = Client::connect(&Target::Unix(self.socket.clone())).await {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the sink did not listen on {}", self.socket.display());
    }

    /// Waits for the process; its status and stderr.
    fn finish(self) -> (std::process::ExitStatus, String) {
        let out = self.child.wait_with_output().expect("wait");
        (
            out.status,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

/// The source's export, header and archive.
async fn export(a: &Sidecar) -> (runner_api::proto::ExportHeader, Vec<u8>) {
    let mut c = a.client().await;
    let (header, mut archive) = tokio::time::timeout(
        HANG,
        c.export(ExportRequest {
            shell_state: true,
            ..ExportRequest::default()
        }),
    )
    .await
    .expect("answered")
    .expect("exported");
    let mut bytes = Vec::new();
    while let Some(chunk) = archive.next().await.expect("chunk") {
        bytes.extend_from_slice(&chunk);
    }
    (header, bytes)
}

async fn send(
    s: &Sink,
    header: ImportHeader,
    archive: Vec<u8>,
) -> Result<runner_api::proto::ImportResponse, runner_api::Error> {
    let chunks: Vec<Vec<u8>> = archive.chunks(64 << 10).map(<[u8]>::to_vec).collect();
    let mut c = s.client().await;
    tokio::time::timeout(HANG, c.import(header, tokio_stream::iter(chunks)))
        .await
        .expect("import answered")
}

#[tokio::test]
async fn a_stored_checkpoint_starts_a_fork_with_its_files_and_shell_state_once() {
    let a = Sidecar::start().await;
    a.ok(
        "bash",
        json!({"command": "mkdir -p proj/sub && echo base > proj/a.txt && echo deep > proj/sub/b.txt && ln -s /etc/hostname proj/host && cd proj && export CKPT_VAR='two words' && greet() { echo \"hi $1\"; }"}),
    )
    .await;
    let (header, archive) = export(&a).await;
    let state = header.shell_state.clone().expect("shell state");

    let store = tempfile::tempdir().expect("store");
    let s = sink(store.path(), &store.path().join("sink.sock"), 64 << 20, 60);
    let done = send(
        &s,
        ImportHeader {
            shell_state: Some(state),
            ..ImportHeader::default()
        },
        archive.clone(),
    )
    .await
    .expect("stored");
    assert_eq!(done.file_bytes, archive.len() as u64);
    let (status, err) = s.finish();
    assert!(status.success(), "the sink exits 0 once stored: {err}");
    assert_eq!(
        std::fs::read(store.path().join("archive.tar")).expect("archive"),
        archive,
        "stored as it came"
    );
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(store.path().join("checkpoint.json")).expect("manifest"),
    )
    .expect("json");
    assert_eq!(manifest["archiveBytes"], archive.len() as u64);
    assert_eq!(manifest["shellState"], true);
    assert!(!store.path().join("sink.sock").exists(), "socket removed");

    // A fork: the files, the link, the cwd, the variable, the function.
    let from = store.path().to_str().expect("utf-8").to_owned();
    let mut b = Sidecar::start_with(&["--restore-from", &from]).await;
    assert_eq!(
        b.ok("bash", json!({"command": "pwd; echo \"$CKPT_VAR\"; greet fork; cat a.txt sub/b.txt; readlink host"}))
            .await,
        format!(
            "{}\ntwo words\nhi fork\nbase\ndeep\n/etc/hostname\n",
            b.workdir.join("proj").display()
        )
    );
    // The fork changes; its restarted runner keeps the changes (the marker
    // in its state directory says the checkpoint was imported).
    b.ok(
        "bash",
        json!({"command": "echo mine > a.txt && rm sub/b.txt && cd sub && export CKPT_VAR=fork"}),
    )
    .await;
    assert!(b.state.join("restored-from-checkpoint").exists());
    b.stop();
    b.spawn().await;
    assert_eq!(
        b.ok(
            "bash",
            json!({"command": "pwd; echo $CKPT_VAR; cat ../a.txt; ls"})
        )
        .await,
        format!("{}\nfork\nmine\n", b.workdir.join("proj/sub").display())
    );
    // The source never saw any of it.
    assert_eq!(
        a.ok("bash", json!({"command": "cat a.txt sub/b.txt"}))
            .await,
        "base\ndeep\n"
    );
}

#[tokio::test]
async fn the_sink_refuses_what_it_should_and_stores_nothing_then() {
    let store = tempfile::tempdir().expect("store");
    let socket = store.path().join("sink.sock");
    let s = sink(store.path(), &socket, 4096, 60);
    // Over its bound.
    let e = send(&s, ImportHeader::default(), vec![0u8; 64 << 10])
        .await
        .expect_err("over the bound");
    assert!(e.to_string().contains("larger than"), "{e}");
    // A path: the sink stores whole archives only.
    let e = send(
        &s,
        ImportHeader {
            path: "sub".into(),
            ..ImportHeader::default()
        },
        vec![0u8; 512],
    )
    .await
    .expect_err("a path");
    assert!(e.to_string().contains("path must be empty"), "{e}");
    // Nothing but Import.
    let mut c = s.client().await;
    let e = c
        .run("x1", "bash", r#"{"command": "id"}"#, false)
        .await
        .expect_err("no tools here");
    assert!(e.to_string().contains("checkpoint sink"), "{e}");
    let names: Vec<String> = std::fs::read_dir(store.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n != "sink.sock")
        .collect();
    assert!(names.is_empty(), "nothing stored: {names:?}");
    // Still waiting for a good archive; ended by its deadline otherwise.
    let late = sink(store.path(), &store.path().join("late.sock"), 4096, 1);
    let (status, err) = late.finish();
    assert!(!status.success());
    assert!(err.contains("no checkpoint archive arrived"), "{err}");
    let mut s = s;
    let _ = s.child.kill();
    let _ = s.child.wait();
}

#[tokio::test]
async fn a_runner_refuses_to_serve_from_a_damaged_or_missing_checkpoint() {
    let store = tempfile::tempdir().expect("store");
    let work = tempfile::tempdir().expect("work");
    let run = |from: &Path| {
        Command::new(BIN)
            .arg("serve")
            .arg("--socket")
            .arg(work.path().join("r.sock"))
            .arg("--workdir")
            .arg(work.path())
            .arg("--state-dir")
            .arg(work.path().join(".state"))
            .arg("--restore-from")
            .arg(from)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .output()
            .expect("run")
    };
    // No manifest: not a checkpoint (yet).
    let out = run(store.path());
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("checkpoint.json"), "{err}");
    // A manifest that disagrees with the archive.
    std::fs::write(store.path().join("archive.tar"), vec![0u8; 1024]).expect("archive");
    std::fs::write(
        store.path().join("checkpoint.json"),
        r#"{"archiveBytes": 9999, "shellState": false}"#,
    )
    .expect("manifest");
    let out = run(store.path());
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("damaged"), "{err}");
    assert!(
        !work.path().join(".state/restored-from-checkpoint").exists(),
        "no marker for a failed import"
    );
}

/// Copies a directory whole (modes, links, times), as a storage snapshot
/// of the volume would.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("target");
    let out = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", from.display()))
        .arg(to)
        .output()
        .expect("cp");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn a_hold_keeps_the_workspace_still_and_a_volume_fork_takes_only_the_held_state() {
    use prost::Message;
    let mut a = Sidecar::start().await;
    // A secret the source's runner got from its pod's env: its bash
    // snapshot holds it; a fork must never see it.
    a.stop();
    a.env.push(("AGENT_SECRET".into(), "s3cr3t".into()));
    a.spawn().await;
    a.ok(
        "bash",
        json!({"command": "mkdir -p proj && cd proj && echo one > a.txt && export HELD_VAR='two words' && greet() { echo \"hi $1\"; }"}),
    )
    .await;
    // A call in flight when the hold is asked for: the hold waits for it.
    let slow = {
        let c = a.client().await;
        tokio::spawn(async move {
            let mut c = c;
            c.run(
                &common::next_id(),
                "bash",
                &json!({"command": "sleep 1; echo late > late.txt"}).to_string(),
                false,
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut c = a.client().await;
    let holding = tokio::time::timeout(HANG, c.hold(true, 30))
        .await
        .expect("hold answered")
        .expect("held");
    assert!(slow.is_finished() || a.path("proj/late.txt").exists());
    assert_eq!(
        std::fs::read_to_string(a.path("proj/late.txt"))
            .expect("the call in flight finished first"),
        "late\n"
    );
    let state = holding.held.shell_state.clone().expect("shell state");
    assert_eq!(state.cwd, b"proj");
    assert!(
        state.variables.iter().any(|v| v.name == "HELD_VAR"),
        "{state:?}"
    );
    assert!(
        !state.variables.iter().any(|v| v.name == "AGENT_SECRET"),
        "env-given variables never travel: {state:?}"
    );
    // A second hold, export or import is busy meanwhile.
    let mut c2 = a.client().await;
    let busy = c2.hold(false, 5).await.expect_err("one hold at a time");
    assert!(
        busy.to_string().contains("busy") || format!("{busy:?}").contains("Busy"),
        "{busy}"
    );
    // A write asked for while held waits.
    let write = {
        let c = a.client().await;
        tokio::spawn(async move {
            let mut c = c;
            c.run(
                &common::next_id(),
                "write",
                &json!({"file_path": "proj/after.txt", "content": "after\n"}).to_string(),
                false,
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!a.path("proj/after.txt").exists(), "held: the write waits");

    // The volume is copied while held (the source's state directory with it,
    // and a marker of an import the source itself once made).
    let fork_root = tempfile::tempdir().expect("fork");
    let fork_work = fork_root.path().join("work");
    let fork_state = fork_root.path().join("state");
    copy_tree(&a.workdir, &fork_work);
    copy_tree(&a.state, &fork_state);
    std::fs::write(
        fork_state.join("restored-from-checkpoint"),
        "imported checkpoint its-own-source\n",
    )
    .expect("source's marker");

    let released = holding.release().await.expect("released");
    assert_eq!(released.why, "release");
    write
        .await
        .expect("task")
        .expect("the write ran after the release");
    assert!(a.path("proj/after.txt").exists());

    // The checkpoint's state, as the operator stores it for a volume fork.
    let store = tempfile::tempdir().expect("store");
    std::fs::write(store.path().join("shell-state.pb"), state.encode_to_vec()).expect("state");
    std::fs::write(
        store.path().join("checkpoint.json"),
        r#"{"archiveBytes": 0, "shellState": true, "files": "volume", "checkpoint": "uid-1"}"#,
    )
    .expect("manifest");
    let from = store.path().to_str().expect("utf-8").to_owned();
    let mut b = Sidecar::start().await;
    b.stop();
    std::fs::remove_dir_all(&b.workdir).expect("empty workdir");
    std::fs::remove_dir_all(&b.state).ok();
    copy_tree(&fork_work, &b.workdir);
    copy_tree(&fork_state, &b.state);
    b.extra = vec!["--restore-from".into(), from];
    b.spawn().await;
    assert_eq!(
        b.ok(
            "bash",
            json!({"command": "pwd; echo \"$HELD_VAR\"; greet fork; cat a.txt late.txt; echo ${AGENT_SECRET:-none}; ls"})
        )
        .await,
        format!(
            "{}\ntwo words\nhi fork\none\nlate\nnone\na.txt\nlate.txt\n",
            b.workdir.join("proj").display()
        ),
        "the files as held (not the write after), the held state, no env secret"
    );
    // Its own changes survive a restart: the marker now names this checkpoint.
    b.ok("bash", json!({"command": "cd / && export HELD_VAR=mine"}))
        .await;
    assert_eq!(
        std::fs::read_to_string(b.state.join("restored-from-checkpoint")).expect("marker"),
        "imported checkpoint uid-1\n"
    );
    b.stop();
    b.spawn().await;
    assert_eq!(
        b.ok("bash", json!({"command": "pwd; echo $HELD_VAR"}))
            .await,
        "/\nmine\n"
    );
}

#[tokio::test]
async fn a_hold_ends_at_its_deadline_and_refuses_a_longer_one() {
    let a = Sidecar::start().await;
    let mut c = a.client().await;
    let err = c.hold(false, 301).await.expect_err("over the most");
    assert!(err.to_string().contains("300"), "{err}");
    let holding = c.hold(false, 1).await.expect("held");
    // Past its deadline the runner has let go: calls run again.
    let done = tokio::time::timeout(
        HANG,
        a.client().await.run(
            &common::next_id(),
            "write",
            &json!({"file_path": "x.txt", "content": "x"}).to_string(),
            false,
        ),
    )
    .await
    .expect("the write ran once the hold's deadline passed");
    assert!(done.is_ok(), "{done:?}");
    assert_eq!(holding.release().await.expect("released").why, "deadline");
}

/// A runner whose state directory is inside its workdir, as on a
/// persistent workspace (`.agentplane/state` on the claim).
async fn on_claim() -> Sidecar {
    let mut s = Sidecar::start().await;
    s.stop();
    s.state = s.workdir.join(".agentplane/state");
    s.spawn().await;
    s
}

#[tokio::test]
async fn an_archive_imports_into_a_workspace_that_holds_the_runners_state() {
    // Both on claims: the source's archive has a `.agentplane` directory
    // (the user's file in it; the runner's state left out), and the fork's
    // `.agentplane` holds its runner's state, which must survive the import.
    let a = on_claim().await;
    a.ok(
        "bash",
        json!({"command": "mkdir -p .agentplane/mine && echo keep > .agentplane/mine/f && echo x > top.txt && export V=one"}),
    )
    .await;
    let (header, archive) = export(&a).await;
    let b = on_claim().await;
    b.ok(
        "bash",
        json!({"command": "export B=two && echo old > top.txt"}),
    )
    .await;
    let mut c = b.client().await;
    let chunks: Vec<Vec<u8>> = archive.chunks(64 << 10).map(<[u8]>::to_vec).collect();
    let done = tokio::time::timeout(
        HANG,
        c.import(
            ImportHeader {
                overwrite: true,
                shell_state: header.shell_state,
                ..ImportHeader::default()
            },
            tokio_stream::iter(chunks),
        ),
    )
    .await
    .expect("answered");
    assert!(done.is_ok(), "{done:?}");
    assert_eq!(
        b.ok(
            "bash",
            json!({"command": "echo $V ${B:-unset}; cat top.txt .agentplane/mine/f; ls .agentplane"})
        )
        .await,
        "one unset\nx\nkeep\nmine\nstate\n",
        "the files and state imported, the runner's state directory kept"
    );
    // Without overwrite, the merge still names what exists.
    let (_, again) = export(&a).await;
    let chunks: Vec<Vec<u8>> = again.chunks(64 << 10).map(<[u8]>::to_vec).collect();
    let err = c
        .import(ImportHeader::default(), tokio_stream::iter(chunks))
        .await
        .expect_err("conflicts");
    assert!(err.to_string().contains("top.txt"), "{err}");
}
