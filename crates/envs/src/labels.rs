//! Behaviour labellers of the built-in environments ([`harness_core::TrajectoryLabeller`]),
//! each defined beside its world and gathered here.
//!
//! The router's built-in profiler compares a sibling's trajectory with H0's on the same task
//! through these labels (paper Eq. 8 and Table 7: pagination through every source, joint
//! filtering, read-backs, submission through the completion API), and the same labels can
//! produce the paper's behaviour table.

use std::sync::Arc;

use harness_core::TrajectoryLabeller;

pub use harness_appworld::labels::AppWorldLabeller;
pub use harness_dbbench::labels::{
    Choice, DbBenchLabeller, Decision, DecisionPoint, dbbench_decisions,
};
pub use harness_swe::labels::SweLabeller;
pub use harness_tau_retail::labels::TauRetailLabeller;

/// The labellers of the built-in environments.
pub fn builtin_labellers() -> Vec<Arc<dyn TrajectoryLabeller>> {
    vec![
        Arc::new(AppWorldLabeller),
        Arc::new(DbBenchLabeller),
        Arc::new(SweLabeller),
        Arc::new(TauRetailLabeller),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{appworld, dbbench, swe};
    use harness_core::{
        Counts, HarnessId, Outcome, Role, Source, Termination, ToolCall, Trajectory,
        TrajectoryLabels, TrajectoryMessage,
    };
    use serde_json::Value;
    use serde_json::json;
    use std::collections::BTreeSet;

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
