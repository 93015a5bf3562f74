//! The error type of harness-openai and its conversion into [`harness_core::Error`].

/// Result alias used across harness-openai.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong talking to (or serving) an OpenAI-compatible endpoint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration value is unusable (empty base URL, zero concurrency, ...).
    #[error("configuration `{field}`: {message}")]
    Config {
        /// The offending field, e.g. `retry.max_attempts`.
        field: String,
        /// What was found and what was expected.
        message: String,
    },
    /// A request failed for good: retries (if any were allowed) are exhausted or the failure is
    /// not retryable (a 4xx other than 429, an unparseable answer).
    #[error(
        "{method} {endpoint} failed after {attempts} attempt{plural}{status}: {message}",
        plural = if *attempts == 1 { "" } else { "s" },
        status = match status { Some(s) => format!(" (last status HTTP {s})"), None => String::new() }
    )]
    Request {
        /// The HTTP method.
        method: &'static str,
        /// The full URL.
        endpoint: String,
        /// The HTTP status of the last attempt, when one was received.
        status: Option<u16>,
        /// How many attempts were made.
        attempts: u32,
        /// What went wrong on the last attempt.
        message: String,
    },
    /// The endpoint answered with a body that does not follow the protocol (missing token ids,
    /// log-probs of the wrong length, ...).
    #[error("{endpoint}: unexpected response: {message}")]
    Protocol {
        /// The full URL.
        endpoint: String,
        /// What was wrong.
        message: String,
    },
    /// The server could not bind or serve.
    #[error("server: {0}")]
    Server(String),
    /// A harness-core component (prompt encoder, token generator, checkpoint writer) failed.
    #[error(transparent)]
    Core(#[from] harness_core::Error),
}

impl Error {
    /// A configuration error.
    pub fn config(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Config {
            field: field.into(),
            message: message.into(),
        }
    }

    /// This error as a [`harness_core::Error::Chat`] of the chat model `model`.
    pub fn into_chat(self, model: &str) -> harness_core::Error {
        match self {
            Error::Core(e) => e,
            other => harness_core::Error::Chat {
                model: model.to_string(),
                message: other.to_string(),
            },
        }
    }

    /// This error as a [`harness_core::Error::Policy`] of the policy `policy`.
    pub fn into_policy(self, policy: &str) -> harness_core::Error {
        match self {
            Error::Core(e) => e,
            other => harness_core::Error::Policy {
                policy: policy.to_string(),
                message: other.to_string(),
            },
        }
    }
}

/// Where the crates meet without more context, an endpoint failure is reported as a chat-model
/// failure named after the endpoint; [`crate::ChatClient`] and [`crate::RemotePolicy`] use
/// [`Error::into_chat`] and [`Error::into_policy`] to name themselves instead.
impl From<Error> for harness_core::Error {
    fn from(e: Error) -> Self {
        let model = match &e {
            Error::Request { endpoint, .. } | Error::Protocol { endpoint, .. } => endpoint.clone(),
            _ => "openai-compatible endpoint".to_string(),
        };
        e.into_chat(&model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_errors_name_endpoint_status_and_attempts() {
        let e = Error::Request {
            method: "POST",
            endpoint: "http://127.0.0.1:9/v1/chat/completions".into(),
            status: Some(503),
            attempts: 3,
            message: "service unavailable".into(),
        };
        let text = e.into_chat("gpt-x").to_string();
        assert!(text.contains("chat model `gpt-x`"), "{text}");
        assert!(
            text.contains("http://127.0.0.1:9/v1/chat/completions"),
            "{text}"
        );
        assert!(text.contains("3 attempts"), "{text}");
        assert!(text.contains("HTTP 503"), "{text}");
    }
}
