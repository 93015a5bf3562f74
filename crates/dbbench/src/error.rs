//! The error type of harness-dbbench.
//!
//! `Err` means infrastructure failed or user-supplied data is unusable (a task file that does not
//! parse, a database that cannot be created). Misbehaviour of the model inside an episode (bad SQL,
//! unknown tools, malformed arguments) is an error *observation*, never an `Err`.

use std::path::PathBuf;

/// Result alias of harness-dbbench.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in harness-dbbench.
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
    /// A data file has a malformed record.
    #[error("{}:{line}: field `{field}`: {message}", path.display())]
    Data {
        /// The file.
        path: PathBuf,
        /// The 1-based line number.
        line: usize,
        /// The JSON path of the offending field (empty for the whole record).
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
    /// The SQL engine failed as infrastructure (not an error the model's SQL caused).
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
}

impl From<Error> for harness_core::Error {
    fn from(error: Error) -> Self {
        match error {
            Error::Io { path, source } => harness_core::Error::Io { path, source },
            other => harness_core::Error::Environment {
                env: "dbbench".to_string(),
                message: other.to_string(),
            },
        }
    }
}
