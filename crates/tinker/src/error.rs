//! Errors of the Tinker client and learner.

use std::time::Duration;

/// Everything that can go wrong talking to a Tinker server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting is out of range; names the field and what was expected.
    #[error("tinker config `{field}`: {message}")]
    Config {
        /// The field.
        field: String,
        /// What was wrong and what was expected.
        message: String,
    },
    /// The server answered with an error status, or kept failing until the retries ran out.
    #[error("tinker {endpoint}: {message} (HTTP {status}, after {attempts} attempt(s))", status = status.map_or("none".to_string(), |s| s.to_string()))]
    Http {
        /// The endpoint, e.g. `forward_backward`.
        endpoint: String,
        /// The last HTTP status, if any answer came.
        status: Option<u16>,
        /// Attempts made.
        attempts: u32,
        /// The server's detail or the transport error.
        message: String,
    },
    /// A request that changes the server's state was sent, but its answer was lost (dropped
    /// connection or timeout). It is not retried, so that no gradient or optimizer step is
    /// applied twice; whether the server applied it is unknown.
    #[error(
        "tinker {endpoint}: the request was sent but its answer was lost ({message}); it is not retried because the server may already have applied it (resume from the last checkpoint)"
    )]
    Ambiguous {
        /// The endpoint.
        endpoint: String,
        /// The transport error.
        message: String,
    },
    /// An answer did not have the expected shape.
    #[error("tinker {endpoint}: unexpected answer: {message}")]
    Decode {
        /// The endpoint.
        endpoint: String,
        /// What did not parse, with an excerpt of the body.
        message: String,
    },
    /// The server reported that the operation behind a future failed.
    #[error("tinker {operation} (future {request_id}) failed on the server: {message}")]
    FutureFailed {
        /// The operation, e.g. `optim_step`.
        operation: String,
        /// The future's id.
        request_id: String,
        /// The server's message.
        message: String,
    },
    /// A future did not complete in time.
    #[error("tinker {operation} (future {request_id}) did not complete within {waited:?}")]
    FutureTimeout {
        /// The operation.
        operation: String,
        /// The future's id.
        request_id: String,
        /// How long it was polled.
        waited: Duration,
    },
    /// The server's answer contradicts the request (e.g. the wrong number of log-probs).
    #[error("tinker protocol: {0}")]
    Protocol(String),
    /// The learner was given data it cannot train on.
    #[error("tinker learner: {0}")]
    Data(String),
    /// A local file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

impl Error {
    pub(crate) fn config(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Config {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;
