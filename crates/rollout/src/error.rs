//! The error type of harness-rollout and its conversion into [`harness_core::Error`].

use std::path::PathBuf;

use harness_core::HarnessId;

/// Everything that can go wrong in a rescue-training run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration value is out of range or inconsistent with the pool.
    #[error("rescue config{}: `{field}`: {message}", file.as_ref().map(|f| format!(" {}", f.display())).unwrap_or_default())]
    Config {
        /// The config file, when the config came from one.
        file: Option<PathBuf>,
        /// The JSON path of the field (`strategy.allocation.m`).
        field: String,
        /// What was found and what was expected.
        message: String,
    },
    /// A harness selector broke its contract (fewer than asked, H0, duplicates, unknown ids).
    #[error(
        "harness selector `{selector}` returned {returned:?} for task `{task}` (asked for {asked} distinct auxiliary harnesses of the pool in rescue mode): {problem}"
    )]
    Selector {
        /// The selector's name.
        selector: String,
        /// The task it was asked about.
        task: String,
        /// How many harnesses were asked for.
        asked: usize,
        /// What it returned, in its order.
        returned: Vec<HarnessId>,
        /// What is wrong with it.
        problem: String,
    },
    /// A task names an environment the run was not given.
    #[error("task `{task}` names environment `{env}`, but the run has only {available:?}")]
    UnknownEnvironment {
        /// The task's id.
        task: String,
        /// The environment it names.
        env: String,
        /// The environments given.
        available: Vec<String>,
    },
    /// The run directory or one of its files is not in the state the run expects.
    #[error("{}: {message}", path.display())]
    RunDir {
        /// The file or directory at fault.
        path: PathBuf,
        /// What was found and what was expected.
        message: String,
    },
    /// New weights could not be brought to the rollout engine.
    #[error(
        "weight sync `{sync}` failed for policy version {version} after {attempts} attempts; the run stops rather than sample from stale weights: {message}"
    )]
    Sync {
        /// The weight sync's name.
        sync: String,
        /// The policy version that was to be served.
        version: u64,
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        message: String,
    },
    /// The acting policy samples from another version of the weights than the learner's.
    #[error(
        "policy `{policy}` samples from weights version {found}, the learner is at version {expected}: a weight sync was lost or failed; the run stops rather than sample from stale weights"
    )]
    StaleWeights {
        /// The acting policy.
        policy: String,
        /// The learner's version.
        expected: u64,
        /// The version the policy reports.
        found: u64,
    },
    /// A pool error.
    #[error(transparent)]
    Pool(#[from] harness_pool::Error),
    /// A harness-core error (episodes, learner, calibrator, I/O).
    #[error(transparent)]
    Core(#[from] harness_core::Error),
}

/// Result with the rollout [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// A configuration error at `field`.
    pub fn config(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Config {
            file: None,
            field: field.into(),
            message: message.into(),
        }
    }

    /// A run-directory error on `path`.
    pub fn run_dir(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Error::RunDir {
            path: path.into(),
            message: message.into(),
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Core(harness_core::Error::io(path, source))
    }
}

impl From<Error> for harness_core::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Core(e) => e,
            Error::Pool(e) => e.into(),
            Error::Config {
                file,
                field,
                message,
            } => {
                let location = harness_core::Location::at(field);
                harness_core::Error::Invalid {
                    location: match file {
                        Some(f) => location.in_file(f),
                        None => location,
                    },
                    message,
                }
            }
            Error::RunDir { path, message } => harness_core::Error::Invalid {
                location: harness_core::Location::at("").in_file(path),
                message,
            },
            e @ Error::Selector { .. } => harness_core::Error::Selector(e.to_string()),
            e @ Error::UnknownEnvironment { .. } => harness_core::Error::Environment {
                env: match &e {
                    Error::UnknownEnvironment { env, .. } => env.clone(),
                    _ => unreachable!(),
                },
                message: e.to_string(),
            },
            e @ Error::StaleWeights { .. } => harness_core::Error::Policy {
                policy: match &e {
                    Error::StaleWeights { policy, .. } => policy.clone(),
                    _ => unreachable!(),
                },
                message: e.to_string(),
            },
            Error::Sync {
                sync,
                version,
                attempts,
                message,
            } => harness_core::Error::Policy {
                policy: sync,
                message: format!(
                    "weight sync for version {version} failed after {attempts} attempts: {message}"
                ),
            },
        }
    }
}
