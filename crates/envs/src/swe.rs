//! The `swe` environment.
