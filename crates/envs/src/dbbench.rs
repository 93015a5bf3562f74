//! The `dbbench` environment.
