//! What every stage shares: the environment and its task splits, the base harness H0, the
//! initial policy checkpoint, the LLM roles and the progress display.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{DType, Device};
use grpo_candle::{CandlePolicy, PolicyModel, PolicyOptions};
use harness_core::{ChatModel, Environment, Harness, Policy, Split, Task};
use harness_envs::{appworld, dbbench, swe, tau_retail};
use harness_openai::{ChatClient, ChatClientConfig, EngineKind, RemotePolicy, RemotePolicyConfig};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::config::{PrefixMode, RolloutEngine, RunConfig, SandboxMode, TauUser};
use crate::error::{Error, Result, StageExt};
use crate::layout::Layout;
use harness_openai::candle::CandleEncoder;

/// Whether stages draw progress bars (on stderr) or stay quiet (tests, logs to files).
#[derive(Debug, Clone)]
pub struct Progress {
    bars: Option<MultiProgress>,
}

impl Progress {
    /// Bars on stderr.
    pub fn bars() -> Self {
        Progress {
            bars: Some(MultiProgress::with_draw_target(ProgressDrawTarget::stderr())),
        }
    }

    /// No bars.
    pub fn hidden() -> Self {
        Progress { bars: None }
    }

    /// A bar of `len` steps with a message, or a hidden one.
    pub fn bar(&self, len: u64, message: impl Into<String>) -> ProgressBar {
        let Some(multi) = &self.bars else {
            return ProgressBar::hidden();
        };
        let bar = multi.add(ProgressBar::new(len));
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} {msg:<34} [{elapsed_precise}] {wide_bar} {pos}/{len} (eta {eta})",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_message(message.into());
        bar.enable_steady_tick(std::time::Duration::from_millis(250));
        bar
    }

    /// A spinner for work without a known length.
    pub fn spinner(&self, message: impl Into<String>) -> ProgressBar {
        let Some(multi) = &self.bars else {
            return ProgressBar::hidden();
        };
        let bar = multi.add(ProgressBar::new_spinner());
        bar.set_style(
            ProgressStyle::with_template("{spinner} {msg} [{elapsed_precise}]")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.set_message(message.into());
        bar.enable_steady_tick(std::time::Duration::from_millis(250));
        bar
    }

    /// Print a line above the bars.
    pub fn println(&self, line: impl AsRef<str>) {
        match &self.bars {
            // Above live bars; on a stream that is not a terminal indicatif draws nothing, so
            // the line goes to stderr as it is.
            Some(multi) if !multi.is_hidden() => {
                let _ = multi.println(line.as_ref());
            }
            Some(_) => eprintln!("{}", line.as_ref()),
            None => tracing::info!("{}", line.as_ref()),
        }
    }
}

/// What the binary hands the library besides the configuration (only binaries read the
/// process environment). Its `Debug` says which keys are set, never what they are.
#[derive(Clone, Default)]
pub struct Secrets {
    /// The API key of the LLM roles' endpoint (read from `roles.llm_key_env`).
    pub llm_api_key: Option<String>,
    /// The API key of the rollout engine, if it wants one.
    pub engine_api_key: Option<String>,
    /// The API key of the Tinker server (read from `tinker.api_key_env`), if it wants one.
    pub tinker_api_key: Option<String>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |key: &Option<String>| key.as_ref().map(|_| "<redacted>");
        f.debug_struct("Secrets")
            .field("llm_api_key", &redacted(&self.llm_api_key))
            .field("engine_api_key", &redacted(&self.engine_api_key))
            .field("tinker_api_key", &redacted(&self.tinker_api_key))
            .finish()
    }
}

/// The shared state of one seed's run.
pub struct Workbench {
    /// The configuration (one seed).
    pub cfg: RunConfig,
    /// Where everything goes.
    pub layout: Layout,
    /// The environment.
    pub env: Arc<dyn Environment>,
    /// H0.
    pub base: Harness,
    /// The environment's hand-written siblings of H0 (for the embedded default, the ones its
    /// warm start planted against). The main job's pool comes from evolution; these serve as a
    /// ready-made pool ([`Workbench::builtin_pool`]) for smoke runs and comparisons.
    pub builtin_siblings: Vec<Harness>,
    /// Training tasks.
    pub train: Vec<Task>,
    /// Validation tasks.
    pub validation: Vec<Task>,
    /// Test tasks (never seen by evolution, the router or training).
    pub test: Vec<Task>,
    /// The initial policy checkpoint (HF folder) every method starts from.
    pub checkpoint: PathBuf,
    /// The LLM of the roles, when configured.
    pub chat: Option<Arc<dyn ChatModel>>,
    /// Secrets from the binary.
    pub secrets: Secrets,
    /// Progress display.
    pub progress: Progress,
    /// Agent programs that join the pool as siblings (`external.harnesses` and the bundled
    /// Python agent), as harnesses whose `program` is set.
    pub programs: Vec<Harness>,
    /// How programs run (the sandbox, chosen once per run).
    pub runner: harness_external::program::RunnerSettings,
    /// Which sandbox agent programs run in, in words (`run.json`'s `external_sandbox` and the
    /// report), with the reason when `auto` found none; `None` when the run has no programs.
    pub program_sandbox: Option<String>,
}

impl Workbench {
    /// The family a test task is reported under (never routed on): the embedded default's
    /// planted family, else the generator's label (question type, template, repository), else
    /// `all`.
    pub fn family_of(&self, task: &Task) -> String {
        if self.cfg.env.name == "default"
            && let Some(f) = harness_warmstart::Family::of_task(task)
        {
            return f.as_str().to_string();
        }
        harness_router::TaskFeatures::of(task, harness_router::FeatureSource::Metadata)
            .category
            .unwrap_or_else(|| "all".into())
    }

    /// Set up one seed's run: environment and splits, H0, the initial checkpoint (warm-started
    /// and cached for the embedded default), the LLM roles.
    pub fn new(cfg: RunConfig, secrets: Secrets, progress: Progress) -> Result<Self> {
        cfg.validate(None)?;
        cfg.check_key_transport(
            secrets.llm_api_key.is_some(),
            secrets.engine_api_key.is_some(),
        )?;
        cfg.check_tinker_key_transport(secrets.tinker_api_key.is_some())?;
        let layout = Layout::new(&cfg.out);
        let chat = role_client(&cfg, &secrets)?;
        let (env, base, builtin_siblings, checkpoint) = match cfg.env.name.as_str() {
            "default" => {
                let started = crate::organism::warm_start(&cfg, &progress)?;
                (
                    started.env,
                    started.base,
                    started.siblings,
                    started.checkpoint,
                )
            }
            name => {
                let (env, base, siblings) = builtin_environment(name, &cfg, chat.as_ref())?;
                let checkpoint = match &cfg.policy.model {
                    Some(model) => resolve_checkpoint(model)?,
                    None => {
                        // The embedded default's checkpoint, warm-started on DBBench under
                        // its compact H0: it runs here, but was never taught this world.
                        let started = crate::organism::warm_start(&cfg, &progress)?;
                        progress.println(format!(
                            "env {name}: no policy.model, so the embedded default's checkpoint runs (a tiny policy warm-started on DBBench only; its {}-token context may not hold this world's H0)",
                            crate::organism::settings(&cfg)?
                                .model
                                .max_position_embeddings
                        ));
                        started.checkpoint
                    }
                };
                (env, base, siblings, checkpoint)
            }
        };
        let take = |split: Split, n: usize| -> Result<Vec<Task>> {
            let mut tasks = env.tasks(split).at("tasks")?;
            if tasks.len() < n {
                tracing::warn!(
                    "{split:?}: the environment `{}` has {} tasks, fewer than the {n} the run \
                     configuration asks for; the run uses all of them",
                    env.name(),
                    tasks.len()
                );
            }
            tasks.truncate(n);
            if tasks.is_empty() {
                return Err(Error::input(
                    "tasks",
                    PathBuf::from(env.name()),
                    format!("the environment has no {split:?} tasks"),
                ));
            }
            Ok(tasks)
        };
        let train = take(Split::Train, cfg.env.train_tasks)?;
        let validation = take(Split::Validation, cfg.env.validation_tasks)?;
        let test = take(Split::Test, cfg.env.test_tasks)?;
        let mut base = match &cfg.external.h0 {
            Some(path) => external_harness(path, "external.h0")?,
            None => base,
        };
        let mut builtin_siblings = builtin_siblings;
        // Table 8's execution limits when asked (`env.execution_limits = "paper"`): on H0 and
        // the built-in siblings, so that search, training and evaluation all run under them.
        if let Some(limits) = cfg.env.execution_limits.limits() {
            if !base.is_external() {
                base.limits = limits;
            }
            for s in &mut builtin_siblings {
                s.limits = limits;
            }
        }
        let mut programs = Vec::new();
        for (i, path) in cfg.external.harnesses.iter().enumerate() {
            programs.push(external_harness(path, &format!("external.harnesses[{i}]"))?);
        }
        // The bundled agent mirrors a declarative H0 (validation refuses asking for it beside
        // a program H0).
        if cfg.external.wants_python_sibling(&cfg.env.name) && !base.is_external() {
            if interpreter_runs(&cfg.external.python) {
                programs.push(python_sibling(&cfg, &base, &builtin_siblings)?);
            } else if cfg.external.python_sibling == Some(true) {
                return Err(Error::Config {
                    file: PathBuf::from("<run config>"),
                    field: "external.python".into(),
                    message: format!(
                        "`{}` does not run here, and external.python_sibling asks for the bundled Python agent: install Python 3 or name its interpreter",
                        cfg.external.python
                    ),
                });
            } else {
                progress.println(format!(
                    "pool: no agent program: `{}` does not run here, so the bundled Python agent stays out (install Python 3, or set external.python)",
                    cfg.external.python
                ));
            }
        }
        // Programs may also come with a saved pool or an unseen-harness pool.
        let uses_programs = !programs.is_empty()
            || base.is_external()
            || cfg.pool.is_some()
            || !cfg.eval.harnesses.is_empty();
        let (runner, program_sandbox) = program_runner(&cfg, uses_programs, &progress)?;
        Ok(Workbench {
            cfg,
            layout,
            env,
            base,
            builtin_siblings,
            train,
            validation,
            test,
            checkpoint,
            chat,
            secrets,
            progress,
            programs,
            runner,
            program_sandbox,
        })
    }

    /// A fresh local policy on the checkpoint in `dir`.
    pub fn local_policy(&self, dir: &Path, name: &str) -> Result<Arc<CandlePolicy>> {
        let model = load_model(dir)?;
        Ok(Arc::new(CandlePolicy::new(
            model,
            PolicyOptions {
                name: name.to_string(),
                ..PolicyOptions::default()
            },
        )))
    }

    /// The policy that acts in episodes for a local learner on `local`: `local` itself, or a
    /// vLLM / SGLang engine serving the same checkpoint.
    pub fn acting_policy(&self, local: &Arc<CandlePolicy>) -> Result<Arc<dyn Policy>> {
        let kind = match self.cfg.rollout.engine {
            RolloutEngine::Local => return Ok(local.clone() as Arc<dyn Policy>),
            RolloutEngine::Vllm => EngineKind::Vllm,
            RolloutEngine::Sglang => EngineKind::Sglang,
        };
        let url = self.cfg.rollout.engine_url.clone().unwrap_or_default();
        let served = self
            .cfg
            .rollout
            .served_model
            .clone()
            .or_else(|| self.cfg.policy.model.clone())
            .unwrap_or_default();
        let mut config = RemotePolicyConfig::new(url, served, kind);
        if let Some(key) = &self.secrets.engine_api_key {
            config.endpoint = config.endpoint.with_api_key(key.clone());
        }
        let remote = RemotePolicy::new(
            config,
            Arc::new(CandleEncoder::new(local.policy_model().clone())),
        )
        .at("rollout engine")?;
        Ok(Arc::new(remote))
    }

    /// The environment episodes of `policy` run on: the run's own, or, when `pool` holds agent
    /// programs, the run's served over HTTP with a recording proxy in front of `policy`
    /// (harness-external's `ProgramEnv`), so that its programs act through `policy` and their
    /// episodes are recorded token for token. Keep it for as long as the episodes run.
    pub async fn env_for(
        &self,
        pool: &harness_pool::SiblingPool,
        policy: Arc<dyn Policy>,
    ) -> Result<Arc<dyn Environment>> {
        if !pool.members().iter().any(Harness::is_external) {
            return Ok(self.env.clone());
        }
        let x = &self.cfg.external;
        let request_timeout = std::time::Duration::from_secs_f64(x.request_timeout_s);
        let mut proxy = harness_external::proxy::ProxyConfig::new(policy.name());
        proxy.max_requests_per_episode = x.requests_in_flight;
        proxy.request_timeout = request_timeout;
        proxy.prefix_policy = match self.cfg.external.prefix {
            PrefixMode::OwnContext => harness_external::proxy::PrefixPolicy::OwnContext,
            PrefixMode::MaskEpisode => harness_external::proxy::PrefixPolicy::MaskEpisode,
        };
        let served = harness_external::program::ProgramEnv::serve(
            self.env.clone(),
            policy,
            harness_external::program::ProgramEnvConfig {
                proxy,
                env_server: harness_external::envserver::server::EnvServerConfig {
                    max_requests_per_program: x.requests_in_flight,
                    request_timeout,
                    ..Default::default()
                },
                runner: self.runner.clone(),
            },
        )
        .await
        .at("external")?;
        Ok(Arc::new(served))
    }

    /// The environments by name, as the router's paired runs want them, for episodes of
    /// `policy` on `pool` ([`Workbench::env_for`]).
    pub async fn environments_for(
        &self,
        pool: &harness_pool::SiblingPool,
        policy: Arc<dyn Policy>,
    ) -> Result<harness_router::Environments> {
        let env = self.env_for(pool, policy).await?;
        Ok([(env.name().to_string(), env)].into())
    }

    /// `pool` with the run's agent programs ([`Workbench::programs`]) among its siblings: the
    /// same pool when it holds them all already, else a new frozen pool of its members and
    /// the missing programs (siblings of generation 1, in the configuration's order). The
    /// programs of the result, H0 among them when it is one, are written to `programs.json`
    /// for the report.
    pub fn with_programs(
        &self,
        pool: harness_pool::SiblingPool,
    ) -> Result<harness_pool::SiblingPool> {
        let pool = self.add_programs(pool)?;
        let programs: BTreeMap<String, &str> = pool
            .members()
            .iter()
            .filter(|h| h.is_external())
            .map(|h| (h.id().to_string(), h.name.as_str()))
            .collect();
        let path = self.layout.programs();
        std::fs::create_dir_all(self.layout.root())
            .map_err(|e| Error::input("pool", self.layout.root(), e.to_string()))?;
        let text = serde_json::to_string_pretty(&programs).expect("names serialise");
        harness_core::fsutil::write_atomic(&path, text.as_bytes()).at("pool")?;
        Ok(pool)
    }

    fn add_programs(&self, pool: harness_pool::SiblingPool) -> Result<harness_pool::SiblingPool> {
        let missing: Vec<&Harness> = self
            .programs
            .iter()
            .filter(|p| !pool.contains(&p.id()))
            .collect();
        if missing.is_empty() {
            return Ok(pool);
        }
        let mut out = harness_pool::SiblingPool::new(pool.base().clone()).at("pool")?;
        for member in pool.auxiliaries() {
            out.add(member.clone()).at("pool")?;
        }
        for program in missing {
            let direction = format!("agent program: {}", program.description);
            out.add_sibling(program.clone(), 1, Some(direction))
                .at("pool")?;
        }
        let mut settings = pool.settings().clone();
        if let serde_json::Value::Object(map) = &mut settings {
            map.insert(
                "programs".into(),
                serde_json::json!(self.programs.iter().map(|p| &p.name).collect::<Vec<_>>()),
            );
        }
        out.set_settings(settings).at("pool")?;
        out.freeze();
        Ok(out)
    }

    /// H0 with the environment's hand-written siblings, as a frozen pool.
    pub fn builtin_pool(&self) -> Result<harness_pool::SiblingPool> {
        harness_pool::SiblingPool::starter(
            self.base.clone(),
            self.builtin_siblings.iter().cloned(),
            serde_json::json!({"source": "the environment's built-in siblings"}),
        )
        .at("pool")
    }
}

/// Whether `python -c ""` runs.
fn interpreter_runs(python: &str) -> bool {
    std::process::Command::new(python)
        .args(["-c", ""])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// An external harness file of the configuration, as a pool member.
fn external_harness(path: &Path, field: &str) -> Result<Harness> {
    let harness =
        harness_external::program::ExternalHarness::load(path).map_err(|e| Error::Config {
            file: path.to_path_buf(),
            field: field.to_string(),
            message: e.to_string(),
        })?;
    Ok(harness.to_harness())
}

/// The bundled Python DBBench agent as a sibling of `base` (its source run with `-c`),
/// speaking H0's prompts and carrying the hook `external.python_sibling_hook` of the built-in
/// sibling that has it.
fn python_sibling(cfg: &RunConfig, base: &Harness, siblings: &[Harness]) -> Result<Harness> {
    let x = &cfg.external;
    let bad = |field: &str, message: String| Error::Config {
        file: PathBuf::from("<run config>"),
        field: field.to_string(),
        message,
    };
    let hook = &x.python_sibling_hook;
    let Some(sibling) = siblings.iter().find(|s| s.hooks.contains_key(hook)) else {
        let hooks: Vec<&String> = siblings.iter().flat_map(|s| s.hooks.keys()).collect();
        return Err(bad(
            "external.python_sibling_hook",
            format!(
                "no built-in sibling of env `{}` has the hook `{hook}`; expected one of {hooks:?}",
                cfg.env.name
            ),
        ));
    };
    // The sibling's hooks, H0's among them: the in-process sibling fires them all.
    let hooks = sibling.hooks.clone();
    let format = base.tool_view.format.as_str();
    let parser: Arc<dyn harness_core::ActionParser> = if format == harness_core::TOOL_CALL_FORMAT {
        Arc::new(harness_core::ToolCallParser)
    } else if format == dbbench::TOOL_FORMAT {
        Arc::new(dbbench::DbBenchToolParser)
    } else {
        return Err(bad(
            "external.python_sibling",
            format!(
                "the bundled agent speaks the `<tool_call>` formats, and H0 `{}` uses `{format}`",
                base.name
            ),
        ));
    };
    let no_call_reply = match parser.parse("", &[]) {
        harness_core::ParsedAction::Invalid(reason) => {
            Some(harness_core::invalid_action_message(format, &reason))
        }
        _ => None,
    };
    // The source itself, not a path, so that the member's id is the same wherever the run
    // folder is (a pool reused by another run, a moved folder).
    let name = format!("python-agent-{hook}");
    let mirrored = harness_external::agents::mirror_sibling(harness_external::agents::MirrorSpec {
        base,
        hooks,
        no_call_reply,
        command: vec![
            x.python.clone(),
            "-c".into(),
            harness_external::agents::DBBENCH_AGENT.into(),
        ],
        name,
        timeout_s: x.timeout_s,
    })
    .map_err(|e| bad("external.python_sibling", e.to_string()))?;
    Ok(mirrored.to_harness())
}

/// How programs run: inside the sandbox of policy-caused commands when `external.sandbox`
/// asks for it and bubblewrap works (`auto` goes without, saying so, when it does not), and
/// which sandbox that is, in words (`None` without programs).
fn program_runner(
    cfg: &RunConfig,
    uses_programs: bool,
    progress: &Progress,
) -> Result<(harness_external::program::RunnerSettings, Option<String>)> {
    let mut settings = harness_external::program::RunnerSettings {
        sandbox: None,
        ..harness_external::program::RunnerSettings::default()
    };
    if !uses_programs {
        return Ok((settings, None));
    }
    if cfg.external.sandbox == SandboxMode::Off {
        return Ok((
            settings,
            Some("none (external.sandbox = \"off\")".to_string()),
        ));
    }
    let config = swe::SandboxConfig {
        // An agent episode's program is one process tree for its whole episode.
        cpu_seconds: cfg.external.timeout_s.ceil() as u64 + 60,
        ..swe::SandboxConfig::default()
    };
    match harness_external::program::program_sandbox(&config, &cfg.external.python) {
        Ok(sandbox) => {
            settings.sandbox = Some(sandbox);
            let kind = settings.sandbox_kind().to_string();
            Ok((settings, Some(kind)))
        }
        Err(e) if cfg.external.sandbox == SandboxMode::On => Err(Error::Config {
            file: PathBuf::from("<run config>"),
            field: "external.sandbox".into(),
            message: format!("no sandbox for agent programs: {e}"),
        }),
        Err(e) => {
            let note = format!(
                "none: external.sandbox = \"auto\" found no sandbox, so agent programs run with the trainer's user, files and network ({e})"
            );
            progress.println(format!("warning: {note}"));
            Ok((settings, Some(note)))
        }
    }
}

/// The LLM roles' client on `roles.llm`, when one is configured (the retail world's LLM
/// customer and judge ask it too).
fn role_client(cfg: &RunConfig, secrets: &Secrets) -> Result<Option<Arc<dyn ChatModel>>> {
    let Some(url) = &cfg.roles.llm else {
        return Ok(None);
    };
    let mut config = ChatClientConfig::new(url, &cfg.roles.llm_model);
    config.endpoint.timeout = std::time::Duration::from_secs(cfg.roles.timeout_s);
    if let Some(key) = &secrets.llm_api_key {
        config.endpoint = config.endpoint.with_api_key(key.clone());
    }
    Ok(Some(
        Arc::new(ChatClient::new(config).at("roles")?) as Arc<dyn ChatModel>
    ))
}

/// The retail world of `cfg`: its data folder, with the LLM customer and judge when
/// `env.tau_user = "llm"` / `env.tau_nl_judge` ask for them (on `chat`, the roles' client).
pub fn tau_retail_env(
    cfg: &RunConfig,
    chat: Option<&Arc<dyn ChatModel>>,
) -> Result<tau_retail::TauRetail> {
    let dir = cfg
        .env
        .tau_retail_data
        .clone()
        .ok_or_else(|| Error::Config {
            file: PathBuf::from("<run config>"),
            field: "env.tau_retail_data".into(),
            message: format!("needs {}", crate::config::TAU_RETAIL_SOURCE),
        })?;
    let mut env = tau_retail::TauRetail::load(&dir).at("tau-retail")?;
    let needs_chat = |field: &str| {
        chat.cloned().ok_or_else(|| Error::Config {
            file: PathBuf::from("<run config>"),
            field: field.into(),
            message: "the retail world's LLM seats ask the roles' endpoint: set roles.llm".into(),
        })
    };
    let settings = crate::tau::LlmSeatSettings {
        attempts: cfg.env.tau_llm_attempts,
        max_tokens: cfg.roles.max_tokens.unwrap_or(1024),
        ..Default::default()
    };
    if cfg.env.tau_user == TauUser::Llm {
        let customer = crate::tau::LlmCustomer::new(needs_chat("env.tau_user")?, settings);
        env = env.with_user(Arc::new(customer));
    }
    if cfg.env.tau_nl_judge {
        let judge = crate::tau::LlmJudge::new(needs_chat("env.tau_nl_judge")?, settings);
        env = env.with_judge(Arc::new(judge));
    }
    Ok(env)
}

/// A generated environment's split sizes: its defaults, grown to the configured ones under the
/// paper preset (Table 6's sizes, which the defaults do not reach); the quick preset keeps the
/// defaults, so its task sets stay what they were.
fn generated_sizes<T>(
    cfg: &RunConfig,
    mut sizes: T,
    fields: impl Fn(&mut T) -> (&mut usize, &mut usize, &mut usize),
) -> T {
    if cfg.preset == crate::config::Preset::Paper {
        let (train, validation, test) = fields(&mut sizes);
        *train = (*train).max(cfg.env.train_tasks);
        *validation = (*validation).max(cfg.env.validation_tasks);
        *test = (*test).max(cfg.env.test_tasks);
    }
    sizes
}

/// A built-in environment with its own base harness.
fn builtin_environment(
    name: &str,
    cfg: &RunConfig,
    chat: Option<&Arc<dyn ChatModel>>,
) -> Result<(Arc<dyn Environment>, Harness, Vec<Harness>)> {
    Ok(match name {
        "dbbench" => {
            let env = match &cfg.env.dbbench_data {
                Some(path) => dbbench::DbBench::from_jsonl(path, Split::Test).at("dbbench")?,
                None => dbbench::DbBench::generated(&dbbench::GeneratorConfig {
                    seed: cfg.seed,
                    ..generated_sizes(cfg, dbbench::GeneratorConfig::default(), |g| {
                        (&mut g.train, &mut g.validation, &mut g.test)
                    })
                }),
            };
            (Arc::new(env), dbbench::base_harness(), dbbench::siblings())
        }
        "appworld" => (
            Arc::new(appworld::AppWorld::with_config(appworld::AppWorldConfig {
                base_seed: cfg.seed,
                ..generated_sizes(cfg, appworld::AppWorldConfig::default(), |a| {
                    (&mut a.train, &mut a.validation, &mut a.test)
                })
            })),
            appworld::base_harness(),
            appworld::siblings(),
        ),
        "swe" => {
            let env = swe::SweEnv::builtin();
            // Refuse now, not at the first episode, when no sandbox can be made.
            env.sandbox().at("swe")?;
            (Arc::new(env), swe::base_harness(), swe::siblings())
        }
        "tau-retail" => {
            let env = tau_retail_env(cfg, chat)?;
            // H0 carries the benchmark's policy text; the siblings are edits of that H0.
            let base = env.base_harness();
            let siblings = tau_retail::siblings_of(&base);
            (Arc::new(env), base, siblings)
        }
        other => {
            return Err(Error::Config {
                file: PathBuf::from("<run config>"),
                field: "env.name".into(),
                message: format!("unknown environment `{other}`"),
            });
        }
    })
}

/// A checkpoint folder, or (with the `hub` feature) a hub id resolved from the local Hugging
/// Face cache (no download).
fn resolve_checkpoint(model: &str) -> Result<PathBuf> {
    let dir = PathBuf::from(model);
    if dir.join("config.json").is_file() {
        return Ok(dir);
    }
    resolve_hub_id(model, dir)
}

#[cfg(not(feature = "hub"))]
fn resolve_hub_id(_model: &str, dir: PathBuf) -> Result<PathBuf> {
    Err(Error::input(
        "policy",
        dir,
        "expected a checkpoint folder (config.json, safetensors, tokenizer.json); a hub id needs \
         a build with the `hub` feature (`cargo build --release --features hub`)",
    ))
}

#[cfg(feature = "hub")]
fn resolve_hub_id(model: &str, dir: PathBuf) -> Result<PathBuf> {
    let files = grpo_candle::ModelFiles::from_hub_blocking(model, None, true).map_err(|e| {
        Error::input(
            "policy",
            dir.clone(),
            format!(
                "expected a checkpoint folder (config.json, safetensors, tokenizer.json) or a hub id in the local cache: {e}"
            ),
        )
    })?;
    files
        .config
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| Error::input("policy", dir, "the cached checkpoint has no folder"))
}

/// Load a checkpoint folder on the CPU (f32).
pub fn load_model(dir: &Path) -> Result<PolicyModel> {
    PolicyModel::load_dir(dir, DType::F32, &Device::Cpu).map_err(|e| {
        Error::input(
            "policy",
            dir,
            format!("expected a Hugging Face checkpoint folder: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_that_is_not_a_folder_says_what_was_expected() {
        let err = resolve_checkpoint("no-such-org/no-such-model")
            .unwrap_err()
            .to_string();
        assert!(err.contains("no-such-org/no-such-model"), "{err}");
        assert!(err.contains("checkpoint folder"), "{err}");
        #[cfg(not(feature = "hub"))]
        assert!(err.contains("`hub` feature"), "{err}");
    }

    #[test]
    fn secrets_debug_says_which_keys_are_set_but_not_what_they_are() {
        let secrets = Secrets {
            llm_api_key: Some("sk-hunter2".into()),
            engine_api_key: None,
            tinker_api_key: None,
        };
        let text = format!("{secrets:?} {secrets:#?}");
        assert!(!text.contains("hunter2"), "{text}");
        assert!(
            text.contains("llm_api_key: Some(\"<redacted>\")")
                && text.contains("engine_api_key: None"),
            "{text}"
        );
    }
}
