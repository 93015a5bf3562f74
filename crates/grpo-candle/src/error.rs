//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong in grpo-candle.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A tensor operation failed.
    #[error("tensor error: {0}")]
    Candle(#[from] candle_core::Error),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A configuration file is malformed or describes something unsupported.
    #[error("{path}: field `{field}`: {message}")]
    Config {
        /// The file (or a description of the source when there is no file).
        path: PathBuf,
        /// The offending field.
        field: String,
        /// What was expected.
        message: String,
    },
    /// A weight is missing from a checkpoint or has the wrong shape.
    #[error("{path}: weight `{name}`: {message}")]
    Weights {
        /// The checkpoint file or folder.
        path: PathBuf,
        /// The weight's name.
        name: String,
        /// What was expected.
        message: String,
    },
    /// The tokenizer failed to load, encode or decode.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The Hugging Face hub (or its local cache) could not provide a file.
    #[error("hub: {0}")]
    Hub(String),
    /// A request was invalid (bad sampling parameters, empty prompt, ...).
    #[error("invalid request: {0}")]
    Request(String),
    /// Rollouts the trainer cannot train on (e.g. sampled with settings its `pi_old` does not
    /// describe).
    #[error("{location}: {message}")]
    Rollout {
        /// Which group, trajectory, turn and field.
        location: String,
        /// What was found and what was expected.
        message: String,
    },
    /// Something else, with a description.
    #[error("{0}")]
    Msg(String),
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// A configuration error.
    pub fn config(
        path: impl Into<PathBuf>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Error::Config {
            path: path.into(),
            field: field.into(),
            message: message.into(),
        }
    }
}
