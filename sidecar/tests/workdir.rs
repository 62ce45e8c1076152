//! Where bash calls run when the runner is started by hand: from any
//! directory, the workdir or wherever the model last `cd`'d, call after
//! call, across runner restarts and `restart: true` (issue 21: every call
//! after the first ran in the runner's own directory, because the runner's
//! `PWD` was evaluated as the shell's state).

mod common;

use std::path::{Path, PathBuf};

use common::Sidecar;
use serde_json::json;

/// How a runner is started: where from, with what `PWD`, with which
/// `--workdir` spelling, with or without a parked shell.
#[derive(Debug, Clone, Copy)]
enum From {
    /// `/`, with `PWD=/`.
    Root,
    /// A directory beside the workdir.
    Sibling,
    /// A directory removed once the runner is up.
    Removed,
    /// A subdirectory of the workdir.
    Inside,
    /// The workdir's parent, with `--workdir work` (relative).
    ParentRelative,
    /// `/`, with a `PWD` that names a directory that does not exist.
    LyingPwd,
}

const FROM: [From; 6] = [
    From::Root,
    From::Sibling,
    From::Removed,
    From::Inside,
    From::ParentRelative,
    From::LyingPwd,
];

/// A runner started as `from` says, and the directory it was started in.
async fn started(from: From, parked: bool) -> (Sidecar, PathBuf) {
    let scratch = tempfile::tempdir().expect("tempdir").keep();
    let start_dir = match from {
        From::Root | From::LyingPwd => PathBuf::from("/"),
        From::Sibling | From::Removed | From::Inside | From::ParentRelative => scratch.clone(),
    };
    let extra: &[&str] = if parked { &[] } else { &["--no-parked-shell"] };
    // The runner's workdir is only known once the helper made it, so start
    // from the scratch directory first and restart where the case says.
    let mut s = Sidecar::start_from(&start_dir, extra).await;
    std::fs::create_dir_all(s.path("sub")).unwrap();
    let start_dir = match from {
        From::Inside => s.path("sub"),
        From::ParentRelative => s.root.clone(),
        _ => start_dir,
    };
    s.stop();
    s.cwd = Some(start_dir.clone());
    if matches!(from, From::ParentRelative) {
        s.workdir_arg = Some(PathBuf::from("work"));
    }
    if matches!(from, From::LyingPwd) {
        s.env.push(("PWD".into(), "/no/such/dir".into()));
    }
    s.spawn().await;
    if matches!(from, From::Removed) {
        std::fs::remove_dir_all(&scratch).unwrap();
    } else if !matches!(from, From::Sibling) {
        let _ = std::fs::remove_dir_all(&scratch);
    }
    (s, start_dir)
}

fn canonical(p: &Path) -> String {
    std::fs::canonicalize(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .display()
        .to_string()
}

/// `pwd -P` of the next call, without its newline.
async fn where_(s: &Sidecar) -> String {
    s.ok("bash", json!({"command": "pwd -P"}))
        .await
        .trim_end()
        .to_owned()
}

#[tokio::test]
async fn every_bash_call_runs_in_the_workdir_or_where_the_model_went_from_any_start() {
    for from in FROM {
        for parked in [true, false] {
            let case = format!("{from:?}, parked shell {parked}");
            let (mut s, start_dir) = started(from, parked).await;
            let work = canonical(&s.workdir);
            let sub = canonical(&s.path("sub"));
            for n in 0..3 {
                assert_eq!(where_(&s).await, work, "{case}: call {n}");
            }
            // The logical name too: what the model reads from $PWD.
            assert_eq!(
                s.ok("bash", json!({"command": "echo \"$PWD\""})).await,
                format!("{}\n", s.workdir.display()),
                "{case}"
            );
            // A relative write from bash lands in the workdir.
            s.ok("bash", json!({"command": "echo x > made.txt"})).await;
            assert!(s.path("made.txt").is_file(), "{case}");
            if start_dir != s.workdir {
                assert!(!start_dir.join("made.txt").exists(), "{case}");
            }

            // Where the model goes, the next calls stay.
            assert_eq!(
                s.ok("bash", json!({"command": "cd sub && pwd -P"}))
                    .await
                    .trim_end(),
                sub,
                "{case}"
            );
            for n in 0..2 {
                assert_eq!(where_(&s).await, sub, "{case}: call {n} after cd");
            }
            // Assigning PWD moves nothing.
            s.ok("bash", json!({"command": "PWD=/"})).await;
            assert_eq!(where_(&s).await, sub, "{case}: after PWD=/");
            // `cd -` goes back to where the shell was before the last cd.
            assert_eq!(
                s.ok(
                    "bash",
                    json!({"command": "cd - >/dev/null && pwd -P && cd sub"})
                )
                .await
                .trim_end(),
                work,
                "{case}: cd -"
            );

            // A new runner process, started from the same kind of place,
            // resumes there.
            s.stop();
            if matches!(from, From::Removed) {
                let again = tempfile::tempdir().expect("tempdir").keep();
                s.cwd = Some(again.clone());
                s.spawn().await;
                std::fs::remove_dir_all(&again).unwrap();
            } else {
                s.spawn().await;
            }
            assert_eq!(where_(&s).await, sub, "{case}: after a runner restart");
            assert_eq!(where_(&s).await, sub, "{case}: the call after that");

            // restart: true is a fresh shell in the workdir.
            s.ok("bash", json!({"restart": true})).await;
            for n in 0..2 {
                assert_eq!(where_(&s).await, work, "{case}: call {n} after restart");
            }
            assert_eq!(
                s.ok("bash", json!({"restart": true, "command": "pwd -P"}))
                    .await
                    .trim_end(),
                work,
                "{case}: restart with a command"
            );
        }
    }
}

#[tokio::test]
async fn a_working_directory_that_is_gone_runs_nothing_elsewhere() {
    for parked in [true, false] {
        let (s, _) = started(From::Root, parked).await;
        s.ok("bash", json!({"command": "mkdir gone && cd gone"}))
            .await;
        // Removed from inside: the shell state says "gone" is where it is.
        s.ok("bash", json!({"command": "rmdir \"$PWD\""})).await;
        let refused = s.err("bash", json!({"command": "touch ran.txt"})).await;
        assert!(
            refused.contains("cannot be entered any more")
                && refused.contains("did not run")
                && refused.contains(&format!("now in {}", s.workdir.display())),
            "parked {parked}: {refused}"
        );
        assert!(!s.path("ran.txt").exists(), "parked {parked}");
        assert_eq!(where_(&s).await, canonical(&s.workdir), "parked {parked}");
    }
}
