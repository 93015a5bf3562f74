//! The crate's one error type: every variant a user can cause names the file, the line where
//! there is one, and what was expected.

use std::path::{Path, PathBuf};

/// What went wrong while reading a run directory or writing its report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file or folder could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A line of a JSONL file (or a whole JSON file, line 1 onwards) does not have the expected
    /// shape.
    #[error("{}:{line}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The 1-based line (for a whole-file JSON document, the line serde stopped at).
        line: usize,
        /// What was found and what was expected (with the JSON field path at fault).
        message: String,
    },
    /// The directory does not have the layout of a run (or two lines contradict each other).
    #[error("{}: {message}", path.display())]
    Layout {
        /// The folder or file at fault.
        path: PathBuf,
        /// What was found and what was expected.
        message: String,
    },
    /// A plot could not be drawn or written.
    #[error("plot {}: {message}", path.display())]
    Plot {
        /// The SVG file.
        path: PathBuf,
        /// What failed.
        message: String,
    },
}

impl Error {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn parse(path: &Path, line: usize, message: impl Into<String>) -> Self {
        Error::Parse {
            path: path.to_path_buf(),
            line,
            message: message.into(),
        }
    }

    pub(crate) fn layout(path: &Path, message: impl Into<String>) -> Self {
        Error::Layout {
            path: path.to_path_buf(),
            message: message.into(),
        }
    }

    pub(crate) fn plot(path: &Path, message: impl std::fmt::Display) -> Self {
        Error::Plot {
            path: path.to_path_buf(),
            message: message.to_string(),
        }
    }
}

/// Result with the report [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
