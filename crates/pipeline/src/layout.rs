//! Where a run's files go. Every table and plot of the report is made from these files.
//!
//! ```text
//! <out>/run.json                 the resolved configuration of the seed's run
//! <out>/evolve/                  evolution: pool/, rounds.json, round-<g>.json, diversity.json, figure*.svg
//! <out>/calibration/             the first calibration (profiles and validation statistics)
//! <out>/train/<method>/          one rescue-training run per method (metrics.jsonl, groups.jsonl,
//!                                trajectories.jsonl, cost.json, checkpoints/, calibrations/, final/),
//!                                or a search method's h_best.json, search.jsonl (sft.jsonl, final/)
//! <out>/*/stage_cost.json        rollouts, seconds and external tokens of evolve/, calibration/
//!                                and each train/<method>/ (Table 10)
//! <out>/eval/test.jsonl          test Pass@k / Avg@k per method under H0, and Rank-1
//! <out>/eval/rank.jsonl          Table 5: router ranks before and after training
//! <out>/eval/behaviour.jsonl     decision-point choices of the H0 test episodes per method (Table 3)
//!                                 and the decision-point probe (Table 3b)
//! <out>/eval/routing.jsonl       the router's Rank-1 harness per test task and its family
//! <out>/eval/cross.jsonl         test Pass@k / Avg@k per method under unseen harnesses (RQ6)
//! <out>/eval/episodes.jsonl      reward and behaviour labels of every H0 test attempt per method
//! <out>/eval/transfer.jsonl      Table 4: rescued kinds whose held-out instances a trained policy
//!                                 solves under H0 where the initial policy failed
//! <out>/report.md, report.html, plots/
//! ```
//! With several seeds each seed's run is `<out>/seed-<s>/` and the report sits in `<out>`.

use std::path::{Path, PathBuf};

use crate::config::Method;

/// The files of one seed's run.
#[derive(Debug, Clone)]
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    /// The layout under `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Layout { root: root.into() }
    }

    /// The run directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The resolved configuration.
    pub fn config(&self) -> PathBuf {
        self.root.join("run.json")
    }

    /// Evolution's outputs.
    pub fn evolve(&self) -> PathBuf {
        self.root.join("evolve")
    }

    /// The frozen pool evolution wrote.
    pub fn pool(&self) -> PathBuf {
        self.evolve().join("pool")
    }

    /// The agent programs of the pool the seed trains on (harness-report's `programs.json`).
    pub fn programs(&self) -> PathBuf {
        self.root.join(harness_report::layout::PROGRAMS_FILE)
    }

    /// The first calibration.
    pub fn calibration(&self) -> PathBuf {
        self.root.join("calibration")
    }

    /// One method's training run.
    pub fn train(&self, method: Method) -> PathBuf {
        self.root.join("train").join(method.name())
    }

    /// The trained policy of a method, as an HF checkpoint.
    pub fn final_checkpoint(&self, method: Method) -> PathBuf {
        self.train(method).join("final")
    }

    /// The test evaluations.
    pub fn test_results(&self) -> PathBuf {
        self.root.join("eval").join("test.jsonl")
    }

    /// Table 5's rank evaluations.
    pub fn rank_results(&self) -> PathBuf {
        self.root.join("eval").join("rank.jsonl")
    }

    /// The H0 test episodes' decision-point choices per method.
    pub fn behaviour_results(&self) -> PathBuf {
        self.root.join("eval").join("behaviour.jsonl")
    }

    /// Per test task and attempt of every H0 test evaluation: the reward and the behaviour
    /// labels.
    pub fn episode_results(&self) -> PathBuf {
        self.root.join("eval").join("episodes.jsonl")
    }

    /// What Table 3's LLM labeller spent per checkpoint.
    pub fn labeller_usage(&self) -> PathBuf {
        self.root.join("eval").join("labeller.jsonl")
    }

    /// The rescue diagnostics per method.
    pub fn diagnostics_results(&self) -> PathBuf {
        self.root.join("eval").join("diagnostics.jsonl")
    }

    /// Table 4's transfer cases per method.
    pub fn transfer_results(&self) -> PathBuf {
        self.root.join("eval").join("transfer.jsonl")
    }

    /// The test evaluations under harnesses outside the training pool (RQ6).
    pub fn cross_results(&self) -> PathBuf {
        self.root.join("eval").join("cross.jsonl")
    }

    /// The router's Rank-1 choice per test task, with the task's family.
    pub fn routing_results(&self) -> PathBuf {
        self.root.join("eval").join("routing.jsonl")
    }
}
