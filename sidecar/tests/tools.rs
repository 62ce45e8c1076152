//! Every tool rule, driven through the real binary over its socket.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, SystemTime};

use common::{Sidecar, alive, eventually, mode};
use serde_json::json;

#[tokio::test]
async fn bash_state_persists_across_calls_and_runner_restarts() {
    let mut s = Sidecar::start().await;
    std::fs::create_dir(s.path("sub")).unwrap();
    s.ok(
        "bash",
        json!({"command": "export GREETING='hello world'; cd sub; greet() { echo \"hi $1\"; }"}),
    )
    .await;
    let out = s
        .ok(
            "bash",
            json!({"command": "echo \"$GREETING\"; pwd; greet there"}),
        )
        .await;
    assert_eq!(
        out,
        format!("hello world\n{}\nhi there\n", s.path("sub").display())
    );

    // unset sticks too: the snapshot is the whole environment.
    s.ok("bash", json!({"command": "export DROPPED=1"})).await;
    s.ok("bash", json!({"command": "unset DROPPED"})).await;
    assert_eq!(
        s.ok("bash", json!({"command": "echo \"[${DROPPED-}]\""}))
            .await,
        "[]\n"
    );

    assert!(s.stop().success());
    s.spawn().await;
    let out = s
        .ok("bash", json!({"command": "echo \"$GREETING\"; pwd"}))
        .await;
    assert_eq!(out, format!("hello world\n{}\n", s.path("sub").display()));
}

#[tokio::test]
async fn bash_restart_resets_state() {
    let s = Sidecar::start().await;
    s.ok("bash", json!({"command": "export X=1; cd /"})).await;
    assert_eq!(
        s.ok("bash", json!({"restart": true})).await,
        "bash session restarted"
    );
    let out = s
        .ok("bash", json!({"command": "echo \"[${X-}]\"; pwd"}))
        .await;
    assert_eq!(out, format!("[]\n{}\n", s.workdir.display()));
    // restart with a command runs it in the fresh shell.
    s.ok("bash", json!({"command": "export Y=2"})).await;
    let out = s
        .ok(
            "bash",
            json!({"restart": true, "command": "echo \"[${Y-}]\""}),
        )
        .await;
    assert_eq!(out, "[]\n");
}

#[tokio::test]
async fn bash_exit_codes_and_bad_input() {
    let s = Sidecar::start().await;
    assert_eq!(
        s.err("bash", json!({"command": "echo oops >&2; exit 3"}))
            .await,
        // stderr first for a failed call, then the newline the reference
        // puts after a non-empty stderr, then the (empty) stdout.
        "oops\n\nexit code: 3"
    );
    assert_eq!(s.ok("bash", json!({"command": "true"})).await, "");
    assert_eq!(s.err("bash", json!({})).await, "bash: command is required");
    // A field of the wrong type is named, in the tool's terms.
    assert_eq!(
        s.err("bash", json!({"command": 5})).await,
        "bash: command must be a string, not the number 5"
    );
    assert_eq!(
        s.err("bash", json!({"command": "true", "timeout_ms": "x"}))
            .await,
        "bash: timeout_ms must be a whole number of milliseconds, not a string"
    );
    assert_eq!(
        s.err("bash", json!(["touch made", 1])).await,
        "invalid bash input: must be a JSON object, not an array"
    );
    let over = s
        .err(
            "bash",
            json!({"command": "touch made", "timeout_ms": 600_001}),
        )
        .await;
    assert!(over.contains("over the maximum of 600000"), "{over}");
    assert!(
        s.err("bash", json!({"command": "touch made", "timeout_ms": -5}))
            .await
            .contains("positive")
    );
    // A refused restart changes nothing either.
    s.ok("bash", json!({"command": "export KEEP=1"})).await;
    s.err("bash", json!({"restart": true, "timeout_ms": 700_000}))
        .await;
    assert_eq!(s.ok("bash", json!({"command": "echo $KEEP"})).await, "1\n");
    assert!(!s.path("made").exists());
    // Malformed JSON (not an object at all).
    let r = s
        .client()
        .await
        .run(&common::next_id(), "bash", "{not json", false)
        .await
        .unwrap();
    assert!(r.is_error, "{}", r.content);
    assert_eq!(
        r.content,
        "invalid bash input: invalid character 'n' looking for beginning of object key string"
    );
    // stdin is /dev/null: a reader gets EOF instead of hanging.
    assert_eq!(
        s.ok("bash", json!({"command": "cat; echo done"})).await,
        "done\n"
    );
}

#[tokio::test]
async fn bash_timeout_kills_the_whole_group() {
    let s = Sidecar::start().await;
    let pidfile = s.path("bg.pid");
    let r = s
        .call(
            "bash",
            json!({"command": format!("sleep 60 & echo $! > {}; sleep 60", pidfile.display()), "timeout_ms": 1000}),
        )
        .await;
    assert!(r.is_error);
    assert!(
        r.content.contains("timed out after 1000ms"),
        "{}",
        r.content
    );
    let bg: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        eventually(|| !alive(bg)).await,
        "background job {bg} survived the timeout"
    );
    // The state from before the timed-out call is intact.
    assert_eq!(
        s.ok("bash", json!({"command": "pwd"})).await,
        format!("{}\n", s.workdir.display())
    );
}

#[tokio::test]
async fn bash_background_job_does_not_hold_the_call_and_is_reaped() {
    let s = Sidecar::start().await;
    let pidfile = s.path("bg.pid");
    // A generous per-call timeout: if the job held the call open, the call
    // would time out (and say so) instead of returning "started".
    let fut = s.call(
        "bash",
        json!({"command": format!("(sleep 3; echo late) & echo $! > {}; echo started", pidfile.display()), "timeout_ms": 60_000}),
    );
    let r = tokio::time::timeout(Duration::from_secs(50), fut)
        .await
        .expect("call held open");
    assert_eq!(r.content, "started\n");
    assert!(!r.is_error);
    let bg: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The orphan is reparented to the runner (a subreaper) and reaped: no zombie.
    assert!(
        eventually(|| !alive(bg) && !std::path::Path::new(&format!("/proc/{bg}")).exists()).await
    );
}

/// A call with `id`, its result's content.
async fn bash_as(s: &Sidecar, id: &str, command: &str) -> String {
    let r = s
        .try_call(id, "bash", json!({"command": command}))
        .await
        .expect("call was run");
    assert!(!r.is_error, "{command}: {}", r.content);
    r.content
}

/// Issue 21, item 1: what a background job prints after its call returned
/// reaches the next bash result, framed with the call that started it,
/// instead of going into a file nobody reads. The jobs wait for flag files
/// the next call makes, so nothing here depends on timing.
#[tokio::test]
async fn bash_background_output_reaches_the_next_result() {
    let s = Sidecar::start().await;
    let (c1, c2, c3, c4, c5) = ("bg-one", "bg-two", "bg-three", "bg-four", "bg-five");
    assert_eq!(
        bash_as(
            &s,
            c1,
            "(while [ ! -e go1 ]; do sleep 0.02; done; echo late; echo oops >&2; touch printed1) & echo now"
        )
        .await,
        "now\n"
    );
    let out = bash_as(
        &s,
        c2,
        "touch go1; while [ ! -e printed1 ]; do sleep 0.02; done; echo next",
    )
    .await;
    let head = format!(
        "[background output of call {c1}, written after that call returned]\nlate\noops\n[end of background output of call {c1}: its jobs "
    );
    assert!(out.starts_with(&head), "{out}");
    assert!(out.ends_with("]\nnext\n"), "{out}");

    // A job still running says so; its output is not repeated, and a call
    // after which nothing was written shows nothing of it.
    assert_eq!(
        bash_as(
            &s,
            c3,
            "(while [ ! -e go3 ]; do sleep 0.02; done; printf 'no newline'; touch printed3; exec sleep 300) & echo started"
        )
        .await,
        "started\n"
    );
    let out = bash_as(
        &s,
        c4,
        "touch go3; while [ ! -e printed3 ]; do sleep 0.02; done; echo fourth",
    )
    .await;
    assert_eq!(
        out,
        format!(
            "[background output of call {c3}, written after that call returned]\nno newline\n[end of background output of call {c3}: its jobs are still running]\nfourth\n"
        )
    );
    assert_eq!(bash_as(&s, c5, "echo fifth").await, "fifth\n");
    // restart ends the jobs, and with them what they would still write.
    s.ok("bash", json!({"restart": true})).await;
    assert_eq!(bash_as(&s, "bg-six", "echo sixth").await, "sixth\n");
}

/// Late output is bounded within the result: it gets a share of the output
/// budget, so it never pushes the call's own output out of view, and its
/// footer (whether the jobs still run) always shows; all of it is saved
/// beside the call's spill file, named in the result.
#[tokio::test]
async fn bash_background_output_is_bounded_within_the_result() {
    let s = Sidecar::start().await;
    bash_as(
        &s,
        "bg-big",
        "(while [ ! -e go ]; do sleep 0.02; done; head -c 300000 /dev/zero | tr '\\0' x; touch printed) & true",
    )
    .await;
    let out = bash_as(
        &s,
        "bg-after",
        "touch go; while [ ! -e printed ]; do sleep 0.02; done; echo own",
    )
    .await;
    assert!(out.len() <= 40 << 10, "{} bytes", out.len());
    let saved = s.spill.join("bg-after.background.txt");
    let head = "[background output of call bg-big, written after that call returned]\nxxx";
    assert!(out.starts_with(head), "{}", &out[..200]);
    let tail = "x\n[... cut here]\n[end of background output of call bg-big: its jobs ";
    assert!(out.contains(tail), "{}", &out[out.len() - 600..]);
    // The saved size depends on the footer, which says whether the jobs
    // had ended yet when the call finished.
    let note = "]\n[background output is shown up to 32768 bytes per call; all of it (";
    let named = format!(
        " bytes) is saved in {p}; view it in slices, e.g. sed -n '1,200p' {p}]\nown\n",
        p = saved.display()
    );
    assert!(
        out.contains(note) && out.ends_with(&named),
        "{}",
        &out[out.len() - 600..]
    );
    let whole = std::fs::read_to_string(&saved).expect("saved");
    assert_eq!(whole.matches('x').count(), 300_000);
    assert!(whole.starts_with(head));
    assert!(whole.contains("x\n[end of background output of call bg-big: its jobs "));
}

#[tokio::test]
async fn bash_restart_ends_background_jobs() {
    let s = Sidecar::start().await;
    let pidfile = s.path("bg.pid");
    s.ok(
        "bash",
        json!({"command": format!("sleep 60 & echo $! > {}", pidfile.display())}),
    )
    .await;
    let bg: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(alive(bg));
    s.ok("bash", json!({"restart": true})).await;
    assert!(eventually(|| !alive(bg)).await);
}

#[tokio::test]
async fn read_whole_ranges_and_refusals() {
    let s = Sidecar::start().await;
    std::fs::write(s.path("f.txt"), "one\ntwo\nthree\n").unwrap();
    assert_eq!(
        s.ok("read", json!({"file_path": "f.txt"})).await,
        "one\ntwo\nthree\n"
    );
    let abs = s.path("f.txt").display().to_string();
    assert_eq!(
        s.ok("read", json!({"file_path": abs, "view_range": [2, 3]}))
            .await,
        "two\nthree"
    );
    assert_eq!(
        s.ok("read", json!({"file_path": "f.txt", "view_range": [2, -1]}))
            .await,
        "two\nthree\n"
    );
    assert_eq!(
        s.ok("read", json!({"file_path": "f.txt", "view_range": [9, 10]}))
            .await,
        ""
    );
    assert!(
        s.err("read", json!({"file_path": "f.txt", "view_range": [1]}))
            .await
            .contains("view_range must be")
    );
    assert_eq!(
        s.err("read", json!({})).await,
        "read: file_path is required"
    );
    assert!(
        s.err("read", json!({"file_path": "missing"}))
            .await
            .contains("no such file or directory")
    );
    std::fs::create_dir(s.path("d")).unwrap();
    assert!(
        s.err("read", json!({"file_path": "d"}))
            .await
            .contains("is a directory")
    );
    std::fs::write(s.path("bin"), b"ab\0cd").unwrap();
    assert!(
        s.err("read", json!({"file_path": "bin"}))
            .await
            .contains("binary file")
    );
    std::fs::write(s.path("big"), "x\n".repeat(200 << 10)).unwrap();
    assert_eq!(
        s.err("read", json!({"file_path": "big"})).await,
        "read: big is 409600 bytes, exceeds 110000-byte limit. Use the view_range parameter to read specific line ranges, e.g. view_range: [1, 500]."
    );
    // A range of a file over the cap still reads...
    assert_eq!(
        s.ok("read", json!({"file_path": "big", "view_range": [5, 6]}))
            .await,
        "x\nx"
    );
    // ... up to the cap: 55 000 lines of "x" joined are 109 999 bytes.
    // (then cut by the 100 KiB output budget, the rest spilled).
    let most = s
        .ok(
            "read",
            json!({"file_path": "big", "view_range": [1, 55_000]}),
        )
        .await;
    assert!(
        most.starts_with("x\nx\n") && most.contains("the full output (109999 bytes)"),
        "{}",
        &most[most.len() - 300..]
    );
    assert_eq!(
        s.err(
            "read",
            json!({"file_path": "big", "view_range": [1, 55_001]})
        )
        .await,
        "read: view_range [1, 55001] of big exceeds 110000-byte limit. Narrow the view_range to read a smaller portion."
    );
    // One line over the cap cannot be narrowed: an error that says so.
    std::fs::write(s.path("wide"), "y".repeat(300_000)).unwrap();
    assert_eq!(
        s.err("read", json!({"file_path": "wide", "view_range": [1, 1]}))
            .await,
        "read: line 1 of wide alone exceeds 110000-byte limit. The read tool cannot return part of a line, so view_range cannot narrow this further."
    );
    // Absolute paths outside the workdir are accepted: the container is the boundary.
    assert!(
        s.ok("read", json!({"file_path": "/etc/hostname"}))
            .await
            .len()
            < 1000
    );
}

#[tokio::test]
async fn empty_input_is_not_json_for_any_tool() {
    let s = Sidecar::start().await;
    let mut client = s.client().await;
    for tool in ["bash", "read", "write", "edit", "glob", "grep"] {
        for raw in ["", " \n\t "] {
            let r = client
                .run(&common::next_id(), tool, raw, false)
                .await
                .unwrap();
            assert!(r.is_error, "{tool} {raw:?}");
            assert_eq!(
                r.content,
                format!("invalid {tool} input: unexpected end of JSON input")
            );
        }
    }
}

#[tokio::test]
async fn write_creates_dirs_atomically_and_keeps_modes() {
    let s = Sidecar::start().await;
    assert_eq!(
        s.ok("write", json!({"file_path": "a/b/c.txt", "content": "hi"}))
            .await,
        "wrote 2 bytes to a/b/c.txt"
    );
    assert_eq!(std::fs::read_to_string(s.path("a/b/c.txt")).unwrap(), "hi");
    assert_eq!(mode(&s.path("a/b/c.txt")), 0o644);

    std::fs::write(s.path("run.sh"), "#!/bin/sh\necho a\n").unwrap();
    std::fs::set_permissions(s.path("run.sh"), std::fs::Permissions::from_mode(0o751)).unwrap();
    s.ok(
        "write",
        json!({"file_path": "run.sh", "content": "#!/bin/sh\necho b\n"}),
    )
    .await;
    assert_eq!(mode(&s.path("run.sh")), 0o751);
    s.ok(
        "edit",
        json!({"file_path": "run.sh", "old_string": "echo b", "new_string": "echo c"}),
    )
    .await;
    assert_eq!(mode(&s.path("run.sh")), 0o751);
    assert_eq!(s.ok("bash", json!({"command": "./run.sh"})).await, "c\n");

    // A symlink is replaced by a regular file, not written through.
    std::fs::write(s.path("target"), "t").unwrap();
    std::os::unix::fs::symlink("target", s.path("link")).unwrap();
    assert_eq!(
        s.ok("write", json!({"file_path": "link", "content": "new"}))
            .await,
        "wrote 3 bytes to link; link was a symbolic link to target: it is now a regular file with the new content, and the link's target was not written"
    );
    assert_eq!(std::fs::read_to_string(s.path("target")).unwrap(), "t");
    assert!(
        std::fs::symlink_metadata(s.path("link"))
            .unwrap()
            .file_type()
            .is_file()
    );
    assert_eq!(mode(&s.path("link")), 0o644);

    // Refusals change nothing, and no temp file is left behind.
    std::fs::create_dir(s.path("dir")).unwrap();
    assert!(
        s.err("write", json!({"file_path": "dir", "content": "x"}))
            .await
            .contains("is a directory")
    );
    // A trailing "/" names a directory, never a file.
    assert!(
        s.err("write", json!({"file_path": "new/", "content": "x"}))
            .await
            .contains("names a directory")
    );
    assert!(!s.path("new").exists());
    // A file where a parent directory should be is named for what it is not.
    assert_eq!(
        s.err(
            "write",
            json!({"file_path": "run.sh/x.txt", "content": "x"})
        )
        .await,
        "write run.sh/x.txt: mkdir: not a directory"
    );
    assert_eq!(
        s.err("write", json!({"file_path": "x"})).await,
        "write: content is required"
    );
    assert_eq!(
        s.err("write", json!({"file_path": "x", "content": 1}))
            .await,
        "write: content must be a string, not the number 1"
    );
    assert!(!s.path("x").exists());
    let leftovers: Vec<_> = std::fs::read_dir(&s.workdir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".agent-write-"))
        .collect();
    assert!(leftovers.is_empty());
}

#[tokio::test]
async fn edit_rules() {
    let s = Sidecar::start().await;
    std::fs::write(s.path("e.txt"), "a b a").unwrap();
    let dup = s
        .err(
            "edit",
            json!({"file_path": "e.txt", "old_string": "a", "new_string": "z"}),
        )
        .await;
    assert!(dup.contains("appears 2 times"), "{dup}");
    assert_eq!(std::fs::read_to_string(s.path("e.txt")).unwrap(), "a b a");
    assert_eq!(
        s.ok(
            "edit",
            json!({"file_path": "e.txt", "old_string": "a", "new_string": "z", "replace_all": true})
        )
        .await,
        "edited e.txt (2 replacement(s))"
    );
    assert_eq!(std::fs::read_to_string(s.path("e.txt")).unwrap(), "z b z");
    s.ok(
        "edit",
        json!({"file_path": "e.txt", "old_string": " b", "new_string": ""}),
    )
    .await;
    assert_eq!(std::fs::read_to_string(s.path("e.txt")).unwrap(), "z z");
    // Through a symlink: the edited text replaces the link, and says so.
    std::os::unix::fs::symlink("e.txt", s.path("l.txt")).unwrap();
    assert_eq!(
        s.ok(
            "edit",
            json!({"file_path": "l.txt", "old_string": "z z", "new_string": "y"}),
        )
        .await,
        "edited l.txt (1 replacement(s); l.txt was a symbolic link to e.txt: it is now a regular file with the new content, and the link's target was not written)"
    );
    assert_eq!(std::fs::read_to_string(s.path("l.txt")).unwrap(), "y");
    assert_eq!(std::fs::read_to_string(s.path("e.txt")).unwrap(), "z z");
    std::fs::create_dir(s.path("sub")).unwrap();
    assert_eq!(
        s.err(
            "edit",
            json!({"file_path": "sub", "old_string": "a", "new_string": "b"}),
        )
        .await,
        "edit: sub is a directory, not a regular file"
    );
    assert!(
        s.err(
            "edit",
            json!({"file_path": "e.txt", "old_string": "q", "new_string": "r"})
        )
        .await
        .contains("not found")
    );
    assert_eq!(
        s.err(
            "edit",
            json!({"file_path": "e.txt", "old_string": "", "new_string": "r"})
        )
        .await,
        "edit: old_string is required"
    );
    assert_eq!(
        s.err("edit", json!({"file_path": "e.txt", "old_string": "z"}))
            .await,
        "edit: new_string is required"
    );
    std::fs::write(s.path("bin"), b"z\0z").unwrap();
    assert!(
        s.err(
            "edit",
            json!({"file_path": "bin", "old_string": "z", "new_string": "y"})
        )
        .await
        .contains("binary")
    );
    assert_eq!(std::fs::read(s.path("bin")).unwrap(), b"z\0z");
    assert!(
        s.err(
            "edit",
            json!({"file_path": "missing", "old_string": "z", "new_string": "y"})
        )
        .await
        .contains("no such file")
    );
    assert!(!s.path("missing").exists());
}

#[tokio::test]
async fn glob_matches_doublestar_newest_first() {
    let s = Sidecar::start().await;
    let now = SystemTime::now();
    for (i, p) in ["old.rs", "src/mid.rs", "src/deep/new.rs", "src/notes.txt"]
        .iter()
        .enumerate()
    {
        let path = s.path(p);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "x").unwrap();
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(now - Duration::from_secs(1000 - 100 * i as u64))
            .unwrap();
    }
    let out = s.ok("glob", json!({"pattern": "**/*.rs"})).await;
    let want: Vec<String> = ["src/deep/new.rs", "src/mid.rs", "old.rs"]
        .iter()
        .map(|p| s.path(p).display().to_string())
        .collect();
    assert_eq!(out, want.join("\n"));
    assert_eq!(
        s.ok("glob", json!({"pattern": "*.rs"})).await,
        s.path("old.rs").display().to_string()
    );
    assert_eq!(
        s.ok("glob", json!({"pattern": "*.txt", "path": "src"}))
            .await,
        s.path("src/notes.txt").display().to_string()
    );
    let abs = format!("{}/**/new.rs", s.workdir.display());
    assert_eq!(
        s.ok("glob", json!({"pattern": abs})).await,
        s.path("src/deep/new.rs").display().to_string()
    );
    // `**` matches zero segments too: `src/**` is `src` and all below it
    // (newest first, the directory older than what was written into it last).
    let out = s.ok("glob", json!({"pattern": "src/**"})).await;
    let lines: Vec<&str> = out.lines().collect();
    for p in [
        "src",
        "src/deep",
        "src/deep/new.rs",
        "src/mid.rs",
        "src/notes.txt",
    ] {
        assert!(
            lines.contains(&s.path(p).display().to_string().as_str()),
            "src/** lacks {p}: {out}"
        );
    }
    assert_eq!(lines.len(), 5, "{out}");
    assert_eq!(
        s.ok("glob", json!({"pattern": "*.none"})).await,
        "no matches"
    );
    assert!(
        s.err("glob", json!({"pattern": "a[", }))
            .await
            .contains("invalid pattern")
    );
    assert!(
        s.err("glob", json!({"pattern": "*", "path": "nope"}))
            .await
            .contains("no such file")
    );
}

#[tokio::test]
async fn grep_shells_out_to_gnu_grep() {
    let s = Sidecar::start().await;
    std::fs::create_dir_all(s.path("d")).unwrap();
    std::fs::write(s.path("d/a.txt"), "alpha\nbeta 42\n").unwrap();
    std::fs::write(s.path("d/b.bin"), b"beta\0 42").unwrap();
    let out = s.ok("grep", json!({"pattern": "beta \\d+"})).await;
    assert_eq!(out, format!("{}:2:beta 42\n", s.path("d/a.txt").display()));
    let one = s
        .ok("grep", json!({"pattern": "alpha", "path": "d/a.txt"}))
        .await;
    assert_eq!(one, format!("{}:1:alpha\n", s.path("d/a.txt").display()));
    assert_eq!(
        s.ok("grep", json!({"pattern": "gamma"})).await,
        "no matches"
    );
    let bad = s.err("grep", json!({"pattern": "(unclosed"})).await;
    assert!(
        bad.starts_with("grep: ") && bad.contains("parenthes"),
        "{bad}"
    );
    assert!(
        s.err("grep", json!({"pattern": "x", "path": "nope"}))
            .await
            .contains("no such file")
    );
    assert_eq!(
        s.err("grep", json!({"path": "d"})).await,
        "grep: pattern is required"
    );
}

#[tokio::test]
async fn grep_answers_in_path_order_and_searches_any_text() {
    let s = Sidecar::start().await;
    // More files than one grep process is given, created in reverse, with
    // a directory whose name falls among them.
    let mut want = Vec::new();
    for i in (0..1500).rev() {
        std::fs::create_dir_all(s.path("t/m")).unwrap();
        std::fs::write(s.path(&format!("t/f{i:04}.txt")), format!("needle {i}\n")).unwrap();
    }
    std::fs::write(s.path("t/m/inner.txt"), "needle in m\n").unwrap();
    // "f0000.txt" < ... < "f1499.txt" < "m" (its files where its name falls).
    for i in 0..1500 {
        want.push(format!(
            "{}:1:needle {i}",
            s.path(&format!("t/f{i:04}.txt")).display()
        ));
    }
    want.push(format!(
        "{}:1:needle in m",
        s.path("t/m/inner.txt").display()
    ));
    let out = s
        .ok("grep", json!({"pattern": "needle", "path": "t"}))
        .await;
    assert_eq!(out.lines().collect::<Vec<_>>(), want);

    // Text is anything without a NUL in its first 8 KiB: Latin-1 included
    // (its byte comes back as U+FFFD), a NUL further in too.
    std::fs::create_dir_all(s.path("enc")).unwrap();
    std::fs::write(s.path("enc/latin.txt"), b"caf\xe9 needle\n").unwrap();
    std::fs::write(s.path("enc/utf.txt"), "café needle\n").unwrap();
    std::fs::write(s.path("enc/early.bin"), b"needle\0\n").unwrap();
    let mut late = vec![b'x'; 9000];
    late.extend_from_slice(b"\nlate\0 needle\n");
    std::fs::write(s.path("enc/late.txt"), late).unwrap();
    let out = s
        .ok("grep", json!({"pattern": "needle", "path": "enc"}))
        .await;
    assert_eq!(
        out,
        format!(
            "{}:2:late needle\n{}:1:caf\u{fffd} needle\n{}:1:café needle\n",
            s.path("enc/late.txt").display(),
            s.path("enc/latin.txt").display(),
            s.path("enc/utf.txt").display()
        )
    );
    // A UTF-8 pattern keeps its meaning: one character, not its bytes.
    let out = s
        .ok("grep", json!({"pattern": "caf[é] ", "path": "enc"}))
        .await;
    assert_eq!(
        out,
        format!("{}:1:café needle\n", s.path("enc/utf.txt").display())
    );
    // A binary file named directly has nothing to search.
    assert_eq!(
        s.ok(
            "grep",
            json!({"pattern": "needle", "path": "enc/early.bin"})
        )
        .await,
        "no matches"
    );
    // What grep cannot read is not waited on.
    nix::unistd::mkfifo(&s.path("enc/fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    assert_eq!(
        s.err("grep", json!({"pattern": "x", "path": "enc/fifo"}))
            .await,
        "grep: enc/fifo is a FIFO (named pipe), not a file or directory to search"
    );
    // A bad pattern is an error even where nothing is searched.
    std::fs::create_dir_all(s.path("empty")).unwrap();
    assert!(
        s.err("grep", json!({"pattern": "(unclosed", "path": "empty"}))
            .await
            .starts_with("grep: ")
    );
}

#[tokio::test]
async fn output_is_sanitized_capped_and_spilled() {
    let s = Sidecar::start().await;
    assert_eq!(
        s.ok("bash", json!({"command": "printf 'a\\0b'"})).await,
        "ab"
    );
    let id = common::next_id();
    let r = s
        .try_call(
            &id,
            "bash",
            json!({"command": "yes 0123456789 | head -c 300000; exit 4"}),
        )
        .await
        .unwrap();
    assert!(r.is_error);
    assert!(r.content.len() <= toolset::MAX_OUTPUT_BYTES);
    assert!(
        r.content.ends_with("\nexit code: 4"),
        "{}",
        &r.content[r.content.len() - 300..]
    );
    let spill = s.spill.join(format!("{id}.txt"));
    assert!(r.content.contains(&spill.display().to_string()));
    assert_eq!(std::fs::metadata(&spill).unwrap().len(), 300_000);
    // A multi-byte character is never split by the cap.
    let r = s
        .call("bash", json!({"command": "yes é | head -c 250000"}))
        .await;
    assert!(r.content.len() <= toolset::MAX_OUTPUT_BYTES);
    // Text results (read of a file between the caps) spill too.
    // (100 KiB output budget < 110 000-byte read cap).
    std::fs::write(s.path("mid.txt"), "y".repeat(105_000)).unwrap();
    let id = common::next_id();
    let r = s
        .try_call(&id, "read", json!({"file_path": "mid.txt"}))
        .await
        .unwrap();
    assert!(!r.is_error && r.content.len() <= toolset::MAX_OUTPUT_BYTES);
    assert_eq!(
        std::fs::metadata(s.spill.join(format!("{id}.txt")))
            .unwrap()
            .len(),
        105_000
    );
    // Working files do not pile up: what is left is the output file of the
    // one shell parked for the next call.
    let left: Vec<String> = std::fs::read_dir(s.state.join("calls"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        left.len() <= 2
            && left
                .iter()
                .all(|n| n.ends_with(".shell.out") || n.ends_with(".shell.err")),
        "{left:?}"
    );
}

#[tokio::test]
async fn a_gibibyte_of_output_stays_within_a_few_mib() {
    let s = Sidecar::start().await;
    // Warm up: every code path of a spilled bash call once.
    s.call(
        "bash",
        json!({"command": "head -c 200000 /dev/zero | tr '\\0' x"}),
    )
    .await;
    let before = s.status_kib("VmHWM");
    let id = common::next_id();
    let r = s
        .try_call(
            &id,
            "bash",
            json!({"command": "head -c 1073741824 /dev/zero | tr '\\0' x", "timeout_ms": 600_000}),
        )
        .await
        .unwrap();
    assert!(
        !r.is_error,
        "{}",
        &r.content[r.content.len().saturating_sub(300)..]
    );
    assert!(r.content.len() <= toolset::MAX_OUTPUT_BYTES);
    let after = s.status_kib("VmHWM");
    eprintln!("VmHWM before {before} KiB, after {after} KiB");
    assert!(
        after <= before + 4 * 1024,
        "peak RSS grew from {before} to {after} KiB"
    );
    let spill = s.spill.join(format!("{id}.txt"));
    assert_eq!(std::fs::metadata(&spill).unwrap().len(), 1 << 30);
    std::fs::remove_file(spill).unwrap();
}
