//! Shared by the smoke tests of the root package's examples: build an example with cargo in
//! this test's profile and read the JSONL files a run writes.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The cargo profile this test was built with, from its own path (`<target>/<dir>/deps/<exe>`).
fn profile_args() -> Vec<String> {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .and_then(Path::file_name)
        .and_then(|d| d.to_str())
        .unwrap_or("debug")
        .to_string();
    match dir.as_str() {
        "debug" => vec![],
        "release" => vec!["--release".into()],
        other => vec!["--profile".into(), other.into()],
    }
}

/// Builds the example `name` (a no-op when `cargo test --workspace` already built it:
/// `--workspace` resolves features as that command does, so no dependency is rebuilt with other
/// features) and returns its path, as cargo reports it.
pub fn example_binary(name: &str) -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args([
            "build",
            "--offline",
            "--workspace",
            "--example",
            name,
            "--message-format",
            "json",
        ])
        .args(profile_args())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "building the example {name} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == name)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .unwrap_or_else(|| panic!("cargo reports the executable of {name}"))
}

/// A fresh, empty folder `name` under cargo's scratch directory for integration tests.
pub fn fresh_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).expect("clear the previous run");
    }
    std::fs::create_dir_all(&dir).expect("output folder");
    dir
}

/// Every line of a JSONL file.
pub fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON value per line"))
        .collect()
}
