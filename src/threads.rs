//! The process's CPU threads, set before any thread starts: shared by the `harness-s` binary
//! and the `full_pipeline` example.

/// Set `RAYON_NUM_THREADS` (which rayon's pool and candle's read when they start) to what
/// `wanted` gives, unless the variable is set already. Call it first thing in `main`, before
/// the async runtime or any other thread starts.
pub fn set_unless_given(wanted: impl FnOnce() -> Option<usize>) {
    if std::env::var_os("RAYON_NUM_THREADS").is_some() {
        return;
    }
    if let Some(n) = wanted() {
        // SAFETY: no other thread exists yet (the caller's contract); the async runtime,
        // rayon's pool and candle's pool all start after this and read the variable then.
        #[allow(unsafe_code)]
        unsafe {
            std::env::set_var("RAYON_NUM_THREADS", n.to_string())
        };
    }
}
