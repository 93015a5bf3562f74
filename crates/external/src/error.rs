//! The error type of harness-external and its conversion into [`harness_core::Error`].

/// Result alias used across harness-external.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong serving an environment, talking to one, or proxying a policy.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration value is unusable.
    #[error("configuration `{field}`: {message}")]
    Config {
        /// The offending field, e.g. `idle_timeout`.
        field: String,
        /// What was found and what was expected.
        message: String,
    },
    /// An HTTP request failed (no answer, or an error status).
    #[error("{method} {url} failed{status}: {message}", status = match status { Some(s) => format!(" (HTTP {s})"), None => String::new() })]
    Request {
        /// The HTTP method.
        method: &'static str,
        /// The full URL.
        url: String,
        /// The HTTP status, when one was received.
        status: Option<u16>,
        /// The server's error message, or the transport's.
        message: String,
    },
    /// A server answered with a body that does not follow the protocol.
    #[error("{url}: unexpected response: {message}")]
    Protocol {
        /// The full URL.
        url: String,
        /// What was wrong.
        message: String,
    },
    /// A server could not bind or serve.
    #[error("server: {0}")]
    Server(String),
    /// A harness-core component (the environment, the policy) failed.
    #[error(transparent)]
    Core(#[from] harness_core::Error),
}

impl Error {
    pub(crate) fn config(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Config {
            field: field.into(),
            message: message.into(),
        }
    }

    /// The error as a harness-core environment error of `env`.
    pub fn into_env_error(self, env: &str) -> harness_core::Error {
        match self {
            Error::Core(e) => e,
            other => harness_core::Error::Environment {
                env: env.to_string(),
                message: other.to_string(),
            },
        }
    }
}
