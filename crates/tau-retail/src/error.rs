//! The error type of harness-tau-retail.
//!
//! `Err` means infrastructure failed or user-supplied data is unusable (a task file or a database
//! that does not parse). Misbehaviour of the model inside an episode (unknown tools, malformed
//! arguments, a write the policy forbids) is an error *observation*, never an `Err`.

use std::path::PathBuf;

/// Result alias of harness-tau-retail.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in harness-tau-retail.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A JSON data file (a database, a task list, a split file) does not have the expected
    /// shape.
    #[error("{}: field `{field}`: {message}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// The JSON path of the offending field (empty for the whole file).
        field: String,
        /// What was found and what was expected.
        message: String,
    },
    /// A task's metadata does not describe a task of this environment.
    #[error("task `{task}`: field `metadata.{field}`: {message}")]
    Task {
        /// The task id.
        task: String,
        /// The offending metadata field.
        field: String,
        /// What was found and what was expected.
        message: String,
    },
}

impl From<Error> for harness_core::Error {
    fn from(error: Error) -> Self {
        match error {
            Error::Io { path, source } => harness_core::Error::Io { path, source },
            other => harness_core::Error::Environment {
                env: "tau_retail".to_string(),
                message: other.to_string(),
            },
        }
    }
}
