//! Errors of harness-pool.

use std::path::PathBuf;

/// Everything that can go wrong with a pool.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A pool file is missing, malformed or inconsistent with the rest of the pool.
    #[error("{}: {message}", file.display())]
    Invalid {
        /// The file (or directory) at fault.
        file: PathBuf,
        /// What was found and what was expected.
        message: String,
    },
    /// A change to a frozen pool.
    #[error("the pool is frozen (the paper fixes the pool during training): {0}")]
    Frozen(String),
    /// A member that breaks the pool's rules (duplicate id, invalid harness).
    #[error("pool member: {0}")]
    Member(String),
    /// A harness-core error (harness parsing or validation, I/O).
    #[error(transparent)]
    Core(#[from] harness_core::Error),
}

/// Result with the pool's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl From<Error> for harness_core::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Core(e) => e,
            Error::Invalid { file, message } => harness_core::Error::Invalid {
                location: harness_core::Location::at("").in_file(file),
                message,
            },
            other => harness_core::Error::invalid("pool", other.to_string()),
        }
    }
}
