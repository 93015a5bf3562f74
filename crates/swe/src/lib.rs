//! A SWE-style repository-repair world.
//!
//! Each task is an instance in the SWE-Gym shape ([`SweInstance`]: an issue text, the files of
//! a Python repository, a gold patch, FAIL_TO_PASS and PASS_TO_PASS test ids). An episode gets
//! its own temporary copy of the repository and these tools:
//!
//! | tool | what it does |
//! |---|---|
//! | `view_file{path, start_line?, end_line?}` | a file with line numbers, or a directory listing |
//! | `search{pattern, path?}` | regex search over the copy, capped |
//! | `replace{path, old, new}` | replace a string that occurs exactly once |
//! | `create_file{path, content}` | create or overwrite a file |
//! | `run_tests{tests}` | run unittest ids with `python3` (empty list: all tests) |
//! | `run_shell{command}` | `sh -c` in the copy; **only offered when enabled**, see below |
//! | `submit{}` | end the episode ([`harness_core::ToolKind::Submit`]) |
//!
//! The verifier judges the final state of the copy (whether or not the policy called `submit`,
//! like SWE-agent's auto-submission; the details say whether it did) in a fresh copy built from
//! the instance's files and the policy's text files (without any test file when the call judge
//! decides; with the instance's own test files and its hidden `test_patch` for the in-process
//! runner), and judges every FAIL_TO_PASS and PASS_TO_PASS test (see below): R = 1
//! when all pass. Test runs and the verifier run on tokio's blocking pool, so a long test run
//! does not stall the other episodes on the runtime.
//!
//! # A sandbox for every command
//! Tests, shell commands and the verifier run in a bubblewrap sandbox ([`sandbox`]): no
//! network, their own pid namespace with a fresh `/proc` (nothing outlives the command, the
//! trainer's processes are not there), the system read-only, a private `/tmp`, the episode's
//! copy as the only folder of the host, an empty environment, limits on CPU seconds, address
//! space, processes and file size ([`SandboxConfig`]), an unprivileged user in a user
//! namespace made for the command, and a seccomp filter, so that nothing a run leaves in the
//! kernel (keyrings, IPC) reaches a later one. Where no sandbox can be made (bubblewrap
//! missing or failing its probe), [`SweEnv::start`] refuses with an error that says how to
//! install one, unless [`SandboxConfig::allow_unsandboxed`] is set
//! (unsafe: the policy's code then runs with the trainer's user, files, network and
//! environment). Every path a file tool takes stays inside the copy (no absolute paths, no
//! `..`, no symlink leading out).
//!
//! # The judge never shares a process with the policy's code
//! The tests import code the policy wrote, and a policy trained with RL will find any way to
//! be rewarded without fixing the bug. Any verdict produced inside the process that imports
//! that code can be forged (by impersonating the reporter, objects equal to anything,
//! unittest's internals reached through `inspect`, audit hooks, ...), so none is produced there:
//! - the verifier builds its copy from the instance's files plus the policy's UTF-8 text files,
//!   leaving out hidden and cache folders (`.git`, `__pycache__`, any dot folder: Python would
//!   import a module planted there), links, non-text files and test files the instance does
//!   not have (and, when the call judge decides, every test file: the values the tests assert
//!   would be readable there by the policy's code); the outcome's `left_out` lists what it
//!   left out; a repository with more files
//!   or bytes to copy than the instance's own plus [`SweConfig::verify_max_new_files`] and
//!   [`SweConfig::verify_max_added_bytes`] fails verification, with the reason in
//!   `copy_refused`, before anything is written;
//! - each hidden test is a list of calls ([`SweInstance::call_tests`], [`judge`]): the driver
//!   in the sandbox imports the policy's code, makes the calls and returns plain data only
//!   (each result as a tagged snapshot, each exception as its class, MRO and message, classes
//!   named by identity); it holds no expected value, key or verdict. A result cut short in the
//!   driver is an error, never compared, and a gold result cut short refuses the spec. The trainer compares the observations with the gold
//!   code's, computed once per instance from the gold-patched files in a sandbox the policy's
//!   code never reaches ([`SweEnv::gold_expectations`]); an id passes only when every step
//!   matches. The outcome's details say `"verdict": "judged"`;
//! - an instance without call specs (a user's SWE-Gym import) can be verified only by the
//!   in-process unittest runner ([`exec::run_verdict_tests`]), which the policy's code can
//!   forge; the environment refuses such an instance unless
//!   [`SweConfig::allow_in_process_verdict`] is set, and then the details say
//!   `"verdict": "in_process"` with a warning. The built-in instances all have call specs;
//! - [`tamper::scan`] lists added lines that reach for the test machinery in the details'
//!   `tamper` (a statistic of attempted tampering, not a defence: the judge does not need it).
//!
//! What this does not stop (docs/SECURITY.md has the full list): the calls mirror the repository's
//! visible tests, so code that special-cases exactly those inputs passes, as with any test
//! suite; a correct fix that adds a public attribute to an object a test compares fails; and
//! the public `run_tests` tool still runs unittest in one process, its statuses are feedback
//! the policy's code can rewrite.
//!
//! # Shell access
//! Two switches must both be on for the policy to run arbitrary commands. The environment
//! offers `run_shell` only when it is built with [`SweConfig::shell`] set (off by default);
//! and [`base_harness`] lists the tools it shows in `tool_view.include` without `run_shell`,
//! so a harness enables the shell by adding it there (a harness that names `run_shell` for an
//! environment without it fails validation with a clear error). A harness with no `include`
//! list shows every tool the environment offers. Shell commands run in the same sandbox as the
//! tests.
//!
//! ```no_run
//! use harness_swe::{self as swe, SweEnv};
//! use harness_core::{Environment, Split, run_episode};
//!
//! # async fn demo() -> harness_core::Result<()> {
//! let env = SweEnv::builtin();
//! let task = env.tasks(Split::Train)?.remove(0);
//! let oracle = env.oracle(&task)?;
//! let trajectory = run_episode(&oracle, &swe::base_harness(), &env, &task, 0).await?;
//! assert!(trajectory.is_success());
//! # Ok(()) }
//! ```

mod builtin;
pub mod diff;
pub mod exec;
mod instance;
pub mod judge;
pub mod labels;
mod oracle;
use harness_sandbox as sandbox;
mod session;
pub mod tamper;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use harness_core::{
    EnvSession, Environment, Error, Harness, HookAction, HookEvent, HookSpec, Result, Split, Task,
};
use harness_pool::sibling::{hook_spec as hook, one_hook_sibling};
use serde_json::json;

pub use builtin::{PAIR_SEED, builtin_instances, discover_test_ids};
pub use exec::{CommandOutput, TestRun, TestStatus};
pub use instance::{SweInstance, check_relative_path, is_test_id, load_jsonl, normalize_test_id};
pub use oracle::{OraclePolicy, oracle_calls};
pub use sandbox::{Sandbox, SandboxConfig};
pub use session::{SweSession, is_test_path, tools};
pub use tamper::TamperFinding;

/// The environment's name ([`Task::env`] of its tasks).
pub const ENV_NAME: &str = "swe";

/// Settings of the environment.
#[derive(Debug, Clone, PartialEq)]
pub struct SweConfig {
    /// The Python interpreter (`python3`).
    pub python: String,
    /// Offer the `run_shell` tool (off by default; see the module docs).
    pub shell: bool,
    /// Time limit of a `run_tests` or `run_shell` call.
    pub command_timeout: Duration,
    /// Time limit of the verifier's test run.
    pub verify_timeout: Duration,
    /// Bytes of command output kept (the rest is dropped and counted).
    pub output_cap: usize,
    /// Lines shown by one `view_file` call.
    pub max_view_lines: usize,
    /// Matches shown by one `search` call.
    pub max_search_results: usize,
    /// The largest file the tools read or write, in bytes; also the largest file of the
    /// policy's the verifier copies (a larger one is left out, listed in `left_out`).
    pub max_file_bytes: usize,
    /// Files the verifier's copy may hold beyond the instance's own number (default 1,000).
    /// A repository with more to copy fails verification without running a test; the
    /// outcome's `copy_refused` says which cap and where (the copy is made on the host's
    /// disk, so without a cap a policy could fill it).
    pub verify_max_new_files: usize,
    /// Bytes the verifier's copy may hold beyond the instance's own files' total (default
    /// 32 MiB, at least `max_file_bytes`); more fails verification like
    /// `verify_max_new_files`.
    pub verify_max_added_bytes: u64,
    /// Start Python without the `site` module (`-S`): no site-packages, about 30 ms faster
    /// per run. Right for repositories that need only the standard library (the built-in
    /// ones); leave it off for repositories with third-party dependencies.
    pub no_site: bool,
    /// The sandbox every command of the policy's runs in (see [`sandbox`]).
    pub sandbox: SandboxConfig,
    /// Verify instances that have no call specs (`call_tests`) with the in-process unittest
    /// runner ([`exec::run_verdict_tests`]). Off by default: that runner judges inside the
    /// process that imports the policy's code, so the policy's code can forge its verdict
    /// (the outcome's details say `"verdict": "in_process"` and why). Instances with call specs,
    /// the built-in ones among them, are always judged outside that process ([`judge`]).
    pub allow_in_process_verdict: bool,
}

impl SweConfig {
    /// Check every setting; the error names the field (`swe.<field>`) and what was expected.
    pub fn check(&self) -> Result<()> {
        let positive = |field: &str, ok: bool, what: &str| {
            if ok {
                Ok(())
            } else {
                Err(Error::invalid(format!("swe.{field}"), what.to_string()))
            }
        };
        positive(
            "python",
            !self.python.trim().is_empty(),
            "must name a Python interpreter, such as `python3`",
        )?;
        positive(
            "command_timeout",
            !self.command_timeout.is_zero(),
            "must be longer than zero",
        )?;
        positive(
            "verify_timeout",
            !self.verify_timeout.is_zero(),
            "must be longer than zero",
        )?;
        positive("output_cap", self.output_cap > 0, "must be at least 1 byte")?;
        positive(
            "max_view_lines",
            self.max_view_lines > 0,
            "must be at least 1",
        )?;
        positive(
            "max_search_results",
            self.max_search_results > 0,
            "must be at least 1",
        )?;
        positive(
            "max_file_bytes",
            self.max_file_bytes > 0,
            "must be at least 1 byte",
        )?;
        if self.verify_max_new_files == 0 {
            return Err(Error::invalid(
                "swe.verify_max_new_files",
                "must be at least 1 (files the verifier's copy may hold beyond the instance's own), got 0",
            ));
        }
        if self.verify_max_added_bytes < self.max_file_bytes as u64 {
            return Err(Error::invalid(
                "swe.verify_max_added_bytes",
                format!(
                    "must be at least `swe.max_file_bytes` ({} bytes), so that one new file of \
                     the largest size fits, got {}",
                    self.max_file_bytes, self.verify_max_added_bytes
                ),
            ));
        }
        self.sandbox
            .check("swe.sandbox")
            .map_err(|(field, message)| Error::invalid(field, message))
    }
}

impl Default for SweConfig {
    fn default() -> Self {
        SweConfig {
            python: "python3".to_string(),
            shell: false,
            command_timeout: Duration::from_secs(20),
            verify_timeout: Duration::from_secs(60),
            output_cap: 12_000,
            max_view_lines: 300,
            max_search_results: 50,
            max_file_bytes: 512 * 1024,
            verify_max_new_files: 1_000,
            verify_max_added_bytes: 32 << 20,
            no_site: false,
            sandbox: SandboxConfig::default(),
            allow_in_process_verdict: false,
        }
    }
}

/// The repository-repair environment: a set of instances with splits, served as tasks.
///
/// It refuses to start an episode (or validate an instance) when its settings are invalid or
/// no sandbox can be made, unless [`SandboxConfig::allow_unsandboxed`] is set; the sandbox is
/// probed once, on first use ([`SweEnv::sandbox`]).
#[derive(Debug, Clone)]
pub struct SweEnv {
    instances: BTreeMap<String, Arc<SweInstance>>,
    config: Arc<SweConfig>,
    sandbox: Arc<OnceLock<std::result::Result<Option<Arc<Sandbox>>, Refusal>>>,
    /// The gold code's observations of each instance's call specs, computed on first use.
    gold: Arc<std::sync::Mutex<BTreeMap<String, GoldCell>>>,
}

/// One instance's expected observations, computed on first use ([`judge::gold_expectations`])
/// and kept once computed (a failed computation, e.g. a time limit under load, is retried).
pub(crate) type GoldCell = Arc<std::sync::Mutex<Option<Arc<judge::Expectations>>>>;

/// Why no episode can start, kept to answer every later call alike.
#[derive(Debug, Clone)]
enum Refusal {
    /// A setting is invalid: the field and what was expected.
    Invalid(harness_core::Location, String),
    /// No sandbox can be made, and running without one is not allowed.
    NoSandbox(String),
}

impl SweEnv {
    /// The built-in instances ([`builtin_instances`]) with the default configuration, except
    /// that Python starts without `site` (the built-in repositories need only the standard
    /// library).
    pub fn builtin() -> Self {
        Self::from_instances(builtin_instances())
            .unwrap_or_else(|e| unreachable!("built-in instances are valid: {e}"))
            .with_config(SweConfig {
                no_site: true,
                ..SweConfig::default()
            })
    }

    /// An environment serving `instances` (ids must be unique and each instance well formed).
    pub fn from_instances(instances: Vec<SweInstance>) -> Result<Self> {
        let mut map = BTreeMap::new();
        for (i, instance) in instances.into_iter().enumerate() {
            instance.check().map_err(|(field, message)| {
                Error::invalid(format!("instances[{i}].{field}"), message)
            })?;
            let id = instance.instance_id.clone();
            if map.insert(id.clone(), Arc::new(instance)).is_some() {
                return Err(Error::invalid(
                    format!("instances[{i}].instance_id"),
                    format!("`{id}` is used twice; expected unique ids"),
                ));
            }
        }
        Ok(SweEnv {
            instances: map,
            config: Arc::new(SweConfig::default()),
            sandbox: Arc::default(),
            gold: Arc::default(),
        })
    }

    /// Instances from a JSONL file in the SWE-Gym shape (see [`load_jsonl`]); those without
    /// a `split` field go to `default_split`.
    pub fn load(path: impl AsRef<Path>, default_split: Split) -> Result<Self> {
        let path = path.as_ref();
        Self::from_instances(load_jsonl(path, default_split)?).map_err(|e| e.in_file(path))
    }

    /// The same environment with another configuration.
    pub fn with_config(mut self, config: SweConfig) -> Self {
        self.config = Arc::new(config);
        self.sandbox = Arc::default();
        self.gold = Arc::default();
        self
    }

    /// The sandbox the policy's commands run in, probed on the first call: `Ok(None)` only
    /// when none can be made and [`SandboxConfig::allow_unsandboxed`] is set. `Err` when a
    /// setting is invalid, or when no sandbox can be made and running without one is not
    /// allowed (the message says how to install bubblewrap). Blocks for the probe (a fraction
    /// of a second) on the first call.
    pub fn sandbox(&self) -> Result<Option<Arc<Sandbox>>> {
        let config = &self.config;
        let probed = self.sandbox.get_or_init(|| {
            if let Err(e) = config.check() {
                return Err(match e {
                    Error::Invalid { location, message } => Refusal::Invalid(location, message),
                    other => Refusal::NoSandbox(other.to_string()),
                });
            }
            match Sandbox::new(&config.sandbox, &config.python) {
                Ok(sandbox) => Ok(Some(Arc::new(sandbox))),
                Err(_) if config.sandbox.allow_unsandboxed => Ok(None),
                Err(message) => Err(Refusal::NoSandbox(message)),
            }
        });
        match probed {
            Ok(sandbox) => Ok(sandbox.clone()),
            Err(Refusal::Invalid(location, message)) => Err(Error::Invalid {
                location: location.clone(),
                message: message.clone(),
            }),
            Err(Refusal::NoSandbox(message)) => Err(Error::Environment {
                env: ENV_NAME.to_string(),
                message: format!(
                    "the repository-repair world runs the policy's code only in a sandbox, and none can be made: {message}"
                ),
            }),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SweConfig {
        &self.config
    }

    /// Every instance, by id.
    pub fn instances(&self) -> impl Iterator<Item = &SweInstance> {
        self.instances.values().map(Arc::as_ref)
    }

    /// One instance.
    pub fn instance(&self, instance_id: &str) -> Option<&SweInstance> {
        self.instances.get(instance_id).map(Arc::as_ref)
    }

    /// The task of an instance: id `swe/<instance_id>`, the problem statement as instruction,
    /// and in the metadata (never shown to the policy) the test lists and the gold patch.
    pub fn task_for(instance: &SweInstance) -> Task {
        let seed = instance
            .instance_id
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
        let mut task = Task::new(
            format!("{ENV_NAME}/{}", instance.instance_id),
            ENV_NAME,
            instance.split,
            instance.problem_statement.clone(),
            seed,
        );
        task.metadata = json!({
            "instance_id": instance.instance_id,
            "repo": instance.repo,
            "FAIL_TO_PASS": instance.fail_to_pass,
            "PASS_TO_PASS": instance.pass_to_pass,
            "patch": instance.patch,
        });
        task
    }

    fn lookup(&self, task: &Task) -> Result<Arc<SweInstance>> {
        let id = task
            .metadata
            .get("instance_id")
            .and_then(|v| v.as_str())
            .or_else(|| task.id.strip_prefix("swe/"))
            .unwrap_or(&task.id);
        self.instances
            .get(id)
            .cloned()
            .ok_or_else(|| Error::Environment {
                env: ENV_NAME.to_string(),
                message: format!(
                    "task `{}` names instance `{id}`, which this environment does not have",
                    task.id
                ),
            })
    }

    /// Start an episode as a concrete [`SweSession`] (what [`Environment::reset`] boxes).
    /// The seed does not change the initial state: an instance has one repository.
    pub fn start(&self, task: &Task) -> Result<SweSession> {
        let sandbox = self.sandbox()?;
        let instance = self.lookup(task)?;
        self.check_verdict(&instance)?;
        let gold = self.gold_cell(&instance.instance_id);
        SweSession::create(instance, Arc::clone(&self.config), sandbox, gold)
    }

    /// Refuse an instance without call specs unless the in-process verdict is allowed.
    fn check_verdict(&self, instance: &SweInstance) -> Result<()> {
        if instance.call_tests.is_empty() && !self.config.allow_in_process_verdict {
            return Err(Error::invalid(
                "swe.allow_in_process_verdict",
                format!(
                    "instance `{}` has no call specs (`call_tests`), so only the in-process unittest runner could verify it, and the policy's code can forge that runner's verdict; give the instance `call_tests`, or set swe.allow_in_process_verdict = true to accept a forgeable verdict",
                    instance.instance_id
                ),
            ));
        }
        Ok(())
    }

    fn gold_cell(&self, instance_id: &str) -> GoldCell {
        let mut cells = self.gold.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(cells.entry(instance_id.to_string()).or_default())
    }

    /// The gold code's observations of an instance's call specs (computed once, in a sandbox
    /// the policy's code never reaches). `Err` when the gold code does not run them as written.
    pub fn gold_expectations(&self, instance_id: &str) -> Result<Arc<judge::Expectations>> {
        let instance =
            self.instances.get(instance_id).cloned().ok_or_else(|| {
                Error::invalid("instance_id", format!("no instance `{instance_id}`"))
            })?;
        let sandbox = self.sandbox()?;
        gold_of(
            &self.gold_cell(instance_id),
            &self.config,
            sandbox.as_deref(),
            &instance,
        )
        .map_err(|message| Error::Environment {
            env: ENV_NAME.to_string(),
            message: format!("instance `{instance_id}`: {message}"),
        })
    }

    /// The oracle policy of a task (replays the gold patch through the tools, then submits).
    pub fn oracle(&self, task: &Task) -> Result<OraclePolicy> {
        let instance = self.lookup(task)?;
        OraclePolicy::new(&instance).map_err(|message| Error::Environment {
            env: ENV_NAME.to_string(),
            message: format!("instance `{}`: {message}", instance.instance_id),
        })
    }

    /// Check an instance against `python3`: before the gold patch every FAIL_TO_PASS test must
    /// fail and every PASS_TO_PASS test pass; after it (and the test patch) all must pass.
    pub fn validate_instance(&self, instance_id: &str) -> Result<InstanceReport> {
        let instance =
            self.instances.get(instance_id).cloned().ok_or_else(|| {
                Error::invalid("instance_id", format!("no instance `{instance_id}`"))
            })?;
        let sandbox = self.sandbox()?;
        let io = |e: std::io::Error| Error::Environment {
            env: ENV_NAME.to_string(),
            message: format!("cannot run `{}`: {e}", self.config.python),
        };
        self.check_verdict(&instance)?;
        let gold = if instance.call_tests.is_empty() {
            None
        } else {
            Some(self.gold_expectations(instance_id)?)
        };
        let run = |files: &BTreeMap<String, String>| -> Result<TestRun> {
            let dir = tempfile::tempdir().map_err(|e| Error::io(std::env::temp_dir(), e))?;
            let root = dir
                .path()
                .canonicalize()
                .map_err(|e| Error::io(dir.path(), e))?;
            for (path, text) in files {
                let target = root.join(path);
                if let Some(parent) = target.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
                }
                std::fs::write(&target, text).map_err(|e| Error::io(&target, e))?;
            }
            let ids = instance.all_tests();
            match &gold {
                Some(gold) => {
                    let calls = judge::run_calls(
                        &self.config,
                        sandbox.as_deref(),
                        &root,
                        &instance.call_tests,
                        &ids,
                        self.config.verify_timeout,
                        self.config.output_cap,
                    )
                    .map_err(io)?;
                    Ok(judge::judge(&ids, gold, calls))
                }
                None => exec::run_verdict_tests(
                    &self.config,
                    sandbox.as_deref(),
                    &root,
                    &ids,
                    self.config.verify_timeout,
                    self.config.output_cap,
                )
                .map_err(io),
            }
        };
        let invalid = |message: String| Error::invalid(format!("{instance_id}.patch"), message);
        let mut before_files = instance.files.clone();
        if !instance.test_patch.trim().is_empty() {
            diff::apply_to_files(&mut before_files, &instance.test_patch).map_err(invalid)?;
        }
        let after_files = instance.fixed_files(true).map_err(invalid)?;
        let before = run(&before_files)?;
        let after = run(&after_files)?;
        let status = |run: &TestRun, id: &String| {
            run.statuses.get(id).copied().unwrap_or(TestStatus::NotRun)
        };
        let why = |run: &TestRun, id: &String| match run.problems.get(id) {
            Some(problems) if !problems.is_empty() => format!(" ({})", problems.join("; ")),
            _ => String::new(),
        };
        let mut problems = Vec::new();
        for id in &instance.fail_to_pass {
            if status(&before, id) == TestStatus::Pass {
                problems.push(format!("FAIL_TO_PASS {id} passes before the patch"));
            }
        }
        for id in &instance.pass_to_pass {
            let s = status(&before, id);
            if s != TestStatus::Pass {
                problems.push(format!(
                    "PASS_TO_PASS {id} is {} before the patch{}",
                    s.as_str(),
                    why(&before, id)
                ));
            }
        }
        for id in instance.all_tests() {
            let s = status(&after, &id);
            if s != TestStatus::Pass {
                problems.push(format!(
                    "{id} is {} after the patch{}",
                    s.as_str(),
                    why(&after, &id)
                ));
            }
        }
        Ok(InstanceReport {
            instance_id: instance_id.to_string(),
            problems,
            before,
            after,
        })
    }
}

/// The expected observations in `cell`, computed on first use from the gold code.
pub(crate) fn gold_of(
    cell: &GoldCell,
    config: &SweConfig,
    sandbox: Option<&Sandbox>,
    instance: &SweInstance,
) -> std::result::Result<Arc<judge::Expectations>, String> {
    // Held while computing, so concurrent first uses compute once.
    let mut slot = cell.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(gold) = slot.as_ref() {
        return Ok(Arc::clone(gold));
    }
    let gold = Arc::new(judge::gold_expectations(config, sandbox, instance)?);
    *slot = Some(Arc::clone(&gold));
    Ok(gold)
}

/// What [`SweEnv::validate_instance`] found.
#[derive(Debug, Clone)]
pub struct InstanceReport {
    /// The instance.
    pub instance_id: String,
    /// Every violation (empty when the instance is sound).
    pub problems: Vec<String>,
    /// The test run on the original repository.
    pub before: TestRun,
    /// The test run after the gold patch.
    pub after: TestRun,
}

#[async_trait]
impl Environment for SweEnv {
    fn name(&self) -> &str {
        ENV_NAME
    }

    async fn reset(&self, task: &Task, _seed: u64) -> Result<Box<dyn EnvSession>> {
        Ok(Box::new(self.start(task)?))
    }

    fn tasks(&self, split: Split) -> Result<Vec<Task>> {
        Ok(self
            .instances
            .values()
            .filter(|i| i.split == split)
            .map(|i| Self::task_for(i))
            .collect())
    }
}

/// The tools [`base_harness`] shows: every tool except `run_shell`.
pub const BASE_TOOLS: &[&str] = &[
    tools::VIEW,
    tools::SEARCH,
    tools::REPLACE,
    tools::CREATE,
    tools::RUN_TESTS,
    tools::SUBMIT,
];

/// The base harness H0 of the repair world: a system prompt describing the job and the
/// workflow (slots `workflow` and `editing` for sibling edits to extend), the default limits,
/// and a tool view without `run_shell`.
pub fn base_harness() -> Harness {
    let mut harness = Harness::new(
        "swe-H0",
        "You are a software engineer fixing an issue in a Python repository. The repository is \
         checked out in a working directory that only you use; the issue text comes next.\n\n\
         How to work:\n{workflow}\n\nEditing files:\n{editing}\n\n\
         You may take at most {max_env_actions} tool actions. Call one tool per message with \
         <tool_call>{{\"name\": ..., \"arguments\": {{...}}}}</tool_call>. When the fix is \
         in place, call `submit`.",
    );
    harness.description =
        "Base harness for SWE-style repository repair: read, edit, test, submit.".to_string();
    harness.prompt.slots.insert(
        "workflow".to_string(),
        "1. Find the code the issue is about (search, view_file).\n\
         2. Understand why it misbehaves; the existing tests show what is expected.\n\
         3. Change the code, not the tests, with the smallest edit that fixes the issue.\n\
         4. Run the relevant tests with run_tests and make sure nothing else broke."
            .to_string(),
    );
    harness.prompt.slots.insert(
        "editing".to_string(),
        "`replace` needs the exact text to change, including indentation, and it must occur \
         once in the file; view the lines first and copy them."
            .to_string(),
    );
    harness.tool_view.include = Some(BASE_TOOLS.iter().map(|t| t.to_string()).collect());
    harness
}

/// Built-in siblings of [`base_harness`], each with hooks that can fire in the repair world
/// (whose observations are never paginated) within its limits:
/// - `swe-test-before-submit`: refuses `submit` until `run_tests` has run without error;
/// - `swe-edit-recovery`: after a failed tool call, how to make `replace` and paths work;
/// - `swe-low-budget`: with three actions left, stop exploring and submit the fix.
pub fn siblings() -> Vec<Harness> {
    let base = base_harness();
    let sibling = |name: &str, description: &str, hook: &str, spec: HookSpec| {
        one_hook_sibling(&base, name, description, hook, spec)
    };
    vec![
        sibling(
            "swe-test-before-submit",
            "Holds back submission until the tests have been run.",
            "test-before-submit",
            hook(
                HookAction::Require,
                HookEvent::BeforeFinish,
                "tool_called",
                json!({"name": session::tools::RUN_TESTS}),
                "Run the tests that cover your change with run_tests before submitting, and make sure they pass.",
            ),
        ),
        sibling(
            "swe-edit-recovery",
            "Explains how to recover from a failed edit or lookup.",
            "edit-recovery",
            hook(
                HookAction::Warn,
                HookEvent::OnError,
                "tool_error",
                json!({}),
                "The last step failed; read the error. Call one tool per reply in a <tool_call> block. For replace, view the lines first and copy `old` exactly, with its indentation, and include enough lines that it occurs once; paths are relative to the repository root.",
            ),
        ),
        sibling(
            "swe-low-budget",
            "Warns when few actions remain so that the fix is submitted.",
            "low-budget-submit",
            hook(
                HookAction::Warn,
                HookEvent::AfterTool,
                "remaining_steps_lte",
                json!({"threshold": 3}),
                "Only a few actions are left. Stop exploring: make the edit you are most sure of, run the failing test once if you can, and call submit.",
            ),
        ),
    ]
}

// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
