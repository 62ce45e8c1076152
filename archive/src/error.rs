//! The crate's one error type.

use std::fmt;

/// Why an archive could not be packed or was refused on unpacking. Every
/// refusal of an entry names it, so the sender can find and fix it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read or written on this side.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// One entry of the archive was refused.
    #[error("archive entry {entry:?}: {problem}")]
    Entry { entry: String, problem: Problem },
    /// The archive as a whole is not one this side reads.
    #[error("archive: {0}")]
    Malformed(String),
    /// More entries than the limit.
    #[error("the archive holds more than {limit} entries, the most allowed")]
    TooManyEntries { limit: u64 },
    /// The files' sizes add up past the limit.
    #[error(
        "{entry:?} ({size} bytes) takes the archive's files past {limit} bytes, the most allowed"
    )]
    TooLarge {
        entry: String,
        size: u64,
        limit: u64,
    },
}

/// What is wrong with one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The name starts at `/`.
    Absolute,
    /// The name has a `..` component.
    Traversal,
    /// The name is empty, holds a NUL, or is too long.
    BadName(&'static str),
    /// A symbolic link whose target leads out of the archive's tree.
    SymlinkEscapes { target: String },
    /// The entry would be written through a symbolic link an earlier entry
    /// made.
    ThroughSymlink { link: String },
    /// A hard link to something that is not a file earlier in the archive.
    HardLinkOutside { target: String },
    /// A device, FIFO or socket.
    Special(&'static str),
    /// A sparse file (its stated size can be far beyond its bytes).
    Sparse,
    /// An entry type this reader does not take.
    Unsupported(u8),
    /// The name was already used by an earlier entry.
    Duplicate,
    /// A parent of the entry is a file an earlier entry made.
    ParentNotDirectory,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Absolute => f.write_str(
                "an absolute path; entries must be relative to the directory they are unpacked into",
            ),
            Problem::Traversal => f.write_str(
                "a path with a `..` component, which could reach outside the directory it is unpacked into",
            ),
            Problem::BadName(why) => write!(f, "an unusable name ({why})"),
            Problem::SymlinkEscapes { target } => write!(
                f,
                "a symbolic link to {target:?}, which escapes the archive's tree (absolute, or `..` past its top)"
            ),
            Problem::ThroughSymlink { link } => write!(
                f,
                "would be written through the symbolic link {link:?} an earlier entry made"
            ),
            Problem::HardLinkOutside { target } => write!(
                f,
                "a hard link to {target:?}, which is not a regular file earlier in the archive"
            ),
            Problem::Special(kind) => write!(f, "a {kind}; only files, directories and links are taken"),
            Problem::Sparse => f.write_str(
                "a sparse file; sparse entries are not taken (their stated size is not their bytes)",
            ),
            Problem::Unsupported(t) => write!(
                f,
                "an entry of type {:?}, which is not a file, directory or link",
                char::from(*t)
            ),
            Problem::Duplicate => f.write_str("the name appears twice in the archive"),
            Problem::ParentNotDirectory => {
                f.write_str("a parent of it is a file an earlier entry made")
            }
        }
    }
}

impl Error {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn entry(entry: &[u8], problem: Problem) -> Self {
        Error::Entry {
            entry: crate::name::shown(entry),
            problem,
        }
    }

    /// The refused entry's problem, if this is a refusal of one entry.
    pub fn problem(&self) -> Option<&Problem> {
        match self {
            Error::Entry { problem, .. } => Some(problem),
            _ => None,
        }
    }
}
