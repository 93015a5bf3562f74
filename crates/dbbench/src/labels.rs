//! The behaviour labeller of DBBench ([`harness_core::TrajectoryLabeller`]): schema lookups, read-backs and the commit; and the choices an episode made at its decision points.
//!
//! The router's built-in profiler compares a sibling's trajectory with H0's on the same task
//! through these labels (paper Eq. 8 and Table 7), and the same labels can produce the paper's
//! behaviour table. The labeller adds its environment's features to the generic ones of
//! [`GenericLabeller`].

use std::collections::BTreeSet;

use harness_core::labels::flag_value;
use harness_core::{
    BehaviourFeature, GenericLabeller, Step, Trajectory, TrajectoryLabeller, TrajectoryLabels,
    steps,
};
use serde::{Deserialize, Serialize};

use crate as dbbench;

/// DBBench: schema lookups, read-backs after changes and the committed answer.
#[derive(Debug, Clone, Copy, Default)]
pub struct DbBenchLabeller;

fn sql_of(step: &Step) -> Option<String> {
    (step.call.name == dbbench::SQL_TOOL)
        .then(|| {
            step.call
                .arguments
                .get("query")?
                .as_str()
                .map(str::to_string)
        })
        .flatten()
}

fn first_keyword(sql: &str) -> String {
    sql.trim_start_matches(|c: char| c.is_whitespace() || c == '(')
        .split(|c: char| !c.is_ascii_alphabetic())
        .next()
        .unwrap_or_default()
        .to_ascii_uppercase()
}

impl TrajectoryLabeller for DbBenchLabeller {
    fn env(&self) -> &str {
        dbbench::ENV_NAME
    }

    fn features(&self) -> Vec<BehaviourFeature> {
        GenericLabeller::with_generic_features(vec![
            BehaviourFeature::count("sql_queries", "SQL statements run"),
            BehaviourFeature::count("schema_lookups", "schema lookups"),
            BehaviourFeature::count("modifications", "table changes"),
            BehaviourFeature::flag(
                "readback_after_write",
                "reads the table back after its last change",
            ),
            BehaviourFeature::flag(
                "commits_answer",
                "commits an answer with commit_final_answer",
            ),
        ])
    }

    fn label(&self, trajectory: &Trajectory) -> TrajectoryLabels {
        let steps = steps(trajectory);
        let mut labels = GenericLabeller::generic_labels(trajectory);
        let (mut queries, mut lookups, mut changes) = (0.0, 0.0, 0.0);
        let mut read_after_change = false;
        for sql in steps.iter().filter_map(sql_of) {
            queries += 1.0;
            let keyword = first_keyword(&sql);
            let lower = sql.to_ascii_lowercase();
            match keyword.as_str() {
                "SHOW" | "DESCRIBE" | "DESC" | "PRAGMA" | "EXPLAIN" => lookups += 1.0,
                "SELECT"
                    if lower.contains("information_schema") || lower.contains("sqlite_master") =>
                {
                    lookups += 1.0
                }
                "SELECT" | "WITH" => read_after_change = changes > 0.0,
                "INSERT" | "UPDATE" | "DELETE" | "REPLACE" => {
                    changes += 1.0;
                    read_after_change = false;
                }
                _ => {}
            }
        }
        labels.insert("sql_queries".into(), queries);
        labels.insert("schema_lookups".into(), lookups);
        labels.insert("modifications".into(), changes);
        labels.insert("readback_after_write".into(), flag_value(read_after_change));
        labels.insert(
            "commits_answer".into(),
            flag_value(steps.iter().any(|s| s.call.name == dbbench::COMMIT_TOOL)),
        );
        labels
    }
}

/// A decision point of a DBBench episode: the first moment the task's answer, or its repair,
/// was within reach. The embedded default's planted failures are wrong choices at these points
/// (paper Table 3's behaviour frequencies, measured where they are decided).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionPoint {
    /// A change (INSERT, UPDATE, DELETE) has just succeeded.
    AfterChange,
    /// A read in an episode without a change has just returned rows.
    AfterResult,
    /// A statement has just failed on a table or column name.
    AfterNameError,
}

impl DecisionPoint {
    /// Every point, in table order.
    pub const ALL: [DecisionPoint; 3] = [
        DecisionPoint::AfterChange,
        DecisionPoint::AfterResult,
        DecisionPoint::AfterNameError,
    ];

    /// A short name.
    pub fn as_str(self) -> &'static str {
        match self {
            DecisionPoint::AfterChange => "after_change",
            DecisionPoint::AfterResult => "after_result",
            DecisionPoint::AfterNameError => "after_name_error",
        }
    }

    /// The point named `name` (its [`as_str`](Self::as_str)).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == name)
    }

    /// The good choice at this point and the planted bad one.
    pub fn good_and_planted(self) -> (Choice, Choice) {
        match self {
            DecisionPoint::AfterChange => (Choice::Commit, Choice::Check),
            DecisionPoint::AfterResult => (Choice::Commit, Choice::Rerun),
            DecisionPoint::AfterNameError => (Choice::QuotedRetry, Choice::Repeat),
        }
    }
}

/// What the policy did next at a [`DecisionPoint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Choice {
    /// Committed an answer.
    Commit,
    /// Read the table again after a change.
    Check,
    /// Ran the same statement again.
    Rerun,
    /// Ran the failed statement again, unchanged.
    Repeat,
    /// Ran another statement that quotes names with backticks.
    QuotedRetry,
    /// Anything else (another statement, a turn without a call).
    Other,
    /// No further tool call followed (a limit, or turns without a call).
    Ended,
}

impl Choice {
    /// The name written in run files (the serde name).
    pub fn as_str(self) -> &'static str {
        match self {
            Choice::Commit => "commit",
            Choice::Check => "check",
            Choice::Rerun => "rerun",
            Choice::Repeat => "repeat",
            Choice::QuotedRetry => "quoted_retry",
            Choice::Other => "other",
            Choice::Ended => "ended",
        }
    }
}

/// One decision of an episode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// Where.
    pub point: DecisionPoint,
    /// What came next.
    pub choice: Choice,
}

fn is_change(sql: &str) -> bool {
    matches!(
        first_keyword(sql).as_str(),
        "INSERT" | "UPDATE" | "DELETE" | "REPLACE"
    )
}

fn failed(step: &Step) -> bool {
    step.response
        .as_deref()
        .is_some_and(|r| r.trim_start().starts_with("Error"))
}

fn names_error(step: &Step) -> bool {
    step.response.as_deref().is_some_and(|r| {
        let r = r.to_ascii_lowercase();
        r.trim_start().starts_with("error")
            && (r.contains("no such column")
                || r.contains("no such table")
                || r.contains("unknown column")
                || r.contains("syntax error"))
    })
}

/// The decision points a DBBench episode reached, each with the choice that followed (at most
/// one per point: the first time it arose). Steps are read from the trajectory, so the
/// analysis needs nothing but the recorded episode.
pub fn dbbench_decisions(trajectory: &Trajectory) -> Vec<Decision> {
    let steps = steps(trajectory);
    let next = |i: usize| -> Option<&Step> { steps.get(i + 1) };
    let mut out: Vec<Decision> = Vec::new();
    let mut seen = BTreeSet::new();
    let mut changed = false;
    for (i, step) in steps.iter().enumerate() {
        let Some(sql) = sql_of(step) else { continue };
        let point = if names_error(step) {
            Some(DecisionPoint::AfterNameError)
        } else if failed(step) || step.response.is_none() {
            None
        } else if is_change(&sql) {
            changed = true;
            Some(DecisionPoint::AfterChange)
        } else if !changed && matches!(first_keyword(&sql).as_str(), "SELECT" | "WITH") {
            Some(DecisionPoint::AfterResult)
        } else {
            None
        };
        let Some(point) = point else { continue };
        if !seen.insert(point) {
            continue;
        }
        let choice = match next(i) {
            None => Choice::Ended,
            Some(n) if n.call.name == dbbench::COMMIT_TOOL => Choice::Commit,
            Some(n) => match sql_of(n) {
                None => Choice::Other,
                Some(q) if q.trim() == sql.trim() => match point {
                    DecisionPoint::AfterNameError => Choice::Repeat,
                    _ => Choice::Rerun,
                },
                Some(q) => match point {
                    DecisionPoint::AfterChange if !is_change(&q) => Choice::Check,
                    DecisionPoint::AfterNameError if q.contains('`') => Choice::QuotedRetry,
                    _ => Choice::Other,
                },
            },
        };
        out.push(Decision { point, choice });
    }
    out
}
