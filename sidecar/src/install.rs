//! `agent-sidecar install DEST`: the runner image holds nothing but this
//! binary, so the sandbox pod's init container runs it to copy itself into
//! an emptyDir the session's image then starts it from.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::error::Error;

/// Copies this executable to `dest`, mode 0755. The copy is written beside
/// `dest` and renamed over it, so a container starting from `dest` never
/// sees a half-written binary.
pub fn install(dest: &Path) -> Result<(), Error> {
    let me = std::env::current_exe().map_err(|e| Error::io("cannot find this executable", e))?;
    let dir = dest.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("cannot create {}", dir.display()), e))?;
    let tmp = dir.join(format!(".agent-sidecar.{}", std::process::id()));
    std::fs::copy(&me, &tmp)
        .map_err(|e| Error::io(format!("cannot copy to {}", tmp.display()), e))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| Error::io(format!("cannot chmod {}", tmp.display()), e))?;
    std::fs::rename(&tmp, dest)
        .map_err(|e| Error::io(format!("cannot install {}", dest.display()), e))?;
    crate::cli::print_line(&format!("installed {}", dest.display()))
}
