//! The crate's error type.

use std::path::PathBuf;

/// What can go wrong in a warm start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting is out of range.
    #[error("warm-start settings: `{field}`: {message}")]
    Settings {
        /// The field, as in the JSON form (`model.hidden_size`).
        field: String,
        /// What was expected.
        message: String,
    },
    /// A demonstration could not be scripted.
    #[error("demonstration: {0}")]
    Demo(String),
    /// Fitting or using the tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A file of the cache could not be read or written.
    #[error("{path}: {message}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// The model or the fine-tuning failed.
    #[error(transparent)]
    Model(#[from] grpo_candle::Error),
    /// An episode failed (infrastructure, not model behaviour).
    #[error(transparent)]
    Core(#[from] harness_core::Error),
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, e: impl std::fmt::Display) -> Self {
        Error::Io {
            path: path.into(),
            message: e.to_string(),
        }
    }

    pub(crate) fn setting(field: &str, message: impl Into<String>) -> Self {
        Error::Settings {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;
