//! One round of Directional Harness Evolution (Eq. 2), parent selection (Eq. 3) and the pool
//! it grows (Eq. 4), driven for `T` rounds by [`Evolution::run`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use harness_core::{Harness, HarnessId, LocalEval, Task, ToolSpec, Trajectory};
use harness_pool::SiblingPool;
use serde::{Deserialize, Serialize};

use crate::analyst::Analyst;
use crate::cause::FailureAnalysis;
use crate::cover::{Cover, select_parents};
use crate::direction::{Direction, ReportedCause, allocate, plan_directions};
use crate::editor::{EditRequest, Editor, Proposal};
use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::local_eval::{feedback, net, plan_local_eval, run_local_eval, self_review};
use crate::settings::EvolveSettings;
use crate::usage::{RoleUsage, UsageByRole};
use crate::validate::{Rejection, Stage, validate_child};

/// A parent of a round: how it did on the round's training tasks and what the analyst found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParentRecord {
    /// Its id.
    pub id: HarnessId,
    /// Its name.
    pub name: String,
    /// Training tasks run.
    pub tasks: usize,
    /// Of which solved.
    pub solved: usize,
    /// The failure analysis.
    pub analysis: FailureAnalysis,
    /// Causes no direction targets, with the reason.
    pub reported: Vec<ReportedCause>,
}

/// What became of one proposal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum CandidateOutcome {
    /// The editor proposed nothing.
    NoProposal,
    /// Rejected; never pooled.
    Invalid {
        /// Where and why.
        rejection: Rejection,
    },
    /// Valid and pooled.
    Valid {
        /// The child's id.
        id: HarnessId,
        /// Its name.
        name: String,
        /// The kept version's local evaluation against the parent.
        local_eval: LocalEval,
        /// Whether the kept version is the revision.
        revised: bool,
        /// Validation tasks solved (V(H) of Eq. 3).
        validation_solved: usize,
        /// Validation tasks H0 fails and the child solves.
        repaired_vs_h0: Vec<String>,
        /// Validation tasks H0 solves and the child fails.
        regressed_vs_h0: Vec<String>,
    },
}

/// One proposal of a round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateRecord {
    /// The direction's id.
    pub direction: String,
    /// The parent's id and name.
    pub parent: HarnessId,
    /// The parent's name.
    pub parent_name: String,
    /// The targeted causes.
    pub causes: Vec<String>,
    /// The direction's variant.
    pub variant: usize,
    /// The editor's brief of the kept version.
    pub brief: Option<String>,
    /// Components the kept version edits.
    pub components: Vec<String>,
    /// A rejected revision, if the revision failed validation.
    pub revision_rejected: Option<Rejection>,
    /// What became of it.
    pub outcome: CandidateOutcome,
}

/// The report of one round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundReport {
    /// g, from 1.
    pub round: usize,
    /// The round's seed.
    pub seed: u64,
    /// The proposal budget.
    pub budget: usize,
    /// Fresh training tasks each parent ran on.
    pub train_tasks: usize,
    /// The parents P_g.
    pub parents: Vec<ParentRecord>,
    /// Proposals made (directions tried).
    pub proposed: usize,
    /// Valid children (pooled).
    pub valid: usize,
    /// Rejected children, by stage.
    pub invalid: BTreeMap<String, usize>,
    /// Directions for which the editor proposed nothing.
    pub no_proposal: usize,
    /// Every proposal.
    pub candidates: Vec<CandidateRecord>,
    /// Parents chosen for the next round (Eq. 3) and their coverage.
    pub selection: Cover,
    /// Names of the chosen parents.
    pub selected_names: Vec<String>,
    /// External tokens per role spent in this round.
    pub usage: UsageByRole,
}

/// The result of an evolution run.
#[derive(Debug, Clone)]
pub struct EvolutionResult {
    /// The frozen pool: H0 and every valid child of every round (Eq. 4).
    pub pool: SiblingPool,
    /// One report per round.
    pub rounds: Vec<RoundReport>,
    /// V(H) on the validation tasks for every pool member, by id.
    pub validation_solved: BTreeMap<HarnessId, BTreeSet<String>>,
    /// The validation task ids.
    pub validation_tasks: Vec<String>,
    /// External tokens per role over the run.
    pub usage: UsageByRole,
}

/// A Directional Harness Evolution run over one environment.
pub struct Evolution {
    /// Table 8's settings or others.
    pub settings: EvolveSettings,
    /// The frozen policy in the environment.
    pub executor: Executor,
    /// The failure analyst.
    pub analyst: Arc<dyn Analyst>,
    /// The editor.
    pub editor: Arc<dyn Editor>,
    /// The training tasks rounds sample from.
    pub train: Vec<Task>,
    /// The validation tasks of parent selection.
    pub validation: Vec<Task>,
}

/// A seeded permutation (SplitMix64 Fisher-Yates), so each round's fresh tasks follow from the
/// run seed alone.
fn shuffled<T: Clone>(items: &[T], seed: u64) -> Vec<T> {
    let mut out = items.to_vec();
    let mut state = seed;
    for i in (1..out.len()).rev() {
        state = harness_core::call_seed(state, i as u32);
        out.swap(i, (state % (i as u64 + 1)) as usize);
    }
    out
}

/// Stage seeds besides the rounds': the validation runs share one so V(H) pairs across rounds.
const VALIDATION_STAGE: u32 = 0x5641_4c00;

fn usage_delta(analyst: RoleUsage, editor: RoleUsage) -> UsageByRole {
    BTreeMap::from([
        ("analyst".to_string(), analyst),
        ("editor".to_string(), editor),
    ])
}

struct Kept {
    child: Harness,
    proposal: Proposal,
    eval: LocalEval,
    revised: bool,
    revision_rejected: Option<Rejection>,
}

impl Evolution {
    /// The seed of the validation runs.
    pub fn validation_seed(&self) -> u64 {
        harness_core::call_seed(self.settings.seed, VALIDATION_STAGE)
    }

    /// The fresh training tasks of round `g` (1-based): consecutive slices of one seeded
    /// permutation, wrapping around when the training set runs out.
    pub fn round_tasks(&self, round: usize) -> Vec<Task> {
        let order = shuffled(&self.train, self.settings.seed);
        let n = self.settings.train_tasks_per_round.min(order.len());
        (0..n)
            .map(|i| order[((round - 1) * n + i) % order.len()].clone())
            .collect()
    }

    /// Run all `T` rounds from `base` and return the frozen pool with the reports.
    pub async fn run(&self, mut base: Harness) -> Result<EvolutionResult> {
        self.settings.validate()?;
        // The settings promise greedy rollouts (Table 8); an executor sampling otherwise would
        // make every figure of the round mean something else.
        let greedy = self.executor.sampling.temperature == 0.0;
        if greedy != self.settings.greedy {
            return Err(Error::settings(
                "greedy",
                format!(
                    "is {}, but the executor samples at temperature {}; set the executor's sampling to match",
                    self.settings.greedy, self.executor.sampling.temperature
                ),
            ));
        }
        if self.train.is_empty() {
            return Err(Error::Run(
                "no training tasks: rounds run parents on fresh training tasks".into(),
            ));
        }
        if self.validation.is_empty() {
            return Err(Error::Run(
                "no validation tasks: parent selection (Eq. 3) needs them".into(),
            ));
        }
        if let Some(limits) = self.settings.limits {
            base.limits = limits;
        }
        base.validate()?;
        let mut pool = SiblingPool::new(base.clone())?;
        let val_seed = self.validation_seed();
        let h0_runs = self.executor.run(&base, &self.validation, val_seed).await?;
        let h0_solved: BTreeSet<String> = solved_set(&h0_runs);
        let mut validation_solved = BTreeMap::from([(base.id(), h0_solved.clone())]);
        let mut parents = vec![base.clone()];
        let mut rounds = Vec::new();
        let start = (self.analyst.usage(), self.editor.usage());
        for (g0, &budget) in self.settings.proposal_budgets.iter().enumerate() {
            let g = g0 + 1;
            let report = self
                .round(
                    g,
                    budget,
                    &parents,
                    &mut pool,
                    &h0_solved,
                    &mut validation_solved,
                )
                .await?;
            let selected: Vec<Harness> = report
                .selection
                .parents
                .iter()
                .filter_map(|id| pool.get(&HarnessId(id.clone())).cloned())
                .collect();
            if selected.is_empty() {
                tracing::warn!(
                    round = g,
                    "no valid child: the parents stay for the next round"
                );
            } else {
                parents = selected;
            }
            tracing::info!(
                round = g,
                proposed = report.proposed,
                valid = report.valid,
                covered = report.selection.covered,
                "round finished"
            );
            rounds.push(report);
        }
        pool.set_settings(serde_json::json!({
            "evolution": self.settings,
            "env": self.executor.env.name(),
            "policy": self.executor.policy.name(),
            "analyst": self.analyst.name(),
            "editor": self.editor.name(),
        }))?;
        pool.freeze();
        let end = (self.analyst.usage(), self.editor.usage());
        Ok(EvolutionResult {
            pool,
            rounds,
            validation_solved,
            validation_tasks: self.validation.iter().map(|t| t.id.clone()).collect(),
            usage: usage_delta(end.0 - start.0, end.1 - start.1),
        })
    }

    /// Run each parent on the round's tasks and analyse its failures.
    async fn analyse_parents(
        &self,
        tasks: &[Task],
        parents: &[Harness],
        seed: u64,
    ) -> Result<(
        Vec<ParentRecord>,
        Vec<Vec<(Task, Trajectory)>>,
        Vec<(HarnessId, crate::direction::DirectionPlan)>,
    )> {
        let mut records = Vec::new();
        let mut runs_by_parent = Vec::new();
        let mut plans = Vec::new();
        for parent in parents {
            let runs = self.executor.run(parent, tasks, seed).await?;
            let failures: Vec<Trajectory> =
                runs.iter().filter(|t| !t.is_success()).cloned().collect();
            let analysis = self.analyst.analyse(parent, &failures).await?;
            let plan = plan_directions(&analysis, &self.settings);
            records.push(ParentRecord {
                id: parent.id(),
                name: parent.name.clone(),
                tasks: runs.len(),
                solved: runs.iter().filter(|t| t.is_success()).count(),
                analysis,
                reported: plan.reported.clone(),
            });
            plans.push((parent.id(), plan));
            runs_by_parent.push(tasks.iter().cloned().zip(runs).collect());
        }
        Ok((records, runs_by_parent, plans))
    }

    /// One round g: analyse, propose along each direction, validate, evaluate locally, revise
    /// once, pool every valid child, select the next parents.
    async fn round(
        &self,
        g: usize,
        budget: usize,
        parents: &[Harness],
        pool: &mut SiblingPool,
        h0_solved: &BTreeSet<String>,
        validation_solved: &mut BTreeMap<HarnessId, BTreeSet<String>>,
    ) -> Result<RoundReport> {
        let usage_start = (self.analyst.usage(), self.editor.usage());
        let seed = self.settings.round_seed(g);
        let tasks = self.round_tasks(g);
        let (records, runs_by_parent, plans) = self.analyse_parents(&tasks, parents, seed).await?;
        let directions = allocate(g, &plans, budget);
        let smoke_task = &tasks[0];
        let tools: Vec<ToolSpec> = {
            let session = self.executor.env.reset(smoke_task, seed).await?;
            session.tools()
        };
        let mut briefs: Vec<String> = Vec::new();
        let mut candidates = Vec::new();
        let mut children: Vec<Harness> = Vec::new();
        for direction in &directions {
            let p = parents
                .iter()
                .position(|h| h.id() == direction.parent)
                .unwrap_or_else(|| unreachable!("directions name this round's parents"));
            let parent = &parents[p];
            let parent_runs = &runs_by_parent[p];
            let mut record = CandidateRecord {
                direction: direction.id.clone(),
                parent: parent.id(),
                parent_name: parent.name.clone(),
                causes: direction.causes.iter().map(|c| c.kind.clone()).collect(),
                variant: direction.variant,
                brief: None,
                components: Vec::new(),
                revision_rejected: None,
                outcome: CandidateOutcome::NoProposal,
            };
            let kept = self
                .candidate(
                    g,
                    direction,
                    parent,
                    parent_runs,
                    &briefs,
                    &tools,
                    smoke_task,
                    seed,
                    pool,
                    &children,
                )
                .await?;
            match kept {
                Err(None) => {}
                Err(Some((proposal, rejection))) => {
                    record.brief = Some(proposal.brief.clone());
                    record.components = proposal.components();
                    briefs.push(proposal.brief);
                    tracing::info!(direction = %direction.id, stage = ?rejection.stage, "invalid child: {}", rejection.reason);
                    record.outcome = CandidateOutcome::Invalid { rejection };
                }
                Ok(kept) => {
                    record.brief = Some(kept.proposal.brief.clone());
                    record.components = kept.proposal.components();
                    record.revision_rejected = kept.revision_rejected.clone();
                    briefs.push(kept.proposal.brief.clone());
                    record.outcome = CandidateOutcome::Valid {
                        id: kept.child.id(),
                        name: kept.child.name.clone(),
                        local_eval: kept.eval.clone(),
                        revised: kept.revised,
                        validation_solved: 0,
                        repaired_vs_h0: Vec::new(),
                        regressed_vs_h0: Vec::new(),
                    };
                    children.push(kept.child);
                }
            }
            candidates.push(record);
        }
        // V(H) of every valid child on the validation tasks (Eq. 3), with the shared seed.
        let val_seed = self.validation_seed();
        let mut solved: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for child in &children {
            let runs = self.executor.run(child, &self.validation, val_seed).await?;
            let set = solved_set(&runs);
            solved.insert(child.id().0, set.clone());
            validation_solved.insert(child.id(), set);
        }
        for record in &mut candidates {
            if let CandidateOutcome::Valid {
                id,
                validation_solved,
                repaired_vs_h0,
                regressed_vs_h0,
                ..
            } = &mut record.outcome
            {
                let set = &solved[&id.0];
                *validation_solved = set.len();
                *repaired_vs_h0 = set.difference(h0_solved).cloned().collect();
                *regressed_vs_h0 = h0_solved.difference(set).cloned().collect();
            }
        }
        let selection = select_parents(&solved, self.settings.parent_slots);
        for child in children {
            pool.add(child)?;
        }
        let selected_names = selection
            .parents
            .iter()
            .filter_map(|id| pool.get(&HarnessId(id.clone())).map(|h| h.name.clone()))
            .collect();
        let mut invalid: BTreeMap<String, usize> = BTreeMap::new();
        for c in &candidates {
            if let CandidateOutcome::Invalid { rejection } = &c.outcome {
                *invalid
                    .entry(format!("{:?}", rejection.stage).to_lowercase())
                    .or_default() += 1;
            }
        }
        let usage_end = (self.analyst.usage(), self.editor.usage());
        Ok(RoundReport {
            round: g,
            seed,
            budget,
            train_tasks: tasks.len(),
            parents: records,
            proposed: directions.len(),
            valid: candidates
                .iter()
                .filter(|c| matches!(c.outcome, CandidateOutcome::Valid { .. }))
                .count(),
            invalid,
            no_proposal: candidates
                .iter()
                .filter(|c| c.outcome == CandidateOutcome::NoProposal)
                .count(),
            candidates,
            selection,
            selected_names,
            usage: usage_delta(usage_end.0 - usage_start.0, usage_end.1 - usage_start.1),
        })
    }

    /// Propose, validate, evaluate and revise one candidate. `Err(None)`: no proposal;
    /// `Err(Some(..))`: the initial candidate was rejected.
    #[allow(clippy::too_many_arguments)]
    async fn candidate(
        &self,
        g: usize,
        direction: &Direction,
        parent: &Harness,
        parent_runs: &[(Task, Trajectory)],
        briefs: &[String],
        tools: &[ToolSpec],
        smoke_task: &Task,
        seed: u64,
        pool: &SiblingPool,
        children: &[Harness],
    ) -> Result<std::result::Result<Kept, Option<(Proposal, Rejection)>>> {
        let request = EditRequest {
            parent,
            direction,
            other_briefs: briefs,
            tools,
            env: self.executor.env.name(),
        };
        let Some(proposal) = self.editor.propose(&request).await? else {
            return Ok(Err(None));
        };
        let check = |proposal: Proposal| async move {
            let verdict = validate_child(
                parent,
                &proposal,
                self.executor.env.as_ref(),
                smoke_task,
                seed,
            )
            .await?;
            let verdict = verdict.and_then(|child| {
                let id = child.id();
                if pool.contains(&id) || children.iter().any(|c| c.id() == id) {
                    Err(Rejection {
                        stage: Stage::Duplicate,
                        reason: format!("the child has id {id}, the same content as a harness already pooled this run"),
                    })
                } else {
                    Ok(child)
                }
            });
            Ok::<_, Error>((proposal, verdict))
        };
        let (proposal, verdict) = check(proposal).await?;
        let child = match verdict {
            Ok(child) => child,
            Err(rejection) => return Ok(Err(Some((proposal, rejection)))),
        };
        let parent_success: BTreeMap<String, bool> = parent_runs
            .iter()
            .map(|(task, t)| (task.id.clone(), t.is_success()))
            .collect();
        let plan = plan_local_eval(direction, parent_runs, &self.settings);
        let ran: Vec<String> = plan.tasks.iter().map(|t| t.id.clone()).collect();
        let (eval, _) =
            run_local_eval(&self.executor, &child, &plan, &parent_success, seed).await?;
        let mut kept = Kept {
            child,
            proposal,
            eval,
            revised: false,
            revision_rejected: None,
        };
        let mut revision_note = None;
        let fb = feedback(direction, &kept.eval);
        let wants_revision = !fb.unrepaired.is_empty() || !kept.eval.regressed.is_empty();
        if self.settings.revisions > 0
            && wants_revision
            && let Some(revised) = self.editor.revise(&request, &kept.proposal, &fb).await?
        {
            {
                let (revised, verdict) = check(revised).await?;
                match verdict {
                    Err(rejection) => {
                        revision_note = Some(format!(
                            "The revision was rejected at {:?}: {}.",
                            rejection.stage, rejection.reason
                        ));
                        kept.revision_rejected = Some(rejection);
                    }
                    Ok(child) => {
                        let (eval, _) =
                            run_local_eval(&self.executor, &child, &plan, &parent_success, seed)
                                .await?;
                        let (before, after) = (net(&kept.eval), net(&eval));
                        // The host keeps the better measured version; ties keep the initial one.
                        if after > before {
                            revision_note = Some(format!(
                                "The revision was kept: net {after:+} against {before:+} for the initial version on the same tasks."
                            ));
                            kept = Kept {
                                child,
                                proposal: revised,
                                eval,
                                revised: true,
                                revision_rejected: None,
                            };
                        } else {
                            revision_note = Some(format!(
                                "The initial version was kept: the revision measured net {after:+} against {before:+}."
                            ));
                        }
                    }
                }
            }
        }
        let n = children.len() + 1;
        kept.child.name = format!("g{g}.{n}-{}", direction.label());
        kept.child.description = kept.proposal.brief.clone();
        kept.child.lineage.parent = Some(parent.id());
        kept.child.lineage.generation = g as u32;
        kept.child.lineage.direction = Some(direction.label());
        kept.child.lineage.causes = direction.causes.iter().map(|c| c.kind.clone()).collect();
        kept.child.lineage.notes = vec![
            kept.proposal.brief.clone(),
            self_review(direction, &kept.eval, &ran, revision_note.as_deref()),
        ];
        kept.child.lineage.local_eval = Some(kept.eval.clone());
        Ok(Ok(kept))
    }
}

fn solved_set(runs: &[Trajectory]) -> BTreeSet<String> {
    runs.iter()
        .filter(|t| t.is_success())
        .map(|t| t.task_id.clone())
        .collect()
}
