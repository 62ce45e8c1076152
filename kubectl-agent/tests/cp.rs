//! `kubectl agent cp`'s two directions against a real runner, served
//! in-process on a temp socket (the port-forward is only the way there):
//! trees, modes and links come back as they went, targets in the way are
//! refused unless --overwrite, and a session whose workspace holds a link
//! out of it is refused on this side with nothing left behind.
//!
//! One test function: the runner's process supervisor reaps every child
//! of the test process, so two runners in one process would see each
//! other's children.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use kubectl_agent::cp::{self, Options};
use runner_api::{Client, Target};

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
                    "file {:o} {}",
                    m.mode() & 0o7777,
                    std::fs::read_to_string(&p).unwrap()
                )
            };
            out.insert(rel, what);
        }
    }
    out
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cp_copies_both_ways_and_refuses_what_it_should() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let workdir = root.join("work");
    std::fs::create_dir_all(&workdir).unwrap();
    let socket = root.join("runner.sock");
    let runner = sidecar::Runner::new(sidecar::RunnerConfig::new(
        workdir.clone(),
        root.join("state"),
        root.join("spill"),
        toolset::ResolvedToolset::default_enabled(),
    ))
    .unwrap();
    let listen = sidecar::service::Listen {
        socket: socket.clone(),
        tcp: None,
        tls: None,
    };
    tokio::spawn(sidecar::service::serve(
        runner,
        listen,
        std::future::pending(),
    ));
    let mut client = None;
    for _ in 0..400 {
        if let Ok(c) = Client::connect(&Target::Unix(socket.clone())).await {
            client = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let mut c = client.expect("the runner answered");

    // A local tree up to the session and back.
    let local = root.join("local");
    let src = local.join("proj");
    std::fs::create_dir_all(src.join("lib/deep")).unwrap();
    std::fs::write(src.join("run.sh"), "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(src.join("run.sh"), std::fs::Permissions::from_mode(0o750)).unwrap();
    std::fs::write(src.join("lib/deep/x.txt"), "x").unwrap();
    std::os::unix::fs::symlink("../run.sh", src.join("lib/run")).unwrap();
    let up = cp::upload(&mut c, &src, "dst", Options::default())
        .await
        .expect("uploaded");
    assert_eq!(up.entries, 5);
    assert_eq!(tree(&workdir.join("dst")), tree(&src));

    let back = local.join("back");
    let down = cp::download(&mut c, "dst", &back, Options::default())
        .await
        .expect("downloaded");
    assert_eq!(down.entries, 5);
    assert_eq!(tree(&back), tree(&src));
    // Into an existing directory: under the remote's name.
    cp::download(&mut c, "dst", &back, Options::default())
        .await
        .expect("into a directory");
    assert_eq!(tree(&back.join("dst")), tree(&src));

    // Files: renamed on the way up, into a directory with a trailing slash.
    cp::upload(&mut c, &src.join("run.sh"), "b.sh", Options::default())
        .await
        .expect("file up");
    assert_eq!(
        std::fs::read_to_string(workdir.join("b.sh")).unwrap(),
        "#!/bin/sh\n"
    );
    assert_eq!(
        std::fs::metadata(workdir.join("b.sh")).unwrap().mode() & 0o777,
        0o750
    );
    cp::upload(&mut c, &src.join("run.sh"), "dst/lib/", Options::default())
        .await
        .expect("into");
    assert!(workdir.join("dst/lib/run.sh").is_file());
    let one = local.join("one.sh");
    cp::download(&mut c, "b.sh", &one, Options::default())
        .await
        .expect("file down");
    assert_eq!(std::fs::read_to_string(&one).unwrap(), "#!/bin/sh\n");

    // Targets in the way: refused, then replaced with --overwrite.
    let e = cp::download(&mut c, "b.sh", &one, Options::default())
        .await
        .expect_err("exists");
    assert!(e.to_string().contains("--overwrite"), "{e}");
    std::fs::write(workdir.join("b.sh"), "new\n").unwrap();
    let over = Options {
        overwrite: true,
        ..Options::default()
    };
    cp::download(&mut c, "b.sh", &one, over)
        .await
        .expect("overwritten");
    assert_eq!(std::fs::read_to_string(&one).unwrap(), "new\n");
    let e = cp::upload(&mut c, &one, "b.sh", Options::default())
        .await
        .expect_err("exists there");
    assert!(e.to_string().contains("already exist"), "{e}");

    // The session's workspace links out of itself: refused here, by name,
    // and nothing of it is left on this side.
    std::fs::create_dir_all(workdir.join("leaky")).unwrap();
    std::fs::write(workdir.join("leaky/ok"), "fine").unwrap();
    std::os::unix::fs::symlink("/etc", workdir.join("leaky/etc")).unwrap();
    let before = names(&local);
    let e = cp::download(&mut c, "leaky", &local.join("leaky"), Options::default())
        .await
        .expect_err("refused");
    assert!(
        e.to_string().contains("\"etc\"") && e.to_string().contains("escapes"),
        "{e}"
    );
    assert_eq!(names(&local), before, "something was left behind");
    let allowed = Options {
        allow_escaping_symlinks: true,
        ..Options::default()
    };
    cp::download(&mut c, "leaky", &local.join("leaky"), allowed)
        .await
        .expect("allowed");
    assert_eq!(
        std::fs::read_link(local.join("leaky/etc")).unwrap(),
        Path::new("/etc")
    );

    // Bounded: a limit below the content is refused by the runner.
    let small = Options {
        max_bytes: 3,
        ..Options::default()
    };
    let e = cp::download(&mut c, "leaky", &local.join("small"), small)
        .await
        .expect_err("bounded");
    assert!(e.to_string().contains("the most allowed"), "{e}");
    assert!(!local.join("small").exists());
}
