//! Behaviour labellers of the built-in environments ([`harness_core::TrajectoryLabeller`]).
//!
//! The router's built-in profiler compares a sibling's trajectory with H0's on the same task
//! through these labels (paper Eq. 8 and Table 7: pagination through every source, joint
//! filtering, read-backs, submission through the completion API), and the same labels can
//! produce the paper's behaviour table. Each labeller adds its environment's features to the
//! generic ones of [`GenericLabeller`].

use std::collections::BTreeSet;
use std::sync::Arc;

use harness_core::{
    BehaviourFeature, GenericLabeller, Step, Trajectory, TrajectoryLabeller, TrajectoryLabels,
    steps,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{appworld, dbbench, swe, tau_retail};

/// The labellers of the built-in environments.
pub fn builtin_labellers() -> Vec<Arc<dyn TrajectoryLabeller>> {
    vec![
        Arc::new(AppWorldLabeller),
        Arc::new(DbBenchLabeller),
        Arc::new(SweLabeller),
        Arc::new(tau_retail::labels::TauRetailLabeller),
    ]
}

fn with_generic(mut specific: Vec<BehaviourFeature>) -> Vec<BehaviourFeature> {
    specific.extend(GenericLabeller::generic_features());
    specific
}

fn flag(b: bool) -> f64 {
    if b { 1.0 } else { 0.0 }
}

fn insert(labels: &mut TrajectoryLabels, name: &str, value: f64) {
    labels.insert(name.to_string(), value);
}

/// The app world: pagination, documentation lookups, read-backs and `complete_task`.
#[derive(Debug, Clone, Copy, Default)]
pub struct AppWorldLabeller;

/// The `(app, api, arguments)` of a `call_api` step.
fn api_call(step: &Step) -> Option<(&str, &str, &Value)> {
    if step.call.name != appworld::tool::CALL_API {
        return None;
    }
    let args = &step.call.arguments;
    Some((
        args.get("app")?.as_str()?,
        args.get("api")?.as_str()?,
        args.get("arguments").unwrap_or(&Value::Null),
    ))
}

fn is_read_api(api: &str) -> bool {
    api.starts_with("list_") || api.starts_with("show_")
}

impl TrajectoryLabeller for AppWorldLabeller {
    fn env(&self) -> &str {
        appworld::ENV_NAME
    }

    fn features(&self) -> Vec<BehaviourFeature> {
        with_generic(vec![
            BehaviourFeature::count("pages_fetched", "listing pages fetched"),
            BehaviourFeature::count("later_pages", "pages beyond the first fetched"),
            BehaviourFeature::count("folders_searched", "mail folders searched"),
            BehaviourFeature::count(
                "docs_before_first_use",
                "APIs whose documentation is read before their first call",
            ),
            BehaviourFeature::count("writes", "state-changing API calls"),
            BehaviourFeature::flag(
                "readback_after_write",
                "reads the changed state back after its last write",
            ),
            BehaviourFeature::flag("completes_task", "submits through complete_task"),
        ])
    }

    fn label(&self, trajectory: &Trajectory) -> TrajectoryLabels {
        let steps = steps(trajectory);
        let mut labels = GenericLabeller::generic_labels(trajectory);
        let mut pages = 0.0;
        let mut later_pages = 0.0;
        let mut folders = BTreeSet::new();
        let mut documented = BTreeSet::new();
        let mut called = BTreeSet::new();
        let mut docs_first = 0.0;
        let mut writes = 0.0;
        let mut last_write: Option<(usize, String)> = None;
        let mut read_after_write = false;
        for (i, step) in steps.iter().enumerate() {
            if step.call.name == appworld::tool::SHOW_API {
                let args = &step.call.arguments;
                if let (Some(app), Some(api)) = (
                    args.get("app").and_then(Value::as_str),
                    args.get("api").and_then(Value::as_str),
                ) {
                    documented.insert((app.to_string(), api.to_string()));
                }
                continue;
            }
            let Some((app, api, arguments)) = api_call(step) else {
                continue;
            };
            let key = (app.to_string(), api.to_string());
            if called.insert(key.clone()) && documented.contains(&key) {
                docs_first += 1.0;
            }
            if api.starts_with("list_") {
                pages += 1.0;
                if arguments.get("page").and_then(Value::as_u64).unwrap_or(1) >= 2 {
                    later_pages += 1.0;
                }
                if let Some(folder) = arguments.get("folder").and_then(Value::as_str) {
                    folders.insert(folder.to_string());
                }
            }
            if is_read_api(api) {
                if last_write.as_ref().is_some_and(|(_, a)| a == app) {
                    read_after_write = true;
                }
            } else {
                writes += 1.0;
                last_write = Some((i, app.to_string()));
                read_after_write = false;
            }
        }
        insert(&mut labels, "pages_fetched", pages);
        insert(&mut labels, "later_pages", later_pages);
        insert(&mut labels, "folders_searched", folders.len() as f64);
        insert(&mut labels, "docs_before_first_use", docs_first);
        insert(&mut labels, "writes", writes);
        insert(
            &mut labels,
            "readback_after_write",
            flag(last_write.is_some() && read_after_write),
        );
        insert(
            &mut labels,
            "completes_task",
            flag(
                steps
                    .iter()
                    .any(|s| s.call.name == appworld::tool::COMPLETE_TASK),
            ),
        );
        labels
    }
}

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
        with_generic(vec![
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
        insert(&mut labels, "sql_queries", queries);
        insert(&mut labels, "schema_lookups", lookups);
        insert(&mut labels, "modifications", changes);
        insert(&mut labels, "readback_after_write", flag(read_after_change));
        insert(
            &mut labels,
            "commits_answer",
            flag(steps.iter().any(|s| s.call.name == dbbench::COMMIT_TOOL)),
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

/// The repository world: reading, searching, editing and running the tests.
#[derive(Debug, Clone, Copy, Default)]
pub struct SweLabeller;

impl TrajectoryLabeller for SweLabeller {
    fn env(&self) -> &str {
        swe::ENV_NAME
    }

    fn features(&self) -> Vec<BehaviourFeature> {
        with_generic(vec![
            BehaviourFeature::count("files_viewed", "files viewed"),
            BehaviourFeature::count("searches", "repository searches"),
            BehaviourFeature::count("edits", "file edits"),
            BehaviourFeature::count("test_runs", "test runs"),
            BehaviourFeature::flag(
                "tests_before_first_edit",
                "runs the tests before its first edit (reproduces the failure)",
            ),
            BehaviourFeature::flag(
                "tests_after_last_edit",
                "runs the tests after its last edit (checks the assertions)",
            ),
        ])
    }

    fn label(&self, trajectory: &Trajectory) -> TrajectoryLabels {
        use swe::tools;
        let steps = steps(trajectory);
        let mut labels = GenericLabeller::generic_labels(trajectory);
        let count = |name: &str| steps.iter().filter(|s| s.call.name == name).count() as f64;
        let is_edit = |s: &Step| s.call.name == tools::REPLACE || s.call.name == tools::CREATE;
        let first_edit = steps.iter().position(is_edit);
        let last_edit = steps.iter().rposition(is_edit);
        let test_at: Vec<usize> = steps
            .iter()
            .enumerate()
            .filter(|(_, s)| s.call.name == tools::RUN_TESTS)
            .map(|(i, _)| i)
            .collect();
        insert(&mut labels, "files_viewed", count(tools::VIEW));
        insert(&mut labels, "searches", count(tools::SEARCH));
        insert(
            &mut labels,
            "edits",
            steps.iter().filter(|s| is_edit(s)).count() as f64,
        );
        insert(&mut labels, "test_runs", test_at.len() as f64);
        insert(
            &mut labels,
            "tests_before_first_edit",
            flag(first_edit.is_some_and(|e| test_at.iter().any(|t| *t < e))),
        );
        insert(
            &mut labels,
            "tests_after_last_edit",
            flag(last_edit.is_some_and(|e| test_at.iter().any(|t| *t > e))),
        );
        labels
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use harness_core::{
        Counts, HarnessId, Outcome, Role, Source, Termination, ToolCall, TrajectoryMessage,
    };
    use serde_json::json;

    fn trajectory(env: &str, calls: &[ToolCall], termination: Termination) -> Trajectory {
        let mut messages = Vec::new();
        for call in calls {
            messages.push(TrajectoryMessage {
                role: Role::Assistant,
                source: Source::Policy,
                content: call.to_tool_call_block(),
                name: None,
                hook: None,
            });
            messages.push(TrajectoryMessage {
                role: Role::Tool,
                source: Source::Environment,
                content: "ok".into(),
                name: Some(call.name.clone()),
                hook: None,
            });
        }
        Trajectory {
            task_id: "t".into(),
            env: env.into(),
            harness_id: HarnessId("h".into()),
            harness_name: "H".into(),
            seed: 0,
            policy: "p".into(),
            messages,
            turns: Vec::new(),
            final_answer: None,
            outcome: Outcome::failure(json!(null)),
            termination,
            policy_version: None,
            counts: Counts {
                env_actions: calls.len() as u32,
                ..Counts::default()
            },
        }
    }

    fn assert_complete(labeller: &dyn TrajectoryLabeller, labels: &TrajectoryLabels) {
        let names: BTreeSet<String> = labeller.features().into_iter().map(|f| f.name).collect();
        let got: BTreeSet<String> = labels.keys().cloned().collect();
        assert_eq!(names, got, "{}: every feature labelled", labeller.env());
    }

    #[test]
    fn appworld_labels_pagination_docs_readback_and_completion() {
        let api = |api: &str, arguments: Value| {
            ToolCall::new(
                appworld::tool::CALL_API,
                json!({"app": "mail", "api": api, "arguments": arguments}),
            )
        };
        let calls = vec![
            ToolCall::new(
                appworld::tool::SHOW_API,
                json!({"app": "mail", "api": "list_emails"}),
            ),
            api("list_emails", json!({"folder": "inbox", "page": 1})),
            api("list_emails", json!({"folder": "inbox", "page": 2})),
            api("list_emails", json!({"folder": "spam"})),
            api("send_email", json!({"to": "a"})),
            api("show_email", json!({"id": 1})),
            ToolCall::new(appworld::tool::COMPLETE_TASK, json!({"answer": "3"})),
        ];
        let labels = AppWorldLabeller.label(&trajectory("appworld", &calls, Termination::EnvDone));
        assert_complete(&AppWorldLabeller, &labels);
        assert_eq!(labels["pages_fetched"], 3.0);
        assert_eq!(labels["later_pages"], 1.0);
        assert_eq!(labels["folders_searched"], 2.0);
        assert_eq!(labels["docs_before_first_use"], 1.0);
        assert_eq!(labels["writes"], 1.0);
        assert_eq!(labels["readback_after_write"], 1.0);
        assert_eq!(labels["completes_task"], 1.0);

        let single = AppWorldLabeller.label(&trajectory(
            "appworld",
            &calls[1..2],
            Termination::PolicyFinished,
        ));
        assert_eq!(single["docs_before_first_use"], 0.0);
        assert_eq!(single["completes_task"], 0.0);
        assert_eq!(single["readback_after_write"], 0.0);
        assert_eq!(single["submitted"], 0.0);
    }

    #[test]
    fn dbbench_labels_lookups_readback_and_commit() {
        let sql = |q: &str| ToolCall::new(dbbench::SQL_TOOL, json!({"query": q}));
        let calls = vec![
            sql("SHOW COLUMNS FROM t"),
            sql("UPDATE t SET a = 1"),
            sql("select * from t"),
            ToolCall::new(dbbench::COMMIT_TOOL, json!({"answers": []})),
        ];
        let labels = DbBenchLabeller.label(&trajectory("dbbench", &calls, Termination::EnvDone));
        assert_complete(&DbBenchLabeller, &labels);
        assert_eq!(labels["sql_queries"], 3.0);
        assert_eq!(labels["schema_lookups"], 1.0);
        assert_eq!(labels["modifications"], 1.0);
        assert_eq!(labels["readback_after_write"], 1.0);
        assert_eq!(labels["commits_answer"], 1.0);
        let no_readback = DbBenchLabeller.label(&trajectory(
            "dbbench",
            &calls[..2],
            Termination::MaxEnvActions,
        ));
        assert_eq!(no_readback["readback_after_write"], 0.0);
        assert_eq!(no_readback["ran_out_of_budget"], 1.0);
    }

    /// A DBBench episode of `(statement or commit, response)` steps.
    fn db_episode(steps: &[(&str, &str)]) -> Trajectory {
        let calls: Vec<ToolCall> = steps
            .iter()
            .map(|(q, _)| match *q {
                "COMMIT" => ToolCall::new(dbbench::COMMIT_TOOL, json!({"answers": []})),
                q => ToolCall::new(dbbench::SQL_TOOL, json!({"query": q})),
            })
            .collect();
        let mut t = trajectory("dbbench", &calls, Termination::MaxEnvActions);
        for (i, (_, response)) in steps.iter().enumerate() {
            t.messages[2 * i + 1].content = (*response).into();
        }
        t
    }

    #[test]
    fn dbbench_decisions_find_the_planted_choices_and_their_repairs() {
        use Choice::*;
        use DecisionPoint::*;
        let d = |steps: &[(&str, &str)]| -> Vec<(DecisionPoint, Choice)> {
            dbbench_decisions(&db_episode(steps))
                .into_iter()
                .map(|d| (d.point, d.choice))
                .collect()
        };
        let ok = "Query OK, 1 row affected";
        // Change family: checking after the change (planted) or committing (repaired).
        assert_eq!(
            d(&[
                ("UPDATE t SET a = 1", ok),
                ("SELECT COUNT(*) FROM t", "[(3,)]"),
                ("SELECT COUNT(*) FROM t", "[(3,)]"),
            ]),
            [(AfterChange, Check)]
        );
        assert_eq!(
            d(&[("DELETE FROM t WHERE b = 2", ok), ("COMMIT", "")]),
            [(AfterChange, Commit)]
        );
        // Recheck family: the same query again (planted) or the commit.
        assert_eq!(
            d(&[
                ("SELECT SUM(a) FROM t", "[(7,)]"),
                ("SELECT SUM(a) FROM t", "[(7,)]")
            ]),
            [(AfterResult, Rerun)]
        );
        assert_eq!(
            d(&[("SELECT AVG(a) FROM t", "[(2.5,)]"), ("COMMIT", "")]),
            [(AfterResult, Commit)]
        );
        // Quoting family: the failed statement again (planted), or quoted names, then a
        // result that is committed.
        let err = "Error: no such column: unit price";
        assert_eq!(
            d(&[
                ("SELECT unit price FROM t", err),
                ("SELECT unit price FROM t", err)
            ]),
            [(AfterNameError, Repeat)]
        );
        assert_eq!(
            d(&[
                ("SELECT unit price FROM t", err),
                ("SELECT `unit price` FROM `t`", "[(4,)]"),
                ("COMMIT", ""),
            ]),
            [(AfterNameError, QuotedRetry), (AfterResult, Commit)]
        );
        // A read after a change is a check, not a result; a last step is a decision that
        // ended the episode; other errors are no decision.
        assert_eq!(
            d(&[("INSERT INTO t VALUES (1)", ok)]),
            [(AfterChange, Ended)]
        );
        assert_eq!(
            d(&[("SELECT a FROM t WHERE", "Error: incomplete input")]),
            []
        );
        assert_eq!(
            AfterChange.good_and_planted(),
            (Choice::Commit, Choice::Check)
        );
        for point in DecisionPoint::ALL {
            assert_eq!(DecisionPoint::parse(point.as_str()), Some(point));
            assert_eq!(serde_json::to_value(point).unwrap(), point.as_str());
        }
        for choice in [Commit, Check, Rerun, Repeat, QuotedRetry, Other, Ended] {
            assert_eq!(serde_json::to_value(choice).unwrap(), choice.as_str());
        }
    }

    #[test]
    fn swe_labels_reproduction_and_verification() {
        use swe::tools;
        let calls = vec![
            ToolCall::new(tools::RUN_TESTS, json!({"tests": []})),
            ToolCall::new(tools::VIEW, json!({"path": "a.py"})),
            ToolCall::new(
                tools::REPLACE,
                json!({"path": "a.py", "old": "x", "new": "y"}),
            ),
            ToolCall::new(tools::RUN_TESTS, json!({"tests": []})),
            ToolCall::new(tools::SUBMIT, json!({})),
        ];
        let labels = SweLabeller.label(&trajectory("swe", &calls, Termination::EnvDone));
        assert_complete(&SweLabeller, &labels);
        assert_eq!(labels["test_runs"], 2.0);
        assert_eq!(labels["tests_before_first_edit"], 1.0);
        assert_eq!(labels["tests_after_last_edit"], 1.0);
        let unchecked = SweLabeller.label(&trajectory(
            "swe",
            &calls[1..3],
            Termination::PolicyFinished,
        ));
        assert_eq!(unchecked["tests_before_first_edit"], 0.0);
        assert_eq!(unchecked["tests_after_last_edit"], 0.0);
        assert_eq!(unchecked["edits"], 1.0);
    }

    #[test]
    fn builtin_labellers_cover_the_built_in_environments() {
        let envs: Vec<String> = builtin_labellers()
            .iter()
            .map(|l| l.env().to_string())
            .collect();
        assert_eq!(envs, vec!["appworld", "dbbench", "swe", "tau-retail"]);
    }
}
