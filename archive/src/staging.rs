//! A directory an unpack writes into before it is moved into place (or
//! where replaced entries wait to go), removed with all it holds when
//! dropped unless kept: a refused or interrupted transfer leaves nothing
//! behind, whichever end -- the runner or `kubectl agent cp` -- it ran on.

use std::path::{Path, PathBuf};

#[derive(Debug)]
pub struct Staging(Option<PathBuf>);

impl Staging {
    /// Takes charge of `dir`, which the caller made (e.g. a temporary
    /// directory it kept): it is removed on drop.
    pub fn adopt(dir: PathBuf) -> Self {
        Staging(Some(dir))
    }

    /// The directory (a path that does not exist once kept).
    pub fn path(&self) -> &Path {
        self.0.as_deref().unwrap_or(Path::new("/nonexistent"))
    }

    /// Leaves the directory where it is: its contents were moved into place.
    pub fn keep(&mut self) {
        self.0 = None;
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            crate::remove_tree(&p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_staging_directory_goes_with_read_only_contents_and_a_kept_one_stays() {
        let root = tempfile::tempdir().expect("tempdir");
        let dropped = root.path().join("dropped");
        std::fs::create_dir_all(dropped.join("ro/inner")).expect("mkdir");
        std::fs::write(dropped.join("ro/inner/f"), b"x").expect("write");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dropped.join("ro"), std::fs::Permissions::from_mode(0o555))
            .expect("chmod");
        drop(Staging::adopt(dropped.clone()));
        assert!(!dropped.exists());

        let kept = root.path().join("kept");
        std::fs::create_dir(&kept).expect("mkdir");
        let mut s = Staging::adopt(kept.clone());
        assert_eq!(s.path(), kept);
        s.keep();
        drop(s);
        assert!(kept.is_dir());
    }
}
