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
