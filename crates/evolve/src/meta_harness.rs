//! The Meta-Harness comparison variant (paper, "Implementation of Comparison Variants", and
//! Table 1's frozen-policy row): a proposer that sees earlier candidates with their scores and
//! trajectories revises the harness; every candidate is checked for compatibility and scored on
//! training tasks; one `H_best` by training score is kept. It uses the same proposal budgets,
//! executor and verifier as Directional Harness Evolution, but keeps no pool and selects no
//! complementary parents.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use harness_core::{Harness, HarnessId, Task, ToolSpec, Trajectory};
use serde::{Deserialize, Serialize};

use crate::analyst::Analyst;
use crate::direction::Direction;
use crate::editor::{EditRequest, Editor, Proposal};
use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::settings::EvolveSettings;
use crate::usage::{RoleUsage, UsageByRole};
use crate::validate::{Rejection, validate_child};

/// One scored candidate of the search.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetaCandidate {
    /// Its id.
    pub id: HarnessId,
    /// Its name.
    pub name: String,
    /// The candidate it revises (`None` for the base).
    pub parent: Option<HarnessId>,
    /// The proposer's brief.
    pub brief: String,
    /// Training tasks solved.
    pub solved: usize,
    /// Training tasks run.
    pub tasks: usize,
}

impl MetaCandidate {
    /// Training success rate.
    pub fn score(&self) -> f64 {
        if self.tasks == 0 {
            0.0
        } else {
            self.solved as f64 / self.tasks as f64
        }
    }
}

/// The history a proposer sees: every scored candidate with its harness and trajectories.
pub struct History<'a> {
    /// Scored candidates in order, the base first.
    pub candidates: &'a [MetaCandidate],
    /// Their harnesses, by id.
    pub harnesses: &'a BTreeMap<HarnessId, Harness>,
    /// Their training trajectories, by id.
    pub trajectories: &'a BTreeMap<HarnessId, Vec<Trajectory>>,
    /// The environment's tools.
    pub tools: &'a [ToolSpec],
    /// The environment's name.
    pub env: &'a str,
}

/// Proposes the next candidate from the search history.
///
/// # Design
/// Meta-Harness's proposer reads earlier implementations, scores and execution traces; here it
/// gets them as plain data ([`History`]) and returns which candidate it revises and the edit,
/// which the host validates and scores itself. `Ok(None)` ends nothing: the slot is counted as
/// spent without a candidate.
#[async_trait]
pub trait Proposer: Send + Sync {
    /// A short name for reports.
    fn name(&self) -> &str;

    /// The candidate to revise and the revision.
    async fn propose(&self, history: &History<'_>) -> Result<Option<(HarnessId, Proposal)>>;

    /// Cumulative external-model usage.
    fn usage(&self) -> RoleUsage {
        RoleUsage::default()
    }
}

/// The built-in proposer: revise the best-scoring candidate so far along the root causes of
/// its failed trajectories, through an [`Analyst`] and an [`Editor`] (offline with the
/// built-in ones, or LLM-backed), each repeat along the same causes asking for a new variant.
/// Unlike Directional Harness Evolution it keeps one line of descent and applies no 2-3 cause,
/// 2-task support rule.
pub struct AnalystEditorProposer {
    /// Reads the best candidate's failures.
    pub analyst: Arc<dyn Analyst>,
    /// Writes the revision.
    pub editor: Arc<dyn Editor>,
    /// Direction rules (Table 8).
    pub settings: EvolveSettings,
}

#[async_trait]
impl Proposer for AnalystEditorProposer {
    fn name(&self) -> &str {
        "analyst-editor-proposer"
    }

    async fn propose(&self, history: &History<'_>) -> Result<Option<(HarnessId, Proposal)>> {
        // The best score so far; ties go to the earlier candidate.
        let Some(best) =
            history
                .candidates
                .iter()
                .fold(None::<&MetaCandidate>, |acc, c| match acc {
                    Some(a) if a.score() >= c.score() => Some(a),
                    _ => Some(c),
                })
        else {
            return Ok(None);
        };
        let harness = &history.harnesses[&best.id];
        let failures: Vec<Trajectory> = history.trajectories[&best.id]
            .iter()
            .filter(|t| !t.is_success())
            .cloned()
            .collect();
        let analysis = self.analyst.analyse(harness, &failures).await?;
        // Meta-Harness has no direction rule: the best candidate's causes, most frequent
        // first, up to `max_causes_per_direction` at a time, however thin their support.
        let causes: Vec<_> = analysis
            .causes
            .into_iter()
            .filter(|c| !c.tasks.is_empty())
            .collect();
        let groups: Vec<Vec<_>> = causes
            .chunks(self.settings.max_causes_per_direction.max(1))
            .map(<[_]>::to_vec)
            .collect();
        if groups.is_empty() {
            return Ok(None);
        }
        let tries = history
            .candidates
            .iter()
            .filter(|c| c.parent.as_ref() == Some(&best.id))
            .count();
        let direction = Direction {
            id: format!("meta-{}", history.candidates.len()),
            parent: best.id.clone(),
            causes: groups[tries % groups.len()].clone(),
            variant: tries / groups.len(),
        };
        let briefs: Vec<String> = history.candidates.iter().map(|c| c.brief.clone()).collect();
        let request = EditRequest {
            parent: harness,
            direction: &direction,
            other_briefs: &briefs,
            tools: history.tools,
            env: history.env,
        };
        Ok(self
            .editor
            .propose(&request)
            .await?
            .map(|p| (best.id.clone(), p)))
    }

    fn usage(&self) -> RoleUsage {
        self.analyst.usage() + self.editor.usage()
    }
}

/// The outcome of a Meta-Harness search.
#[derive(Debug, Clone)]
pub struct MetaHarnessResult {
    /// H_best: the highest training score (ties: the earlier candidate, the base first).
    pub best: Harness,
    /// Every scored candidate, the base first.
    pub candidates: Vec<MetaCandidate>,
    /// Proposals rejected by validation.
    pub rejected: Vec<Rejection>,
    /// Slots the proposer left empty.
    pub empty: usize,
    /// External tokens of the proposer.
    pub usage: UsageByRole,
}

/// A Meta-Harness search with Directional Harness Evolution's budgets and executor.
pub struct MetaHarnessSearch {
    /// The settings (the total of `proposal_budgets` is the search budget).
    pub settings: EvolveSettings,
    /// The frozen policy in the environment.
    pub executor: Executor,
    /// The proposer.
    pub proposer: Arc<dyn Proposer>,
    /// Training tasks to score on (the first `train_tasks_per_round` of them are used).
    pub train: Vec<Task>,
}

impl MetaHarnessSearch {
    /// Search from `base` and return H_best.
    pub async fn run(&self, mut base: Harness) -> Result<MetaHarnessResult> {
        self.settings.validate()?;
        if self.train.is_empty() {
            return Err(Error::Run(
                "no training tasks to score candidates on".into(),
            ));
        }
        if let Some(limits) = self.settings.limits {
            base.limits = limits;
        }
        base.validate()?;
        let tasks: Vec<Task> = self
            .train
            .iter()
            .take(self.settings.train_tasks_per_round)
            .cloned()
            .collect();
        let seed = self.settings.round_seed(1);
        let session = self.executor.env.reset(&tasks[0], seed).await?;
        let tools = session.tools();
        drop(session);
        let start = self.proposer.usage();
        let mut harnesses = BTreeMap::new();
        let mut trajectories = BTreeMap::new();
        let mut candidates = Vec::new();
        let mut rejected = Vec::new();
        let mut empty = 0;
        let tasks = &tasks;
        let score = |h: Harness, parent: Option<HarnessId>, brief: String| async move {
            let runs = self.executor.run(&h, tasks, seed).await?;
            let candidate = MetaCandidate {
                id: h.id(),
                name: h.name.clone(),
                parent,
                brief,
                solved: runs.iter().filter(|t| t.is_success()).count(),
                tasks: runs.len(),
            };
            Ok::<_, Error>((h, candidate, runs))
        };
        let (h, c, runs) = score(base.clone(), None, "base harness".into()).await?;
        trajectories.insert(h.id(), runs);
        harnesses.insert(h.id(), h);
        candidates.push(c);
        let budget: usize = self.settings.proposal_budgets.iter().sum();
        for n in 0..budget {
            let history = History {
                candidates: &candidates,
                harnesses: &harnesses,
                trajectories: &trajectories,
                tools: &tools,
                env: self.executor.env.name(),
            };
            let Some((parent_id, proposal)) = self.proposer.propose(&history).await? else {
                empty += 1;
                continue;
            };
            let Some(parent) = harnesses.get(&parent_id).cloned() else {
                rejected.push(Rejection {
                    stage: crate::validate::Stage::References,
                    reason: format!("the proposer revised {parent_id}, which is not a candidate"),
                });
                continue;
            };
            match validate_child(
                &parent,
                &proposal,
                self.executor.env.as_ref(),
                &tasks[0],
                seed,
            )
            .await?
            {
                Err(rejection) => rejected.push(rejection),
                Ok(child) if harnesses.contains_key(&child.id()) => {
                    rejected.push(Rejection {
                        stage: crate::validate::Stage::Duplicate,
                        reason: format!("candidate {} was already scored", child.id()),
                    });
                }
                Ok(mut child) => {
                    child.name = format!("meta-{}", n + 1);
                    child.description = proposal.brief.clone();
                    child.lineage.parent = Some(parent_id.clone());
                    child.lineage.generation = parent.lineage.generation + 1;
                    child.lineage.notes = vec![proposal.brief.clone()];
                    let (h, c, runs) = score(child, Some(parent_id), proposal.brief).await?;
                    trajectories.insert(h.id(), runs);
                    harnesses.insert(h.id(), h);
                    candidates.push(c);
                }
            }
        }
        let best = candidates
            .iter()
            .fold(None::<&MetaCandidate>, |acc, c| match acc {
                Some(a) if a.score() >= c.score() => Some(a),
                _ => Some(c),
            })
            .unwrap_or_else(|| unreachable!("the base is always scored"));
        Ok(MetaHarnessResult {
            best: harnesses[&best.id].clone(),
            candidates,
            rejected,
            empty,
            usage: BTreeMap::from([("proposer".to_string(), self.proposer.usage() - start)]),
        })
    }
}
