//! The `appworld` environment.
