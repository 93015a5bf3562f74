//! [`RescueConfig`]: one serde value describes a whole training run, and every strategy of the
//! paper (and DAPO's dynamic sampling) is a [`Strategy`] value rather than code.

use std::path::Path;

use harness_core::{HarnessId, RescueObjective, SamplingParams};
use harness_pool::SiblingPool;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// K = G = 8: rollouts per task under H0 and size of every retained group (paper, "Shared
/// Policy Optimization": "Each retained group contains G = K = 8 trajectories").
pub const PAPER_GROUP_SIZE: usize = 8;
/// Tasks per update: Table 9 reports 2,560 plain-GRPO rollouts over 40 updates, i.e.
/// 64 = 8 tasks x 8 rollouts per update.
pub const PAPER_BATCH_TASKS: usize = 8;
/// Updates of the Table 9 runs.
pub const PAPER_UPDATES: u64 = 40;
/// Profiles are "refreshed every ten updates, and re-anchored with the final policy"
/// (paper, "Profile refresh").
pub const PAPER_CALIBRATE_EVERY: u64 = 10;
/// Test tasks receive three executor rollouts (Pass@3 / Avg@3, "Evaluation protocol").
pub const PAPER_EVAL_K: usize = 3;

/// How a run forms each task's retained group.
///
/// The JSON form is tagged by `kind`:
/// `{"kind": "grpo"}`, `{"kind": "h0_rescue"}`, `{"kind": "random_harness"}`,
/// `{"kind": "router", "allocation": {"kind": "top_k"}}`,
/// `{"kind": "router", "allocation": {"kind": "top_m_x_n", "m": 4, "n": 2}}`,
/// `{"kind": "fixed_mixture", "mixture": [{"harness": "H0", "rollouts": 4}, ...]}`,
/// `{"kind": "dynamic_sampling", "max_batches": 3}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Strategy {
    /// Plain GRPO: keep the initial H0 group whatever its rewards.
    Grpo,
    /// "GRPO (H0 rescue)": replace an all-failure group with K fresh H0 rollouts (new seeds).
    H0Rescue,
    /// "Random Harness": rescue with K distinct auxiliary pool members drawn at random.
    RandomHarness,
    /// Rescue with the harnesses a [`harness_core::HarnessSelector`] returns (Eq. 10).
    Router {
        /// How the rescue rollouts are spread over the selected harnesses.
        #[serde(default)]
        allocation: Allocation,
    },
    /// "Fixed mixed-harness GRPO": every task gets the same mixture of harnesses, without
    /// waiting for an all-failure base group ("4 H0 + 4 Claude Code", "H0 + Top-4").
    FixedMixture {
        /// Harnesses with their rollout counts; the counts sum to the group size.
        mixture: Vec<MixtureEntry>,
    },
    /// DAPO-style dynamic sampling: drop groups without reward variance and draw more tasks,
    /// at most `max_batches` batches of tasks per update, until the batch is full.
    DynamicSampling {
        /// Upper bound on task batches drawn for one update (1 = no extra draws).
        max_batches: usize,
    },
}

impl Default for Strategy {
    /// Harness-S: router rescue with Top-K allocation.
    fn default() -> Self {
        Strategy::Router {
            allocation: Allocation::TopK,
        }
    }
}

impl Strategy {
    /// The name written into `metrics.jsonl` and `cost.json`.
    pub fn label(&self) -> String {
        match self {
            Strategy::Grpo => "grpo".into(),
            Strategy::H0Rescue => "h0_rescue".into(),
            Strategy::RandomHarness => "random_harness".into(),
            Strategy::Router {
                allocation: Allocation::TopK,
            } => "router_top_k".into(),
            Strategy::Router {
                allocation: Allocation::TopMXN { m, n },
            } => format!("router_top_{m}x{n}"),
            Strategy::FixedMixture { .. } => "fixed_mixture".into(),
            Strategy::DynamicSampling { .. } => "dynamic_sampling".into(),
        }
    }

    /// Whether the strategy retains trajectories of sibling harnesses in place of a failed H0
    /// group (random-harness and router rescue): the only groups a rescue objective other than
    /// the paper's changes.
    pub fn rescues_with_siblings(&self) -> bool {
        matches!(self, Strategy::RandomHarness | Strategy::Router { .. })
    }

    /// Whether the strategy asks a selector (and so re-anchors a calibrator).
    pub fn uses_selector(&self) -> bool {
        matches!(self, Strategy::Router { .. })
    }
}

/// How the router's rescue rollouts are spread (paper, "Rescue allocation variants").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Allocation {
    /// One rollout on each of K selected harnesses (the paper's Top-8).
    #[default]
    TopK,
    /// `n` rollouts on each of `m` selected harnesses (the paper's LLM Router 4x2); `m * n` is
    /// the group size.
    #[serde(rename = "top_m_x_n")]
    TopMXN {
        /// Harnesses selected.
        m: usize,
        /// Rollouts per selected harness.
        n: usize,
    },
}

/// One harness of a fixed mixture.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixtureEntry {
    /// `"base"` for H0, a member's id, or a member's unique name.
    pub harness: String,
    /// Rollouts under it for every task.
    pub rollouts: usize,
}

/// Retries of the weight sync after each update.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyncRetry {
    /// Attempts before the run stops with an error (at least 1).
    pub attempts: u32,
    /// Pause before the second attempt, doubled after each failure.
    pub backoff_ms: u64,
}

impl Default for SyncRetry {
    fn default() -> Self {
        SyncRetry {
            attempts: 3,
            backoff_ms: 500,
        }
    }
}

/// The complete configuration of a rescue-training run. Paper values are the defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RescueConfig {
    /// The one seed of the run: task order, episode seeds, selector seeds, random draws.
    #[serde(default)]
    pub seed: u64,
    /// Policy updates (Table 9: 40).
    #[serde(default = "default_updates")]
    pub updates: u64,
    /// K = G: rollouts per task under H0 and size of every retained group.
    #[serde(default = "default_group_size")]
    pub group_size: usize,
    /// Tasks per update.
    #[serde(default = "default_batch_tasks")]
    pub batch_tasks: usize,
    /// How retained groups are formed.
    #[serde(default)]
    pub strategy: Strategy,
    /// How the policy tokens of trajectories retained from a sibling rescue are scored
    /// (`harness_core::objective`): `generating` (the paper, Eqs. 13-16, the default), `masked`
    /// (only the turns from the sibling's first intervention on) or `h0` (re-rendered under
    /// H0's prompt, Guide's `r / (r + gamma)`). H0 groups are scored as the paper scores them
    /// whatever the setting. Only for sibling-rescue strategies (`random_harness`, `router`).
    #[serde(default)]
    pub rescue_objective: RescueObjective,
    /// Shuffle the task order each epoch (seeded); `false` keeps the given order.
    #[serde(default = "yes")]
    pub shuffle: bool,
    /// Episodes in flight at once.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// How the policy samples in training and validation episodes. The trainer's `pi_old` must
    /// describe it (temperature, no truncation) for Eq. 16's weight to be an importance weight.
    #[serde(default)]
    pub sampling: SamplingParams,
    /// Re-anchor the calibrator every this many updates (0: only before training and at the end).
    #[serde(default = "default_calibrate_every")]
    pub calibrate_every: u64,
    /// Calibrate once before the first update (Algorithm 1, line 1).
    #[serde(default = "yes")]
    pub initial_calibration: bool,
    /// Re-anchor with the final policy (Algorithm 1, line 14).
    #[serde(default = "yes")]
    pub final_calibration: bool,
    /// Validation Pass@k / Avg@k under H0 every this many updates (0: never).
    #[serde(default)]
    pub eval_every: u64,
    /// Attempts per validation task.
    #[serde(default = "default_eval_k")]
    pub eval_k: usize,
    /// Write a checkpoint every this many updates (0: only at the end).
    #[serde(default = "default_checkpoint_every")]
    pub checkpoint_every: u64,
    /// Complete checkpoints kept on disk (at least 1; 2 keeps the previous one).
    #[serde(default = "default_keep_checkpoints")]
    pub keep_checkpoints: usize,
    /// Retries of the weight sync after each update.
    #[serde(default)]
    pub sync_retry: SyncRetry,
}

fn default_updates() -> u64 {
    PAPER_UPDATES
}
fn default_group_size() -> usize {
    PAPER_GROUP_SIZE
}
fn default_batch_tasks() -> usize {
    PAPER_BATCH_TASKS
}
fn default_concurrency() -> usize {
    64
}
fn default_calibrate_every() -> u64 {
    PAPER_CALIBRATE_EVERY
}
fn default_eval_k() -> usize {
    PAPER_EVAL_K
}
fn default_checkpoint_every() -> u64 {
    10
}
fn default_keep_checkpoints() -> usize {
    2
}
fn yes() -> bool {
    true
}

impl Default for RescueConfig {
    fn default() -> Self {
        serde_json::from_str("{}").unwrap_or_else(|_| unreachable!("every field has a default"))
    }
}

impl RescueConfig {
    /// Parse a config document; errors name the file (when given) and the field.
    pub fn from_json(text: &str, file: Option<&Path>) -> Result<Self> {
        let de = &mut serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| Error::Config {
            file: file.map(Path::to_path_buf),
            field: e.path().to_string(),
            message: e.into_inner().to_string(),
        })
    }

    /// Read and parse a config file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_json(&text, Some(path))
    }

    /// Distinct auxiliary harnesses (pool members besides H0) one rescue group of the strategy
    /// draws from: K for random-harness and Top-K rescue, m for Top-m x n, none for the others
    /// (a fixed mixture names its members instead). [`RescueConfig::validate`] refuses a pool
    /// with fewer.
    pub fn auxiliaries_needed(&self) -> usize {
        match self.strategy {
            Strategy::RandomHarness
            | Strategy::Router {
                allocation: Allocation::TopK,
            } => self.group_size,
            Strategy::Router {
                allocation: Allocation::TopMXN { m, .. },
            } => m,
            _ => 0,
        }
    }

    /// Check the values on their own and against the pool the run trains with.
    pub fn validate(&self, pool: &SiblingPool) -> Result<()> {
        let positive = |field: &str, v: usize| {
            if v == 0 {
                Err(Error::config(field, "must be at least 1"))
            } else {
                Ok(())
            }
        };
        positive("group_size", self.group_size)?;
        positive("batch_tasks", self.batch_tasks)?;
        positive("concurrency", self.concurrency)?;
        positive("keep_checkpoints", self.keep_checkpoints)?;
        if self.eval_every > 0 {
            positive("eval_k", self.eval_k)?;
        }
        if self.sync_retry.attempts == 0 {
            return Err(Error::config("sync_retry.attempts", "must be at least 1"));
        }
        let k = self.group_size;
        let auxiliaries = pool.auxiliaries().count();
        let need_aux = |field: &str| {
            let n = self.auxiliaries_needed();
            if auxiliaries < n {
                Err(Error::config(
                    field,
                    format!(
                        "needs {n} distinct auxiliary harnesses but the pool has {auxiliaries} besides H0"
                    ),
                ))
            } else {
                Ok(())
            }
        };
        match &self.strategy {
            Strategy::Grpo | Strategy::H0Rescue => {}
            Strategy::RandomHarness => need_aux("strategy")?,
            Strategy::Router { allocation } => match *allocation {
                Allocation::TopK => need_aux("strategy.allocation")?,
                Allocation::TopMXN { m, n } => {
                    if m == 0 || n == 0 || m * n != k {
                        return Err(Error::config(
                            "strategy.allocation",
                            format!(
                                "m = {m} harnesses x n = {n} rollouts must be positive and give the group size {k} (every rescue group has K rollouts)"
                            ),
                        ));
                    }
                    need_aux("strategy.allocation.m")?;
                }
            },
            Strategy::FixedMixture { mixture } => {
                if mixture.is_empty() {
                    return Err(Error::config(
                        "strategy.mixture",
                        "is empty; expected harnesses with rollout counts",
                    ));
                }
                let total: usize = mixture.iter().map(|e| e.rollouts).sum();
                if total != k {
                    return Err(Error::config(
                        "strategy.mixture",
                        format!("rollout counts sum to {total}; expected the group size {k}"),
                    ));
                }
                for (i, entry) in mixture.iter().enumerate() {
                    if entry.rollouts == 0 {
                        return Err(Error::config(
                            format!("strategy.mixture[{i}].rollouts"),
                            "must be at least 1",
                        ));
                    }
                    resolve_harness(pool, &entry.harness)
                        .map_err(|m| Error::config(format!("strategy.mixture[{i}].harness"), m))?;
                }
            }
            Strategy::DynamicSampling { max_batches } => {
                positive("strategy.max_batches", *max_batches)?;
            }
        }
        self.validate_rescue_objective(pool)
    }

    /// `rescue_objective` against the strategy and the pool: a non-paper objective needs a
    /// sibling rescue to act on, and `h0` needs every auxiliary the rescue may pick to be
    /// re-renderable under H0 (no agent program, the same tool view and memory policy as H0).
    fn validate_rescue_objective(&self, pool: &SiblingPool) -> Result<()> {
        let objective = self.rescue_objective;
        if objective.is_paper() {
            return Ok(());
        }
        if !self.strategy.rescues_with_siblings() {
            return Err(Error::config(
                "rescue_objective",
                format!(
                    "`{objective}` scores trajectories retained from a sibling rescue, and strategy `{}` retains none; expected `generating`, or strategy `random_harness` or `router`",
                    self.strategy.label()
                ),
            ));
        }
        if objective == RescueObjective::H0 {
            let refused: Vec<String> = pool
                .auxiliaries()
                .filter_map(|h| harness_core::h0_rerender_refusal(pool.base(), h))
                .collect();
            if !refused.is_empty() {
                return Err(Error::config(
                    "rescue_objective",
                    format!(
                        "`h0` re-renders rescued turns under H0's prompt (hook messages dropped, observations kept), which cannot show what these siblings' policy saw: {}; expected a pool whose auxiliaries differ from H0 only in prompt, skills, hooks, context policy or limits, or `rescue_objective = \"generating\"` or `\"masked\"`",
                        refused.join("; ")
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Resolve a mixture's harness reference: `"base"`/`"H0"` for the base, a member id, or a
/// member's unique name.
pub fn resolve_harness(
    pool: &SiblingPool,
    reference: &str,
) -> std::result::Result<HarnessId, String> {
    if reference == "base" {
        return Ok(pool.base_id().clone());
    }
    let id = HarnessId(reference.to_string());
    if pool.contains(&id) {
        return Ok(id);
    }
    let named: Vec<&harness_core::Harness> = pool
        .members()
        .iter()
        .filter(|h| h.name == reference)
        .collect();
    match named.as_slice() {
        [one] => Ok(one.id()),
        [] => Err(format!(
            "`{reference}` is neither `base`, a member id nor a member name; members: {}",
            pool.members()
                .iter()
                .map(|h| format!("{} ({})", h.name, h.id()))
                .collect::<Vec<_>>()
                .join(", ")
        )),
        _ => Err(format!(
            "`{reference}` names {} members; use an id",
            named.len()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use harness_core::Harness;

    fn pool(siblings: usize) -> SiblingPool {
        SiblingPool::starter(
            Harness::new("H0", "Base."),
            (1..=siblings).map(|i| Harness::new(format!("S{i}"), format!("Sibling {i}."))),
            serde_json::Value::Null,
        )
        .unwrap()
    }

    #[test]
    fn defaults_are_the_paper_values() {
        let cfg = RescueConfig::default();
        assert_eq!((cfg.group_size, cfg.batch_tasks, cfg.updates), (8, 8, 40));
        assert_eq!((cfg.calibrate_every, cfg.eval_k), (10, 3));
        assert!(cfg.initial_calibration && cfg.final_calibration);
        assert_eq!(cfg.strategy, Strategy::default());
        assert_eq!(cfg.strategy.label(), "router_top_k");
    }

    #[test]
    fn every_strategy_round_trips_through_json() {
        for (json, label) in [
            (r#"{"kind": "grpo"}"#, "grpo"),
            (r#"{"kind": "h0_rescue"}"#, "h0_rescue"),
            (r#"{"kind": "random_harness"}"#, "random_harness"),
            (r#"{"kind": "router"}"#, "router_top_k"),
            (
                r#"{"kind": "router", "allocation": {"kind": "top_m_x_n", "m": 4, "n": 2}}"#,
                "router_top_4x2",
            ),
            (
                r#"{"kind": "fixed_mixture", "mixture": [{"harness": "base", "rollouts": 4}, {"harness": "S1", "rollouts": 4}]}"#,
                "fixed_mixture",
            ),
            (
                r#"{"kind": "dynamic_sampling", "max_batches": 3}"#,
                "dynamic_sampling",
            ),
        ] {
            let cfg = RescueConfig::from_json(&format!(r#"{{"strategy": {json}}}"#), None).unwrap();
            assert_eq!(cfg.strategy.label(), label);
            cfg.validate(&pool(8)).unwrap();
            let back =
                RescueConfig::from_json(&serde_json::to_string(&cfg).unwrap(), None).unwrap();
            assert_eq!(back, cfg);
        }
    }

    #[test]
    fn bad_documents_name_the_file_and_the_field() {
        let err = RescueConfig::from_json(
            r#"{"strategy": {"kind": "router", "allocation": {"kind": "top_m_x_n", "m": 4}}}"#,
            Some(Path::new("runs/a.json")),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("runs/a.json") && err.contains("strategy"),
            "{err}"
        );
        let err = RescueConfig::from_json(r#"{"group_sise": 8}"#, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("group_sise"), "{err}");
    }

    #[test]
    fn inconsistent_values_are_refused_with_the_field_and_what_was_expected() {
        let check = |json: &str, siblings: usize| {
            RescueConfig::from_json(json, None)
                .unwrap()
                .validate(&pool(siblings))
                .unwrap_err()
                .to_string()
        };
        let err = check(r#"{"strategy": {"kind": "random_harness"}}"#, 7);
        assert!(
            err.contains("needs 8 distinct auxiliary harnesses but the pool has 7"),
            "{err}"
        );
        let err = check(
            r#"{"strategy": {"kind": "fixed_mixture", "mixture": [{"harness": "base", "rollouts": 4}, {"harness": "S1", "rollouts": 3}]}}"#,
            8,
        );
        assert!(err.contains("sum to 7; expected the group size 8"), "{err}");
        let err = check(
            r#"{"strategy": {"kind": "fixed_mixture", "mixture": [{"harness": "base", "rollouts": 4}, {"harness": "Claude", "rollouts": 4}]}}"#,
            8,
        );
        assert!(
            err.contains("strategy.mixture[1].harness") && err.contains("`Claude`"),
            "{err}"
        );
        let err = check(r#"{"group_size": 0}"#, 8);
        assert!(err.contains("`group_size`: must be at least 1"), "{err}");
    }

    #[test]
    fn rescue_objectives_are_settings_of_sibling_rescue() {
        let cfg = RescueConfig::default();
        assert_eq!(
            cfg.rescue_objective,
            RescueObjective::Generating,
            "the paper's"
        );
        for o in ["generating", "masked", "h0"] {
            let cfg = RescueConfig::from_json(&format!(r#"{{"rescue_objective": "{o}"}}"#), None)
                .unwrap();
            assert_eq!(cfg.rescue_objective.label(), o);
            cfg.validate(&pool(8)).unwrap();
        }
        let err = RescueConfig::from_json(
            r#"{"rescue_objective": "hinted"}"#,
            Some(Path::new("r.json")),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("r.json") && err.contains("rescue_objective") && err.contains("masked"),
            "{err}"
        );
        let err = RescueConfig::from_json(
            r#"{"rescue_objective": "masked", "strategy": {"kind": "grpo"}}"#,
            None,
        )
        .unwrap()
        .validate(&pool(8))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("rescue_objective") && err.contains("retains none"),
            "{err}"
        );
    }

    #[test]
    fn h0_is_refused_for_a_tool_view_sibling_and_masked_is_not() {
        let mut view = Harness::new("S-view", "Base.");
        view.tool_view.max_observation_chars = Some(200);
        let p = SiblingPool::starter(
            Harness::new("H0", "Base."),
            (1..=7)
                .map(|i| Harness::new(format!("S{i}"), format!("Sibling {i}.")))
                .chain([view]),
            serde_json::Value::Null,
        )
        .unwrap();
        let cfg = |o: &str| {
            RescueConfig::from_json(&format!(r#"{{"rescue_objective": "{o}"}}"#), None).unwrap()
        };
        let err = cfg("h0").validate(&p).unwrap_err().to_string();
        assert!(
            err.contains("rescue_objective") && err.contains("S-view") && err.contains("tool view"),
            "{err}"
        );
        // Controls: the same pool is fine for the other objectives, and a pool without the
        // tool-view sibling is fine for `h0`.
        cfg("masked").validate(&p).unwrap();
        cfg("generating").validate(&p).unwrap();
        cfg("h0").validate(&pool(8)).unwrap();
    }

    #[test]
    fn the_auxiliaries_a_strategy_needs_are_what_validation_asks_of_the_pool() {
        for (json, needed) in [
            (r#"{"strategy": {"kind": "grpo"}}"#, 0),
            (r#"{"strategy": {"kind": "h0_rescue"}}"#, 0),
            (r#"{"strategy": {"kind": "random_harness"}}"#, 8),
            (
                r#"{"strategy": {"kind": "router", "allocation": {"kind": "top_k"}}}"#,
                8,
            ),
            (
                r#"{"strategy": {"kind": "router", "allocation": {"kind": "top_m_x_n", "m": 4, "n": 2}}}"#,
                4,
            ),
        ] {
            let cfg = RescueConfig::from_json(json, None).unwrap();
            assert_eq!(cfg.auxiliaries_needed(), needed, "{json}");
            assert!(cfg.validate(&pool(needed)).is_ok(), "{json}");
            if needed > 0 {
                assert!(cfg.validate(&pool(needed - 1)).is_err(), "{json}");
            }
        }
    }
}
