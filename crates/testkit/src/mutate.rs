//! Hostile copies of valid files, and the check every loader must pass on them.
//!
//! A loader test writes a small valid file, then feeds the loader deterministic mutants of it
//! ([`truncations`], [`bit_flips`], [`number_swaps`], the depth bombs) through [`check`], which
//! asserts that loading never panics, that every failure is an `Err` naming the file, and that
//! the loading thread's live heap stays within a budget. A budget can only be enforced when the
//! test binary counts its allocations, so such a binary installs [`TrackingAlloc`]:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: harness_testkit::mutate::TrackingAlloc = harness_testkit::mutate::TrackingAlloc;
//! ```
//!
//! Everything is seeded or exhaustive, so a failure names a mutant that the next run rebuilds.
//! Set `HARNESS_MUTATE_TRACE=1` (with `--nocapture`) to print each mutant before it is loaded:
//! a loader that exhausts its budget aborts the process, and the last line names the culprit.

// The allocator below is the only unsafe code here: a `GlobalAlloc` must be an `unsafe impl`
// forwarding to the system allocator.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::fmt::Display;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

/// One hostile copy of a file and how it was made (shown when the loader fails on it).
#[derive(Debug, Clone)]
pub struct Mutant {
    /// What was changed (`cut at 17`, `bit 3 flipped at 120`, ...).
    pub what: String,
    /// The mutated content.
    pub bytes: Vec<u8>,
}

impl Mutant {
    /// A mutant from its description and content.
    pub fn new(what: impl Into<String>, bytes: impl Into<Vec<u8>>) -> Self {
        Mutant {
            what: what.into(),
            bytes: bytes.into(),
        }
    }
}

/// SplitMix64: a tiny seeded generator, so mutants are the same on every run and machine.
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Prefixes of `bytes`: every length below `dense` in steps of `step`, then `spread` lengths
/// spread evenly over the rest (the header of a format is where a cut matters most).
pub fn truncations(bytes: &[u8], dense: usize, step: usize, spread: usize) -> Vec<Mutant> {
    let dense = dense.min(bytes.len());
    let mut lens: Vec<usize> = (0..dense).step_by(step.max(1)).collect();
    let rest = bytes.len() - dense;
    if rest > 0 && spread > 0 {
        lens.extend((0..spread).map(|i| dense + rest * i / spread));
    }
    lens.dedup();
    lens.into_iter()
        .filter(|&len| len < bytes.len())
        .map(|len| Mutant::new(format!("cut at {len} of {}", bytes.len()), &bytes[..len]))
        .collect()
}

/// `count` copies of `bytes` with one bit flipped each, at seeded offsets: every other one
/// within the first `focus` bytes (the header), the rest anywhere.
pub fn bit_flips(bytes: &[u8], count: usize, seed: u64, focus: usize) -> Vec<Mutant> {
    if bytes.is_empty() {
        return Vec::new();
    }
    let mut rng = SplitMix::new(seed);
    (0..count)
        .map(|i| {
            let span = if i % 2 == 0 {
                focus.clamp(1, bytes.len())
            } else {
                bytes.len()
            };
            let at = rng.below(span);
            let bit = rng.below(8);
            let mut m = bytes.to_vec();
            m[at] ^= 1 << bit;
            Mutant::new(format!("bit {bit} flipped at {at}"), m)
        })
        .collect()
}

/// Numbers a hostile file puts where a count, a size, an offset or an id belongs.
pub const HOSTILE_NUMBERS: &[&str] = &[
    "0",
    "-1",
    "1.5",
    "4294967295",
    "4294967296",
    "1099511627776",
    "9223372036854775807",
    "18446744073709551615",
    "18446744073709551616",
    "1e308",
    "-9223372036854775808",
];

/// Copies of a text file with one of its decimal numbers replaced by each of
/// [`HOSTILE_NUMBERS`] (other than itself); at most `limit` numbers are chosen, spread evenly over the file.
pub fn number_swaps(bytes: &[u8], limit: usize) -> Vec<Mutant> {
    let mut spans = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() {
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            spans.push((start, i));
        } else {
            i += 1;
        }
    }
    let chosen: Vec<(usize, usize)> = if spans.len() <= limit {
        spans
    } else {
        (0..limit).map(|k| spans[k * spans.len() / limit]).collect()
    };
    let mut out = Vec::new();
    for (start, end) in chosen {
        for value in HOSTILE_NUMBERS {
            if value.as_bytes() == &bytes[start..end] {
                continue;
            }
            let mut m = bytes[..start].to_vec();
            m.extend_from_slice(value.as_bytes());
            m.extend_from_slice(&bytes[end..]);
            let was = String::from_utf8_lossy(&bytes[start..end]);
            out.push(Mutant::new(
                format!("number {was} at {start} -> {value}"),
                m,
            ));
        }
    }
    out
}

/// Deeper than any real configuration and deep enough to overflow a recursive parser's stack.
pub const BOMB_DEPTH: usize = 100_000;

/// JSON documents nested [`BOMB_DEPTH`] deep (arrays, objects, and both inside a valid-looking
/// object).
pub fn json_depth_bombs() -> Vec<Mutant> {
    let d = BOMB_DEPTH;
    let arrays = format!("{}{}", "[".repeat(d), "]".repeat(d));
    let objects = format!("{}1{}", "{\"a\":".repeat(d), "}".repeat(d));
    let inside = format!("{{\"name\": {arrays}}}");
    vec![
        Mutant::new(format!("arrays nested {d} deep"), arrays),
        Mutant::new(format!("objects nested {d} deep"), objects),
        Mutant::new(format!("a field holding arrays nested {d} deep"), inside),
        Mutant::new(format!("unclosed arrays {d} deep"), "[".repeat(d)),
    ]
}

/// TOML documents nested [`BOMB_DEPTH`] deep: dotted keys, table headers, inline tables and
/// arrays.
pub fn toml_depth_bombs() -> Vec<Mutant> {
    let d = BOMB_DEPTH;
    let dotted = vec!["a"; d].join(".");
    vec![
        Mutant::new(format!("a dotted key {d} deep"), format!("{dotted} = 1\n")),
        Mutant::new(
            format!("a table header {d} deep"),
            format!("[{dotted}]\nx = 1\n"),
        ),
        Mutant::new(
            format!("an array-of-tables header {d} deep"),
            format!("[[{dotted}]]\nx = 1\n"),
        ),
        Mutant::new(
            format!("inline tables nested {d} deep"),
            format!("x = {}1{}\n", "{a = ".repeat(d), "}".repeat(d)),
        ),
        Mutant::new(
            format!("arrays nested {d} deep"),
            format!("x = {}{}\n", "[".repeat(d), "]".repeat(d)),
        ),
    ]
}

/// The usual mix for a small text file (JSON or TOML): cuts (dense over the first 512 bytes),
/// bit flips, and hostile numbers. Sized so that a loader of a few-kilobyte file runs it in well
/// under a second in a debug build.
pub fn text_mutants(bytes: &[u8], seed: u64) -> Vec<Mutant> {
    let mut out = truncations(bytes, 512, 3, 40);
    out.extend(bit_flips(bytes, 200, seed, 512));
    out.extend(number_swaps(bytes, 12));
    out
}

/// A loader's result on one mutant, reduced to what [`check`] asserts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MutantOutcome {
    /// The mutant loaded (it was still valid).
    Loaded,
    /// The loader refused it with this message.
    Refused(String),
}

/// Load a mutant and assert the contract of issue 25 item 5: `load` does not panic, an `Err`
/// names `file` (its full path), and the thread's live heap grows by at most `budget` bytes
/// while it runs. Returns what happened, for tests that expect a particular refusal.
///
/// Panics (failing the test) with `what` when the contract is broken. A single allocation past
/// the budget is refused, which aborts the process: nothing a loader does should ever need it.
pub fn check<T, E: Display>(
    what: &str,
    file: &Path,
    budget: usize,
    load: impl FnOnce() -> Result<T, E>,
) -> MutantOutcome {
    assert!(
        TrackingAlloc::installed(),
        "install harness_testkit::mutate::TrackingAlloc as the test binary's #[global_allocator]"
    );
    // invariant-exception: test support; a debugging switch read only while tests run.
    if std::env::var_os("HARNESS_MUTATE_TRACE").is_some() {
        eprintln!("mutant: {what} ({})", file.display());
    }
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let previous = LIMIT.with(|l| l.replace(base.saturating_add(budget as isize)));
    let result = catch_unwind(AssertUnwindSafe(|| {
        load().map(|_| ()).map_err(|e| e.to_string())
    }));
    LIMIT.with(|l| l.set(previous));
    let grew = PEAK.with(Cell::get) - base;
    let outcome = match result {
        Ok(Ok(())) => MutantOutcome::Loaded,
        Ok(Err(message)) => {
            let shown = file.display().to_string();
            assert!(
                message.contains(&shown),
                "{what}: the error does not name {shown}: {message}"
            );
            MutantOutcome::Refused(message)
        }
        Err(panic) => {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            panic!("{what}: loading {} panicked: {why}", file.display());
        }
    };
    assert!(
        grew <= budget as isize,
        "{what}: loading {} grew the heap by {grew} bytes, over the budget of {budget}",
        file.display()
    );
    outcome
}

thread_local! {
    /// Bytes allocated and not yet freed by this thread (frees of other threads' blocks make
    /// it drift, which only matters between checks: each check measures from its own start).
    static LIVE: Cell<isize> = const { Cell::new(0) };
    /// The highest `LIVE` since the current check began.
    static PEAK: Cell<isize> = const { Cell::new(0) };
    /// `LIVE` may not pass this; allocations that would are refused.
    static LIMIT: Cell<isize> = const { Cell::new(isize::MAX) };
}

/// The system allocator, counting each thread's live bytes so that [`check`] can bound them.
#[derive(Debug, Clone, Copy, Default)]
pub struct TrackingAlloc;

impl TrackingAlloc {
    /// Whether the running binary allocates through a `TrackingAlloc`.
    pub fn installed() -> bool {
        let before = LIVE.with(Cell::get);
        let probe = std::hint::black_box(vec![0u8; 4096]);
        let after = LIVE.with(Cell::get);
        drop(probe);
        after - before >= 4096
    }

    /// Count `grow` more bytes on this thread; false when that would pass the limit.
    fn admit(grow: isize) -> bool {
        // A panic's message and backtrace (and the symbol tables a backtrace caches for the
        // rest of the process) are the test's report, not the loader's memory, even when the
        // loader catches the panic and goes on.
        if std::thread::panicking() {
            return true;
        }
        let live = LIVE.try_with(Cell::get).unwrap_or(0);
        let limit = LIMIT.try_with(Cell::get).unwrap_or(isize::MAX);
        let next = live.saturating_add(grow);
        if grow > 0 && next > limit {
            return false;
        }
        let _ = LIVE.try_with(|l| l.set(next));
        let _ = PEAK.try_with(|p| p.set(p.get().max(next)));
        true
    }

    fn release(size: usize) {
        let _ = LIVE.try_with(|l| l.set(l.get().saturating_sub(size as isize)));
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the counting
// touches only const-initialised thread-locals without destructors, which never allocate.
unsafe impl GlobalAlloc for TrackingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !Self::admit(layout.size() as isize) {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded as received.
        let p = unsafe { System.alloc(layout) };
        if p.is_null() {
            Self::release(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !Self::admit(layout.size() as isize) {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded as received.
        let p = unsafe { System.alloc_zeroed(layout) };
        if p.is_null() {
            Self::release(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        Self::release(layout.size());
        // SAFETY: forwarded as received.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let grow = new_size as isize - layout.size() as isize;
        if !Self::admit(grow) {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded as received.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if p.is_null() {
            let _ = LIVE.try_with(|l| l.set(l.get().saturating_sub(grow)));
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutants_are_deterministic_and_differ_from_the_original() {
        let text = br#"{"a": 12, "b": [1, 2, 3], "c": "x"}"#;
        let a = text_mutants(text, 7);
        let b = text_mutants(text, 7);
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.what, y.what);
            assert_eq!(x.bytes, y.bytes);
            assert_ne!(x.bytes, text.to_vec(), "{}", x.what);
        }
        let swaps = number_swaps(text, 2);
        assert_eq!(swaps.len(), 2 * HOSTILE_NUMBERS.len());
        assert!(
            swaps
                .iter()
                .any(|m| m.bytes == br#"{"a": 18446744073709551615, "b": [1, 2, 3], "c": "x"}"#)
        );
        let cuts = truncations(&[0u8; 100], 10, 2, 3);
        let lens: Vec<usize> = cuts.iter().map(|m| m.bytes.len()).collect();
        assert_eq!(lens, vec![0, 2, 4, 6, 8, 10, 40, 70]);
    }
}
