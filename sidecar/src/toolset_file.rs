//! The session's resolved toolset as a file (`serve --toolset`): read
//! bounded, parsed whole. Its own module because three parts of the runner
//! read the file -- start-up, the watch for changes and a warm sandbox's
//! binding -- and none of them should have to reach into another for it.

use std::path::{Path, PathBuf};

use crate::error::Error;

/// The largest toolset file the runner reads: the ConfigMap it comes in
/// holds 1 MiB in all.
pub const MAX_TOOLSET_BYTES: u64 = 1 << 20;

/// Loads the `--toolset` file, or the default toolset when there is none.
pub fn load_toolset(path: Option<&PathBuf>) -> Result<toolset::ResolvedToolset, Error> {
    let Some(path) = path else {
        return Ok(toolset::ResolvedToolset::default_enabled());
    };
    let bytes = read_toolset(path)?;
    parse_toolset(path, &bytes)
}

/// The toolset file's bytes, at most [`MAX_TOOLSET_BYTES`] of them.
pub fn read_toolset(path: &Path) -> Result<Vec<u8>, Error> {
    crate::fsutil::read_config_file(path, MAX_TOOLSET_BYTES).map_err(|e| Error::ToolsetFile {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// A toolset file's bytes as a resolved toolset.
pub fn parse_toolset(path: &Path, bytes: &[u8]) -> Result<toolset::ResolvedToolset, Error> {
    serde_json::from_slice(bytes).map_err(|e| Error::ToolsetFile {
        path: path.to_path_buf(),
        message: format!(
            "not a resolved toolset ({{\"tools\": [...], \"policies\": {{...}}}}): {e}"
        ),
    })
}
