//! The error type of harness-core and the crates that convert into it.
//!
//! `Err` means infrastructure failed (a file could not be read, a harness is invalid, a backend is
//! down). Misbehaviour of the model inside an episode is recorded in the trajectory instead.

use std::fmt;
use std::path::PathBuf;

/// Result alias used across harness-core.
pub type Result<T> = std::result::Result<T, Error>;

/// Where a problem in user-supplied data sits: an optional file and a JSON path inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The file the data came from, when it came from a file.
    pub file: Option<PathBuf>,
    /// A JSON path such as `hooks.low-budget.parameters.threshold` (empty for the document root).
    pub path: String,
}

impl Location {
    /// A location inside an in-memory document.
    pub fn at(path: impl Into<String>) -> Self {
        Self {
            file: None,
            path: path.into(),
        }
    }

    /// The same location, attributed to `file`.
    pub fn in_file(mut self, file: impl Into<PathBuf>) -> Self {
        self.file = Some(file.into());
        self
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{}: ", file.display())?;
        }
        if self.path.is_empty() {
            write!(f, "at the document root")
        } else {
            write!(f, "at `{}`", self.path)
        }
    }
}

/// Everything that can go wrong in harness-core.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A document did not parse (bad JSON, wrong type, unknown field).
    #[error("{location}: {message}")]
    Parse {
        /// Where the problem is.
        location: Location,
        /// What was found and what was expected.
        message: String,
    },
    /// A document parsed but is not valid (dangling slot, unknown tool, zero limit, ...).
    #[error("{location}: {message}")]
    Invalid {
        /// Where the problem is.
        location: Location,
        /// What was found and what was expected.
        message: String,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// An environment failed as infrastructure (not a tool error the model caused).
    #[error("environment `{env}`: {message}")]
    Environment {
        /// The environment's name.
        env: String,
        /// What failed.
        message: String,
    },
    /// A policy backend failed or broke its contract.
    #[error("policy `{policy}`: {message}")]
    Policy {
        /// The policy's name.
        policy: String,
        /// What failed.
        message: String,
    },
    /// A chat model (editor, profiler, voter) failed.
    #[error("chat model `{model}`: {message}")]
    Chat {
        /// The model's name.
        model: String,
        /// What failed.
        message: String,
    },
    /// A harness selector (router) failed.
    #[error("harness selector: {0}")]
    Selector(String),
    /// A learner (the policy update) failed.
    #[error("learner `{learner}`: {message}")]
    Learner {
        /// The learner's name.
        learner: String,
        /// What failed.
        message: String,
    },
    /// A calibrator (router re-anchoring) failed.
    #[error("calibrator `{calibrator}`: {message}")]
    Calibration {
        /// The calibrator's name.
        calibrator: String,
        /// What failed.
        message: String,
    },
}

impl Error {
    /// A validation error at `path` in an in-memory document.
    pub fn invalid(path: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Invalid {
            location: Location::at(path),
            message: message.into(),
        }
    }

    /// Attribute a parse or validation error to a file (other variants are returned unchanged).
    pub fn in_file(self, file: impl Into<PathBuf>) -> Self {
        match self {
            Error::Parse { location, message } => Error::Parse {
                location: location.in_file(file),
                message,
            },
            Error::Invalid { location, message } => Error::Invalid {
                location: location.in_file(file),
                message,
            },
            other => other,
        }
    }

    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
