//! What the umbrella crate's docs and the README claim, checked against the tree.

use std::collections::BTreeSet;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Package names of the library crates under `crates/`.
fn library_packages() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for entry in std::fs::read_dir(root().join("crates")).expect("crates/") {
        let dir = entry.expect("entry").path();
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        if !dir.join("src/lib.rs").exists() {
            continue;
        }
        let name = manifest
            .lines()
            .find_map(|l| l.trim().strip_prefix("name = "))
            .map(|n| n.trim_matches('"').to_string())
            .expect("package name");
        out.insert(name);
    }
    out
}

#[test]
fn the_umbrella_docs_say_what_it_re_exports() {
    let lib = read("src/lib.rs");
    let docs: String = lib
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    // `pub use harness_core as core;` -> ("harness-core", "core").
    let exported: Vec<(String, String)> = lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub use "))
        .filter_map(|l| {
            let (krate, alias) = l.trim_end_matches(';').split_once(" as ")?;
            Some((krate.replace('_', "-"), alias.to_string()))
        })
        .collect();
    for (krate, alias) in &exported {
        assert!(
            docs.contains(krate.as_str()) && docs.contains(&format!("[`{alias}`]")),
            "src/lib.rs re-exports `{krate}` as `{alias}` without saying so"
        );
    }
    let missing: Vec<String> = library_packages()
        .into_iter()
        .filter(|p| !exported.iter().any(|(k, _)| k == p))
        .collect();
    if docs.contains("re-exports the workspace") {
        assert!(
            missing.is_empty(),
            "src/lib.rs says it re-exports the workspace's crates but does not re-export {missing:?}"
        );
    }
}

#[test]
fn the_readme_ties_rescue_training_to_the_crate_that_runs_it() {
    let readme = read("README.md");
    let intro = readme.split("\n## ").next().expect("README opening");
    // The opening describes the rescue method; it must say which crate runs the rescue loop
    // rather than claim that every checkout does.
    assert!(
        intro.contains("rescue"),
        "the opening no longer describes rescue"
    );
    assert!(
        intro.contains("`harness-rollout`"),
        "README's opening describes rescue training without naming the crate that runs it"
    );
    // Where that crate is present, it is the one named.
    let rollout = root().join("crates/rollout/Cargo.toml");
    if let Ok(manifest) = std::fs::read_to_string(&rollout) {
        assert!(
            manifest.contains("name = \"harness-rollout\""),
            "{} is not the package `harness-rollout` the README names",
            rollout.display()
        );
    }
}
