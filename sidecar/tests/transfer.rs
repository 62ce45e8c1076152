//! Export and import against the real binary over its socket: a round trip
//! into a fresh runner keeps files, modes, links and bash's state; an
//! export waits for a running call; the runner's own files and inherited
//! env stay out of exports; imports refuse what they should, before
//! anything lands in the workspace.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use common::{Sidecar, eventually};
use runner_api::proto::{ExportHeader, ExportRequest, ImportHeader, ImportResponse};
use serde_json::json;

/// An RPC that does not answer within this is a hang. Never a timing
/// assertion.
const HANG: Duration = Duration::from_secs(60);

async fn export(
    s: &Sidecar,
    req: ExportRequest,
) -> Result<(ExportHeader, Vec<u8>), runner_api::Error> {
    let mut c = s.client().await;
    let (header, mut archive) = tokio::time::timeout(HANG, c.export(req))
        .await
        .expect("export answered")?;
    let mut bytes = Vec::new();
    while let Some(chunk) = archive.next().await? {
        assert!(chunk.len() <= 1 << 20, "a chunk of {} bytes", chunk.len());
        bytes.extend_from_slice(&chunk);
    }
    assert_eq!(bytes.len() as u64, header.archive_bytes);
    Ok((header, bytes))
}

async fn import(
    s: &Sidecar,
    header: ImportHeader,
    archive: Vec<u8>,
) -> Result<ImportResponse, runner_api::Error> {
    let chunks: Vec<Vec<u8>> = archive.chunks(64 << 10).map(<[u8]>::to_vec).collect();
    let mut c = s.client().await;
    tokio::time::timeout(HANG, c.import(header, tokio_stream::iter(chunks)))
        .await
        .expect("import answered")
}

/// Every entry under `root`: its kind, mode and content or target.
fn tree(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let what = if m.file_type().is_symlink() {
                format!("link -> {}", std::fs::read_link(&p).unwrap().display())
            } else if m.is_dir() {
                stack.push(p.clone());
                format!("dir {:o}", m.mode() & 0o7777)
            } else {
                format!(
                    "file {:o} {:?}",
                    m.mode() & 0o7777,
                    String::from_utf8_lossy(&std::fs::read(&p).unwrap())
                )
            };
            out.insert(rel, what);
        }
    }
    out
}

#[tokio::test]
async fn a_round_trip_into_a_fresh_runner_keeps_files_modes_links_and_bash_state() {
    let a = Sidecar::start().await;
    a.ok(
        "bash",
        json!({"command": "mkdir -p src/pkg empty 'sp ace' ro && echo hi > src/a.txt && printf 'x\\0y' > src/bin && chmod 640 src/a.txt && echo '#!/bin/sh' > run.sh && chmod 755 run.sh && echo s > 'sp ace/f' && ln -s ../run.sh src/link && ln -s missing dangling && echo k > ro/kept && chmod 555 ro && echo u > setuid && chmod 4755 setuid && cd src/pkg && export MYVAR='two words' && greet() { echo \"hello $1\"; }"}),
    )
    .await;
    let before = tree(&a.workdir);
    let (header, archive) = export(
        &a,
        ExportRequest {
            shell_state: true,
            ..ExportRequest::default()
        },
    )
    .await
    .expect("exported");
    assert!(header.directory);
    assert_eq!(header.skipped_count, 0, "{:?}", header.skipped);
    let state = header.shell_state.clone().expect("shell state");
    assert_eq!(state.cwd, b"src/pkg");

    let b = Sidecar::start().await;
    let done = import(
        &b,
        ImportHeader {
            shell_state: Some(state),
            ..ImportHeader::default()
        },
        archive,
    )
    .await
    .expect("imported");
    assert_eq!(done.entries, header.entries);
    let mut want = before.clone();
    // setuid is not carried in.
    want.insert("setuid".into(), "file 755 \"u\\n\"".into());
    assert_eq!(tree(&b.workdir), want);
    assert_eq!(before["setuid"], "file 4755 \"u\\n\"");

    let out = b
        .ok(
            "bash",
            json!({"command": "pwd; echo \"$MYVAR\"; greet fork"}),
        )
        .await;
    assert_eq!(
        out,
        format!(
            "{}\ntwo words\nhello fork\n",
            b.workdir.join("src/pkg").display()
        )
    );
    // The runner's own environment is still there under the imported state.
    assert_eq!(
        b.ok("bash", json!({"command": "echo ${PATH:+set}"})).await,
        "set\n"
    );
    // Tidy: the read-only directory would keep the temp dir from going.
    for s in [&a, &b] {
        let _ = std::fs::set_permissions(s.path("ro"), std::fs::Permissions::from_mode(0o755));
    }
}

#[tokio::test]
async fn an_export_leaves_out_the_runners_files_and_inherited_env() {
    let mut s = Sidecar::start().await;
    s.stop();
    // The runner's state and spill directories inside the workdir.
    s.state = s.workdir.join(".runner-state");
    s.spill = s.workdir.join(".runner-spill");
    s.env.push(("SECRET_TOKEN".into(), "tok-3f9a1c".into()));
    s.spawn().await;
    s.ok(
        "bash",
        json!({"command": "echo $SECRET_TOKEN > /dev/null; export MINE=1; head -c 200000 /dev/zero | tr '\\0' a; echo"}),
    )
    .await;
    assert!(
        std::fs::read_dir(&s.spill).unwrap().count() > 0,
        "a spill file"
    );
    // A link to the snapshot travels as a link, never as its content.
    std::os::unix::fs::symlink(s.state.join("shell.snapshot"), s.path("leak")).unwrap();
    assert!(s.state.join("shell.snapshot").exists());
    let (header, archive) = export(
        &s,
        ExportRequest {
            shell_state: true,
            ..ExportRequest::default()
        },
    )
    .await
    .expect("exported");
    let names: Vec<String> = tar::Archive::new(archive.as_slice())
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect();
    assert!(
        names.iter().all(|n| !n.starts_with(".runner-")),
        "{names:?}"
    );
    let mut leak = tar::Archive::new(archive.as_slice());
    let leak = leak
        .entries()
        .unwrap()
        .map(|e| e.unwrap())
        .find(|e| e.path().unwrap().as_os_str() == "leak")
        .expect("the link is archived");
    assert_eq!(leak.header().entry_type(), tar::EntryType::Symlink);
    assert_eq!(leak.header().size().unwrap(), 0);
    assert_eq!(header.skipped_count, 2, "{:?}", header.skipped);
    assert!(
        header.skipped.iter().any(|w| w.contains("state directory")),
        "{:?}",
        header.skipped
    );
    assert!(
        header.skipped.iter().any(|w| w.contains("spill directory")),
        "{:?}",
        header.skipped
    );
    let state = header.shell_state.unwrap();
    let vars: Vec<&str> = state.variables.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(vars, ["MINE"]);
    // Bounded: more entries than asked for is refused, not cut.
    let e = export(
        &s,
        ExportRequest {
            max_entries: 2,
            ..ExportRequest::default()
        },
    )
    .await
    .expect_err("refused");
    assert!(e.to_string().contains("more than 2 entries"), "{e}");
    // Asking for the runner's own directory is refused by name.
    let e = export(
        &s,
        ExportRequest {
            path: ".runner-state".into(),
            ..ExportRequest::default()
        },
    )
    .await
    .expect_err("refused");
    assert_eq!(e.refusal(), Some(runner_api::Refusal::TransferRefused));
    assert!(e.to_string().contains("state directory"), "{e}");
    let e = export(
        &s,
        ExportRequest {
            path: "../".into(),
            ..ExportRequest::default()
        },
    )
    .await
    .expect_err("refused");
    assert!(e.to_string().contains("outside the workdir"), "{e}");
}

#[tokio::test]
async fn an_export_waits_for_a_running_bash_call() {
    let s = Sidecar::start().await;
    let runner = s.client().await;
    let call = tokio::spawn(async move {
        let mut c = runner;
        c.run(
            "slow-writer",
            "bash",
            &json!({"command": "touch started; sleep 2; echo done > marker"}).to_string(),
            false,
        )
        .await
    });
    let started = s.path("started");
    assert!(eventually(|| started.exists()).await, "the call started");
    let (_, archive) = export(&s, ExportRequest::default())
        .await
        .expect("exported");
    let mut found = None;
    for e in tar::Archive::new(archive.as_slice()).entries().unwrap() {
        let mut e = e.unwrap();
        if e.path().unwrap().as_os_str() == "marker" {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut e, &mut text).unwrap();
            found = Some(text);
        }
    }
    assert_eq!(found.as_deref(), Some("done\n"), "the export did not wait");
    assert!(!call.await.unwrap().unwrap().is_error);
}

#[tokio::test]
async fn an_import_into_an_existing_directory_refuses_conflicts_unless_overwrite() {
    let s = Sidecar::start().await;
    std::fs::create_dir_all(s.path("dest/keep")).unwrap();
    std::fs::write(s.path("dest/keep/old"), "old").unwrap();
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o644);
    h.set_size(3);
    b.append_data(&mut h, "keep/new", &b"new"[..]).unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o600);
    h.set_size(2);
    b.append_data(&mut h, "other", &b"ok"[..]).unwrap();
    let archive = b.into_inner().unwrap();
    let e = import(
        &s,
        ImportHeader {
            path: "dest".into(),
            ..ImportHeader::default()
        },
        archive.clone(),
    )
    .await
    .expect_err("conflict");
    assert!(
        e.to_string().contains("already exist") && e.to_string().contains("keep"),
        "{e}"
    );
    assert_eq!(
        tree(&s.path("dest")),
        BTreeMap::from([
            ("keep".into(), "dir 755".into()),
            ("keep/old".into(), "file 644 \"old\"".into())
        ])
    );
    import(
        &s,
        ImportHeader {
            path: "dest".into(),
            overwrite: true,
            ..ImportHeader::default()
        },
        archive,
    )
    .await
    .expect("overwritten");
    let t = tree(&s.path("dest"));
    assert_eq!(t["keep/new"], "file 644 \"new\"");
    assert_eq!(t["other"], "file 600 \"ok\"");
    assert!(!t.contains_key("keep/old"), "{t:?}");
    // A new target's missing parents are made when it is moved into place.
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o644);
    h.set_size(1);
    b.append_data(&mut h, "f", &b"1"[..]).unwrap();
    import(
        &s,
        ImportHeader {
            path: "x/y/z".into(),
            ..ImportHeader::default()
        },
        b.into_inner().unwrap(),
    )
    .await
    .expect("imported");
    assert_eq!(std::fs::read_to_string(s.path("x/y/z/f")).unwrap(), "1");
    let names: Vec<_> = std::fs::read_dir(&s.workdir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        names
            .iter()
            .all(|n| !n.to_string_lossy().starts_with(".agentplane")),
        "{names:?}"
    );
    assert_eq!(t.len(), 3, "{t:?}");
}

#[tokio::test]
async fn background_jobs_are_stopped_during_an_export_and_continued_after() {
    let s = Sidecar::start().await;
    s.ok(
        "bash",
        json!({"command": "(echo $BASHPID > bg.pid; while :; do echo x >> bg.log; sleep 0.02; done) > /dev/null 2>&1 &"}),
    )
    .await;
    let log = s.path("bg.log");
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    assert!(eventually(|| size(&log) > 0).await, "the job writes");
    let (_, archive) = export(&s, ExportRequest::default())
        .await
        .expect("exported");
    assert!(!archive.is_empty());
    // Continued: it writes on after the export.
    let after = size(&log);
    assert!(
        eventually(|| size(&log) > after + 10).await,
        "the background job was not continued"
    );
    // And it is not left stopped.
    let pid: i32 = std::fs::read_to_string(s.path("bg.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let state = stat
        .rsplit(')')
        .next()
        .and_then(|r| r.split_whitespace().next());
    assert_ne!(state, Some("T"), "{stat}");
    s.ok("bash", json!({"restart": true})).await;
}
