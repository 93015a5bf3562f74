//! Every shell command the README, `docs/` and the crates' READMEs show in a `sh` or `bash`
//! block (or after a `$ ` prompt in a `text` block) runs as written, as far as it can be
//! checked without running the job:
//!
//! - `cargo run|build|test`: the package exists, its features exist, the example or test
//!   exists in it and every feature the example requires is turned on, and each `--flag` after
//!   `--` is one the example's command line declares;
//! - `harness-s ...`, `target/release/harness-s ...` and `cargo run -- ...`: the binary's own
//!   command line parses the arguments, and for the subcommands that read a run configuration
//!   the configuration resolves (files, `--preset`, flags and every `--set`) and validates;
//! - a script or a repository file named in the command exists;
//! - two commands of one block that share a run folder agree on its learner (a run folder
//!   refuses a second learner).
//!
//! The cheap ones run: every documented `harness-s` command that prints help, a version or
//! `--explain`'s list runs and prints something, and where a document shows what such a
//! command prints ("`harness-s ...` prints:" and a `text` block), it prints exactly that.
//!
//! Commands of other programs (python, pip, vllm, echo) are left to their own documentation.

#[allow(dead_code)]
#[path = "../src/cli.rs"]
mod cli;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::Parser;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One command as a block shows it (continuation lines joined, comments cut).
#[derive(Debug, Clone)]
struct Documented {
    file: PathBuf,
    line: usize,
    block: usize,
    words: Vec<String>,
}

impl std::fmt::Display for Documented {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: `{}`",
            self.file.display(),
            self.line,
            self.words.join(" ")
        )
    }
}

/// The markdown files whose commands are checked.
fn documents() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    for dir in ["docs", "crates"] {
        let mut found: Vec<PathBuf> = walk(&root().join(dir))
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .filter(|p| dir == "docs" || p.file_name().is_some_and(|n| n == "README.md"))
            .collect();
        found.sort();
        files.extend(found);
    }
    files
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if !path.ends_with("target") {
                out.extend(walk(&path));
            }
        } else {
            out.push(path);
        }
    }
    out
}

/// Each character of `text` with whether it stands outside quotes (a quote character itself
/// counts as inside), as the shell reads them.
fn unquoted(text: &str) -> impl Iterator<Item = (usize, char, bool)> + '_ {
    let (mut single, mut double) = (false, false);
    text.char_indices().map(move |(i, c)| {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            _ => return (i, c, !single && !double),
        }
        (i, c, false)
    })
}

/// Cut a shell comment: a `#` at the start of a word, outside quotes.
fn uncomment(line: &str) -> &str {
    let mut previous = ' ';
    for (i, c, outside) in unquoted(line) {
        if c == '#' && outside && previous.is_whitespace() {
            return &line[..i];
        }
        previous = c;
    }
    line
}

/// What `scripts/fetch-data.sh tau2-retail` prints where the data is available (the test's
/// `HARNESS_TAU2_RETAIL`); a marker that stops the configuration from being resolved where it
/// is not.
fn tau2_retail() -> String {
    match harness_testkit::data::external_data(&harness_testkit::data::TAU2_RETAIL_DATA) {
        Some(dir) => dir.to_string_lossy().into_owned(),
        None => NO_DATA.to_string(),
    }
}

/// Stands for data this machine does not have.
const NO_DATA: &str = "<data-not-fetched>";

/// The command substitutions the documents use, done as the shell does them.
fn substitute(line: &str) -> String {
    const FETCH: &str = "$(scripts/fetch-data.sh tau2-retail)";
    if line.contains(FETCH) {
        assert!(root().join("scripts/fetch-data.sh").exists());
        line.replace(FETCH, &tau2_retail())
    } else {
        line.to_string()
    }
}

/// Whether `text` leaves a quote open.
fn open_quote(text: &str) -> bool {
    let (mut single, mut double) = (false, false);
    for c in text.chars() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            _ => {}
        }
    }
    single || double
}

/// `line` split at the shell's command separators outside quotes (`&&`, `||`, `;`, `|`, `&`).
fn split_commands(line: &str) -> Vec<String> {
    let mut parts = vec![String::new()];
    for (_, c, outside) in unquoted(line) {
        if outside && matches!(c, ';' | '|' | '&') {
            if !parts.last().unwrap().trim().is_empty() {
                parts.push(String::new());
            }
            continue;
        }
        parts.last_mut().unwrap().push(c);
    }
    parts
}

/// What a fenced block of a document holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    /// `sh` or `bash`: every line is shell.
    Shell,
    /// `text`: commands on the lines that start with `$ `, output on the others.
    Text,
    /// Anything else (TOML, JSON, Rust).
    Other,
}

/// The commands of every `sh` / `bash` block of `file`, and of the `$ ` lines of its `text`
/// blocks: lines joined at a trailing `\` or an open quote, split at the command separators,
/// variables assigned in the block (`S="..."`) substituted.
fn commands(file: &Path) -> Vec<Documented> {
    let text = std::fs::read_to_string(file).unwrap();
    let mut out = Vec::new();
    let mut in_block: Option<Block> = None;
    let mut pending = String::new();
    let mut first_line = 0;
    let mut block = 0;
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let trimmed = raw.trim_start();
        if let Some(lang) = trimmed.strip_prefix("```") {
            in_block = match in_block {
                None => {
                    block += 1;
                    vars.clear();
                    Some(match lang.trim() {
                        "sh" | "bash" => Block::Shell,
                        "text" => Block::Text,
                        _ => Block::Other,
                    })
                }
                Some(_) => None,
            };
            continue;
        }
        let raw = match in_block {
            Some(Block::Shell) => raw,
            // A text block shows a command on a line that starts with the prompt `$ `, its
            // output on the others.
            Some(Block::Text) => match trimmed.strip_prefix("$ ") {
                Some(command) => command,
                None => continue,
            },
            Some(Block::Other) | None => continue,
        };
        if pending.is_empty() {
            first_line = i + 1;
        }
        let line = if open_quote(&pending) {
            raw.trim_end()
        } else {
            uncomment(raw).trim_end()
        };
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(line);
        if open_quote(&pending) {
            pending.push('\n');
            continue;
        }
        let whole = substitute(&std::mem::take(&mut pending));
        for part in split_commands(&whole) {
            let Some(mut words) = shlex::split(part.trim()) else {
                panic!(
                    "{}:{first_line}: unbalanced quotes in `{part}`",
                    file.display()
                );
            };
            if words.is_empty() {
                continue;
            }
            // An assignment alone is a variable of the block; before a command, its
            // environment.
            while let Some((name, value)) = words.first().and_then(|w| w.split_once('=')) {
                if !name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c == '_' || c.is_ascii_lowercase())
                    || name.is_empty()
                {
                    break;
                }
                if words.len() == 1 {
                    vars.insert(name.to_string(), value.to_string());
                }
                words.remove(0);
            }
            // An unquoted `$S` splits at whitespace and keeps its quote characters, as in
            // the shell.
            let words: Vec<String> = words
                .into_iter()
                .flat_map(|w| match w.strip_prefix('$').and_then(|v| vars.get(v)) {
                    Some(value) => value.split_whitespace().map(str::to_string).collect(),
                    None => vec![w],
                })
                .collect();
            if !words.is_empty() {
                out.push(Documented {
                    file: file.strip_prefix(root()).unwrap_or(file).to_path_buf(),
                    line: first_line,
                    block,
                    words,
                });
            }
        }
    }
    out
}

/// A workspace package: its folder, features, examples (with their required features) and
/// integration tests.
#[derive(Debug)]
struct Package {
    dir: PathBuf,
    features: BTreeSet<String>,
    examples: BTreeMap<String, BTreeSet<String>>,
    tests: BTreeSet<String>,
}

fn packages() -> BTreeMap<String, Package> {
    let mut dirs = vec![root()];
    for entry in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
        if entry.path().join("Cargo.toml").exists() {
            dirs.push(entry.path());
        }
    }
    let mut out = BTreeMap::new();
    for dir in dirs {
        let manifest: toml::Value =
            toml::from_str(&std::fs::read_to_string(dir.join("Cargo.toml")).unwrap()).unwrap();
        let name = manifest["package"]["name"].as_str().unwrap().to_string();
        let features = manifest
            .get("features")
            .and_then(|f| f.as_table())
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default();
        let stems = |sub: &str| -> BTreeSet<String> {
            std::fs::read_dir(dir.join(sub))
                .map(|entries| {
                    entries
                        .flatten()
                        .filter_map(|e| {
                            let p = e.path();
                            (p.extension().is_some_and(|x| x == "rs"))
                                .then(|| p.file_stem().unwrap().to_string_lossy().into_owned())
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut examples: BTreeMap<String, BTreeSet<String>> = stems("examples")
            .into_iter()
            .map(|e| (e, BTreeSet::new()))
            .collect();
        for example in manifest
            .get("example")
            .and_then(|e| e.as_array())
            .into_iter()
            .flatten()
        {
            let name = example["name"].as_str().unwrap().to_string();
            let required = example
                .get("required-features")
                .and_then(|r| r.as_array())
                .into_iter()
                .flatten()
                .map(|f| f.as_str().unwrap().to_string())
                .collect();
            examples.insert(name, required);
        }
        let tests = stems("tests");
        out.insert(
            name,
            Package {
                dir,
                features,
                examples,
                tests,
            },
        );
    }
    out
}

/// The long flags an example's command line declares: clap's derive (a field under
/// `#[arg(long ...)]`, or `long = "name"`), or a hand-written parser's match arms
/// (`"--name" =>`).
fn example_flags(source: &str) -> BTreeSet<String> {
    let mut flags = BTreeSet::from(["--help".to_string()]);
    let lines: Vec<&str> = source.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let line = line.trim();
        for arm in line.split('|') {
            let arm = arm.trim();
            if let Some(flag) = arm.strip_prefix("\"--")
                && let Some((name, _)) = flag.split_once('"')
                && (line.contains("=>") || line.ends_with('|'))
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            {
                flags.insert(format!("--{name}"));
            }
        }
        // A flag a helper reads from the argument list: `flag(&args, "--tasks", 6)`.
        if line.contains("args") && !line.contains("=>") {
            for piece in line.split("\"--").skip(1) {
                if let Some((name, _)) = piece.split_once('"')
                    && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                {
                    flags.insert(format!("--{name}"));
                }
            }
        }
        if !(line.starts_with("#[arg(") || line.starts_with("#[clap(")) || !line.contains("long") {
            continue;
        }
        if let Some(named) = line.split("long = \"").nth(1) {
            flags.insert(format!("--{}", named.split('"').next().unwrap()));
            continue;
        }
        let field = lines[i + 1..]
            .iter()
            .map(|l| l.trim())
            .find(|l| !l.starts_with("#[") && !l.starts_with("///"))
            .unwrap_or("");
        let field = field.trim_start_matches("pub ");
        if let Some((name, _)) = field.split_once(':') {
            flags.insert(format!("--{}", name.trim().replace('_', "-")));
        }
    }
    flags
}

/// What a checked command's run folder and learner resolve to, for the block-level check.
#[derive(Debug)]
struct Resolved {
    out: PathBuf,
    learner: String,
}

/// Check one command; `Ok(None)` when it is not one this test checks.
fn check(
    cmd: &Documented,
    packages: &BTreeMap<String, Package>,
) -> Result<Option<Resolved>, String> {
    let words = &cmd.words;
    let program = words[0].as_str();
    // Repository files the command names exist.
    for w in words.iter().flat_map(|w| w.split('=')) {
        if ["configs/", "crates/", "scripts/", "docs/"]
            .iter()
            .any(|p| w.starts_with(p))
            && !root().join(w).exists()
        {
            return Err(format!("names {w}, which the repository does not have"));
        }
    }
    if program.starts_with("scripts/") || (program == "bash" && words.len() > 1) {
        let script = if program == "bash" {
            &words[1]
        } else {
            &words[0]
        };
        return if root().join(script).exists() {
            Ok(None)
        } else {
            Err(format!("no script {script}"))
        };
    }
    if program == "harness-s" || program.ends_with("/harness-s") {
        return cli_args(&words[1..]).map(Some);
    }
    if program != "cargo" {
        return Ok(None);
    }
    let sub = words.get(1).map(String::as_str).unwrap_or("");
    if !matches!(sub, "run" | "build" | "test") {
        return Ok(None);
    }
    let (cargo_args, rest) = match words.iter().position(|w| w == "--") {
        Some(i) => (&words[2..i], &words[i + 1..]),
        None => (&words[2..], &words[words.len()..]),
    };
    let mut package = "harness-s".to_string();
    let mut features = BTreeSet::new();
    let mut example = None;
    let mut tests = Vec::new();
    let mut bin = None;
    let mut it = cargo_args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("cargo {a} without its value"))
        };
        match a.as_str() {
            "-p" | "--package" => package = value()?,
            "--features" | "-F" => features.extend(value()?.split([',', ' ']).map(str::to_string)),
            "--example" => example = Some(value()?),
            "--test" => tests.push(value()?),
            "--bin" => bin = Some(value()?),
            "--release" | "-q" | "--quiet" | "--workspace" | "--no-fail-fast" | "--all-targets"
            | "--lib" | "--bins" | "--examples" | "--tests" | "--locked" => {}
            other if other.starts_with('-') => {
                return Err(format!("cargo flag {other} is not one this test knows"));
            }
            _ => {}
        }
    }
    let pkg = packages
        .get(&package)
        .ok_or_else(|| format!("no package {package} in the workspace"))?;
    for f in &features {
        let (owner, feature) = match f.split_once('/') {
            Some((p, f)) => (packages.get(p).ok_or(format!("no package {p}"))?, f),
            None => (pkg, f.as_str()),
        };
        if !owner.features.contains(feature) {
            return Err(format!("{package} has no feature {f}"));
        }
    }
    for t in &tests {
        if !pkg.tests.contains(t) {
            return Err(format!("{package} has no test {t}"));
        }
    }
    if let Some(example) = example {
        let required = pkg
            .examples
            .get(&example)
            .ok_or_else(|| format!("{package} has no example {example}"))?;
        let missing: Vec<&String> = required.difference(&features).collect();
        if !missing.is_empty() {
            return Err(format!(
                "example {example} needs --features {}",
                missing
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            ));
        }
        let source =
            std::fs::read_to_string(pkg.dir.join("examples").join(format!("{example}.rs")))
                .map_err(|e| format!("example {example}: {e}"))?;
        let flags = example_flags(&source);
        for w in rest.iter().filter(|w| w.starts_with("--")) {
            let flag = w.split('=').next().unwrap();
            if !flags.contains(flag) {
                return Err(format!(
                    "example {example} takes no {flag} (it takes {})",
                    flags.iter().cloned().collect::<Vec<_>>().join(", ")
                ));
            }
        }
        return Ok(None);
    }
    if sub == "run"
        && package == "harness-s"
        && bin.as_deref().unwrap_or("harness-s") == "harness-s"
    {
        return cli_args(rest).map(Some);
    }
    Ok(None)
}

/// Parse `args` with the binary's command line; resolve the run configuration where the
/// subcommand reads one.
fn cli_args(args: &[String]) -> Result<Resolved, String> {
    let parsed = match cli::Cli::try_parse_from(
        std::iter::once("harness-s".to_string()).chain(args.iter().cloned()),
    ) {
        Ok(parsed) => parsed,
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ) =>
        {
            return Ok(Resolved {
                out: PathBuf::new(),
                learner: "help".into(),
            });
        }
        Err(e) => return Err(e.to_string()),
    };
    let common = match parsed.command {
        cli::Command::Run { common, .. }
        | cli::Command::Train { common, .. }
        | cli::Command::Eval { common, .. }
        | cli::Command::Serve { common, .. }
        | cli::Command::Evolve(common)
        | cli::Command::Calibrate(common)
        | cli::Command::Report(common) => common,
        cli::Command::Sweep { file, .. } => {
            return if root().join(&file).exists() {
                Ok(Resolved {
                    out: file,
                    learner: "sweep".into(),
                })
            } else {
                Err(format!("no sweep file {}", file.display()))
            };
        }
        cli::Command::EnvServe(_) => {
            return Ok(Resolved {
                out: PathBuf::new(),
                learner: "env-serve".into(),
            });
        }
    };
    if args.iter().any(|a| a.contains(NO_DATA)) {
        eprintln!(
            "not resolving `harness-s {}`: {} is not set ({})",
            args.join(" "),
            harness_testkit::data::TAU2_RETAIL_DATA.var,
            harness_testkit::data::TAU2_RETAIL_DATA.how
        );
        return Ok(Resolved {
            out: PathBuf::new(),
            learner: "unresolved".into(),
        });
    }
    let cfg = common.config().map_err(|e| format!("{e:#}"))?;
    Ok(Resolved {
        out: cfg.out.clone(),
        learner: format!("{:?}", cfg.learner),
    })
}

#[test]
fn every_documented_command_runs_as_written() {
    let packages = packages();
    let mut failures = Vec::new();
    let mut checked = 0;
    let mut cli_commands = 0;
    for file in documents() {
        let mut by_out: BTreeMap<(usize, PathBuf), (String, Documented)> = BTreeMap::new();
        for cmd in commands(&file) {
            match check(&cmd, &packages) {
                Err(e) => failures.push(format!("{cmd}: {e}")),
                Ok(None) => checked += 1,
                Ok(Some(resolved)) => {
                    checked += 1;
                    cli_commands += 1;
                    if resolved.out.as_os_str().is_empty() {
                        continue;
                    }
                    let key = (cmd.block, resolved.out.clone());
                    match by_out.get(&key) {
                        Some((learner, earlier)) if *learner != resolved.learner => failures.push(
                            format!(
                                "{cmd}: runs the learner {} in {}, where {earlier} runs {learner}: the run folder refuses the second",
                                resolved.learner,
                                resolved.out.display()
                            ),
                        ),
                        Some(_) => {}
                        None => {
                            by_out.insert(key, (resolved.learner, cmd.clone()));
                        }
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "documented commands that do not run as written:\n{}",
        failures.join("\n")
    );
    // The README's two commands and the CLI's documented uses were all seen.
    assert!(
        checked >= 30 && cli_commands >= 10,
        "{checked} checked, {cli_commands} CLI"
    );
}

#[test]
fn the_checker_catches_what_it_should() {
    let packages = packages();
    let doc = |line: &str| Documented {
        file: "x.md".into(),
        line: 1,
        block: 1,
        words: shlex::split(line).unwrap(),
    };
    for (bad, why) in [
        (
            "cargo run --release -p harness-openai --example serve -- --port 8000",
            "needs --features candle",
        ),
        (
            "cargo run --release --example full_pipeline -- --set seed=1",
            "takes no --set",
        ),
        (
            "cargo run --release --example nowhere",
            "has no example nowhere",
        ),
        ("harness-s evolve --config run.toml", "run.toml"),
        ("harness-s train --no-such-flag", "--no-such-flag"),
        ("harness-s run --set train.no_such=1", "train.no_such"),
        (
            "cargo test -p harness-envs --features nope",
            "no feature nope",
        ),
        ("bash scripts/none.sh", "does not have"),
    ] {
        let e = check(&doc(bad), &packages).expect_err(bad);
        assert!(e.contains(why), "{bad}: {e}");
    }
    for good in [
        "cargo run --release -p harness-openai --features candle --example serve -- --port 8000",
        "cargo run --release -- run --preset paper --set train.group_size=8",
        "harness-s report --config configs/compare.toml",
    ] {
        check(&doc(good), &packages).unwrap_or_else(|e| panic!("{good}: {e}"));
    }
    let words = |line: &str| shlex::split(line).unwrap();
    assert_eq!(
        harness_args(&words("cargo run --release --bin harness-s -- run --help")),
        Some(words("run --help"))
    );
    assert_eq!(
        harness_args(&words("target/release/harness-s run --explain")),
        Some(words("run --explain"))
    );
    assert_eq!(
        harness_args(&words(
            "cargo run --release --example full_pipeline -- --help"
        )),
        None
    );
    assert!(cheap(&words("run --preset paper --explain")));
    assert!(!cheap(&words("run --preset paper")));
    let md = std::env::temp_dir().join(format!("documented-{}.md", std::process::id()));
    std::fs::write(
        &md,
        "`harness-s run --explain` prints:\n\n```text\n$ harness-s run --help\nsome output\n```\n",
    )
    .unwrap();
    let found = commands(&md);
    let outputs = documented_outputs(&md);
    std::fs::remove_file(&md).ok();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].words, words("harness-s run --help"));
    assert_eq!(
        outputs,
        [(
            words("harness-s run --explain"),
            3,
            vec!["$ harness-s run --help".to_string(), "some output".into()]
        )]
    );
    assert_eq!(uncomment("a 'b # c' # d"), "a 'b # c' ");
    assert_eq!(
        split_commands("echo 'a | b' | cargo x && y & z"),
        ["echo 'a | b' ", " cargo x ", " y ", " z"]
    );
    let flags = example_flags(
        "#[arg(long)]\n/// x\nrun_dir: PathBuf,\n#[arg(long = \"k\")]\nx: u8,\n\"--out\" | \"-o\" => 1,\nlet t = flag(&args, \"--tasks\", 6)?;",
    );
    assert_eq!(
        flags.into_iter().collect::<Vec<_>>(),
        ["--help", "--k", "--out", "--run-dir", "--tasks"]
    );
}

/// The arguments a documented command gives the `harness-s` binary, if it runs it:
/// `harness-s ...`, `target/release/harness-s ...`, or `cargo run [--bin harness-s] -- ...`.
fn harness_args(words: &[String]) -> Option<Vec<String>> {
    let program = words[0].as_str();
    if program == "harness-s" || program.ends_with("/harness-s") {
        return Some(words[1..].to_vec());
    }
    if program != "cargo" || words.get(1).map(String::as_str) != Some("run") {
        return None;
    }
    let split = words.iter().position(|w| w == "--").unwrap_or(words.len());
    let cargo_args = &words[2..split];
    let names = |flag: &str| {
        cargo_args
            .windows(2)
            .find(|w| w[0] == flag)
            .map(|w| w[1].clone())
    };
    let ours = names("-p")
        .or_else(|| names("--package"))
        .is_none_or(|p| p == "harness-s")
        && names("--example").is_none()
        && names("--bin").is_none_or(|b| b == "harness-s");
    ours.then(|| words.get(split + 1..).unwrap_or_default().to_vec())
}

/// Whether running `args` costs nothing: it prints help, a version or `--explain`'s list and
/// stops before any stage.
fn cheap(args: &[String]) -> bool {
    args.iter().any(|a| {
        matches!(
            a.as_str(),
            "--help" | "-h" | "--version" | "-V" | "--explain"
        )
    })
}

/// Run the built binary with `args` in the repository's root; its standard output.
fn run_binary(args: &[String]) -> Result<String, String> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_harness-s"))
        .args(args)
        .current_dir(root())
        .env_remove("RUST_BACKTRACE")
        .output()
        .map_err(|e| format!("cannot start harness-s: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "exits with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Every `text` block a document introduces with "`<command>` prints:", as (the command's
/// words, the line of the block, the block's lines).
fn documented_outputs(file: &Path) -> Vec<(Vec<String>, usize, Vec<String>)> {
    let text = std::fs::read_to_string(file).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim() != "```text" {
            continue;
        }
        let Some(intro) = lines[..i].iter().rev().find(|l| !l.trim().is_empty()) else {
            continue;
        };
        let Some(before) = intro.trim_end().strip_suffix("prints:") else {
            continue;
        };
        let Some(command) = before
            .trim_end()
            .strip_suffix('`')
            .and_then(|b| b.rsplit('`').next())
        else {
            continue;
        };
        let body: Vec<String> = lines[i + 1..]
            .iter()
            .take_while(|l| l.trim() != "```")
            .map(|l| l.trim_end().to_string())
            .collect();
        out.push((shlex::split(command).unwrap_or_default(), i + 1, body));
    }
    out
}

#[test]
fn the_cheap_documented_commands_run_and_print_what_the_documents_show() {
    let mut failures = Vec::new();
    let mut ran = 0;
    for file in documents() {
        let name = file.strip_prefix(root()).unwrap_or(&file).to_path_buf();
        for cmd in commands(&file) {
            let Some(args) = harness_args(&cmd.words).filter(|a| cheap(a)) else {
                continue;
            };
            ran += 1;
            match run_binary(&args) {
                Ok(stdout) if !stdout.trim().is_empty() => {}
                Ok(_) => failures.push(format!("{cmd}: prints nothing")),
                Err(e) => failures.push(format!("{cmd}: {e}")),
            }
        }
        for (words, line, body) in documented_outputs(&file) {
            let Some(args) = (!words.is_empty())
                .then(|| harness_args(&words))
                .flatten()
                .filter(|a| cheap(a))
            else {
                continue;
            };
            ran += 1;
            match run_binary(&args) {
                Ok(stdout) => {
                    let printed: Vec<&str> = stdout.lines().map(str::trim_end).collect();
                    if printed != body {
                        failures.push(format!(
                            "{}:{line}: `{}` prints\n{}\nwhere the document shows\n{}",
                            name.display(),
                            words.join(" "),
                            printed.join("\n"),
                            body.join("\n")
                        ));
                    }
                }
                Err(e) => failures.push(format!(
                    "{}:{line}: `{}`: {e}",
                    name.display(),
                    words.join(" ")
                )),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // MAIN_JOB.md's `run --help` and its `--explain` listing at least.
    assert!(ran >= 2, "{ran} cheap commands run");
}
