//! What write and edit do about a symbolic link in place of the file they
//! replace: find it, and say that it was replaced rather than written
//! through.

use std::path::{Path, PathBuf};

/// The target of `path` if it is a symbolic link, which write and edit
/// replace with a regular file rather than write through.
pub(crate) fn link_target(path: &Path) -> Option<PathBuf> {
    std::fs::symlink_metadata(path)
        .ok()
        .filter(|m| m.file_type().is_symlink())
        .and_then(|_| std::fs::read_link(path).ok())
}

/// What a write or edit result adds when it replaced a symbolic link, so the
/// model is not left believing the link's target changed.
pub(crate) fn replaced_link_note(shown: &str, target: &Path) -> String {
    format!(
        "; {shown} was a symbolic link to {}: it is now a regular file with the new content, and the link's target was not written",
        target.display()
    )
}
