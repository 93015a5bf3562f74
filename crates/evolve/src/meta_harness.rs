//! The Meta-Harness comparison variant (paper, "Implementation of Comparison Variants", and
//! Table 1's frozen-policy row): a proposer that reads the whole search history (every earlier
//! candidate's harness, score and a sample of its traces, and every proposal with its outcome,
//! [`History`]) revises any candidate; every candidate is checked for compatibility and scored
//! on training tasks; one `H_best` by training score is kept. It uses Directional Harness
//! Evolution's executor and verifier, but keeps no pool and selects no complementary parents.
//! [`HistoryProposer`] is the built-in, offline proposer; [`crate::LlmProposer`] asks a model
//! with the same history as a prompt.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use harness_core::{Harness, HarnessId, Task, ToolSpec, Trajectory};
use serde::{Deserialize, Serialize};

use crate::analyst::Analyst;
use crate::cause::Cause;
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

/// One proposal the search received: which candidate it revised, along what, and what became
/// of it. Empty slots leave no attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    /// The proposal slot (1-based, in the order the proposals were made; empty slots count).
    pub slot: usize,
    /// The candidate it revised.
    pub parent: HarnessId,
    /// The proposer's brief.
    pub brief: String,
    /// What it targeted, as the proposer named it (cause kinds for the built-in proposers).
    pub focus: Vec<String>,
    /// Scored as a new candidate, or rejected.
    pub outcome: AttemptOutcome,
}

/// What became of a proposal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AttemptOutcome {
    /// Validated and scored as candidate `id`.
    Scored {
        /// The new candidate.
        id: HarnessId,
    },
    /// Refused by validation (or a duplicate of a scored candidate).
    Rejected {
        /// Why.
        reason: String,
    },
}

/// How much of the history a proposer reads. Meta-Harness's proposer reads every earlier
/// candidate's code, score and execution traces from files; here every candidate is listed
/// with its score, parent and brief, and the `detailed_candidates` best-ranked ones also with
/// their harness and a sample of their traces (failures first, in task order), each trace cut
/// to `trace_chars` characters. The built-in proposer and an LLM proposer read the same sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryBounds {
    /// Candidates shown with their harness and traces (the best-ranked ones).
    pub detailed_candidates: usize,
    /// Traces shown per detailed candidate.
    pub traces_per_candidate: usize,
    /// Characters per trace.
    pub trace_chars: usize,
}

impl Default for HistoryBounds {
    fn default() -> Self {
        HistoryBounds {
            detailed_candidates: 8,
            traces_per_candidate: 4,
            trace_chars: 1_200,
        }
    }
}

/// The history a proposer sees: every scored candidate with its harness and trajectories, and
/// every proposal made so far with its outcome.
pub struct History<'a> {
    /// Scored candidates in order, the base first.
    pub candidates: &'a [MetaCandidate],
    /// Their harnesses, by id.
    pub harnesses: &'a BTreeMap<HarnessId, Harness>,
    /// Their training trajectories, by id.
    pub trajectories: &'a BTreeMap<HarnessId, Vec<Trajectory>>,
    /// Every proposal so far, in order, scored or rejected.
    pub attempts: &'a [Attempt],
    /// The proposal slot being filled (1-based; slots the proposer left empty count too).
    pub slot: usize,
    /// The environment's tools.
    pub tools: &'a [ToolSpec],
    /// The environment's name.
    pub env: &'a str,
}

impl History<'_> {
    /// The candidates by training score, best first; ties keep the earlier candidate first.
    pub fn ranked(&self) -> Vec<&MetaCandidate> {
        let mut ranked: Vec<&MetaCandidate> = self.candidates.iter().collect();
        ranked.sort_by(|a, b| b.score().total_cmp(&a.score()));
        ranked
    }

    /// The candidates a proposer reads in detail: the `bounds.detailed_candidates` best-ranked.
    pub fn detailed(&self, bounds: &HistoryBounds) -> Vec<&MetaCandidate> {
        let mut ranked = self.ranked();
        ranked.truncate(bounds.detailed_candidates.max(1));
        ranked
    }

    /// The traces of candidate `id` a proposer reads: its failures in task order, then its
    /// successes, at most `bounds.traces_per_candidate`.
    pub fn traces(&self, id: &HarnessId, bounds: &HistoryBounds) -> Vec<&Trajectory> {
        let runs = self.trajectories.get(id).map_or(&[][..], Vec::as_slice);
        runs.iter()
            .filter(|t| !t.is_success())
            .chain(runs.iter().filter(|t| t.is_success()))
            .take(bounds.traces_per_candidate)
            .collect()
    }

    /// The history as text for a proposer's prompt: every candidate (score, parent, brief),
    /// the detailed ones with their harness and traces, and every proposal with its outcome.
    pub fn render(&self, bounds: &HistoryBounds) -> String {
        let mut out = format!(
            "Search history in environment `{}`: {} candidates scored, {} proposals made.\n\nCandidates (best first):\n",
            self.env,
            self.candidates.len(),
            self.attempts.len()
        );
        let ranked = self.ranked();
        for c in &ranked {
            out.push_str(&format!(
                "- {} `{}`: solved {}/{} training tasks; parent {}; brief: {}\n",
                c.id,
                c.name,
                c.solved,
                c.tasks,
                c.parent
                    .as_ref()
                    .map_or("none".to_string(), |p| p.to_string()),
                c.brief
            ));
        }
        for c in self.detailed(bounds) {
            let traces = self.traces(&c.id, bounds);
            out.push_str(&format!(
                "\n## Candidate {} `{}` (solved {}/{})\nharness:\n{}\ntraces ({} of {}, failures first):\n",
                c.id,
                c.name,
                c.solved,
                c.tasks,
                self.harnesses[&c.id].to_json_pretty(),
                traces.len(),
                self.trajectories.get(&c.id).map_or(0, Vec::len)
            ));
            for t in traces {
                out.push_str(&crate::trace::digest(t, bounds.trace_chars));
                out.push('\n');
            }
        }
        if !self.attempts.is_empty() {
            out.push_str("\nProposals so far:\n");
            for a in self.attempts {
                let outcome = match &a.outcome {
                    AttemptOutcome::Scored { id } => format!("scored as {id}"),
                    AttemptOutcome::Rejected { reason } => format!("rejected: {reason}"),
                };
                out.push_str(&format!(
                    "- slot {}: revised {} along [{}]: {} -> {outcome}\n",
                    a.slot,
                    a.parent,
                    a.focus.join(", "),
                    a.brief
                ));
            }
        }
        out.push_str("\nTools of the environment:\n");
        for tool in self.tools {
            out.push_str(&format!(
                "- {} ({:?}): {}\n",
                tool.name, tool.kind, tool.description
            ));
        }
        out
    }
}

/// A proposer's answer: the candidate it revises, the revision, and what it targets.
#[derive(Debug, Clone, PartialEq)]
pub struct MetaProposal {
    /// The candidate revised (any scored candidate of the history).
    pub parent: HarnessId,
    /// The revision.
    pub proposal: Proposal,
    /// What it targets (recorded in the attempt; cause kinds for the built-in proposers).
    pub focus: Vec<String>,
}

/// Proposes the next candidate from the search history.
///
/// # Design
/// Meta-Harness's proposer reads earlier implementations, scores and execution traces; here it
/// gets them as plain data ([`History`]) and returns which candidate it revises and the edit,
/// which the host validates and scores itself. `Ok(None)` leaves the slot empty: like a refused
/// or duplicate proposal it runs no rollout and spends no budget, and counts toward
/// [`MetaHarnessSearch::max_unscored_in_a_row`].
#[async_trait]
pub trait Proposer: Send + Sync {
    /// A short name for reports.
    fn name(&self) -> &str;

    /// The candidate to revise and the revision.
    async fn propose(&self, history: &History<'_>) -> Result<Option<MetaProposal>>;

    /// Cumulative external-model usage.
    fn usage(&self) -> RoleUsage {
        RoleUsage::default()
    }
}

/// The cause groups of the failed trajectories among `traces`, at most `per_direction` causes
/// each, most frequent first, however thin their support (Meta-Harness has no direction rule).
async fn cause_groups<'t>(
    analyst: &dyn Analyst,
    harness: &Harness,
    traces: impl IntoIterator<Item = &'t Trajectory>,
    per_direction: usize,
) -> Result<Vec<Vec<Cause>>> {
    let failures: Vec<Trajectory> = traces
        .into_iter()
        .filter(|t| !t.is_success())
        .cloned()
        .collect();
    if failures.is_empty() {
        return Ok(Vec::new());
    }
    let analysis = analyst.analyse(harness, &failures).await?;
    let causes: Vec<Cause> = analysis
        .causes
        .into_iter()
        .filter(|c| !c.tasks.is_empty())
        .collect();
    Ok(causes
        .chunks(per_direction.max(1))
        .map(<[_]>::to_vec)
        .collect())
}

fn focus_of(causes: &[Cause]) -> Vec<String> {
    causes.iter().map(|c| c.kind.clone()).collect()
}

async fn edit_along(
    editor: &dyn Editor,
    history: &History<'_>,
    parent: &MetaCandidate,
    causes: Vec<Cause>,
    variant: usize,
) -> Result<Option<MetaProposal>> {
    let direction = Direction {
        id: format!("meta-{}", history.slot),
        parent: parent.id.clone(),
        causes,
        variant,
    };
    let briefs: Vec<String> = history.candidates.iter().map(|c| c.brief.clone()).collect();
    let request = EditRequest {
        parent: &history.harnesses[&parent.id],
        direction: &direction,
        other_briefs: &briefs,
        tools: history.tools,
        env: history.env,
    };
    Ok(editor
        .propose(&request)
        .await?
        .map(|proposal| MetaProposal {
            parent: parent.id.clone(),
            proposal,
            focus: focus_of(&direction.causes),
        }))
}

/// A one-line-of-descent proposer: revise the best-scoring candidate so far along the root
/// causes of its failed trajectories, through an [`Analyst`] and an [`Editor`] (offline with
/// the built-in ones, or LLM-backed), each repeat along the same causes asking for a new
/// variant. WHALE's searches use it. Unlike Directional Harness Evolution it applies no 2-3
/// cause, 2-task support rule; unlike [`HistoryProposer`] it reads only the best candidate.
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

    async fn propose(&self, history: &History<'_>) -> Result<Option<MetaProposal>> {
        let Some(best) = history.ranked().first().copied() else {
            return Ok(None);
        };
        let groups = cause_groups(
            self.analyst.as_ref(),
            &history.harnesses[&best.id],
            &history.trajectories[&best.id],
            self.settings.max_causes_per_direction,
        )
        .await?;
        if groups.is_empty() {
            return Ok(None);
        }
        // Every earlier proposal from this candidate is a try, scored or not, so that a refused
        // or duplicate revision moves on to the next cause group instead of being repeated.
        let tries = history
            .attempts
            .iter()
            .filter(|a| a.parent == best.id)
            .count();
        edit_along(
            self.editor.as_ref(),
            history,
            best,
            groups[tries % groups.len()].clone(),
            tries / groups.len(),
        )
        .await
    }

    fn usage(&self) -> RoleUsage {
        self.analyst.usage() + self.editor.usage()
    }
}

/// The built-in Meta-Harness proposer: it reads the whole history as an LLM proposer would
/// (the same [`History::detailed`] candidates and [`History::traces`] sample) and revises the
/// best-ranked candidate with a cause group no earlier proposal from that candidate targeted,
/// moving down the ranking when a candidate's groups are spent (so a branch that scored lower
/// is revised before the best one is retried); when every group of every detailed candidate
/// was tried, it asks the editor for a new variant along the best-ranked candidate's groups,
/// least tried first. Rejected proposals count as tried; a request the editor leaves
/// unanswered is not asked again, and the next one is. Each candidate's sample is analysed
/// once.
pub struct HistoryProposer {
    /// Reads each detailed candidate's sampled failures.
    pub analyst: Arc<dyn Analyst>,
    /// Writes the revision.
    pub editor: Arc<dyn Editor>,
    /// Causes per revision (`max_causes_per_direction`).
    pub settings: EvolveSettings,
    /// How much of the history it reads.
    pub bounds: HistoryBounds,
    groups: Mutex<BTreeMap<HarnessId, Vec<Vec<Cause>>>>,
    barren: Mutex<BTreeSet<(HarnessId, Vec<String>, usize)>>,
}

impl HistoryProposer {
    /// A proposer over `analyst` and `editor`.
    pub fn new(
        analyst: Arc<dyn Analyst>,
        editor: Arc<dyn Editor>,
        settings: EvolveSettings,
        bounds: HistoryBounds,
    ) -> Self {
        HistoryProposer {
            analyst,
            editor,
            settings,
            bounds,
            groups: Mutex::new(BTreeMap::new()),
            barren: Mutex::new(BTreeSet::new()),
        }
    }

    async fn groups_of(
        &self,
        history: &History<'_>,
        candidate: &MetaCandidate,
    ) -> Result<Vec<Vec<Cause>>> {
        if let Some(groups) = self.groups.lock().expect("unpoisoned").get(&candidate.id) {
            return Ok(groups.clone());
        }
        let groups = cause_groups(
            self.analyst.as_ref(),
            &history.harnesses[&candidate.id],
            history.traces(&candidate.id, &self.bounds),
            self.settings.max_causes_per_direction,
        )
        .await?;
        self.groups
            .lock()
            .expect("unpoisoned")
            .insert(candidate.id.clone(), groups.clone());
        Ok(groups)
    }
}

#[async_trait]
impl Proposer for HistoryProposer {
    fn name(&self) -> &str {
        "history-proposer"
    }

    async fn propose(&self, history: &History<'_>) -> Result<Option<MetaProposal>> {
        let tries = |parent: &HarnessId, focus: &[String]| {
            history
                .attempts
                .iter()
                .filter(|a| &a.parent == parent && a.focus == focus)
                .count()
        };
        // Every (candidate, cause group, variant) to try, in order: the untried groups of the
        // detailed candidates best-ranked first, then new variants along the best-ranked
        // candidate's groups, least tried first. A request the editor could not serve is
        // remembered and skipped, so an empty answer never blocks the rest.
        let mut untried = Vec::new();
        let mut variants = Vec::new();
        for candidate in history.detailed(&self.bounds) {
            let groups = self.groups_of(history, candidate).await?;
            let first_with_groups = variants.is_empty() && untried.is_empty();
            for group in &groups {
                match tries(&candidate.id, &focus_of(group)) {
                    0 => untried.push((candidate, group.clone(), 0)),
                    n if first_with_groups => variants.push((candidate, group.clone(), n)),
                    _ => {}
                }
            }
        }
        variants.sort_by_key(|(_, _, n)| *n);
        for (candidate, group, variant) in untried.into_iter().chain(variants) {
            let key = (candidate.id.clone(), focus_of(&group), variant);
            if self.barren.lock().expect("unpoisoned").contains(&key) {
                continue;
            }
            let proposal =
                edit_along(self.editor.as_ref(), history, candidate, group, variant).await?;
            if proposal.is_some() {
                return Ok(proposal);
            }
            self.barren.lock().expect("unpoisoned").insert(key);
        }
        Ok(None)
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
    /// Every proposal, in order, with its outcome.
    pub attempts: Vec<Attempt>,
    /// Proposals rejected by validation.
    pub rejected: Vec<Rejection>,
    /// Slots the proposer left empty.
    pub empty: usize,
    /// The search stopped before its budget was spent: the proposer made
    /// [`MetaHarnessSearch::max_unscored_in_a_row`] proposals in a row that scored nothing.
    pub stopped_unscored: bool,
    /// External tokens of the proposer.
    pub usage: UsageByRole,
}

/// The default of [`MetaHarnessSearch::max_unscored_in_a_row`] (the paper gives none).
pub const DEFAULT_MAX_UNSCORED_IN_A_ROW: usize = 10;

/// A Meta-Harness search with Directional Harness Evolution's executor. Its budget, the total
/// of `settings.proposal_budgets`, counts scored candidates, each scored with one rollout per
/// scoring task, so the budget is a number of search rollouts: a proposal that scores nothing
/// (refused by validation, a duplicate of a scored candidate, or a slot the proposer left
/// empty) spends no rollout and no budget. The search stops early when
/// `max_unscored_in_a_row` proposals in a row scored nothing.
pub struct MetaHarnessSearch {
    /// The settings (the total of `proposal_budgets` is the number of candidates to score).
    pub settings: EvolveSettings,
    /// Proposals in a row that score nothing after which the search stops before its budget
    /// is spent ([`DEFAULT_MAX_UNSCORED_IN_A_ROW`]; at least 1).
    pub max_unscored_in_a_row: usize,
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
        let mut attempts: Vec<Attempt> = Vec::new();
        let mut unscored_in_a_row = 0usize;
        let mut stopped_unscored = false;
        let mut n = 0usize;
        while candidates.len() - 1 < budget {
            if unscored_in_a_row >= self.max_unscored_in_a_row.max(1) {
                stopped_unscored = true;
                break;
            }
            n += 1;
            unscored_in_a_row += 1;
            let history = History {
                candidates: &candidates,
                harnesses: &harnesses,
                trajectories: &trajectories,
                attempts: &attempts,
                slot: n,
                tools: &tools,
                env: self.executor.env.name(),
            };
            let Some(MetaProposal {
                parent: parent_id,
                proposal,
                focus,
            }) = self.proposer.propose(&history).await?
            else {
                empty += 1;
                continue;
            };
            // The revised candidate, checked: it must exist, pass validation and not repeat a
            // scored candidate; only then is it scored (and the budget spent).
            let checked = match harnesses.get(&parent_id).cloned() {
                None => Err(Rejection {
                    stage: crate::validate::Stage::References,
                    reason: format!("the proposer revised {parent_id}, which is not a candidate"),
                }),
                Some(parent) => validate_child(
                    &parent,
                    &proposal,
                    self.executor.env.as_ref(),
                    &tasks[0],
                    seed,
                )
                .await?
                .and_then(|child| {
                    if harnesses.contains_key(&child.id()) {
                        Err(Rejection {
                            stage: crate::validate::Stage::Duplicate,
                            reason: format!("candidate {} was already scored", child.id()),
                        })
                    } else {
                        Ok((parent, child))
                    }
                }),
            };
            let outcome = match checked {
                Err(rejection) => {
                    let reason = rejection.reason.clone();
                    rejected.push(rejection);
                    AttemptOutcome::Rejected { reason }
                }
                Ok((parent, mut child)) => {
                    unscored_in_a_row = 0;
                    child.name = format!("meta-{n}");
                    child.description = proposal.brief.clone();
                    child.lineage.parent = Some(parent_id.clone());
                    child.lineage.generation = parent.lineage.generation + 1;
                    child.lineage.notes = vec![proposal.brief.clone()];
                    let (h, c, runs) =
                        score(child, Some(parent_id.clone()), proposal.brief.clone()).await?;
                    let id = h.id();
                    trajectories.insert(id.clone(), runs);
                    harnesses.insert(id.clone(), h);
                    candidates.push(c);
                    AttemptOutcome::Scored { id }
                }
            };
            attempts.push(Attempt {
                slot: n,
                parent: parent_id,
                brief: proposal.brief,
                focus,
                outcome,
            });
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
            attempts,
            rejected,
            empty,
            stopped_unscored,
            usage: BTreeMap::from([("proposer".to_string(), self.proposer.usage() - start)]),
        })
    }
}
