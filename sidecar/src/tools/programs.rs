//! The programs the tools execute, fixed at start-up so that a file written
//! later into a PATH directory is never run in their place: the shell, and
//! the grep the sandbox has (probed once for PCRE).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The shell every bash call runs; the sandbox image must have it.
pub const BASH: &str = "/bin/bash";

/// The grep the sandbox has, probed once per runner.
#[derive(Debug, Clone)]
pub enum GrepBinary {
    Found { path: PathBuf, pcre: bool },
    Missing,
}

/// Finds a program on PATH, considering only absolute PATH entries, so a file
/// planted in the working directory is never run in its place.
pub(crate) fn look_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .filter(|d| d.is_absolute())
        .map(|d| d.join(name))
        .find(|p| {
            std::fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// Finds grep on PATH and asks it once whether it has PCRE (`grep -P ''
/// /dev/null` exits 1, "no match", when it does and 2 when it was built
/// without). Runs at start-up, before the supervisor reaps children, so it
/// waits for its own child; a grep that does not answer within the probe's
/// bound is taken as having no PCRE.
pub fn probe() -> GrepBinary {
    let Some(path) = look_path("grep") else {
        return GrepBinary::Missing;
    };
    let pcre = Command::new(&path)
        .args(["-P", "", "/dev/null"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(|mut child| {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                match child.try_wait() {
                    Ok(Some(status)) => return matches!(status.code(), Some(0 | 1)),
                    Ok(None) if std::time::Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        return false;
                    }
                }
            }
        })
        .unwrap_or(false);
    tracing::info!(grep = %path.display(), pcre, "grep probed");
    GrepBinary::Found { path, pcre }
}
