//! The error type of harness-evolve.

use std::path::PathBuf;

/// Everything that can go wrong while evolving harnesses. Model misbehaviour inside an episode
/// and unusable LLM answers are data (recorded in the round report), never `Err`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting is out of range; names the field and what was expected.
    #[error("evolution settings: `{field}`: {message}")]
    Settings {
        /// The settings field at fault (e.g. `proposal_budgets[1]`).
        field: String,
        /// What was found and what was expected.
        message: String,
    },
    /// Input data (a parent-selection instance, a report file) is malformed.
    #[error("{}{field}: {message}", file.as_ref().map(|f| format!("{}: ", f.display())).unwrap_or_default())]
    Input {
        /// The file the data came from, if any.
        file: Option<PathBuf>,
        /// The JSON path at fault.
        field: String,
        /// What was found and what was expected.
        message: String,
    },
    /// The evolution cannot go on (no training tasks, the base harness fails validation, ...).
    #[error("evolution: {0}")]
    Run(String),
    /// A plot could not be drawn or written.
    #[error("plot `{}`: {message}", file.display())]
    Plot {
        /// The SVG file.
        file: PathBuf,
        /// What failed.
        message: String,
    },
    /// A pool error (adding a member, saving).
    #[error(transparent)]
    Pool(#[from] harness_pool::Error),
    /// A harness-core error (an environment or policy backend failed, I/O).
    #[error(transparent)]
    Core(#[from] harness_core::Error),
}

/// Result with the evolution [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// A settings error at `field`.
    pub fn settings(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Settings {
            field: field.into(),
            message: message.into(),
        }
    }

    /// An input error at `field` of an in-memory document.
    pub fn input(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Input {
            file: None,
            field: field.into(),
            message: message.into(),
        }
    }
}

impl From<Error> for harness_core::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Core(e) => e,
            Error::Pool(e) => e.into(),
            Error::Settings { field, message } => {
                harness_core::Error::invalid(format!("evolution.{field}"), message)
            }
            Error::Input {
                file,
                field,
                message,
            } => {
                let mut location = harness_core::Location::at(field);
                if let Some(file) = file {
                    location = location.in_file(file);
                }
                harness_core::Error::Invalid { location, message }
            }
            Error::Plot { file, message } => harness_core::Error::Io {
                path: file,
                source: std::io::Error::other(message),
            },
            Error::Run(message) => harness_core::Error::invalid("evolution", message),
        }
    }
}
