//! Hostile archives against the runner's Import, each kind its own test,
//! the runner under an address-space limit (`prlimit --as`, as in
//! `hostile.rs`): every one is refused with the entry and the problem
//! named, nothing of it is left in the workspace (not even the staging
//! directory), and the runner still serves afterwards.

mod common;

use std::time::Duration;

use common::{HOSTILE_AS_LIMIT, Sidecar};
use runner_api::Refusal;
use runner_api::proto::ImportHeader;
use serde_json::json;

const HANG: Duration = Duration::from_secs(60);

/// One raw tar entry: a GNU header with `name`, type `kind`, the stated
/// `size` and `link` written as given (no checks, unlike tar::Builder),
/// then `data` padded to the block.
fn raw(name: &[u8], kind: u8, size: u64, link: &[u8], data: &[u8]) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    {
        let b = h.as_mut_bytes();
        b[..name.len()].copy_from_slice(name);
        b[157..157 + link.len()].copy_from_slice(link);
        b[156] = kind;
    }
    h.set_mode(0o644);
    h.set_size(size);
    h.set_mtime(1_700_000_000);
    h.set_cksum();
    let mut out = h.as_bytes().to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

fn file(name: &str, data: &[u8]) -> Vec<u8> {
    raw(name.as_bytes(), b'0', data.len() as u64, b"", data)
}

/// Entries, then the end marker.
fn archive(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut out = entries.concat();
    out.extend_from_slice(&[0; 1024]);
    out
}

async fn hostile() -> Sidecar {
    Sidecar::start_limited(&[], Some(HOSTILE_AS_LIMIT)).await
}

/// Imports `bytes` into `dest` and expects a refusal whose message holds
/// every one of `words`; then checks the workspace is as it was (empty)
/// and the runner serves.
async fn refused_with(s: &Sidecar, header: ImportHeader, bytes: Vec<u8>, words: &[&str]) {
    let chunks: Vec<Vec<u8>> = bytes.chunks(64 << 10).map(<[u8]>::to_vec).collect();
    let mut c = s.client().await;
    let res = tokio::time::timeout(HANG, c.import(header, tokio_stream::iter(chunks)))
        .await
        .expect("import answered: a hang");
    let e = res.expect_err("the archive should be refused");
    assert_eq!(e.refusal(), Some(Refusal::TransferRefused), "{e}");
    let msg = e.to_string();
    for w in words {
        assert!(msg.contains(w), "{w:?} not in: {msg}");
    }
    let left: Vec<_> = std::fs::read_dir(&s.workdir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left in the workspace: {left:?}");
    let r = s.call("bash", json!({"command": "echo alive"})).await;
    assert_eq!(r.content, "alive\n");
    assert!(common::alive(s.pid()));
}

async fn refused(s: &Sidecar, bytes: Vec<u8>, words: &[&str]) {
    refused_with(s, ImportHeader::default(), bytes, words).await;
}

#[tokio::test]
async fn an_absolute_path_is_refused() {
    let s = hostile().await;
    let a = archive(&[file("ok", b"1"), file("/tmp/planted", b"x")]);
    refused(&s, a, &["\"/tmp/planted\"", "absolute"]).await;
}

#[tokio::test]
async fn a_dotdot_path_is_refused() {
    let s = hostile().await;
    let a = archive(&[file("a/../../escaped", b"x")]);
    refused(&s, a, &["a/../../escaped", "`..`"]).await;
}

#[tokio::test]
async fn a_symlink_whose_target_escapes_is_refused() {
    let s = hostile().await;
    let a = archive(&[raw(b"etc", b'2', 0, b"/etc", b"")]);
    refused(&s, a, &["\"etc\"", "escapes", "/etc"]).await;
    let a = archive(&[raw(b"d/up", b'2', 0, b"../../x", b"")]);
    refused(&s, a, &["d/up", "escapes"]).await;
}

#[tokio::test]
async fn writing_through_a_symlink_is_refused_even_when_allowed_to_escape() {
    let s = hostile().await;
    let outside = s.root.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let a = archive(&[
        raw(b"l", b'2', 0, outside.to_str().unwrap().as_bytes(), b""),
        file("l/planted", b"x"),
    ]);
    let header = ImportHeader {
        allow_escaping_symlinks: true,
        ..ImportHeader::default()
    };
    refused_with(
        &s,
        header,
        a,
        &["l/planted", "through the symbolic link \"l\""],
    )
    .await;
    assert!(!outside.join("planted").exists());
    // And inside the tree: a link to a directory, then a file under it.
    let a = archive(&[
        raw(b"real/", b'5', 0, b"", b""),
        raw(b"alias", b'2', 0, b"real", b""),
        file("alias/x", b"x"),
    ]);
    refused(&s, a, &["alias/x", "through the symbolic link"]).await;
}

#[tokio::test]
async fn a_hard_link_outside_the_archive_is_refused() {
    let s = hostile().await;
    let a = archive(&[raw(b"pw", b'1', 0, b"/etc/passwd", b"")]);
    refused(&s, a, &["\"pw\"", "hard link", "/etc/passwd"]).await;
    let a = archive(&[raw(b"up", b'1', 0, b"../x", b"")]);
    refused(&s, a, &["\"up\"", "hard link"]).await;
    // A hard link to a file the archive made is taken (checked below too).
    let a = archive(&[file("f", b"same"), raw(b"g", b'1', 0, b"f", b"")]);
    let mut c = s.client().await;
    let chunks = vec![a];
    c.import(
        ImportHeader {
            path: "ok".into(),
            ..ImportHeader::default()
        },
        tokio_stream::iter(chunks),
    )
    .await
    .expect("an inside hard link is taken");
    assert_eq!(std::fs::read(s.path("ok/g")).unwrap(), b"same");
}

#[tokio::test]
async fn devices_and_fifos_are_refused() {
    let s = hostile().await;
    for (kind, word) in [
        (b'3', "character device"),
        (b'4', "block device"),
        (b'6', "FIFO"),
    ] {
        let a = archive(&[raw(b"dev", kind, 0, b"", b"")]);
        refused(&s, a, &["\"dev\"", word]).await;
    }
}

#[tokio::test]
async fn sparse_files_are_refused() {
    let s = hostile().await;
    // A GNU sparse entry claiming a terabyte.
    let a = archive(&[raw(b"sparse", b'S', 0, b"", b"")]);
    refused(&s, a, &["\"sparse\"", "sparse"]).await;
    // A PAX-described sparse file.
    let pax = b"33 GNU.sparse.size=1099511627776\n";
    let a = archive(&[
        raw(b"././@PaxHeader", b'x', pax.len() as u64, b"", pax),
        file("big", b""),
    ]);
    refused(&s, a, &["sparse"]).await;
}

#[tokio::test]
async fn a_file_past_the_size_cap_is_refused_before_its_bytes_are_read() {
    let s = hostile().await;
    // States 100 GiB and sends none of it: refused at the header.
    let a = archive(&[raw(b"huge", b'0', 100 << 30, b"", b"")]);
    refused(
        &s,
        a,
        &["\"huge\"", "107374182400 bytes", "the most allowed"],
    )
    .await;
    // Within the runner's maximum, past the request's own.
    let a = archive(&[file("a", &[7; 600]), file("b", &[7; 600])]);
    let header = ImportHeader {
        max_bytes: 1000,
        ..ImportHeader::default()
    };
    refused_with(&s, header, a, &["\"b\"", "past 1000 bytes"]).await;
    // A limit over the runner's maximum is refused as such.
    let header = ImportHeader {
        max_bytes: u64::MAX,
        ..ImportHeader::default()
    };
    refused_with(&s, header, archive(&[]), &["over the runner's maximum"]).await;
}

#[tokio::test]
async fn too_many_entries_are_refused() {
    let s = hostile().await;
    let entries: Vec<Vec<u8>> = (0..50).map(|i| file(&format!("f{i}"), b"")).collect();
    let header = ImportHeader {
        max_entries: 20,
        ..ImportHeader::default()
    };
    refused_with(&s, header, archive(&entries), &["more than 20 entries"]).await;
}

#[tokio::test]
async fn a_huge_long_name_record_is_not_read_into_memory() {
    let s = hostile().await;
    // A GNU long name stating 2 GiB (past the address-space limit if it
    // were allocated), then a little of it.
    let a = archive(&[raw(b"././@LongLink", b'L', 2 << 30, b"", &[b'a'; 4096])]);
    refused(&s, a, &["GNU long name", "2147483648 bytes"]).await;
}

#[tokio::test]
async fn a_truncated_or_corrupt_archive_is_refused_and_nothing_is_kept() {
    let s = hostile().await;
    let mut a = archive(&[file("first", b"kept?"), file("second", &[1; 2000])]);
    a.truncate(512 * 3);
    refused(&s, a, &["\"second\"", "truncated"]).await;
    let mut a = archive(&[file("x", b"1")]);
    a[0] ^= 0x55;
    refused(&s, a, &["checksum"]).await;
    // Into a target whose parents do not exist yet: they are not made
    // either.
    let a = archive(&[file("ok", b"1"), raw(b"dev", b'6', 0, b"", b"")]);
    let header = ImportHeader {
        path: "new/nested/target".into(),
        ..ImportHeader::default()
    };
    refused_with(&s, header, a, &["\"dev\"", "FIFO"]).await;
}

#[tokio::test]
async fn a_target_outside_the_workdir_or_among_the_runners_files_is_refused() {
    let s = hostile().await;
    let header = ImportHeader {
        path: "../elsewhere".into(),
        ..ImportHeader::default()
    };
    refused_with(
        &s,
        header,
        archive(&[file("x", b"1")]),
        &["outside the workdir"],
    )
    .await;
    assert!(!s.root.join("elsewhere").exists());
    let state = s.state.display().to_string();
    std::os::unix::fs::symlink(&s.state, s.path("st")).unwrap();
    for path in ["st", &state] {
        let header = ImportHeader {
            path: format!("{path}/sub"),
            ..ImportHeader::default()
        };
        let a = archive(&[file("shell.snapshot", b"id > planted\n")]);
        let chunks = vec![a];
        let e = s
            .client()
            .await
            .import(header, tokio_stream::iter(chunks))
            .await
            .expect_err("refused");
        assert_eq!(e.refusal(), Some(Refusal::TransferRefused), "{e}");
    }
    std::fs::remove_file(s.path("st")).unwrap();
    assert!(!s.state.join("sub").exists());
}
