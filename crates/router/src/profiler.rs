//! Building Harness Behavior Profiles from paired trajectories (paper Eq. 11:
//! P_i = Profile(E_i, E_0)): the [`Profiler`] trait and the built-in deterministic profiler.
//!
//! The built-in profiler runs offline. For every validation task on which the sibling and H0
//! differ in outcome, it writes an entry: `when` from the task's features (environment,
//! category, difficulty, instruction keywords), `behavior` from the labelled trajectory features
//! that differ between the sibling and H0 (pages fetched, lookups before first use, read-backs,
//! submission, tool errors, test runs, ... as the environment's [`TrajectoryLabeller`] measures
//! them). Entries where the sibling succeeds go to `prefer`, those where it fails to `avoid`.
//! Observations repeated across tasks of one family with the same behaviour are consolidated
//! into one entry for the family; single-task observations keep their full task condition.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use harness_core::{
    FeatureKind, GenericLabeller, Harness, Task, Trajectory, TrajectoryLabeller, TrajectoryLabels,
    Usage,
};

use crate::error::Result;
use crate::features::TaskFeatures;
use crate::profile::{Entry, Profile, consolidate};

/// One validation task's paired evidence for a sibling.
#[derive(Debug, Clone, Copy)]
pub struct PairedTask<'a> {
    /// The task.
    pub task: &'a Task,
    /// The sibling's episodes.
    pub sibling: &'a [Trajectory],
    /// H0's episodes on the same seeds and limits.
    pub base: &'a [Trajectory],
}

fn rate(episodes: &[Trajectory]) -> f64 {
    if episodes.is_empty() {
        0.0
    } else {
        episodes.iter().filter(|t| t.is_success()).count() as f64 / episodes.len() as f64
    }
}

impl PairedTask<'_> {
    /// The sibling's success rate on the task.
    pub fn sibling_rate(&self) -> f64 {
        rate(self.sibling)
    }

    /// H0's success rate on the task.
    pub fn base_rate(&self) -> f64 {
        rate(self.base)
    }

    /// Whether the outcomes differ (the evidence profiles are made of).
    pub fn differs(&self) -> bool {
        (self.sibling_rate() - self.base_rate()).abs() > 1e-12
    }
}

/// What a profiler sees for one sibling.
#[derive(Debug, Clone)]
pub struct ProfileInput<'a> {
    /// H0.
    pub base: &'a Harness,
    /// The sibling being profiled.
    pub sibling: &'a Harness,
    /// Every validation task with both harnesses' episodes.
    pub pairs: Vec<PairedTask<'a>>,
    /// Where the "when" conditions' task features come from.
    pub features: crate::features::FeatureSource,
}

/// A profiler's result for one sibling.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProfileOutcome {
    /// The consolidated profile (empty after a failure).
    pub profile: Profile,
    /// Whether the profiler gave up (its answers stayed malformed) and left the profile empty.
    pub failed: bool,
    /// Malformed answers rejected on the way.
    pub rejected_answers: usize,
    /// External tokens spent.
    pub usage: Usage,
}

/// Builds one sibling's profile from paired validation evidence.
///
/// # Design
/// A profiler sees complete paired trajectories, not summaries, so that an LLM profiler can
/// read what actually happened and the built-in one can label it. Its answer must be a valid
/// [`Profile`]; a profiler whose model keeps answering badly reports `failed` with an empty
/// profile instead of an `Err`, so one bad sibling never stops a calibration. `Err` is for
/// infrastructure only.
#[async_trait]
pub trait Profiler: Send + Sync {
    /// A short name for logs and the calibration file.
    fn name(&self) -> &str;

    /// Profile one sibling.
    async fn profile(&self, input: &ProfileInput<'_>) -> Result<ProfileOutcome>;
}

/// The built-in deterministic profiler.
#[derive(Clone)]
pub struct BuiltinProfiler {
    labellers: BTreeMap<String, Arc<dyn TrajectoryLabeller>>,
    max_behaviours: usize,
}

impl std::fmt::Debug for BuiltinProfiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuiltinProfiler")
            .field("labellers", &self.labellers.keys().collect::<Vec<_>>())
            .field("max_behaviours", &self.max_behaviours)
            .finish()
    }
}

impl BuiltinProfiler {
    /// A profiler with these labellers (by environment); environments without one are labelled
    /// by [`GenericLabeller`]. At most three differing behaviours are named per entry.
    pub fn new(labellers: impl IntoIterator<Item = Arc<dyn TrajectoryLabeller>>) -> Self {
        BuiltinProfiler {
            labellers: labellers
                .into_iter()
                .map(|l| (l.env().to_string(), l))
                .collect(),
            max_behaviours: 3,
        }
    }

    /// Name at most `n` (at least 1) differing behaviours per entry.
    pub fn with_max_behaviours(mut self, n: usize) -> Self {
        self.max_behaviours = n.max(1);
        self
    }

    /// The behaviour of the sibling relative to H0 on one task, as text.
    pub fn behaviour(&self, pair: &PairedTask<'_>) -> String {
        let generic: Arc<dyn TrajectoryLabeller> = Arc::new(GenericLabeller);
        let labeller = self.labellers.get(&pair.task.env).unwrap_or(&generic);
        let sibling = mean_labels(labeller.as_ref(), pair.sibling);
        let base = mean_labels(labeller.as_ref(), pair.base);
        // (priority, order, phrase): flags first, then counts by relative difference.
        let mut found: Vec<(f64, usize, String)> = Vec::new();
        for (order, feature) in labeller.features().iter().enumerate() {
            let s = sibling.get(&feature.name).copied().unwrap_or(0.0);
            let b = base.get(&feature.name).copied().unwrap_or(0.0);
            match feature.kind {
                FeatureKind::Flag => {
                    if s >= 0.5 && b < 0.5 {
                        found.push((2.0, order, format!("{}, H0 does not", feature.description)));
                    } else if s < 0.5 && b >= 0.5 {
                        found.push((
                            2.0,
                            order,
                            format!("H0 {}, the sibling does not", feature.description),
                        ));
                    }
                }
                FeatureKind::Count => {
                    let d = s - b;
                    if d.abs() >= 0.5 {
                        let relative = d.abs() / s.max(b).max(1.0);
                        let word = if d > 0.0 { "more" } else { "fewer" };
                        found.push((
                            relative,
                            order,
                            format!("{word} {} than H0", feature.description),
                        ));
                    }
                }
            }
        }
        found.sort_by(|a, b| {
            b.0.partial_cmp(&a.0)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(a.1.cmp(&b.1))
        });
        found.truncate(self.max_behaviours);
        if found.is_empty() {
            return "the same labelled behaviour as H0 with a different outcome".into();
        }
        found
            .into_iter()
            .map(|(_, _, phrase)| phrase)
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The profile of one sibling (what [`Profiler::profile`] returns, synchronously).
    pub fn build(&self, input: &ProfileInput<'_>) -> Profile {
        // (family condition, behaviour) -> [(task condition, task id)]
        type Groups = BTreeMap<(String, String), Vec<(String, String)>>;
        let mut prefer: Groups = BTreeMap::new();
        let mut avoid: Groups = BTreeMap::new();
        for pair in input.pairs.iter().filter(|p| p.differs()) {
            let features = TaskFeatures::of(pair.task, input.features);
            let groups = if pair.sibling_rate() > pair.base_rate() {
                &mut prefer
            } else {
                &mut avoid
            };
            groups
                .entry((features.family_condition(), self.behaviour(pair)))
                .or_default()
                .push((features.task_condition(), pair.task.id.clone()));
        }
        let entries = |groups: Groups| {
            let mut out = Vec::new();
            for ((family, behaviour), tasks) in groups {
                if tasks.len() >= 2 {
                    // A repeated observation: one entry for the family.
                    let support = tasks.into_iter().map(|(_, id)| id).collect();
                    out.push(Entry::new(family, behaviour, support));
                } else {
                    // A single-task observation keeps its full condition.
                    for (condition, id) in tasks {
                        out.push(Entry::new(condition, behaviour.clone(), vec![id]));
                    }
                }
            }
            consolidate(out)
        };
        Profile {
            prefer: entries(prefer),
            avoid: entries(avoid),
        }
    }
}

/// The mean of each feature over episodes.
fn mean_labels(labeller: &dyn TrajectoryLabeller, episodes: &[Trajectory]) -> TrajectoryLabels {
    let mut sum = TrajectoryLabels::new();
    for t in episodes {
        for (k, v) in labeller.label(t) {
            *sum.entry(k).or_insert(0.0) += v;
        }
    }
    let n = episodes.len().max(1) as f64;
    sum.values_mut().for_each(|v| *v /= n);
    sum
}

#[async_trait]
impl Profiler for BuiltinProfiler {
    fn name(&self) -> &str {
        "builtin"
    }

    async fn profile(&self, input: &ProfileInput<'_>) -> Result<ProfileOutcome> {
        Ok(ProfileOutcome {
            profile: self.build(input),
            ..ProfileOutcome::default()
        })
    }
}
