//! Agent programs as harnesses: an [`ExternalHarness`] is a command line with limits, run once
//! per episode by a [`ProgramRunner`] against an environment server session and a recording
//! proxy episode.
//!
//! ```json
//! {"kind": "external", "name": "my-agent", "command": ["python3", "agent.py"],
//!  "env": {"AGENT_STYLE": "terse"},
//!  "limits": {"max_model_calls": 15, "max_env_actions": 15, "timeout_s": 120}}
//! ```
//!
//! The program is started with an empty environment plus `PATH` (the runner's setting), the
//! harness's `env`, and:
//!
//! | variable | value |
//! | --- | --- |
//! | `HARNESS_ENV_URL` | the environment server (`http://127.0.0.1:port`) |
//! | `HARNESS_SESSION_ID` | the episode's session; `GET $HARNESS_ENV_URL/v1/sessions/$HARNESS_SESSION_ID/episode` gives the task, the initial observation and the tools |
//! | `HARNESS_SESSION_TOKEN` | the session's token, sent as `Authorization: Bearer <token>`: it authorises this session's `episode`, `step` and `finish`, nothing else |
//! | `HARNESS_PROXY_URL`, `OPENAI_BASE_URL` | the recording proxy's OpenAI base URL (`.../v1`) |
//! | `HARNESS_PROXY_KEY`, `OPENAI_API_KEY` | the episode's key |
//! | `HARNESS_MODEL` | the model name to send |
//! | `HARNESS_LIMITS` | the limits as JSON |
//! | `HARNESS_TASK_ID`, `HARNESS_SEED` | the task and the episode seed |
//!
//! The program acts through the session (steps) and the proxy (model calls) and finishes the
//! session (`POST .../finish`), which runs the verifier on the server. The episode is a
//! failure, with [`harness_core::Termination::ProgramFailed`] and the reason in the outcome's
//! details (`{"external": {"failure", "reason", "exit_code", "stderr_tail"}}`), when the
//! program exits with an error or a signal (`crashed`), runs past `timeout_s` (`timed_out`:
//! it is killed), exits without finishing its session (`unfinished`) or its session is gone
//! when the runner reads it (`session_gone`: closed or expired). The program runs in its own
//! process group, and the whole group is killed when the program ends, however it ends.
//!
//! # Confined to its episode
//! The runner alone opens the session, reads its outcome and closes it, with the environment
//! server's runner token ([`ProgramEnv`] sets one; see [`crate::envserver`]'s authority). The
//! program holds its session's token and its proxy episode's key: it can step and finish its
//! own session and call the policy for its own episode, nothing else: no task lists, no other
//! sessions, no verdict (`finish` answers it `"outcome": null`; the verifier's details stay
//! with the runner). Whatever it does, only its own episode fails: both servers bound its
//! requests in flight and their time, and a session it cannot finish or that is gone is a
//! failed episode with the reason, never an error of the run.
//!
//! # The sandbox
//! With [`RunnerSettings::sandbox`] set (made by [`program_sandbox`]), the program runs inside
//! the sandbox of policy-caused commands (`harness_sandbox`): bubblewrap
//! namespaces, resource limits and, when the runner is root, a user of its own. It then sees
//! the system read-only, a private `/tmp`, a fresh working folder of its own (its current
//! folder, removed after the episode), and, read-only, each command argument that names an
//! existing file, that file alone (a path relative to the runner's current folder is handed
//! to the program made absolute): `["python3", "agent.py"]` runs its script, and the folder
//! the script lies in (a checkout, a run folder with instance files) is not there. A program
//! of several files names each in its command or ships as one (a Python zipapp). Its
//! environment is the sandbox's (`PATH` with the sandbox's Python first, `HOME=/tmp`, ...)
//! plus the harness's `env` and the variables above; the sandbox's `PATH` is kept. It runs in
//! a pid namespace of its own: when it ends, or is killed, the kernel kills everything it
//! left inside, a child that called `setsid` included.
//!
//! Its network is a namespace of its own where only the environment server and the proxy are
//! reachable, at the URLs it is handed ([`crate::relay`]: a forwarder inside relays
//! `127.0.0.1:<port>` to Unix sockets bound from the host, where a relay connects them to the
//! servers); the host's other loopback services and the network are not. A sandbox built
//! with [`SandboxConfig::share_network`] set gives the program the host's network instead
//! (no relay). Without a sandbox, a program runs with the runner's user, files and network,
//! and a process that leaves the group with `setsid` outlives the episode.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use harness_core::{
    EnvSession, Environment, Harness, HarnessId, Limits, Location, Outcome, Policy, ProgramSpec,
    SamplingParams, Split, Task, Termination, Trajectory,
};
use harness_sandbox::{Sandbox, SandboxConfig, UidLease};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use crate::envserver::SessionStatus;
use crate::envserver::client::RemoteEnv;
use crate::envserver::server::{EnvServer, EnvServerConfig, EnvServerHandle};
use crate::error::{Error, Result};
use crate::proxy::{
    EpisodeEnd, EpisodeRecord, EpisodeSpec, ProxyConfig, ProxyHandle, RecordingProxy,
};
use crate::relay::{FORWARDER, Relay};

/// The `kind` of an external pool member.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExternalKind {
    /// An agent program.
    #[default]
    External,
}

/// The limits of one run of a program.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgramLimits {
    /// Model calls through the proxy.
    #[serde(default = "default_model_calls")]
    pub max_model_calls: u32,
    /// Steps on the environment session.
    #[serde(default = "default_env_actions")]
    pub max_env_actions: u32,
    /// Prompt tokens per call.
    #[serde(default = "default_context_tokens")]
    pub max_context_tokens: u32,
    /// Generated tokens per call.
    #[serde(default = "default_output_tokens")]
    pub max_output_tokens: u32,
    /// Wall-clock seconds before the program is killed.
    #[serde(default = "default_timeout_s")]
    pub timeout_s: f64,
}

fn default_model_calls() -> u32 {
    Limits::default().max_model_calls
}
fn default_env_actions() -> u32 {
    Limits::default().max_env_actions
}
fn default_context_tokens() -> u32 {
    Limits::default().max_context_tokens
}
fn default_output_tokens() -> u32 {
    Limits::default().max_output_tokens
}
fn default_timeout_s() -> f64 {
    300.0
}

impl Default for ProgramLimits {
    fn default() -> Self {
        ProgramLimits {
            max_model_calls: default_model_calls(),
            max_env_actions: default_env_actions(),
            max_context_tokens: default_context_tokens(),
            max_output_tokens: default_output_tokens(),
            timeout_s: default_timeout_s(),
        }
    }
}

impl ProgramLimits {
    /// The episode limits the proxy enforces.
    pub fn episode_limits(&self) -> Limits {
        Limits {
            max_model_calls: self.max_model_calls,
            max_env_actions: self.max_env_actions,
            max_context_tokens: self.max_context_tokens,
            max_output_tokens: self.max_output_tokens,
        }
    }
}

/// An agent program as a pool member (see the module docs for what it is handed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalHarness {
    /// Always `external`.
    pub kind: ExternalKind,
    /// A human name.
    pub name: String,
    /// What it is.
    #[serde(default)]
    pub description: String,
    /// The program and its arguments.
    pub command: Vec<String>,
    /// Extra environment variables (names starting with `HARNESS_` are the runner's).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Its limits.
    #[serde(default)]
    pub limits: ProgramLimits,
}

fn invalid(file: Option<&Path>, path: &str, message: impl Into<String>) -> Error {
    let mut location = Location::at(path);
    if let Some(file) = file {
        location = location.in_file(file);
    }
    Error::Core(harness_core::Error::Invalid {
        location,
        message: message.into(),
    })
}

impl ExternalHarness {
    /// Parse and validate JSON; errors name `file` (when given), the field and what was
    /// expected.
    pub fn from_json(text: &str, file: Option<&Path>) -> Result<Self> {
        let de = &mut serde_json::Deserializer::from_str(text);
        let harness: ExternalHarness = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let mut location = Location::at(path);
            if let Some(file) = file {
                location = location.in_file(file);
            }
            Error::Core(harness_core::Error::Parse {
                location,
                message: format!(
                    "{} (an external harness is {{\"kind\": \"external\", \"name\", \"command\": [...], \"env\": {{...}}, \"limits\": {{...}}}})",
                    e.into_inner()
                ),
            })
        })?;
        harness.validate_in(file)?;
        Ok(harness)
    }

    /// Read and validate a file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::Core(harness_core::Error::Io {
                path: path.to_path_buf(),
                source: e,
            })
        })?;
        Self::from_json(&text, Some(path))
    }

    /// Check the command, the variables and the limits.
    pub fn validate(&self) -> Result<()> {
        self.validate_in(None)
    }

    fn validate_in(&self, file: Option<&Path>) -> Result<()> {
        if self.name.trim().is_empty() {
            return Err(invalid(file, "name", "expected a non-empty name"));
        }
        match self.command.first() {
            None => {
                return Err(invalid(
                    file,
                    "command",
                    "expected the program and its arguments, e.g. [\"python3\", \"agent.py\"], got an empty list",
                ));
            }
            Some(program) if program.trim().is_empty() => {
                return Err(invalid(
                    file,
                    "command[0]",
                    "expected a program, got an empty string",
                ));
            }
            _ => {}
        }
        if let Some(i) = self.command.iter().position(|a| a.contains('\0')) {
            return Err(invalid(
                file,
                &format!("command[{i}]"),
                "contains a NUL byte",
            ));
        }
        for (name, value) in &self.env {
            let path = format!("env.{name}");
            if name.is_empty() || name.contains('=') || name.contains('\0') || value.contains('\0')
            {
                return Err(invalid(
                    file,
                    &path,
                    "expected a variable name without `=` or NUL bytes, and a value without NUL bytes",
                ));
            }
            if name.starts_with("HARNESS_") || name == "OPENAI_BASE_URL" || name == "OPENAI_API_KEY"
            {
                return Err(invalid(
                    file,
                    &path,
                    "the runner sets HARNESS_*, OPENAI_BASE_URL and OPENAI_API_KEY itself",
                ));
            }
        }
        let l = &self.limits;
        for (field, value) in [
            ("limits.max_model_calls", l.max_model_calls),
            ("limits.max_env_actions", l.max_env_actions),
            ("limits.max_context_tokens", l.max_context_tokens),
            ("limits.max_output_tokens", l.max_output_tokens),
        ] {
            if value == 0 {
                return Err(invalid(file, field, "expected at least 1"));
            }
        }
        if !(l.timeout_s.is_finite() && l.timeout_s > 0.0) {
            return Err(invalid(
                file,
                "limits.timeout_s",
                format!(
                    "expected a number of seconds above zero, got {}",
                    l.timeout_s
                ),
            ));
        }
        Ok(())
    }

    /// The harness as a pool member: a [`Harness`] whose [`Harness::program`] is set (its
    /// prompt unused), with these limits.
    pub fn to_harness(&self) -> Harness {
        let mut harness = Harness::new(
            self.name.clone(),
            "(an external agent program: its prompts are its own)",
        );
        harness.description = self.description.clone();
        harness.limits = self.limits.episode_limits();
        harness.program = Some(ProgramSpec {
            command: self.command.clone(),
            env: self.env.clone(),
            timeout_s: self.limits.timeout_s,
        });
        harness
    }

    /// The external harness a pool member describes; an error naming `program` when it is not
    /// one.
    pub fn from_harness(harness: &Harness) -> Result<Self> {
        let program = harness.program.as_ref().ok_or_else(|| {
            invalid(
                None,
                "program",
                format!("harness `{}` is not an agent program", harness.name),
            )
        })?;
        let external = ExternalHarness {
            kind: ExternalKind::External,
            name: harness.name.clone(),
            description: harness.description.clone(),
            command: program.command.clone(),
            env: program.env.clone(),
            limits: ProgramLimits {
                max_model_calls: harness.limits.max_model_calls,
                max_env_actions: harness.limits.max_env_actions,
                max_context_tokens: harness.limits.max_context_tokens,
                max_output_tokens: harness.limits.max_output_tokens,
                timeout_s: program.timeout_s,
            },
        };
        external.validate()?;
        Ok(external)
    }

    /// The pool member's id ([`Harness::id`] of [`ExternalHarness::to_harness`]): a content
    /// hash of the command, variables and limits, not of the name.
    pub fn id(&self) -> HarnessId {
        self.to_harness().id()
    }
}

/// How a program run failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgramFailure {
    /// It exited with an error status or was ended by a signal.
    Crashed,
    /// It ran past its `timeout_s` and was killed.
    TimedOut,
    /// It exited without finishing its session.
    Unfinished,
    /// Its session was gone when the runner read the outcome (closed or expired).
    SessionGone,
}

/// What happened to the process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgramRun {
    /// The process id (also its process group's id); under a sandbox, bubblewrap's.
    pub pid: u32,
    /// Its exit code (`None` when a signal ended it).
    pub exit_code: Option<i32>,
    /// How it failed, if it did.
    pub failure: Option<ProgramFailure>,
    /// Why, in words.
    pub reason: Option<String>,
    /// Seconds it ran.
    pub seconds: f64,
    /// The end of what it wrote to stderr.
    pub stderr_tail: String,
}

/// One episode of a program: its trajectory, the proxy's record and the process's fate.
#[derive(Debug, Clone)]
pub struct ProgramEpisode {
    /// The trajectory (turns as the proxy recorded them, the verifier's outcome or the
    /// failure).
    pub trajectory: Trajectory,
    /// The proxy's record (prefix-check counts included).
    pub record: EpisodeRecord,
    /// The process.
    pub run: ProgramRun,
}

/// Settings of a [`ProgramRunner`].
#[derive(Debug, Clone)]
pub struct RunnerSettings {
    /// `PATH` for programs (the binary hands in its own; this crate reads no variables).
    pub path: String,
    /// The most bytes of stderr kept.
    pub stderr_tail_bytes: usize,
    /// The sandbox programs run in ([`program_sandbox`]; see the module docs), or `None` to
    /// run them directly with the runner's user, files and network (`path` applies only then).
    pub sandbox: Option<Arc<Sandbox>>,
}

impl Default for RunnerSettings {
    /// Programs sandboxed when bubblewrap works here ([`default_sandbox`]), else unsandboxed.
    fn default() -> Self {
        RunnerSettings {
            path: "/usr/local/bin:/usr/bin:/bin".into(),
            stderr_tail_bytes: 4096,
            sandbox: default_sandbox().ok(),
        }
    }
}

impl RunnerSettings {
    /// Which sandbox programs run in, in words for reports and `run.json`: `bubblewrap
    /// (own network: env server and proxy only)`, `bubblewrap (host network)` or `none`.
    pub fn sandbox_kind(&self) -> &'static str {
        match &self.sandbox {
            Some(sandbox) if sandbox.config().share_network => "bubblewrap (host network)",
            Some(_) => "bubblewrap (own network: env server and proxy only)",
            None => "none",
        }
    }
}

/// The program sandbox with default settings and `python3`, probed once per process: what
/// [`RunnerSettings::default`] uses. The error says why there is none (bubblewrap missing,
/// the probe failed).
pub fn default_sandbox() -> std::result::Result<Arc<Sandbox>, String> {
    static SANDBOX: std::sync::OnceLock<std::result::Result<Arc<Sandbox>, String>> =
        std::sync::OnceLock::new();
    SANDBOX
        .get_or_init(|| {
            program_sandbox(&SandboxConfig::default(), "python3").map_err(|e| e.to_string())
        })
        .clone()
}

/// The sandbox for [`RunnerSettings::sandbox`]: harness-envs' sandbox built from `config`
/// with a network namespace of its own (programs reach only the environment server and the
/// proxy, through [`crate::relay`]; `config.share_network` is ignored, see
/// [`SandboxConfig::share_network`] to give a sandbox the host's network on purpose) and
/// `python` as the interpreter first on its `PATH`. Blocks for the sandbox's probe (a fraction
/// of a second). The error names the setting and says how to install bubblewrap.
pub fn program_sandbox(config: &SandboxConfig, python: &str) -> Result<Arc<Sandbox>> {
    let config = SandboxConfig {
        share_network: false,
        ..config.clone()
    };
    let sandbox = Sandbox::new(&config, python).map_err(|message| {
        Error::config(
            "runner.sandbox",
            format!(
                "agent programs are to run in a sandbox, and none can be made: {message}; to \
                 run programs without one, leave the runner's sandbox unset"
            ),
        )
    })?;
    Ok(Arc::new(sandbox))
}

/// A program's command, with what must live as long as the program runs.
struct Prepared {
    command: tokio::process::Command,
    /// The sandbox's working folder, removed after the run.
    workdir: Option<tempfile::TempDir>,
    /// The sandbox's user, leased until the program has ended.
    lease: Option<UidLease>,
    /// The relay to the servers of a program in a network of its own, open until it ends.
    relay: Option<Relay>,
}

/// Runs programs, one per episode, against an environment server and a recording proxy.
pub struct ProgramRunner {
    env: RemoteEnv,
    proxy: Arc<RecordingProxy>,
    proxy_url: String,
    policy_name: String,
    settings: RunnerSettings,
}

/// Kill every process of the group `pgid`. The workspace forbids `unsafe`, so this asks the
/// system's `kill` program rather than calling `kill(2)` directly (as harness-envs' sandbox
/// does).
fn kill_group(pgid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

impl ProgramRunner {
    /// A runner for sessions of `env` and model calls through `proxy` (served at `proxy_url`,
    /// the OpenAI base URL ending in `/v1`); `policy_name` names the policy in trajectories.
    pub fn new(
        env: RemoteEnv,
        proxy: Arc<RecordingProxy>,
        proxy_url: impl Into<String>,
        policy_name: impl Into<String>,
        settings: RunnerSettings,
    ) -> Self {
        ProgramRunner {
            env,
            proxy,
            proxy_url: proxy_url.into(),
            policy_name: policy_name.into(),
            settings,
        }
    }

    /// Run `program` on `task` with episode seed `seed`: start a session and a proxy
    /// episode, run the program to its end (or kill it), and assemble the trajectory. `Err`
    /// means the infrastructure failed (the environment server, spawning); the program's own
    /// failures are failed episodes.
    pub async fn run(
        &self,
        program: &ExternalHarness,
        task: &Task,
        seed: u64,
    ) -> Result<ProgramEpisode> {
        self.run_with(program, task, seed, None).await
    }

    /// [`ProgramRunner::run`] with every model call of the episode sampled with `sampling`
    /// (whatever the program asks for), as a training run needs.
    pub async fn run_with(
        &self,
        program: &ExternalHarness,
        task: &Task,
        seed: u64,
        sampling: Option<SamplingParams>,
    ) -> Result<ProgramEpisode> {
        program.validate()?;
        let limits = program.limits;
        let session = self
            .env
            .start(&task.id, seed, Some(limits.max_env_actions))
            .await?;
        let key = self.proxy.open_episode(EpisodeSpec {
            task_id: task.id.clone(),
            seed,
            limits: limits.episode_limits(),
            sampling,
        })?;
        // An open server issues tokens too; one without (an older server) leaves the program
        // the session id alone.
        let token = session.started().token.clone().unwrap_or_default();
        let run = self
            .spawn_and_wait(program, task, seed, session.id(), &token, &key)
            .await;
        // Whatever happened, the episode's recording ends here.
        let record = self.proxy.close_episode(&key)?;
        let mut run = run?;
        // A session the program had closed, or that expired, fails this episode only.
        let status: SessionStatus = match self.env.status(session.id()).await {
            Ok(status) => status,
            Err(Error::Request {
                status: Some(code),
                message,
                ..
            }) => {
                if run.failure.is_none() {
                    run.failure = Some(ProgramFailure::SessionGone);
                    run.reason = Some(format!(
                        "the episode's session could not be read after the program ended (HTTP {code}: {message}), so its outcome is lost"
                    ));
                }
                SessionStatus {
                    session_id: session.id().to_string(),
                    task_id: task.id.clone(),
                    state: crate::envserver::SessionState::Open,
                    steps: 0,
                    tool_errors: 0,
                    done: false,
                    outcome: None,
                }
            }
            Err(e) => return Err(e),
        };
        drop(session); // closes the session on the server
        if run.failure.is_none() && status.outcome.is_none() {
            run.failure = Some(ProgramFailure::Unfinished);
            run.reason = Some(
                "the program exited without finishing its session (POST .../finish), so the episode was never verified"
                    .into(),
            );
        }
        let (outcome, termination) = match (&run.failure, &status.outcome) {
            (None, Some(outcome)) => (
                with_prefix_check(outcome.clone(), &record),
                if status.done {
                    Termination::EnvDone
                } else {
                    Termination::PolicyFinished
                },
            ),
            (failure, verified) => (
                Outcome::failure(json!({
                    "external": {
                        "failure": failure,
                        "reason": run.reason,
                        "exit_code": run.exit_code,
                        "stderr_tail": run.stderr_tail,
                        "verifier": verified,
                        "prefix_breaks": record.prefix_breaks,
                        "masked": record.masked(),
                    }
                })),
                Termination::ProgramFailed,
            ),
        };
        let trajectory = record.clone().into_trajectory(EpisodeEnd {
            env: task.env.clone(),
            harness_id: program.id(),
            harness_name: program.name.clone(),
            policy: self.policy_name.clone(),
            outcome,
            termination,
            final_answer: None,
            env_actions: status.steps,
            tool_errors: status.tool_errors,
        });
        Ok(ProgramEpisode {
            trajectory,
            record,
            run,
        })
    }

    async fn spawn_and_wait(
        &self,
        program: &ExternalHarness,
        task: &Task,
        seed: u64,
        session_id: &str,
        token: &str,
        key: &str,
    ) -> Result<ProgramRun> {
        // A program in a network of its own reaches the servers through a relay, at
        // 127.0.0.1 with their own ports.
        let relay = match &self.settings.sandbox {
            Some(sandbox) if !sandbox.config().share_network => {
                let targets = [
                    address_of(self.env.base_url())?,
                    address_of(&self.proxy_url)?,
                ];
                Some(Relay::open(&targets).await?)
            }
            _ => None,
        };
        let (env_url, proxy_url) = match &relay {
            Some(_) => (
                inside_url(self.env.base_url())?,
                inside_url(&self.proxy_url)?,
            ),
            None => (self.env.base_url().to_string(), self.proxy_url.clone()),
        };
        let variables = [
            ("HARNESS_ENV_URL", env_url),
            ("HARNESS_SESSION_ID", session_id.to_string()),
            ("HARNESS_SESSION_TOKEN", token.to_string()),
            ("HARNESS_PROXY_URL", proxy_url.clone()),
            ("HARNESS_PROXY_KEY", key.to_string()),
            ("OPENAI_BASE_URL", proxy_url),
            ("OPENAI_API_KEY", key.to_string()),
            ("HARNESS_MODEL", self.proxy.config().model.clone()),
            (
                "HARNESS_LIMITS",
                serde_json::to_string(&program.limits).unwrap_or_default(),
            ),
            ("HARNESS_TASK_ID", task.id.clone()),
            ("HARNESS_SEED", seed.to_string()),
        ];
        let Prepared {
            mut command,
            workdir,
            lease,
            relay,
        } = match &self.settings.sandbox {
            Some(sandbox) => sandboxed(sandbox, program, &variables, relay)?,
            None => {
                let mut command = tokio::process::Command::new(&program.command[0]);
                command
                    .args(&program.command[1..])
                    .env_clear()
                    .env("PATH", &self.settings.path)
                    .envs(&program.env)
                    .envs(variables);
                Prepared {
                    command,
                    workdir: None,
                    lease: None,
                    relay: None,
                }
            }
        };
        // Under a sandbox the group holds bubblewrap alone (the program runs in a session of
        // its own), and killing bubblewrap takes the sandbox's pid namespace, with everything
        // in it, along.
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let start = Instant::now();
        let mut child = command.spawn().map_err(|e| {
            Error::config(
                "command",
                format!(
                    "cannot start `{}` of external harness `{}`: {e}",
                    program.command[0], program.name
                ),
            )
        })?;
        let pid = child.id().unwrap_or(0);
        let cap = self.settings.stderr_tail_bytes;
        let stderr = child.stderr.take();
        let reader = tokio::spawn(async move {
            let mut tail: Vec<u8> = Vec::new();
            if let Some(mut stderr) = stderr {
                let mut buf = [0u8; 4096];
                while let Ok(n) = stderr.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    tail.extend_from_slice(&buf[..n]);
                    if tail.len() > cap {
                        tail.drain(..tail.len() - cap);
                    }
                }
            }
            String::from_utf8_lossy(&tail).into_owned()
        });
        let timeout = Duration::from_secs_f64(program.limits.timeout_s);
        let waited = tokio::time::timeout(timeout, child.wait()).await;
        // Whatever the program left running in its group goes with it.
        kill_group(pid);
        let (status, timed_out) = match waited {
            Ok(status) => (status.ok(), false),
            Err(_) => {
                let _ = child.kill().await;
                (child.wait().await.ok(), true)
            }
        };
        let seconds = start.elapsed().as_secs_f64();
        // A process outside the group may hold stderr open: give up on the rest then.
        let stderr_tail = match tokio::time::timeout(Duration::from_secs(2), reader).await {
            Ok(Ok(text)) => text,
            _ => "[stderr unavailable: a process outside the program's group kept it open]".into(),
        };
        // The program and everything it started have ended: its user, its relay and its
        // folder go.
        drop(lease);
        drop(relay);
        if let Some(workdir) = workdir {
            let path = workdir.path().to_path_buf();
            if let Err(e) = workdir.close() {
                tracing::warn!(
                    "cannot remove the working folder {} of external harness `{}`: {e}",
                    path.display(),
                    program.name
                );
            }
        }
        let exit_code = status.and_then(|s| s.code());
        let (failure, reason) = if timed_out {
            (
                Some(ProgramFailure::TimedOut),
                Some(format!(
                    "the program ran past its limit of {} s and was killed",
                    program.limits.timeout_s
                )),
            )
        } else {
            match status {
                Some(s) if s.success() => (None, None),
                Some(s) => (
                    Some(ProgramFailure::Crashed),
                    Some(match s.code() {
                        Some(code) => format!("the program exited with status {code}"),
                        None => format!("the program was ended by a signal ({s})"),
                    }),
                ),
                None => (
                    Some(ProgramFailure::Crashed),
                    Some("the program's exit status could not be read".into()),
                ),
            }
        };
        Ok(ProgramRun {
            pid,
            exit_code,
            failure,
            reason,
            seconds,
            stderr_tail,
        })
    }
}

/// The socket address of a server's URL (`http://127.0.0.1:port[/v1]`).
fn address_of(url: &str) -> Result<std::net::SocketAddr> {
    reqwest::Url::parse(url)
        .ok()
        .and_then(|u| u.socket_addrs(|| None).ok())
        .and_then(|addrs| addrs.into_iter().next())
        .ok_or_else(|| {
            Error::config(
                "url",
                format!("expected a server URL such as http://127.0.0.1:8000, got `{url}`"),
            )
        })
}

/// A server's URL as a program in a network of its own reaches it: the forwarder's
/// `127.0.0.1` with the server's port and the URL's path.
fn inside_url(url: &str) -> Result<String> {
    let port = address_of(url)?.port();
    let path = reqwest::Url::parse(url)
        .map(|u| u.path().trim_end_matches('/').to_string())
        .unwrap_or_default();
    Ok(format!("http://127.0.0.1:{port}{path}"))
}

/// `program`'s command inside `sandbox`: a fresh working folder, its file arguments bound
/// read-only, each alone (those arguments made absolute), and `variables` and the harness's
/// `env` on top of the sandbox's environment, whose `PATH` is kept. With `relay`, the program
/// runs under the forwarder ([`crate::relay::FORWARDER`]), whose sockets' folder is bound.
fn sandboxed(
    sandbox: &Sandbox,
    program: &ExternalHarness,
    variables: &[(&str, String)],
    relay: Option<Relay>,
) -> Result<Prepared> {
    let workdir = tempfile::Builder::new()
        .prefix("harness-program-")
        .tempdir()
        .map_err(|source| {
            Error::Core(harness_core::Error::Io {
                path: std::env::temp_dir(),
                source,
            })
        })?;
    let root = workdir.path().canonicalize().map_err(|source| {
        Error::Core(harness_core::Error::Io {
            path: workdir.path().to_path_buf(),
            source,
        })
    })?;
    let mut args = Vec::with_capacity(program.command.len());
    let mut binds: Vec<PathBuf> = Vec::new();
    for (i, arg) in program.command.iter().enumerate() {
        // A bare program name is looked up on `PATH`, not in the current folder.
        let file = if i == 0 && !arg.contains('/') {
            None
        } else {
            Path::new(arg).canonicalize().ok().filter(|p| p.is_file())
        };
        match file.as_ref().and_then(|f| f.to_str().map(|s| (f, s))) {
            Some((file, text)) => {
                if !binds.contains(file) {
                    binds.push(file.clone());
                }
                args.push(text.to_string());
            }
            None => args.push(arg.clone()),
        }
    }
    if let Some(relay) = &relay {
        let folder = relay.folder().canonicalize().map_err(|source| {
            Error::Core(harness_core::Error::Io {
                path: relay.folder().to_path_buf(),
                source,
            })
        })?;
        binds.push(folder);
        let mut forwarded = vec![
            sandbox.python().display().to_string(),
            "-c".to_string(),
            FORWARDER.to_string(),
        ];
        for route in relay.routes() {
            forwarded.push(route.port.to_string());
            forwarded.push(route.socket.display().to_string());
        }
        forwarded.push("--".to_string());
        forwarded.append(&mut args);
        args = forwarded;
    }
    let rest: Vec<&str> = args[1..].iter().map(String::as_str).collect();
    let (command, lease) = sandbox
        .command_with(&root, true, &binds, &args[0], &rest)
        .map_err(|e| {
            Error::config(
                "command",
                format!(
                    "cannot run `{}` of external harness `{}` in the sandbox: {e}",
                    program.command[0], program.name
                ),
            )
        })?;
    let path = command
        .get_envs()
        .find(|(name, _)| *name == "PATH")
        .and_then(|(_, value)| value.map(|v| v.to_os_string()));
    let mut command = command;
    command
        .envs(&program.env)
        .envs(variables.iter().map(|(k, v)| (*k, v.as_str())));
    if let Some(path) = path {
        command.env("PATH", path);
    }
    Ok(Prepared {
        command: tokio::process::Command::from(command),
        workdir: Some(workdir),
        lease,
        relay,
    })
}

/// The verifier's outcome with the proxy's prefix-check counts beside its details
/// (`details.external`), so that a run's trajectories carry them.
fn with_prefix_check(mut outcome: Outcome, record: &EpisodeRecord) -> Outcome {
    let external = json!({"prefix_breaks": record.prefix_breaks, "masked": record.masked()});
    match &mut outcome.details {
        Value::Object(map) => {
            map.insert("external".into(), external);
        }
        Value::Null => outcome.details = json!({ "external": external }),
        other => {
            outcome.details = json!({"verifier": other.take(), "external": external});
        }
    }
    outcome
}

/// What a [`ProgramEnv`] starts.
#[derive(Debug, Clone)]
pub struct ProgramEnvConfig {
    /// The recording proxy.
    pub proxy: ProxyConfig,
    /// The environment server's sessions.
    pub env_server: EnvServerConfig,
    /// How programs are run.
    pub runner: RunnerSettings,
}

/// An environment that also runs external harnesses: the wrapped environment served on a
/// loopback port, a recording proxy in front of the run's acting policy on another, and a
/// [`ProgramRunner`]. In-process harnesses run on the wrapped environment as before;
/// [`harness_core::run_episode`] hands external ones to [`Environment::run_program`], so
/// they take part in rescue, calibration and evaluation like any pool member.
///
/// The programs' model calls go to the policy given here (the run's acting policy, whose
/// weights the learner updates in place or a weight sync keeps current); an episode that
/// names another policy is refused.
pub struct ProgramEnv {
    inner: Arc<dyn Environment>,
    runner: ProgramRunner,
    policy_name: String,
    proxy: Arc<RecordingProxy>,
    _env_server: EnvServerHandle,
    _proxy: ProxyHandle,
}

impl ProgramEnv {
    /// Serve `inner` and a proxy in front of `policy` on loopback ports. The environment
    /// server gets a fresh runner token (any set in `config` is replaced), known to this
    /// runner alone, so programs hold only their sessions' tokens.
    pub async fn serve(
        inner: Arc<dyn Environment>,
        policy: Arc<dyn Policy>,
        config: ProgramEnvConfig,
    ) -> Result<Self> {
        let loopback: std::net::SocketAddr = ([127, 0, 0, 1], 0).into();
        let runner_token = crate::envserver::fresh_token();
        let env_config = EnvServerConfig {
            runner_token: Some(runner_token.clone()),
            ..config.env_server
        };
        let server = EnvServer::new(inner.clone(), env_config)?;
        let env_server = EnvServerHandle::spawn(loopback, server).await?;
        let policy_name = policy.name().to_string();
        let proxy = RecordingProxy::new(policy, config.proxy)?;
        let proxy_handle = ProxyHandle::spawn(loopback, proxy.clone()).await?;
        let remote = RemoteEnv::connect_as(env_server.base_url(), runner_token).await?;
        let runner = ProgramRunner::new(
            remote,
            proxy.clone(),
            proxy_handle.base_url(),
            policy_name.clone(),
            config.runner,
        );
        Ok(ProgramEnv {
            inner,
            runner,
            policy_name,
            proxy,
            _env_server: env_server,
            _proxy: proxy_handle,
        })
    }

    /// The recording proxy (its [`RecordingProxy::stats`] are the run's prefix-check counts).
    pub fn proxy(&self) -> &Arc<RecordingProxy> {
        &self.proxy
    }
}

#[async_trait]
impl Environment for ProgramEnv {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn reset(&self, task: &Task, seed: u64) -> harness_core::Result<Box<dyn EnvSession>> {
        self.inner.reset(task, seed).await
    }

    fn tasks(&self, split: Split) -> harness_core::Result<Vec<Task>> {
        self.inner.tasks(split)
    }

    async fn run_program(
        &self,
        policy: &dyn Policy,
        harness: &Harness,
        task: &Task,
        seed: u64,
        sampling: &SamplingParams,
    ) -> harness_core::Result<Trajectory> {
        if policy.name() != self.policy_name {
            return Err(harness_core::Error::Environment {
                env: self.name().to_string(),
                message: format!(
                    "external harness `{}` acts through the policy `{}` this environment's proxy serves, but the episode asks for `{}`",
                    harness.name,
                    self.policy_name,
                    policy.name()
                ),
            });
        }
        let program =
            ExternalHarness::from_harness(harness).map_err(|e| e.into_env_error(self.name()))?;
        let episode = self
            .runner
            .run_with(&program, task, seed, Some(sampling.clone()))
            .await
            .map_err(|e| e.into_env_error(self.name()))?;
        Ok(episode.trajectory)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_are_reached_inside_at_the_loopback_with_their_ports() {
        assert_eq!(
            inside_url("http://127.0.0.1:4100").unwrap(),
            "http://127.0.0.1:4100"
        );
        assert_eq!(
            inside_url("http://127.0.0.1:4200/v1/").unwrap(),
            "http://127.0.0.1:4200/v1"
        );
        assert_eq!(
            address_of("http://127.0.0.1:4200/v1").unwrap(),
            ([127, 0, 0, 1], 4200).into()
        );
        let err = address_of("not a url").unwrap_err().to_string();
        assert!(err.contains("url") && err.contains("not a url"), "{err}");
    }
}
