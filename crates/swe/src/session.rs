//! One episode: a private copy of the repository and the tools that act on it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use harness_core::{EnvSession, Error, Observation, Outcome, Result, ToolCall, ToolKind, ToolSpec};
use regex::RegexBuilder;
use serde_json::{Map, Value, json};

use super::exec::{self, TestStatus};
use super::instance::{SweInstance, check_relative_path, is_test_id, normalize_test_id};
use super::sandbox::Sandbox;
use super::{ENV_NAME, GoldCell, SweConfig, diff, judge, tamper};

/// Tool names.
pub mod tools {
    /// View a file or list a directory.
    pub const VIEW: &str = "view_file";
    /// Search the repository with a regular expression.
    pub const SEARCH: &str = "search";
    /// Replace a unique string in a file.
    pub const REPLACE: &str = "replace";
    /// Create or overwrite a file.
    pub const CREATE: &str = "create_file";
    /// Run selected tests.
    pub const RUN_TESTS: &str = "run_tests";
    /// Run a shell command (only when the environment enables it).
    pub const SHELL: &str = "run_shell";
    /// End the episode.
    pub const SUBMIT: &str = "submit";
}

/// Directories hidden from listings and searches.
const HIDDEN_DIRS: &[&str] = &[".git", "__pycache__"];

/// The most test ids one `run_tests` call may name.
const MAX_TEST_IDS: usize = 200;

/// One running episode of [`super::SweEnv`]: a temporary copy of the repository (removed when
/// the session is dropped) and the tools that read and change it.
pub struct SweSession {
    work: Workdir,
    // Owns the copy: dropping the session removes it. The blocking jobs hold a `Workdir`, not
    // this, so a job still running when its episode is dropped finds the copy gone and fails.
    _dir: tempfile::TempDir,
    submitted: bool,
}

/// What the commands and the verifier need of a session, owned, so that they can run on a
/// blocking thread while the async runtime goes on with other episodes.
#[derive(Debug, Clone)]
struct Workdir {
    instance: Arc<SweInstance>,
    config: Arc<SweConfig>,
    /// Where the policy's commands run; `None` only when the environment allows running
    /// without a sandbox and none could be made.
    sandbox: Option<Arc<Sandbox>>,
    /// The copy's canonical root.
    root: PathBuf,
    /// The copy's root as the temporary directory named it (may differ through links).
    raw: PathBuf,
    /// The gold code's observations of the instance's call specs, shared by its episodes.
    gold: GoldCell,
}

impl std::fmt::Debug for SweSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SweSession")
            .field("instance", &self.work.instance.instance_id)
            .field("root", &self.work.root)
            .field("submitted", &self.submitted)
            .finish()
    }
}

fn env_error(message: String) -> Error {
    Error::Environment {
        env: ENV_NAME.to_string(),
        message,
    }
}

impl SweSession {
    /// Copy the instance's repository into a fresh temporary directory.
    pub(crate) fn create(
        instance: Arc<SweInstance>,
        config: Arc<SweConfig>,
        sandbox: Option<Arc<Sandbox>>,
        gold: GoldCell,
    ) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("harness-swe-")
            .tempdir()
            .map_err(|e| env_error(format!("cannot create a temporary directory: {e}")))?;
        let root = dir
            .path()
            .canonicalize()
            .map_err(|e| Error::io(dir.path(), e))?;
        write_tree(&root, &instance.files)?;
        Ok(SweSession {
            work: Workdir {
                instance,
                config,
                sandbox,
                root,
                raw: dir.path().to_path_buf(),
                gold,
            },
            _dir: dir,
            submitted: false,
        })
    }

    /// The repository copy's root directory (canonical).
    pub fn root(&self) -> &Path {
        &self.work.root
    }

    /// The instance this episode works on.
    pub fn instance(&self) -> &SweInstance {
        &self.work.instance
    }

    /// Whether `submit` was called.
    pub fn submitted(&self) -> bool {
        self.submitted
    }

    /// The tools of this episode (`run_shell` only when the environment enables the shell).
    pub fn tool_specs(shell: bool) -> Vec<ToolSpec> {
        let object = |props: Value, required: &[&str]| json!({"type": "object", "properties": props, "required": required, "additionalProperties": false});
        let mut specs = vec![
            ToolSpec::new(
                tools::VIEW,
                "Show a file with line numbers (optionally only lines start_line..=end_line), or list a directory.",
                object(
                    json!({
                        "path": {"type": "string", "description": "Path relative to the repository root."},
                        "start_line": {"type": "integer", "minimum": 1},
                        "end_line": {"type": "integer", "minimum": 1}
                    }),
                    &["path"],
                ),
            ),
            ToolSpec::new(
                tools::SEARCH,
                "Search the repository's text files with a regular expression (Rust regex syntax); prints path:line: text for each match, up to a cap.",
                object(
                    json!({
                        "pattern": {"type": "string"},
                        "path": {"type": "string", "description": "Only search this file or directory."}
                    }),
                    &["pattern"],
                ),
            ),
            ToolSpec::new(
                tools::REPLACE,
                "Replace the text `old` by `new` in a file. `old` must occur exactly once; include surrounding lines to make it unique.",
                object(
                    json!({
                        "path": {"type": "string"},
                        "old": {"type": "string"},
                        "new": {"type": "string"}
                    }),
                    &["path", "old", "new"],
                ),
            ),
            ToolSpec::new(
                tools::CREATE,
                "Create a file with the given content (parent directories are created; an existing file is overwritten).",
                object(
                    json!({"path": {"type": "string"}, "content": {"type": "string"}}),
                    &["path", "content"],
                ),
            ),
            ToolSpec::new(
                tools::RUN_TESTS,
                "Run tests with Python's unittest. `tests` lists ids such as `tests.test_mod`, `tests.test_mod.TestCase` or `tests.test_mod.TestCase.test_name`; an empty list runs every test found under tests/.",
                object(
                    json!({"tests": {"type": "array", "items": {"type": "string"}}}),
                    &["tests"],
                ),
            ),
        ];
        if shell {
            specs.push(ToolSpec::new(
                tools::SHELL,
                "Run a shell command (sh -c) in the repository root, with a time limit and an output cap.",
                object(json!({"command": {"type": "string"}}), &["command"]),
            ));
        }
        specs.push(
            ToolSpec::new(
                tools::SUBMIT,
                "Submit the repository in its current state as the fix and end the episode.",
                object(json!({}), &[]),
            )
            .with_kind(ToolKind::Submit),
        );
        specs
    }

    /// Apply one tool call; misuse is an error observation. `Err` only when the machine fails
    /// (the temporary directory vanished, a process could not be started).
    pub fn step_sync(&mut self, call: &ToolCall) -> Result<Observation> {
        if self.submitted {
            return Ok(Observation::error(
                "The episode has ended: the fix was already submitted.",
            ));
        }
        let Some(args) = call.arguments.as_object() else {
            return Ok(Observation::error(format!(
                "The arguments of `{}` must be a JSON object.",
                call.name
            )));
        };
        let result = match call.name.as_str() {
            tools::VIEW => self.view(args),
            tools::SEARCH => self.search(args),
            tools::REPLACE => self.replace(args),
            tools::CREATE => self.create_file(args),
            tools::RUN_TESTS => self.work.run_tests(args),
            tools::SHELL if self.work.config.shell => self.work.shell(args),
            tools::SUBMIT => check_keys(args, &[]).map(|()| {
                self.submitted = true;
                Observation::ok("Submitted. The repository in its current state will be tested.")
                    .finished()
            }),
            other => {
                let names: Vec<String> = Self::tool_specs(self.work.config.shell)
                    .into_iter()
                    .map(|t| t.name)
                    .collect();
                Err(format!(
                    "There is no tool `{other}`. Available tools: {}.",
                    names.join(", ")
                ))
            }
        };
        match result {
            Ok(observation) => Ok(observation),
            Err(message) => Ok(Observation::error(message)),
        }
    }

    /// Judge the final state: the work folder's verification against the instance's tests.
    pub fn verify_sync(&mut self) -> Result<Outcome> {
        self.work.verify(self.submitted)
    }

    fn resolve(&self, path: &str) -> std::result::Result<PathBuf, String> {
        self.work.resolve(path)
    }

    fn display(&self, path: &Path) -> String {
        path.strip_prefix(&self.work.root)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| path.display().to_string())
    }

    fn view(&self, args: &Map<String, Value>) -> std::result::Result<Observation, String> {
        check_keys(args, &["path", "start_line", "end_line"])?;
        let path = string_arg(args, "path")?;
        let start = optional_line(args, "start_line")?;
        let end = optional_line(args, "end_line")?;
        let target = self.resolve(path)?;
        let meta = std::fs::metadata(&target).map_err(|_| format!("`{path}` does not exist."))?;
        if meta.is_dir() {
            return Ok(Observation::ok(self.listing(&target)));
        }
        if !meta.is_file() {
            // A named pipe the policy's code made would block this read for ever.
            return Err(format!("`{path}` is not a regular file."));
        }
        if meta.len() > self.work.config.max_file_bytes as u64 {
            return Err(format!(
                "`{path}` is {} bytes, over the {}-byte limit for viewing; use search instead.",
                meta.len(),
                self.work.config.max_file_bytes
            ));
        }
        let bytes = std::fs::read(&target).map_err(|e| format!("Cannot read `{path}`: {e}."))?;
        let Ok(text) = String::from_utf8(bytes) else {
            return Err(format!("`{path}` is not a UTF-8 text file."));
        };
        let lines: Vec<&str> = text.lines().collect();
        let total = lines.len();
        if total == 0 {
            return Ok(Observation::ok(format!("{path} is empty.")));
        }
        let first = start.unwrap_or(1);
        if first > total {
            return Err(format!(
                "`start_line` {first} is past the end of `{path}` ({total} lines)."
            ));
        }
        let requested_last = end.unwrap_or(total).min(total);
        if requested_last < first {
            return Err(format!(
                "`end_line` ({requested_last}) is before `start_line` ({first})."
            ));
        }
        let last = requested_last.min(first + self.work.config.max_view_lines - 1);
        let width = total.to_string().len();
        let mut out = format!("{path} (lines {first}-{last} of {total})\n");
        for (i, line) in lines[first - 1..last].iter().enumerate() {
            out.push_str(&format!("{:>width$} | {line}\n", first + i));
        }
        if last < requested_last {
            out.push_str(&format!(
                "[... showing at most {} lines; ask for start_line {} to continue]\n",
                self.work.config.max_view_lines,
                last + 1
            ));
        }
        Ok(Observation::ok(cut(&out, self.work.config.output_cap)))
    }

    fn listing(&self, dir: &Path) -> String {
        let mut entries = Vec::new();
        walk(dir, &mut |path, is_dir| {
            let shown = self.display(path);
            entries.push(if is_dir { format!("{shown}/") } else { shown });
            entries.len() < 1000
        });
        let name = self.display(dir);
        let name = if name.is_empty() {
            ".".to_string()
        } else {
            name
        };
        if entries.is_empty() {
            format!("{name}/ is empty.")
        } else {
            cut(
                &format!("{name}/ contains:\n{}\n", entries.join("\n")),
                self.work.config.output_cap,
            )
        }
    }

    fn search(&self, args: &Map<String, Value>) -> std::result::Result<Observation, String> {
        check_keys(args, &["pattern", "path"])?;
        let pattern = string_arg(args, "pattern")?;
        if pattern.is_empty() || pattern.len() > 1000 {
            return Err("`pattern` must be a regular expression of 1 to 1000 bytes.".into());
        }
        let scope = match args.get("path") {
            None | Some(Value::Null) => self.work.root.clone(),
            Some(Value::String(p)) => self.resolve(p)?,
            Some(_) => return Err("`path` must be a string.".into()),
        };
        let regex = RegexBuilder::new(pattern)
            .size_limit(1 << 20)
            .dfa_size_limit(1 << 20)
            .build()
            .map_err(|e| format!("Invalid regular expression: {e}"))?;
        let mut files = Vec::new();
        if scope.is_file() {
            files.push(scope);
        } else if scope.is_dir() {
            walk(&scope, &mut |path, is_dir| {
                if !is_dir {
                    files.push(path.to_path_buf());
                }
                files.len() < 10_000
            });
        } else {
            return Err("The search path does not exist.".into());
        }
        let cap = self.work.config.max_search_results;
        let mut hits = Vec::new();
        let mut more = 0usize;
        for file in files {
            let Ok(meta) = std::fs::metadata(&file) else {
                continue;
            };
            if meta.len() > self.work.config.max_file_bytes as u64 {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&file) else {
                continue;
            };
            for (i, line) in text.lines().enumerate() {
                if regex.is_match(line) {
                    if hits.len() < cap {
                        let shown: String = line.chars().take(200).collect();
                        hits.push(format!("{}:{}: {shown}", self.display(&file), i + 1));
                    } else {
                        more += 1;
                    }
                }
            }
        }
        if hits.is_empty() {
            return Ok(Observation::ok(format!("No matches for `{pattern}`.")));
        }
        let mut out = hits.join("\n");
        if more > 0 {
            out.push_str(&format!(
                "\n[... {more} more matches not shown; narrow the pattern or the path]"
            ));
        }
        Ok(Observation::ok(cut(&out, self.work.config.output_cap)))
    }

    fn replace(&self, args: &Map<String, Value>) -> std::result::Result<Observation, String> {
        check_keys(args, &["path", "old", "new"])?;
        let path = string_arg(args, "path")?;
        let old = string_arg(args, "old")?;
        let new = string_arg(args, "new")?;
        if old.is_empty() {
            return Err("`old` must not be empty; to write a whole file use create_file.".into());
        }
        if old.len() > self.work.config.max_file_bytes
            || new.len() > self.work.config.max_file_bytes
        {
            return Err(format!(
                "`old` and `new` may hold at most {} bytes.",
                self.work.config.max_file_bytes
            ));
        }
        let target = self.resolve(path)?;
        if !target.is_file() {
            return Err(format!("`{path}` is not an existing file."));
        }
        let text = std::fs::read_to_string(&target)
            .map_err(|_| format!("`{path}` is not a UTF-8 text file."))?;
        let positions = occurrences(&text, old);
        match positions.len() {
            0 => {
                return Err(format!(
                    "`old` was not found in `{path}`. Copy it exactly, including indentation and line breaks (view the file first)."
                ));
            }
            1 => {}
            n => {
                let lines: Vec<String> = positions
                    .iter()
                    .take(10)
                    .map(|&p| (text[..p].matches('\n').count() + 1).to_string())
                    .collect();
                return Err(format!(
                    "`old` occurs {n} times in `{path}` (starting on lines {}); include more surrounding text so it is unique.",
                    lines.join(", ")
                ));
            }
        }
        let at = positions[0];
        let updated = format!("{}{new}{}", &text[..at], &text[at + old.len()..]);
        if updated.len() > self.work.config.max_file_bytes {
            return Err(format!(
                "The file would exceed {} bytes.",
                self.work.config.max_file_bytes
            ));
        }
        std::fs::write(&target, &updated).map_err(|e| format!("Cannot write `{path}`: {e}."))?;
        // Show the edited region with a little context.
        let first_line = text[..at].matches('\n').count() + 1;
        let new_lines = new.matches('\n').count() + 1;
        let lines: Vec<&str> = updated.lines().collect();
        let from = first_line.saturating_sub(3).max(1);
        let to = (first_line + new_lines + 2).min(lines.len());
        let mut out = format!("Replaced 1 occurrence in {path}. Lines {from}-{to} now read:\n");
        for n in from..=to {
            if let Some(line) = lines.get(n - 1) {
                out.push_str(&format!("{n:>4} | {line}\n"));
            }
        }
        Ok(Observation::ok(cut(&out, self.work.config.output_cap)))
    }

    fn create_file(&self, args: &Map<String, Value>) -> std::result::Result<Observation, String> {
        check_keys(args, &["path", "content"])?;
        let path = string_arg(args, "path")?;
        let content = string_arg(args, "content")?;
        if content.len() > self.work.config.max_file_bytes {
            return Err(format!(
                "`content` may hold at most {} bytes.",
                self.work.config.max_file_bytes
            ));
        }
        let target = self.resolve(path)?;
        if target == self.work.root || target.is_dir() {
            return Err(format!("`{path}` is a directory."));
        }
        if std::fs::symlink_metadata(&target).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(format!(
                "`{path}` is a symbolic link; it is not overwritten."
            ));
        }
        if std::fs::symlink_metadata(&target).is_ok_and(|m| !m.is_file()) {
            // A named pipe the policy's code made would block this write for ever.
            return Err(format!(
                "`{path}` is not a regular file; it is not overwritten."
            ));
        }
        let existed = target.exists();
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("Cannot create the directories of `{path}`: {e}."))?;
            // A directory created just now cannot be a link, but re-check the final location.
            let parent = parent
                .canonicalize()
                .map_err(|e| format!("Cannot resolve `{path}`: {e}."))?;
            if !parent.starts_with(&self.work.root) {
                return Err(format!(
                    "Invalid path `{path}`: it leads outside the repository."
                ));
            }
        }
        std::fs::write(&target, content).map_err(|e| format!("Cannot write `{path}`: {e}."))?;
        let lines = content.lines().count();
        Ok(Observation::ok(format!(
            "{} {path} ({lines} lines).",
            if existed { "Overwrote" } else { "Created" }
        )))
    }
}

impl Workdir {
    /// Judge the final state in a fresh copy that the policy's commands never ran in: the
    /// policy's text files ([`Workdir::policy_files`]). When the call judge decides, the copy
    /// holds no test file at all ([`is_test_path`]; the calls need only the package). For the
    /// in-process runner it holds the instance's own test files in place of any the policy
    /// changed, no test files the instance does not have, and the hidden test patch applied.
    /// Every file of that copy goes through the tamper scan (a statistic, in the details); then every FAIL_TO_PASS and PASS_TO_PASS test is judged
    /// with the copy read-only: by the call judge when the instance has call specs, by the
    /// in-process unittest runner only when `allow_in_process_verdict` allows it; success when
    /// all pass.
    fn verify(&self, submitted: bool) -> Result<Outcome> {
        let instance = Arc::clone(&self.instance);
        let mut details = json!({
            "instance_id": instance.instance_id,
            "submitted": submitted,
            "sandboxed": self.sandbox.is_some(),
        });
        let (mut files, left_out) = match self.policy_files() {
            Ok(found) => found,
            Err(refused) => {
                // Too much to copy: a failed verification that says why, nothing written.
                details["copy_refused"] = json!(refused);
                details["error"] = json!(format!(
                    "the repository is too large to copy for verification: {refused}; the tests were not run"
                ));
                return Ok(Outcome::failure(details));
            }
        };
        if !left_out.is_empty() {
            details["left_out"] = json!(left_out);
        }
        let judged = !instance.call_tests.is_empty();
        let mut expected = instance.files.clone();
        if judged {
            // The judge's calls need only the package: a test file in the copy would let the
            // policy's code read the asserted values at run time (the instance's tests, the
            // hidden test patch) and answer from them. No test file of any origin is copied.
            files.retain(|path, _| !is_test_path(path));
            expected.retain(|path, _| !is_test_path(path));
        } else {
            // The policy may have edited or added tests; the verdict uses the instance's own.
            files.retain(|path, _| !is_test_path(path) || instance.files.contains_key(path));
            for (path, text) in &instance.files {
                if is_test_path(path) {
                    files.insert(path.clone(), text.clone());
                }
            }
        }
        if !judged && !instance.test_patch.trim().is_empty() {
            if let Err(message) = diff::apply_to_files(&mut files, &instance.test_patch) {
                details["error"] = json!(format!("the test patch does not apply: {message}"));
                return Ok(Outcome::failure(details));
            }
            // The instance is checked when loaded: its test patch applies to its own files.
            let _ = diff::apply_to_files(&mut expected, &instance.test_patch);
        }
        // The scan is a statistic of attempted tampering, not a defence: the verdict comes
        // from a process that never imports the policy's code.
        let findings = tamper::scan(&expected, &files);
        if !findings.is_empty() {
            details["tamper"] = json!(findings);
        }
        let dir = tempfile::Builder::new()
            .prefix("harness-swe-verify-")
            .tempdir()
            .map_err(|e| env_error(format!("cannot create a temporary directory: {e}")))?;
        let fresh = dir
            .path()
            .canonicalize()
            .map_err(|e| Error::io(dir.path(), e))?;
        write_tree(&fresh, &files)?;
        let ids = instance.all_tests();
        let io = |e: std::io::Error| env_error(format!("cannot run `{}`: {e}", self.config.python));
        let run = if judged {
            details["verdict"] = json!("judged");
            let gold = match super::gold_of(
                &self.gold,
                &self.config,
                self.sandbox.as_deref(),
                &instance,
            ) {
                Ok(gold) => gold,
                Err(message) => {
                    details["error"] = json!(format!(
                        "the expected observations could not be computed from the gold code: {message}"
                    ));
                    return Ok(Outcome::failure(details));
                }
            };
            let calls = judge::run_calls(
                &self.config,
                self.sandbox.as_deref(),
                &fresh,
                &instance.call_tests,
                &ids,
                self.config.verify_timeout,
                self.config.output_cap,
            )
            .map_err(io)?;
            judge::judge(&ids, &gold, calls)
        } else if self.config.allow_in_process_verdict {
            details["verdict"] = json!("in_process");
            details["verdict_warning"] = json!(
                "no call specs: the in-process unittest runner judged, whose verdict the policy's code can forge (swe.allow_in_process_verdict)"
            );
            exec::run_verdict_tests(
                &self.config,
                self.sandbox.as_deref(),
                &fresh,
                &ids,
                self.config.verify_timeout,
                self.config.output_cap,
            )
            .map_err(io)?
        } else {
            details["error"] = json!(
                "the instance has no call specs (`call_tests`) and swe.allow_in_process_verdict is off; the tests were not run"
            );
            return Ok(Outcome::failure(details));
        };
        if !run.problems.is_empty() {
            details["problems"] = json!(run.problems);
        }
        let pick = |list: &[String]| -> BTreeMap<String, &'static str> {
            list.iter()
                .map(|id| {
                    let status = run.statuses.get(id).copied().unwrap_or(TestStatus::NotRun);
                    (id.clone(), status.as_str())
                })
                .collect()
        };
        details["FAIL_TO_PASS"] = json!(pick(&instance.fail_to_pass));
        details["PASS_TO_PASS"] = json!(pick(&instance.pass_to_pass));
        let failed: Vec<&String> = run
            .statuses
            .iter()
            .filter(|(_, s)| **s != TestStatus::Pass)
            .map(|(id, _)| id)
            .collect();
        details["failed"] = json!(failed);
        if run.command.timed_out {
            details["timed_out"] = json!(true);
        }
        Ok(if run.all_pass() && !ids.is_empty() {
            Outcome::success(details)
        } else {
            let text = run.command.describe();
            let text = replace_root(&text, &fresh, dir.path());
            details["output"] = json!(exec_tail(&self.relative_paths(&text), 2000));
            Outcome::failure(details)
        })
    }

    /// The policy's repository as text: every regular file of the copy outside hidden and
    /// cache folders (`.git`, `__pycache__`, any folder whose name starts with a dot), never
    /// through a link, that is UTF-8 text within the size limit (or unchanged from the
    /// instance). Also what was left out, and why.
    ///
    /// `Err` says which cap the files to copy exceed: more than the instance's own number of
    /// files plus [`SweConfig::verify_max_new_files`](super::SweConfig), or more bytes than the
    /// instance's own plus [`SweConfig::verify_max_added_bytes`](super::SweConfig). Sizes are
    /// counted before a file is read, so no more than the cap is ever read or written.
    fn policy_files(&self) -> std::result::Result<(BTreeMap<String, String>, Vec<String>), String> {
        let mut files = BTreeMap::new();
        let mut left_out = Vec::new();
        let mut more = 0usize;
        let mut leave_out = |why: String| {
            if left_out.len() < 50 {
                left_out.push(why);
            } else {
                more += 1;
            }
        };
        let config = &self.config;
        let max_files = self
            .instance
            .files
            .len()
            .saturating_add(config.verify_max_new_files);
        let instance_bytes: u64 = self.instance.files.values().map(|t| t.len() as u64).sum();
        let max_bytes = instance_bytes.saturating_add(config.verify_max_added_bytes);
        let mut bytes = 0u64;
        let mut stack = vec![self.root.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            let mut entries: Vec<_> = entries.filter_map(|e| e.ok()).collect();
            entries.sort_by_key(|e| e.file_name());
            for entry in entries {
                let path = entry.path();
                let Ok(meta) = std::fs::symlink_metadata(&path) else {
                    continue;
                };
                let Some(rel) = path
                    .strip_prefix(&self.root)
                    .ok()
                    .and_then(|p| p.to_str())
                    .map(str::to_string)
                else {
                    leave_out(format!("{}: not a UTF-8 name", path.display()));
                    continue;
                };
                let name = entry.file_name().to_string_lossy().into_owned();
                if meta.is_dir() {
                    if name.starts_with('.') || name == "__pycache__" {
                        leave_out(format!("{rel}/: a hidden or cache folder"));
                    } else {
                        stack.push(path);
                    }
                    continue;
                }
                if !meta.is_file() {
                    leave_out(format!("{rel}: not a regular file"));
                    continue;
                }
                if check_relative_path(&rel).is_err() {
                    leave_out(format!("{rel}: not a valid path"));
                    continue;
                }
                let original = self.instance.files.get(&rel);
                let max = original
                    .map_or(0, String::len)
                    .max(self.config.max_file_bytes);
                if meta.len() > max as u64 {
                    leave_out(format!("{rel}: larger than {max} bytes"));
                    continue;
                }
                if files.len() >= max_files {
                    return Err(format!(
                        "more than {max_files} files (the instance's {} plus \
                         `swe.verify_max_new_files` = {}), at `{rel}`",
                        self.instance.files.len(),
                        config.verify_max_new_files
                    ));
                }
                bytes = bytes.saturating_add(meta.len());
                if bytes > max_bytes {
                    return Err(format!(
                        "more than {max_bytes} bytes (the instance's {instance_bytes} plus \
                         `swe.verify_max_added_bytes` = {}), at `{rel}`",
                        config.verify_max_added_bytes
                    ));
                }
                match std::fs::read(&path).map(String::from_utf8) {
                    Ok(Ok(text)) => {
                        files.insert(rel, text);
                    }
                    _ => leave_out(format!("{rel}: not UTF-8 text")),
                }
            }
        }
        if more > 0 {
            left_out.push(format!("... and {more} more"));
        }
        Ok((files, left_out))
    }

    /// Resolve a policy-given path inside the copy: relative, no `..`, and (following any
    /// symlinks along the way) still inside the root.
    fn resolve(&self, path: &str) -> std::result::Result<PathBuf, String> {
        if path.len() > 4096 {
            return Err("The path is too long.".into());
        }
        let trimmed = path.trim();
        if trimmed == "." || trimmed == "./" || trimmed.is_empty() {
            return Ok(self.root.clone());
        }
        check_relative_path(trimmed).map_err(|e| format!("Invalid path `{path}`: {e}."))?;
        let joined = self.root.join(trimmed);
        // Canonicalise the longest existing prefix: symlinks there must not lead outside.
        let mut existing = joined.as_path();
        let mut rest = Vec::new();
        loop {
            match std::fs::symlink_metadata(existing) {
                Ok(_) => break,
                Err(_) => {
                    rest.push(existing.file_name().map(|n| n.to_os_string()));
                    existing = existing.parent().unwrap_or(&self.root);
                }
            }
        }
        let canonical = existing.canonicalize().map_err(|_| {
            format!("Invalid path `{path}`: it cannot be resolved (a dangling link?).")
        })?;
        if !canonical.starts_with(&self.root) {
            return Err(format!(
                "Invalid path `{path}`: it leads outside the repository."
            ));
        }
        let mut resolved = canonical;
        for part in rest.into_iter().rev().flatten() {
            resolved.push(part);
        }
        Ok(resolved)
    }

    /// Command output with the copy's location written as `.`, so observations (tracebacks,
    /// `pwd`) are the same in every episode.
    fn relative_paths(&self, text: &str) -> String {
        let mut out = text.to_string();
        let mut roots = vec![self.root.display().to_string()];
        let raw = self.raw.display().to_string();
        if raw != roots[0] {
            roots.push(raw);
        }
        for root in roots {
            out = out.replace(&format!("{root}/"), "").replace(&root, ".");
        }
        out
    }

    fn run_tests(&self, args: &Map<String, Value>) -> std::result::Result<Observation, String> {
        check_keys(args, &["tests"])?;
        let Some(Value::Array(items)) = args.get("tests") else {
            return Err(
                "`tests` must be a list of test ids (an empty list runs all tests).".into(),
            );
        };
        if items.len() > MAX_TEST_IDS {
            return Err(format!("`tests` may name at most {MAX_TEST_IDS} ids."));
        }
        let mut ids = Vec::with_capacity(items.len());
        for item in items {
            match item.as_str().map(normalize_test_id) {
                Some(id) if is_test_id(&id) => ids.push(id),
                Some(id) => {
                    let shown: String = id.chars().take(100).collect();
                    return Err(format!(
                        "`{shown}` is not a test id; use dotted names such as `tests.test_mod.TestCase.test_name`."
                    ));
                }
                None => return Err("Every entry of `tests` must be a string.".into()),
            }
        }
        let run = exec::run_tests(
            &self.config,
            self.sandbox.as_deref(),
            &self.root,
            &ids,
            self.config.command_timeout,
            self.config.output_cap,
        )
        .map_err(|e| format!("Cannot run `{}`: {e}.", self.config.python))?;
        let count = |s: TestStatus| run.tests.values().filter(|v| **v == s).count();
        let mut summary = format!(
            "Tests: {} passed, {} failed, {} errors, {} skipped.",
            count(TestStatus::Pass),
            count(TestStatus::Fail),
            count(TestStatus::Error),
            count(TestStatus::Skipped)
        );
        let not_run: Vec<&str> = run
            .statuses
            .iter()
            .filter(|(_, s)| **s == TestStatus::NotRun)
            .map(|(id, _)| id.as_str())
            .collect();
        if !not_run.is_empty() {
            summary.push_str(&format!(
                " Not run (time limit or crash): {}.",
                not_run.join(", ")
            ));
        }
        let observation = Observation::ok(format!(
            "{}{summary}\n",
            self.relative_paths(&run.command.describe())
        ));
        // Failing tests are a normal result; a run that never finished is a failed call.
        Ok(Observation {
            error: run.command.timed_out || !not_run.is_empty(),
            ..observation
        })
    }

    fn shell(&self, args: &Map<String, Value>) -> std::result::Result<Observation, String> {
        check_keys(args, &["command"])?;
        let command = string_arg(args, "command")?;
        if command.trim().is_empty() || command.len() > 10_000 {
            return Err("`command` must be a non-empty string of at most 10000 bytes.".into());
        }
        let out = exec::run_shell(
            &self.config,
            self.sandbox.as_deref(),
            &self.root,
            command,
            self.config.command_timeout,
            self.config.output_cap,
        )
        .map_err(|e| format!("Cannot run the command: {e}."))?;
        let observation = Observation::ok(self.relative_paths(&out.describe()));
        Ok(if out.timed_out || out.status != Some(0) {
            Observation {
                error: true,
                ..observation
            }
        } else {
            observation
        })
    }
}

#[async_trait]
impl EnvSession for SweSession {
    fn tools(&self) -> Vec<ToolSpec> {
        Self::tool_specs(self.work.config.shell)
    }

    fn initial_observation(&self) -> String {
        let mut out = format!(
            "Repository `{}` is checked out in your working directory. Files:\n",
            if self.work.instance.repo.is_empty() {
                &self.work.instance.instance_id
            } else {
                &self.work.instance.repo
            }
        );
        for (shown, (path, text)) in self.work.instance.files.iter().enumerate() {
            if shown == 200 {
                out.push_str(&format!(
                    "[... {} more files]\n",
                    self.work.instance.files.len() - shown
                ));
                break;
            }
            out.push_str(&format!("  {path} ({} lines)\n", text.lines().count()));
        }
        out.push_str(
            "Tests use Python's unittest; run them with run_tests (ids like `tests.test_mod.TestCase.test_name`).",
        );
        out
    }

    async fn step(&mut self, call: &ToolCall) -> Result<Observation> {
        // File tools take microseconds; tests and shell commands take up to the time limit, so
        // they run on a blocking thread and the runtime's worker goes on with other episodes.
        let command =
            call.name == tools::RUN_TESTS || (call.name == tools::SHELL && self.work.config.shell);
        match call.arguments.as_object() {
            Some(args) if command && !self.submitted => {
                let (work, args, name) = (self.work.clone(), args.clone(), call.name.clone());
                let result = off_runtime(move || {
                    if name == tools::RUN_TESTS {
                        work.run_tests(&args)
                    } else {
                        work.shell(&args)
                    }
                })
                .await?;
                Ok(result.unwrap_or_else(Observation::error))
            }
            _ => self.step_sync(call),
        }
    }

    async fn verify(&mut self, _final_answer: Option<&str>) -> Result<Outcome> {
        let (work, submitted) = (self.work.clone(), self.submitted);
        off_runtime(move || work.verify(submitted)).await?
    }
}

/// Run blocking work on tokio's blocking pool when called inside a tokio runtime; without one
/// (e.g. under `futures::executor::block_on`) there is no shared worker to stall, so run it here.
async fn off_runtime<T: Send + 'static>(job: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => handle
            .spawn_blocking(job)
            .await
            .map_err(|e| env_error(format!("a blocking command job failed: {e}"))),
        Err(_) => Ok(job()),
    }
}

/// Whether a repository path is a test file (restored before verification): anything under a
/// `tests`/`test` directory, `test_*.py`, `*_test.py` and `conftest.py`.
pub fn is_test_path(path: &str) -> bool {
    let parts: Vec<&str> = path.split('/').collect();
    let file = parts.last().copied().unwrap_or_default();
    parts[..parts.len().saturating_sub(1)]
        .iter()
        .any(|d| *d == "tests" || *d == "test")
        || (file.starts_with("test_") && file.ends_with(".py"))
        || file.ends_with("_test.py")
        || file == "conftest.py"
}

/// `text` with the folder `root` (also named `raw`) written as `.`.
fn replace_root(text: &str, root: &Path, raw: &Path) -> String {
    let mut out = text.to_string();
    for root in [root, raw] {
        let root = root.display().to_string();
        out = out.replace(&format!("{root}/"), "").replace(&root, ".");
    }
    out
}

fn write_tree(root: &Path, files: &BTreeMap<String, String>) -> Result<()> {
    for (path, text) in files {
        check_relative_path(path).map_err(|e| env_error(format!("instance file `{path}`: {e}")))?;
        let target = root.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        }
        std::fs::write(&target, text).map_err(|e| Error::io(&target, e))?;
    }
    Ok(())
}

/// Visit files and directories under `dir` in sorted order, without following symlinks and
/// skipping hidden/cache directories; stop when `visit` returns false.
fn walk(dir: &Path, visit: &mut dyn FnMut(&Path, bool) -> bool) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return true;
    };
    let mut entries: Vec<_> = entries.filter_map(|e| e.ok()).collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let name = entry.file_name().to_string_lossy().into_owned();
        if meta.is_dir() {
            if HIDDEN_DIRS.contains(&name.as_str()) {
                continue;
            }
            if !visit(&path, true) || !walk(&path, visit) {
                return false;
            }
        } else if meta.is_file() && !visit(&path, false) {
            return false;
        }
    }
    true
}

fn check_keys(args: &Map<String, Value>, allowed: &[&str]) -> std::result::Result<(), String> {
    match args.keys().find(|k| !allowed.contains(&k.as_str())) {
        None => Ok(()),
        Some(key) => {
            let shown: String = key.chars().take(50).collect();
            Err(if allowed.is_empty() {
                format!("Unexpected argument `{shown}`; this tool takes no arguments.")
            } else {
                format!(
                    "Unexpected argument `{shown}`; expected only {}.",
                    allowed.join(", ")
                )
            })
        }
    }
}

fn string_arg<'a>(
    args: &'a Map<String, Value>,
    name: &str,
) -> std::result::Result<&'a str, String> {
    match args.get(name) {
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(format!("`{name}` must be a string.")),
        None => Err(format!("Missing required argument `{name}`.")),
    }
}

fn optional_line(
    args: &Map<String, Value>,
    name: &str,
) -> std::result::Result<Option<usize>, String> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 && n <= u32::MAX as u64 => Ok(Some(n as usize)),
            _ => Err(format!("`{name}` must be a positive integer.")),
        },
    }
}

/// Every start position of `needle` in `haystack`, overlapping ones included (so that "unique"
/// really means one place).
pub(crate) fn occurrences(haystack: &str, needle: &str) -> Vec<usize> {
    let mut found = Vec::new();
    if needle.is_empty() {
        return found;
    }
    let mut start = 0;
    while let Some(i) = haystack[start..].find(needle) {
        let at = start + i;
        found.push(at);
        let step = haystack[at..].chars().next().map_or(1, char::len_utf8);
        start = at + step;
    }
    found
}

/// Cut text to `max` bytes at a character boundary, saying how much was cut.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}\n[... {} more bytes cut]\n",
        &text[..end],
        text.len() - end
    )
}

fn exec_tail(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("[...]{}", &text[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_paths() {
        for yes in [
            "tests/test_x.py",
            "pkg/tests/helpers.py",
            "test_a.py",
            "a/b_test.py",
            "conftest.py",
        ] {
            assert!(is_test_path(yes), "{yes}");
        }
        for no in ["pkg/core.py", "testing.py", "README.md", "pkg/tests.py"] {
            assert!(!is_test_path(no), "{no}");
        }
    }

    #[test]
    fn cut_respects_char_boundaries() {
        let text = "ééééé";
        let out = cut(text, 3);
        assert!(out.starts_with('é'));
        assert!(out.contains("more bytes cut"));
        assert_eq!(exec_tail("abcdef", 3), "[...]def");
    }
}
