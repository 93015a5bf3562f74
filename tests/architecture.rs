//! Architecture invariants of docs/ARCHITECTURE.md, checked the way rust-analyzer's tidy tests
//! check theirs: from `cargo metadata` and from the source tree.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Package name -> names of its normal (non-dev, non-build) dependencies, for every package
/// in the resolved graph.
fn normal_dependency_graph() -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // Only the host's packages are needed (and downloaded); the others' manifests are not.
    let rustc = Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("rustc runs");
    let host = String::from_utf8_lossy(&rustc.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .expect("rustc reports its host");
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--filter-platform",
            &host,
        ])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).expect("metadata is JSON");
    let names: BTreeMap<&str, &str> = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| {
            (
                p["id"].as_str().expect("id"),
                p["name"].as_str().expect("name"),
            )
        })
        .collect();
    let mut graph = BTreeMap::new();
    for node in metadata["resolve"]["nodes"].as_array().expect("resolve") {
        let name = names[node["id"].as_str().expect("id")].to_string();
        let deps: BTreeSet<String> = node["deps"]
            .as_array()
            .expect("deps")
            .iter()
            .filter(|d| {
                d["dep_kinds"]
                    .as_array()
                    .is_some_and(|kinds| kinds.iter().any(|k| k["kind"].is_null()))
            })
            .map(|d| names[d["pkg"].as_str().expect("pkg")].to_string())
            .collect();
        graph.entry(name).or_insert_with(BTreeSet::new).extend(deps);
    }
    graph
}

fn closure(graph: &BTreeMap<String, BTreeSet<String>>, start: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![start.to_string()];
    while let Some(name) = stack.pop() {
        for dep in graph.get(&name).into_iter().flatten() {
            if seen.insert(dep.clone()) {
                stack.push(dep.clone());
            }
        }
    }
    seen
}

fn assert_free_of(
    graph: &BTreeMap<String, BTreeSet<String>>,
    package: &str,
    forbidden: &[&str],
    why: &str,
) {
    if !graph.contains_key(package) {
        return; // The crate has not landed in this workspace.
    }
    let deps = closure(graph, package);
    let bad: Vec<&String> = deps
        .iter()
        .filter(|d| {
            forbidden
                .iter()
                .any(|f| *d == f || d.starts_with(&format!("{f}-")))
        })
        .collect();
    assert!(
        bad.is_empty(),
        "{package} must not depend on {bad:?}: {why}"
    );
}

const ML: &[&str] = &[
    "candle",
    "candle-core",
    "candle-nn",
    "tokenizers",
    "hf-hub",
    "safetensors",
    "tch",
    "ort",
];
const HTTP: &[&str] = &["reqwest", "hyper", "axum", "ureq", "h2"];
const RUNTIMES: &[&str] = &["tokio", "async-std", "smol"];

#[test]
fn harness_core_depends_on_no_ml_http_or_runtime_crate() {
    let graph = normal_dependency_graph();
    assert!(graph.contains_key("harness-core"));
    let forbidden: Vec<&str> = ML.iter().chain(HTTP).chain(RUNTIMES).copied().collect();
    assert_free_of(
        &graph,
        "harness-core",
        &forbidden,
        "the core is plain data and the loop",
    );
}

#[test]
fn envs_never_call_a_model() {
    let graph = normal_dependency_graph();
    let forbidden: Vec<&str> = ML
        .iter()
        .chain(HTTP)
        .copied()
        .chain(["grpo-candle", "harness-openai"])
        .collect();
    assert_free_of(
        &graph,
        "harness-envs",
        &forbidden,
        "environments never call a model",
    );
}

/// The worlds, each a crate of its own.
const WORLDS: &[&str] = &[
    "harness-dbbench",
    "harness-appworld",
    "harness-swe",
    "harness-tau-retail",
];

#[test]
fn each_world_builds_alone() {
    // A user who wants one world compiles that world: no world depends on another, and only
    // the repository-repair world, which runs the policy's code, pulls in the sandbox.
    let graph = normal_dependency_graph();
    for world in WORLDS {
        assert!(graph.contains_key(*world), "{world} is a workspace crate");
        let mut forbidden: Vec<&str> = WORLDS.iter().copied().filter(|w| w != world).collect();
        forbidden.push("harness-envs");
        if *world != "harness-swe" {
            forbidden.push("harness-sandbox");
        }
        assert_free_of(&graph, world, &forbidden, "each world builds alone");
    }
    assert!(
        graph["harness-swe"].contains("harness-sandbox"),
        "the repository-repair world runs the policy's code in harness-sandbox"
    );
}

#[test]
fn grpo_candle_knows_nothing_about_environments() {
    let graph = normal_dependency_graph();
    let forbidden: Vec<&str> = WORLDS.iter().copied().chain(["harness-envs"]).collect();
    assert_free_of(
        &graph,
        "grpo-candle",
        &forbidden,
        "the trainer consumes groups, not environments",
    );
}

#[test]
fn the_pool_is_plain_data() {
    let graph = normal_dependency_graph();
    let forbidden: Vec<&str> = ML.iter().chain(HTTP).chain(RUNTIMES).copied().collect();
    assert_free_of(
        &graph,
        "harness-pool",
        &forbidden,
        "a pool is harnesses on disk; every crate that trains or routes reads it",
    );
}

#[test]
fn rollout_sees_the_router_and_evolution_only_through_traits() {
    let graph = normal_dependency_graph();
    assert_free_of(
        &graph,
        "harness-rollout",
        &["harness-router", "harness-evolve"],
        "the rescue loop meets the router through HarnessSelector and Calibrate",
    );
}

#[test]
fn router_and_evolution_reach_models_only_through_the_core_traits() {
    let graph = normal_dependency_graph();
    let forbidden: Vec<&str> = ML
        .iter()
        .chain(HTTP)
        .copied()
        .chain(["grpo-candle", "harness-openai"])
        .collect();
    for package in ["harness-router", "harness-evolve"] {
        assert_free_of(
            &graph,
            package,
            &forbidden,
            "LLM roles are ChatModel trait objects and the policy is a Policy trait object",
        );
    }
}

#[test]
fn the_report_is_made_from_files() {
    let graph = normal_dependency_graph();
    let forbidden: Vec<&str> = ML
        .iter()
        .chain(HTTP)
        .copied()
        .chain([
            "grpo-candle",
            "harness-openai",
            "harness-warmstart",
            "harness-pipeline",
        ])
        .collect();
    assert_free_of(
        &graph,
        "harness-report",
        &forbidden,
        "the report reads run files with the producing crates' serde types and runs nothing",
    );
}

#[test]
fn the_tinker_learner_is_a_protocol_client() {
    let graph = normal_dependency_graph();
    let forbidden: Vec<&str> = ML
        .iter()
        .copied()
        .chain(["grpo-candle", "harness-router", "harness-evolve"])
        .collect();
    assert_free_of(
        &graph,
        "harness-tinker",
        &forbidden,
        "the update runs on the Tinker server; the learner sends per-token weights",
    );
}

#[test]
fn external_harnesses_meet_the_policy_and_environments_only_through_the_core_traits() {
    let graph = normal_dependency_graph();
    assert!(graph.contains_key("harness-external"));
    let forbidden: Vec<&str> = ML
        .iter()
        .copied()
        .chain([
            "grpo-candle",
            "harness-rollout",
            "harness-router",
            "harness-evolve",
            "harness-pipeline",
        ])
        .collect();
    // harness-openai's optional `candle` adapters are switched on for the whole workspace by
    // the crates that serve a candle checkpoint (cargo unifies features), so the graph is
    // checked without it: harness-external's own dependencies, and theirs.
    let mut pruned = graph.clone();
    pruned
        .get_mut("harness-external")
        .expect("listed")
        .remove("harness-openai");
    assert_free_of(
        &pruned,
        "harness-external",
        &forbidden,
        "the environment server and the recording proxy serve any `Environment` and any `Policy`",
    );
    // Agent programs run in harness-sandbox; no environment crate is a dependency.
    assert_free_of(
        &pruned,
        "harness-external",
        &["harness-envs"],
        "agent programs run in harness-sandbox; the environment server serves any `Environment`",
    );
    assert!(
        graph["harness-external"].contains("harness-sandbox"),
        "agent programs run in harness-sandbox"
    );
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Library sources of every crate (not their tests, examples, benches or binaries: the root
/// package's `src/main.rs` is the `harness-s` binary, and the modules only it declares, such
/// as `src/cli.rs`, its command line, are the binary's too).
fn library_sources() -> Vec<PathBuf> {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let main = std::fs::read_to_string(root().join("src/main.rs")).expect("src/main.rs");
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).expect("src/lib.rs");
    let mut binary = vec![root().join("src/main.rs")];
    for line in main.lines() {
        if let Some(name) = line
            .trim()
            .strip_prefix("mod ")
            .and_then(|rest| rest.strip_suffix(';'))
        {
            assert!(
                !lib.contains(&format!("mod {name};")),
                "src/{name}.rs is the binary's; the library must not declare it"
            );
            binary.push(root().join(format!("src/{name}.rs")));
        }
    }
    assert!(
        binary.contains(&root().join("src/cli.rs")),
        "src/main.rs declares its command line, `mod cli;`"
    );
    files.retain(|f| !binary.contains(f) && !f.starts_with(root().join("src/bin")));
    for entry in std::fs::read_dir(root().join("crates"))
        .expect("crates")
        .flatten()
    {
        rust_files(&entry.path().join("src"), &mut files);
    }
    files
}

#[test]
fn only_binaries_read_flags_and_environment_variables() {
    let patterns = [
        "env::var(",
        "env::var_os(",
        "env::vars(",
        "env::args(",
        "env::args_os(",
        "clap::",
    ];
    let mut offenders = Vec::new();
    for file in library_sources() {
        let text = std::fs::read_to_string(&file).expect("readable");
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            // A line may opt out with a stated reason, on it or on the line above:
            // `// invariant-exception: <why>`.
            let marked = |l: &str| l.contains("// invariant-exception:");
            if marked(line) || (i > 0 && marked(lines[i - 1])) {
                continue;
            }
            let code = line.split("//").next().unwrap_or("");
            if patterns.iter().any(|p| code.contains(p)) {
                offenders.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "libraries take configuration as values; read it in binaries:\n{}",
        offenders.join("\n")
    );
}

#[test]
fn every_library_crate_opens_with_a_crate_doc() {
    let mut libs = vec![root().join("src/lib.rs")];
    for entry in std::fs::read_dir(root().join("crates"))
        .expect("crates")
        .flatten()
    {
        libs.push(entry.path().join("src/lib.rs"));
    }
    for lib in libs.into_iter().filter(|l| l.exists()) {
        let text = std::fs::read_to_string(&lib).expect("readable");
        assert!(
            text.trim_start().starts_with("//!"),
            "{} must open with a `//!` crate doc",
            lib.display()
        );
    }
}

/// grpo-candle's layers, bottom first; `error.rs` sits under all of them.
const GRPO_CANDLE_LAYERS: &[&str] = &["ops", "model", "sample", "train"];

#[test]
fn grpo_candle_layers_import_downwards_only() {
    let src = root().join("crates/grpo-candle/src");
    if !src.exists() {
        return; // The crate has not landed in this workspace.
    }
    let mut offenders = Vec::new();
    // Every module is in a layer: at the top there are only the crate root and the error type.
    for entry in std::fs::read_dir(&src).expect("grpo-candle/src").flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let layered = path.is_dir() && GRPO_CANDLE_LAYERS.contains(&name.as_str());
        if !layered && name != "lib.rs" && name != "error.rs" {
            offenders.push(format!("{}: not in a layer", path.display()));
        }
    }
    // A layer names (outside comments) only `crate::error`, itself and the layers below it.
    // `error.rs` is in no layer: it may name none.
    let mut files: Vec<(Option<usize>, PathBuf)> = vec![(None, src.join("error.rs"))];
    for (i, layer) in GRPO_CANDLE_LAYERS.iter().enumerate() {
        let mut in_layer = Vec::new();
        rust_files(&src.join(layer), &mut in_layer);
        assert!(
            !in_layer.is_empty(),
            "grpo-candle/src/{layer} holds no sources"
        );
        files.extend(in_layer.into_iter().map(|f| (Some(i), f)));
    }
    for (own, file) in files {
        let text = std::fs::read_to_string(&file).expect("readable");
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            let at = |what: &str| format!("{}:{}: {what}: {}", file.display(), i + 1, line.trim());
            if code.contains("super::super") {
                offenders.push(at("reaches out of its layer with super::super"));
            }
            for (start, _) in code.match_indices("crate::") {
                let rest = &code[start + "crate::".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if name == "error" {
                    continue;
                }
                match GRPO_CANDLE_LAYERS.iter().position(|l| *l == name) {
                    Some(l) if own.is_some_and(|o| l <= o) => {}
                    Some(_) => offenders.push(at("names a higher layer")),
                    None => offenders.push(at(
                        "names no layer (inside the crate, paths start at a layer: crate::ops::...)",
                    )),
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "grpo-candle's layers (error < ops < model < sample < train) import downwards only:\n{}",
        offenders.join("\n")
    );
}
