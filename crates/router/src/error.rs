//! Errors of harness-router.

use std::path::PathBuf;

/// Everything that can go wrong in the router.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A test task was offered to the router's evidence (calibration or the similarity index);
    /// the paper reserves test tasks for final evaluation.
    #[error(
        "task `{task}` is a test task; test tasks never feed the router ({context}); expected a validation (or training) task"
    )]
    TestTask {
        /// The task's id.
        task: String,
        /// Where it was offered.
        context: String,
    },
    /// A calibration file is malformed or inconsistent.
    #[error("{}: at `{field}`: {message}", file.display())]
    Calibration {
        /// The file at fault (empty for in-memory data).
        file: PathBuf,
        /// The JSON path inside it.
        field: String,
        /// What was found and what was expected.
        message: String,
    },
    /// A setting is out of range.
    #[error("router setting `{field}`: {message}")]
    Setting {
        /// The setting's name.
        field: String,
        /// What was found and what was expected.
        message: String,
    },
    /// Routing was asked for before any calibration.
    #[error("the router has no calibration yet; run the calibrator (Calibrate::calibrate) first")]
    NotCalibrated,
    /// A task's environment is not among those the calibrator was given.
    #[error(
        "task `{task}` runs in environment `{env}`, which the calibrator was not given; expected one of: {known}"
    )]
    UnknownEnvironment {
        /// The task's id.
        task: String,
        /// Its environment.
        env: String,
        /// The environments available.
        known: String,
    },
    /// A selection request the router cannot satisfy (k = 0, an empty pool, ...).
    #[error("selection: {0}")]
    Selection(String),
    /// A pool error.
    #[error(transparent)]
    Pool(#[from] harness_pool::Error),
    /// A harness-core error (episodes, chat models, I/O).
    #[error(transparent)]
    Core(#[from] harness_core::Error),
}

/// Result with the router's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// A calibration problem at `field` of in-memory data.
    pub fn calibration(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Calibration {
            file: PathBuf::new(),
            field: field.into(),
            message: message.into(),
        }
    }

    /// Attribute a calibration problem to `file`.
    pub fn in_file(self, path: impl Into<PathBuf>) -> Self {
        match self {
            Error::Calibration { field, message, .. } => Error::Calibration {
                file: path.into(),
                field,
                message,
            },
            other => other,
        }
    }

    /// A bad setting.
    pub fn setting(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Setting {
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
            Error::Calibration {
                file,
                field,
                message,
            } => {
                let location = harness_core::Location::at(field);
                harness_core::Error::Invalid {
                    location: if file.as_os_str().is_empty() {
                        location
                    } else {
                        location.in_file(file)
                    },
                    message,
                }
            }
            Error::Setting { field, message } => harness_core::Error::invalid(field, message),
            other => harness_core::Error::Selector(other.to_string()),
        }
    }
}
