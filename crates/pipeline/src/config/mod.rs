//! The run configuration: every setting of the main job in one TOML or JSON document.
//!
//! A document may give any subset of the settings; the rest come from the preset it names
//! (`preset = "quick"`, the default, or `"paper"`), and flags (in the binary) override both.
//! Unknown fields are rejected, and every error names the file, the field and what was expected.
//! [`RunConfig::validate`] checks the values that parse but make no sense (K = 0, a Top-K larger
//! than the pool, a missing pool directory, ...).

use std::path::{Path, PathBuf};

use harness_core::RescueObjective;
use harness_evolve::meta_harness::HistoryBounds;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::keys;

mod env;
mod evolve;
mod external;
mod policy;
mod search;
mod set;
mod tinker;
mod train;
mod validate;

pub use env::*;
pub use evolve::*;
pub use external::*;
pub use policy::*;
pub use search::*;
pub use set::*;
pub use tinker::*;
pub use train::*;

/// The most seeds one run configuration may ask for (each seed runs the whole job).
pub const MAX_SEEDS: usize = 1000;

/// Which defaults a document starts from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Preset {
    /// The embedded default: minutes on a laptop CPU.
    #[default]
    Quick,
    /// The paper's values (K = G = 8, 40 updates, re-anchoring every 10, Table 8 evolution,
    /// k = 3 test rollouts), for a real checkpoint on a GPU.
    Paper,
}

impl std::str::FromStr for Preset {
    type Err = String;

    fn from_str(name: &str) -> std::result::Result<Self, String> {
        match name {
            "quick" => Ok(Preset::Quick),
            "paper" => Ok(Preset::Paper),
            other => Err(format!("unknown preset `{other}`; expected quick or paper")),
        }
    }
}

pub use crate::methods::Method;

/// Table 6's split sizes (train, validation, test) of the paper's benchmarks, by the name of the
/// environment that stands in for each: `appworld`, `dbbench`, `swe` (SWE-Gym). The paper
/// preset uses them; an environment with fewer tasks runs all it has (docs/ENVIRONMENTS.md lists where).
pub fn paper_splits(env: &str) -> Option<(usize, usize, usize)> {
    match env {
        "appworld" => Some((320, 150, 262)),
        "dbbench" => Some((1600, 200, 300)),
        "swe" => Some((240, 100, 160)),
        _ => None,
    }
}

/// Every setting of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// The defaults the document starts from.
    pub preset: Preset,
    /// The one seed of the run: every random choice derives from it.
    pub seed: u64,
    /// Seeds run one after another (`seed`, `seed + 1`, ...); the report gives mean and
    /// standard deviation across them, as the paper's Table 1 does.
    pub seeds: usize,
    /// The run directory.
    pub out: PathBuf,
    /// A saved pool directory to train on instead of `out/evolve/pool`.
    pub pool: Option<PathBuf>,
    /// The environment.
    pub env: EnvConfig,
    /// The policy.
    pub policy: PolicyConfig,
    /// The LLM roles.
    pub roles: RolesConfig,
    /// Rollout sampling.
    pub rollout: RolloutConfig,
    /// Evolution.
    pub evolve: EvolveConfig,
    /// Calibration.
    pub calibration: CalibrationConfig,
    /// Training.
    pub train: TrainConfig,
    /// The search methods (Meta-Harness, WHALE).
    #[serde(default = "SearchConfig::quick")]
    pub search: SearchConfig,
    /// Test evaluation.
    pub eval: EvalConfig,
    /// Agent programs in the pool.
    #[serde(default)]
    pub external: ExternalConfig,
    /// Where the policy update runs: `candle` (this process) or `tinker` (a server).
    #[serde(default, skip_serializing_if = "LearnerKind::is_candle")]
    pub learner: LearnerKind,
    /// The Tinker learner.
    #[serde(default, skip_serializing_if = "TinkerSettings::is_default")]
    pub tinker: TinkerSettings,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig::preset(Preset::Quick)
    }
}

impl RunConfig {
    /// The settings of a preset.
    pub fn preset(preset: Preset) -> Self {
        let quick = preset == Preset::Quick;
        RunConfig {
            preset,
            seed: 42,
            seeds: 1,
            out: PathBuf::from("runs/main"),
            pool: None,
            env: EnvConfig {
                name: "default".into(),
                dbbench_data: None,
                tau_retail_data: None,
                tau_user: TauUser::Scripted,
                tau_nl_judge: false,
                tau_llm_attempts: default_tau_llm_attempts(),
                execution_limits: if quick {
                    ExecutionLimits::Harness
                } else {
                    ExecutionLimits::Paper
                },
                train_tasks: if quick { 240 } else { 1000 },
                validation_tasks: if quick { 24 } else { 60 },
                // Every test task of the embedded default (110): paired test tasks resolve
                // about 3.4 points of H0 Avg@3 in one seed (the per-task differences between
                // checkpoints of a seed-42 run spread 0.17-0.19, so the 95% half-width is
                // about 1.96 x 0.18 / sqrt(110)); seeds add their own training noise on top.
                test_tasks: if quick { 110 } else { 100 },
            },
            policy: PolicyConfig {
                model: None,
                cache_dir: PathBuf::from("runs/cache"),
                warm_start_preset: WarmStartPreset::Default,
                warm_start: warm_start_defaults(WarmStartPreset::Default),
                // The tiny policy needs a far larger step than the paper's 4B models for 16
                // updates to move its decisions at all (2e-4 left them unchanged).
                learning_rate: if quick { 1e-3 } else { 1e-6 },
                threads: None,
            },
            roles: RolesConfig {
                llm: None,
                llm_model: "gpt-4o-mini".into(),
                llm_key_env: "OPENAI_API_KEY".into(),
                allow_insecure_http: false,
                voters: 4,
                max_tokens: None,
                timeout_s: default_role_timeout_s(),
                llm_roles: default_llm_roles(),
            },
            rollout: RolloutConfig {
                engine: RolloutEngine::Local,
                engine_url: None,
                allow_insecure_http: false,
                served_model: None,
                weights_dir: None,
                temperature: 1.0,
                concurrency: if quick { 32 } else { 64 },
            },
            evolve: EvolveConfig {
                source: PoolSource::Evolve,
                // Table 8: three rounds with budgets 7 / 8 / 8 and B = 4 parent slots; the
                // quick preset runs three short rounds.
                proposal_budgets: if quick { vec![4, 4, 4] } else { vec![7, 8, 8] },
                parent_slots: 4,
                train_tasks_per_round: if quick { 24 } else { 40 },
                local_eval_tasks: if quick { 12 } else { 30 },
                local_eval_controls: if quick { 4 } else { 10 },
                revisions: 1,
                analyst_batch: default_analyst_batch(),
            },
            calibration: CalibrationConfig {
                every: if quick { 4 } else { 10 },
                rollouts_per_task: 1,
                task_features: harness_router::FeatureSource::Text,
            },
            train: TrainConfig {
                // The quick preset's four rows; the paper preset's every row of Tables 1
                // and 2.
                methods: if quick {
                    vec![
                        Method::Grpo,
                        Method::H0Rescue,
                        Method::HarnessSFixed,
                        Method::HarnessS,
                    ]
                } else {
                    Method::paper_rows()
                },
                updates: if quick { 16 } else { 40 },
                group_size: if quick { 4 } else { 8 },
                // Table 9: 40 updates x 8 tasks x G = 8 = 2,560 plain-GRPO rollouts
                // (harness_rollout::PAPER_BATCH_TASKS).
                batch_tasks: if quick {
                    8
                } else {
                    harness_rollout::config::PAPER_BATCH_TASKS
                },
                eval_every: if quick { 2 } else { 5 },
                eval_k: if quick { 2 } else { 3 },
                checkpoint_every: if quick { 4 } else { 10 },
                rescue_objective: RescueObjective::Generating,
            },
            search: SearchConfig {
                proposals: None,
                meta_harness_budget_ratio: PAPER_META_HARNESS_BUDGET_RATIO,
                whale_sft_learning_rate: if quick { 1e-3 } else { 1e-6 },
                history_candidates: default_history_candidates(),
                history_traces: default_history_traces(),
                history_trace_chars: default_history_trace_chars(),
                max_unscored_in_a_row: default_max_unscored_in_a_row(),
                whale_rounds: if quick { 2 } else { 4 },
            },
            eval: EvalConfig {
                k: 3,
                ranks: 3,
                harnesses: Vec::new(),
            },
            external: ExternalConfig::default(),
            learner: LearnerKind::Candle,
            tinker: TinkerSettings::default(),
        }
    }

    /// Parse a document (`toml` or `json` by the file's extension; `file` names it in errors).
    pub fn parse(text: &str, file: &Path) -> Result<Self> {
        Self::from_value(parse_document(text, file)?, Some(file))
    }

    /// Read a run configuration file.
    pub fn load(file: impl AsRef<Path>) -> Result<Self> {
        let file = file.as_ref();
        Self::from_value(document(file)?, Some(file))
    }

    /// The configuration of `file` (or the defaults without one), with `preset`, when given,
    /// in place of the preset the file names: the file's own settings still apply over it.
    pub fn load_with_preset(file: Option<&Path>, preset: Option<Preset>) -> Result<Self> {
        let mut doc = match file {
            Some(path) => document(path)?,
            None => Value::Object(Default::default()),
        };
        if let Some(preset) = preset {
            doc["preset"] =
                serde_json::to_value(preset).unwrap_or_else(|_| unreachable!("plain data"));
        }
        Self::from_value(doc, file)
    }

    /// Build from a parsed document: the preset it names, with the document's fields over it.
    pub fn from_value(doc: Value, file: Option<&Path>) -> Result<Self> {
        let file_path = file.map_or_else(|| PathBuf::from("<run config>"), Path::to_path_buf);
        let config_error = |field: String, message: String| Error::Config {
            file: file_path.clone(),
            field,
            message,
        };
        let Value::Object(_) = doc else {
            return Err(config_error(
                String::new(),
                "expected a table of settings at the top level".into(),
            ));
        };
        let preset: Preset = match doc.get("preset") {
            None => Preset::Quick,
            Some(v) => serde_json::from_value(v.clone()).map_err(|_| {
                config_error(
                    "preset".into(),
                    format!("expected \"quick\" or \"paper\", found {v}"),
                )
            })?,
        };
        let mut merged = serde_json::to_value(RunConfig::preset(preset))
            .unwrap_or_else(|_| unreachable!("plain data"));
        if preset == Preset::Paper
            && let Some((train, validation, test)) = doc
                .pointer("/env/name")
                .and_then(Value::as_str)
                .and_then(paper_splits)
        {
            // Table 6's split of the environment, under the document's own sizes.
            merged["env"]["train_tasks"] = train.into();
            merged["env"]["validation_tasks"] = validation.into();
            merged["env"]["test_tasks"] = test.into();
        }
        let tiny = doc.pointer("/policy/warm_start_preset") == Some(&Value::from("tiny"));
        if tiny {
            merged["policy"]["warm_start"] = warm_start_defaults(WarmStartPreset::Tiny);
        }
        merge(&mut merged, doc);
        let cfg: RunConfig = serde_path_to_error::deserialize(merged)
            .map_err(|e| config_error(e.path().to_string(), e.into_inner().to_string()))?;
        // The warm start's own fields are checked here too, so a typo names the file.
        harness_warmstart::WarmStartSettings::deserialize(&cfg.policy.warm_start)
            .map_err(|e| config_error("policy.warm_start".into(), e.to_string()))?
            .validate()
            .map_err(|e| config_error("policy.warm_start".into(), e.to_string()))?;
        Ok(cfg)
    }

    /// The run directory of one seed: `out` itself with one seed, `out/seed-<s>` with several.
    pub fn seed_dir(&self, seed: u64) -> PathBuf {
        if self.seeds <= 1 {
            self.out.clone()
        } else {
            self.out.join(format!("seed-{seed}"))
        }
    }

    /// The seeds of the run: `seed`, `seed + 1`, ... ([`RunConfig::validate`] refuses more than
    /// [`MAX_SEEDS`] of them, or a list that would pass `u64::MAX`).
    pub fn seed_list(&self) -> Vec<u64> {
        (0..self.seeds.min(MAX_SEEDS) as u64)
            .map(|i| self.seed.wrapping_add(i))
            .collect()
    }

    /// This configuration with another seed (for one run of several). Every seed's training
    /// starts from the same warm-started checkpoint, the one of this configuration's own seed
    /// (as the paper's runs start from one pretrained model): `policy.warm_start.seed` is
    /// pinned to it.
    pub fn with_seed(&self, seed: u64) -> RunConfig {
        let mut policy = self.policy.clone();
        let warm_seed = self.warm_start_seed();
        if let Some(table) = policy.warm_start.as_object_mut() {
            table.insert("seed".into(), Value::from(warm_seed));
        }
        RunConfig {
            seed,
            seeds: 1,
            out: self.seed_dir(seed),
            policy,
            ..self.clone()
        }
    }

    /// The warm start's seed: `policy.warm_start.seed` when given, else the run's `seed`.
    pub fn warm_start_seed(&self) -> u64 {
        self.policy
            .warm_start
            .get("seed")
            .and_then(Value::as_u64)
            .unwrap_or(self.seed)
    }
}

/// A warm-start preset's settings as a table, without `seed` (it follows the run's).
pub(crate) fn warm_start_defaults(preset: WarmStartPreset) -> Value {
    let settings = match preset {
        // The main job's organism is the prompt-rules variant, the paper's regime (docs/STUDY.md,
        // "The default organism"); harness-warmstart's own default, the recovery-hooks
        // variant, is one setting away (`policy.warm_start.organism = "recovery_hooks"`).
        WarmStartPreset::Default => harness_warmstart::WarmStartSettings {
            organism: harness_warmstart::Organism::PromptRules,
            ..harness_warmstart::WarmStartSettings::default()
        },
        WarmStartPreset::Tiny => harness_warmstart::WarmStartSettings::tiny(),
    };
    let mut value = serde_json::to_value(settings).unwrap_or_else(|_| unreachable!("plain data"));
    if let Some(table) = value.as_object_mut() {
        table.remove("seed");
    }
    value
}

/// A configuration file as a JSON value, before presets and validation (for callers that
/// change a field, such as `preset`, before building the configuration).
pub fn document(file: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(file).map_err(|e| Error::Config {
        file: file.to_path_buf(),
        field: String::new(),
        message: format!("cannot read it: {e}"),
    })?;
    parse_document(&text, file)
}

pub(crate) fn parse_document(text: &str, file: &Path) -> Result<Value> {
    match file.extension().and_then(|e| e.to_str()) {
        Some("json") => serde_json::from_str(text).map_err(|e| Error::Config {
            file: file.to_path_buf(),
            field: String::new(),
            message: format!("not valid JSON: {e}"),
        }),
        Some("toml") => toml::from_str(text).map_err(|e: toml::de::Error| Error::Config {
            file: file.to_path_buf(),
            field: String::new(),
            message: format!("not valid TOML: {}", e.message()),
        }),
        _ => Err(Error::Config {
            file: file.to_path_buf(),
            field: String::new(),
            message: "expected a `.toml` or `.json` run configuration".into(),
        }),
    }
}

/// Merge `over` into `base`: tables merge field by field, anything else replaces.
pub(crate) fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    // `warm_start` is free-form: a document's table replaces the default `{}`
                    // field by field like any other.
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, name: &str) -> Result<RunConfig> {
        RunConfig::parse(text, Path::new(name))
    }

    #[test]
    fn the_key_variable_must_end_in_api_key() {
        let cfg = parse("[roles]\nllm_key_env = \"HOME\"", "run.toml").unwrap();
        let e = cfg
            .validate(Some(Path::new("run.toml")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("run.toml")
                && e.contains("roles.llm_key_env")
                && e.contains("_API_KEY")
                && e.contains("`HOME`"),
            "{e}"
        );
        let cfg = parse("[roles]\nllm_key_env = \"GROQ_API_KEY\"", "run.toml").unwrap();
        cfg.validate(Some(Path::new("run.toml"))).unwrap();
    }

    #[test]
    fn urls_with_credentials_are_refused_without_being_repeated() {
        for (field, text) in [
            (
                "roles.llm",
                "[roles]\nllm = \"https://me:hunter2@api.example.com/v1\"",
            ),
            (
                "rollout.engine_url",
                "[rollout]\nengine = \"vllm\"\nengine_url = \"http://me:hunter2@127.0.0.1:8000\"",
            ),
        ] {
            let cfg = parse(text, "run.toml").unwrap();
            let e = cfg
                .validate(Some(Path::new("run.toml")))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("run.toml") && e.contains(field) && e.contains("credentials"),
                "{e}"
            );
            assert!(!e.contains("hunter2"), "{e}");
        }
    }

    #[test]
    fn keys_go_over_plain_http_only_to_loopback_unless_allowed() {
        let mut cfg = RunConfig::default();
        cfg.roles.llm = Some("http://api.example.com/v1".into());
        cfg.validate(None).unwrap();
        // Without a key nothing secret travels.
        cfg.check_key_transport(false, false).unwrap();
        let e = cfg
            .check_key_transport(true, false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("roles.llm") && e.contains("allow_insecure_http"),
            "{e}"
        );
        cfg.set("roles.allow_insecure_http", "true").unwrap();
        cfg.check_key_transport(true, false).unwrap();
        for url in ["http://127.0.0.1:8000/v1", "https://api.example.com/v1"] {
            cfg.roles.llm = Some(url.into());
            cfg.roles.allow_insecure_http = false;
            cfg.check_key_transport(true, false).unwrap();
        }

        cfg.rollout.engine = RolloutEngine::Vllm;
        cfg.rollout.engine_url = Some("http://gpu-box:8000".into());
        let e = cfg
            .check_key_transport(false, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rollout.engine_url"), "{e}");
        cfg.rollout.allow_insecure_http = true;
        cfg.check_key_transport(false, true).unwrap();
    }

    #[test]
    fn an_insecure_http_setting_that_is_off_stays_out_of_run_json() {
        let value = serde_json::to_value(RunConfig::default()).unwrap();
        assert!(value["roles"].get("allow_insecure_http").is_none());
        assert!(value["rollout"].get("allow_insecure_http").is_none());
    }

    #[test]
    fn an_empty_document_is_the_quick_preset() {
        assert_eq!(parse("", "a.toml").unwrap(), RunConfig::default());
        assert_eq!(parse("{}", "a.json").unwrap(), RunConfig::default());
    }

    #[test]
    fn the_paper_preset_has_the_papers_values() {
        let cfg = parse("preset = \"paper\"", "a.toml").unwrap();
        assert_eq!(cfg.train.group_size, 8);
        assert_eq!(cfg.train.updates, 40);
        assert_eq!(cfg.calibration.every, 10);
        assert_eq!(cfg.evolve.proposal_budgets, vec![7, 8, 8]);
        assert_eq!(cfg.evolve.parent_slots, 4);
        assert_eq!(cfg.eval.k, 3);
        // Table 9: 2,560 plain-GRPO rollouts over 40 updates at G = 8.
        assert_eq!(
            cfg.train.updates as usize * cfg.train.batch_tasks * cfg.train.group_size,
            2560
        );
        assert_eq!(cfg.search.whale_rounds, 4);
        for (env, split) in [
            ("appworld", (320, 150, 262)),
            ("dbbench", (1600, 200, 300)),
            ("swe", (240, 100, 160)),
        ] {
            let cfg = parse(
                &format!("preset = \"paper\"\n[env]\nname = \"{env}\"\n"),
                "a.toml",
            )
            .unwrap();
            let got = (
                cfg.env.train_tasks,
                cfg.env.validation_tasks,
                cfg.env.test_tasks,
            );
            assert_eq!(got, split, "{env}: Table 6");
        }
        // `--env` on the command line (a `set` after the file) gets Table 6's sizes too.
        let mut cfg = parse("preset = \"paper\"\n", "a.toml").unwrap();
        cfg.set("env.name", "\"appworld\"").unwrap();
        assert_eq!(
            (
                cfg.env.train_tasks,
                cfg.env.validation_tasks,
                cfg.env.test_tasks
            ),
            (320, 150, 262)
        );
        cfg.set("env.test_tasks", "7").unwrap();
        cfg.set("env.name", "\"swe\"").unwrap();
        assert_eq!(
            (
                cfg.env.train_tasks,
                cfg.env.validation_tasks,
                cfg.env.test_tasks
            ),
            (240, 100, 7)
        );
        // The document's own sizes still win.
        let cfg = parse(
            "preset = \"paper\"\n[env]\nname = \"dbbench\"\ntest_tasks = 50\n",
            "a.toml",
        )
        .unwrap();
        assert_eq!((cfg.env.train_tasks, cfg.env.test_tasks), (1600, 50));
    }

    #[test]
    fn the_shipped_comparison_configs_load_and_run_every_method() {
        for (name, text, preset) in [
            (
                "configs/compare.toml",
                include_str!("../../../../configs/compare.toml"),
                Preset::Quick,
            ),
            (
                "configs/paper.toml",
                include_str!("../../../../configs/paper.toml"),
                Preset::Paper,
            ),
        ] {
            let cfg = parse(text, name).unwrap_or_else(|e| panic!("{name}: {e}"));
            cfg.validate(None).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(cfg.preset, preset, "{name}");
            assert_eq!(cfg.train.methods, Method::ALL.to_vec(), "{name}");
            let want = if preset == Preset::Quick {
                "unseen"
            } else {
                "builtin"
            };
            assert_eq!(cfg.eval.harnesses, vec![want.to_string()], "{name}");
        }
        let name = "configs/external.toml";
        let cfg = parse(include_str!("../../../../configs/external.toml"), name).unwrap();
        cfg.validate(None).unwrap();
        assert!(cfg.train.methods.contains(&Method::MixtureProgram));
        assert_eq!(cfg.external.python_sibling, Some(true));
        assert_eq!(cfg.policy.warm_start["organism"], "recovery_hooks");
        let name = "configs/recovery-hooks.toml";
        let cfg = parse(
            include_str!("../../../../configs/recovery-hooks.toml"),
            name,
        )
        .unwrap();
        cfg.validate(None).unwrap();
        assert_eq!(cfg.policy.warm_start["organism"], "recovery_hooks");
        let mut default = RunConfig {
            out: cfg.out.clone(),
            seed: cfg.seed,
            ..RunConfig::default()
        };
        default
            .set("policy.warm_start.organism", "recovery_hooks")
            .unwrap();
        assert_eq!(cfg, default, "{name}: only the organism differs");
    }

    #[test]
    fn a_preset_flag_replaces_the_files_preset_but_not_its_settings() {
        assert_eq!(
            RunConfig::load_with_preset(None, Some(Preset::Paper)).unwrap(),
            RunConfig::preset(Preset::Paper)
        );
        let dir = std::env::temp_dir().join(format!("harness-s-preset-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("run.toml");
        std::fs::write(&file, "preset = \"quick\"\n[train]\nupdates = 3\n").unwrap();
        let cfg = RunConfig::load_with_preset(Some(&file), Some(Preset::Paper)).unwrap();
        assert_eq!(cfg.preset, Preset::Paper);
        assert_eq!(cfg.train.group_size, 8);
        assert_eq!(cfg.train.updates, 3);
        assert!(
            "huge"
                .parse::<Preset>()
                .unwrap_err()
                .contains("quick or paper")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn document_fields_override_the_preset_field_by_field() {
        let cfg = parse("preset = \"paper\"\n[train]\nupdates = 3\n", "a.toml").unwrap();
        assert_eq!(cfg.train.updates, 3);
        assert_eq!(cfg.train.group_size, 8);
    }

    #[test]
    fn errors_name_the_file_and_field() {
        let e = parse("[train]\nupdtes = 3\n", "run.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("run.toml") && e.contains("updtes"), "{e}");
        let e = parse("{\"train\": {\"group_size\": \"eight\"}}", "run.json")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("train.group_size") && e.contains("run.json"),
            "{e}"
        );
        let e = parse("[train]\nmethods = [\"ppo\"]\n", "run.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("train.methods") && e.contains("ppo"), "{e}");
    }

    #[test]
    fn validation_names_the_field() {
        let mut cfg = RunConfig::default();
        cfg.train.group_size = 0;
        let e = cfg
            .validate(Some(Path::new("x.toml")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("train.group_size") && e.contains("x.toml"),
            "{e}"
        );
        let cfg = RunConfig {
            pool: Some(PathBuf::from("/nonexistent/pool")),
            ..RunConfig::default()
        };
        let e = cfg.validate(None).unwrap_err().to_string();
        assert!(e.contains("pool") && e.contains("pool.json"), "{e}");
    }

    #[test]
    fn the_main_jobs_organism_is_prompt_rules_and_recovery_hooks_matches_older_runs() {
        let organism = |cfg: &RunConfig| {
            harness_warmstart::WarmStartSettings::deserialize(&cfg.policy.warm_start)
                .unwrap()
                .organism
        };
        let default = parse("", "a.toml").unwrap();
        assert_eq!(organism(&default), harness_warmstart::Organism::PromptRules);
        assert_eq!(default.policy.warm_start["organism"], "prompt_rules");
        // The tiny preset keeps harness-warmstart's own default.
        let tiny = parse("[policy]\nwarm_start_preset = \"tiny\"\n", "a.toml").unwrap();
        assert_eq!(organism(&tiny), harness_warmstart::Organism::RecoveryHooks);
        // Named, the recovery-hooks variant stays named through later settings (which merge
        // over the defaults), and matches a run saved before the setting existed, whose
        // `run.json` leaves the field out.
        let mut hooks = parse(
            "[policy.warm_start]\norganism = \"recovery_hooks\"\n",
            "a.toml",
        )
        .unwrap();
        hooks.set("seed", "43").unwrap();
        hooks
            .set("policy.warm_start.unprompted_good_rate", "0.0")
            .unwrap();
        assert_eq!(organism(&hooks), harness_warmstart::Organism::RecoveryHooks);
        let mut saved = serde_json::to_value(&hooks).unwrap();
        saved["policy"]["warm_start"]
            .as_object_mut()
            .unwrap()
            .remove("organism");
        assert_eq!(
            crate::comparable(saved.clone()),
            crate::comparable(serde_json::to_value(&hooks).unwrap())
        );
        // A saved run without the field is not one of the prompt-rules organism.
        let mut rules = hooks.clone();
        rules
            .set("policy.warm_start.organism", "prompt_rules")
            .unwrap();
        assert_ne!(
            crate::comparable(saved),
            crate::comparable(serde_json::to_value(&rules).unwrap())
        );
        let seeded = parse("[policy.warm_start]\nseed = 7\n", "a.toml").unwrap();
        assert_eq!(seeded.warm_start_seed(), 7);
    }

    #[test]
    fn threads_default_to_one_for_the_embedded_policy_and_do_not_change_a_runs_identity() {
        let cfg = RunConfig::default();
        assert_eq!(cfg.policy.threads, None);
        assert_eq!(cfg.policy.cpu_threads(), Some(1));
        let checkpoint = parse("[policy]\nmodel = \"/models/x\"\n", "a.toml").unwrap();
        assert_eq!(checkpoint.policy.cpu_threads(), None);
        let two = parse("[policy]\nthreads = 2\n", "a.toml").unwrap();
        assert_eq!(two.policy.cpu_threads(), Some(2));
        let e = parse("[policy]\nthreads = 0\n", "run.toml")
            .and_then(|c| c.validate(Some(Path::new("run.toml"))))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("run.toml") && e.contains("policy.threads") && e.contains("at least 1"),
            "{e}"
        );
        let value = |c: &RunConfig| serde_json::to_value(c).unwrap();
        assert_ne!(value(&cfg), value(&two));
        assert_eq!(
            crate::comparable(value(&cfg)),
            crate::comparable(value(&two))
        );
    }
}
