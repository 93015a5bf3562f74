//! The pipeline's error type: configuration errors name the file and field; everything else
//! wraps the error of the crate it came from, with the stage it happened in.

use std::path::PathBuf;

/// What went wrong in a stage of the main job.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A run configuration that cannot be used.
    #[error("{file}: {}{message}", if field.is_empty() { String::new() } else { format!("field `{field}`: ") })]
    Config {
        /// The configuration file (or `<run config>`).
        file: PathBuf,
        /// The field, dotted (`train.group_size`); empty for the whole document.
        field: String,
        /// What was expected.
        message: String,
    },
    /// A stage's input is missing or unusable (a pool directory, a checkpoint, ...).
    #[error("{stage}: {path}: {message}")]
    Input {
        /// The stage that needed it.
        stage: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// What was expected.
        message: String,
    },
    /// A stage failed.
    #[error("{stage}: {source}")]
    Stage {
        /// The stage.
        stage: &'static str,
        /// What failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl Error {
    /// Wrap another crate's error as the failure of `stage`.
    pub fn stage(
        stage: &'static str,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Stage {
            stage,
            source: Box::new(source),
        }
    }

    /// A missing or unusable input of `stage`.
    pub fn input(
        stage: &'static str,
        path: impl Into<PathBuf>,
        message: impl Into<String>,
    ) -> Self {
        Error::Input {
            stage,
            path: path.into(),
            message: message.into(),
        }
    }
}

/// The pipeline's result type.
pub type Result<T> = std::result::Result<T, Error>;

/// Adds the stage to another crate's result.
pub(crate) trait StageExt<T> {
    /// Wrap the error as the failure of `stage`.
    fn at(self, stage: &'static str) -> Result<T>;
}

impl<T, E: std::error::Error + Send + Sync + 'static> StageExt<T> for std::result::Result<T, E> {
    fn at(self, stage: &'static str) -> Result<T> {
        self.map_err(|e| Error::stage(stage, e))
    }
}
