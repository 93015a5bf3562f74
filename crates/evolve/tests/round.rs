//! One evolution round with the test kit's harness-sensitive policy: children repair the
//! planted failures, every valid child is pooled, invalid edits are excluded with reasons.

use std::sync::Arc;

use async_trait::async_trait;
use harness_core::{EditOp, Harness, HarnessEdit, Policy, Split, Task};
use harness_evolve::editor::{EditRequest, Editor, Proposal};
use harness_evolve::exec::{Executor, SharedPolicy};
use harness_evolve::{
    BuiltinEditor, CandidateOutcome, Evolution, EvolveSettings, RuleAnalyst, Stage,
};
use harness_testkit::ScriptedEnv;
use harness_testkit::harness_sensitive::{HarnessSensitivePolicy, Quirk, quirk_task};
use serde_json::json;

/// The policy's cures are the words the built-in editor's repairs use.
fn policy() -> Arc<dyn Policy> {
    Arc::new(
        HarnessSensitivePolicy::new()
            .cured_by(Quirk::StopsAfterFirstPage, &["keep requesting pages"])
            .cured_by(
                Quirk::WastesBudget,
                &["keep one action for the completion call"],
            )
            .cured_by(Quirk::RepeatsFailingCall, &["do not repeat it"])
            .cured_by(Quirk::AnswersInText, &["does not count"]),
    )
}

fn tasks(env: &ScriptedEnv, split: Split, prefix: &str) -> Vec<Task> {
    let plan: &[(Option<Quirk>, usize)] = &[
        (Some(Quirk::StopsAfterFirstPage), 3),
        (Some(Quirk::WastesBudget), 3),
        (Some(Quirk::RepeatsFailingCall), 2),
        (Some(Quirk::AnswersInText), 1),
        (None, 3),
    ];
    let mut out = Vec::new();
    for (quirk, n) in plan {
        for i in 0..*n {
            let tag = quirk.map_or("ok", |q| q.tag());
            let mut task = quirk_task(env, &format!("{prefix}-{tag}-{i}"), *quirk);
            task.split = split;
            out.push(task);
        }
    }
    out
}

fn base() -> Harness {
    let mut h = Harness::new("H0", "Solve the task with tools.\n{action_guidance}");
    h.prompt
        .slots
        .insert("action_guidance".into(), "Call one tool at a time.".into());
    h
}

fn settings(budget: usize) -> EvolveSettings {
    let mut s = EvolveSettings::paper();
    s.proposal_budgets = vec![budget];
    s.train_tasks_per_round = 12;
    s.limits = Some(harness_core::Limits {
        max_env_actions: 10,
        ..harness_core::Limits::default()
    });
    s
}

fn evolution(editor: Arc<dyn Editor>, budget: usize) -> Evolution {
    let env = ScriptedEnv::new(3);
    Evolution {
        settings: settings(budget),
        executor: Executor {
            policy: Arc::new(SharedPolicy(policy())),
            env: Arc::new(env.clone()),
            sampling: harness_core::SamplingParams::greedy(),
            concurrency: 4,
        },
        analyst: Arc::new(RuleAnalyst),
        editor,
        train: tasks(&env, Split::Train, "train"),
        validation: tasks(&env, Split::Validation, "val"),
    }
}

#[tokio::test]
async fn a_round_repairs_the_planted_failures_and_pools_every_valid_child() {
    let evolution = evolution(Arc::new(BuiltinEditor), 3);
    let result = evolution.run(base()).await.unwrap();
    assert_eq!(result.rounds.len(), 1);
    let round = &result.rounds[0];
    let parent = &round.parents[0];
    assert_eq!((parent.tasks, parent.solved), (12, 3));
    let kinds: Vec<&str> = parent
        .analysis
        .causes
        .iter()
        .map(|c| c.kind.as_str())
        .collect();
    assert_eq!(
        kinds,
        vec![
            "budget-before-completion",
            "stopped-paging",
            "repeated-failing-call",
            "finished-without-submit"
        ]
    );
    assert!(parent.analysis.unresolved.is_empty());
    // The single text-answer task is reported, not edited for.
    assert_eq!(parent.reported.len(), 1);
    assert_eq!(parent.reported[0].kind, "finished-without-submit");
    assert_eq!(round.proposed, 3);

    // Every valid child is in the pool with its lineage, not only the selected parents.
    let valid: Vec<_> = round
        .candidates
        .iter()
        .filter_map(|c| match &c.outcome {
            CandidateOutcome::Valid { id, local_eval, .. } => Some((c, id, local_eval)),
            _ => None,
        })
        .collect();
    assert_eq!(valid.len(), round.valid);
    assert!(round.valid >= 2, "{:#?}", round.candidates);
    assert_eq!(result.pool.len(), 1 + round.valid);
    assert!(result.pool.is_frozen());
    let h0 = result.pool.base_id().clone();
    for (record, id, _) in &valid {
        let child = result.pool.get(id).unwrap();
        assert_eq!(child.lineage.parent.as_ref(), Some(&h0));
        assert_eq!(child.lineage.generation, 1);
        assert_eq!(child.lineage.causes, record.causes);
        assert!(child.lineage.local_eval.is_some());
        assert!(
            child
                .lineage
                .notes
                .iter()
                .any(|n| n.starts_with("Measured on"))
        );
    }
    // The three planted causes are three families: a direction each. Each first proposal's
    // child repairs every planted failure its cause explains, with no regression, and together
    // they repair all of them.
    let planted_of = |cause: &str| -> Vec<String> {
        match cause {
            "stopped-paging" => (0..3).map(|i| format!("train-paging-{i}")).collect(),
            "budget-before-completion" => (0..3).map(|i| format!("train-budget-{i}")).collect(),
            "repeated-failing-call" => (0..2).map(|i| format!("train-repeat-{i}")).collect(),
            other => panic!("unexpected cause {other}"),
        }
    };
    let mut repaired_all = std::collections::BTreeSet::new();
    for (record, _, eval) in valid.iter().filter(|(c, _, _)| c.variant == 0) {
        assert_eq!(record.causes.len(), 1, "{:?}", record.causes);
        for task in planted_of(&record.causes[0]) {
            assert!(
                eval.repaired.contains(&task),
                "{task} not repaired by {}: {eval:?}",
                record.direction
            );
        }
        assert!(eval.regressed.is_empty());
        assert!(eval.tasks <= 30 && eval.controls <= 10);
        assert_eq!(record.components, vec!["hooks"]);
        repaired_all.extend(eval.repaired.iter().cloned());
    }
    for cause in [
        "stopped-paging",
        "budget-before-completion",
        "repeated-failing-call",
    ] {
        for task in planted_of(cause) {
            assert!(repaired_all.contains(&task), "{task} repaired by no child");
        }
    }
    // Other variants use other mechanisms.
    let mechanisms: std::collections::BTreeSet<_> =
        valid.iter().map(|(c, _, _)| c.brief.clone()).collect();
    assert_eq!(mechanisms.len(), valid.len());
    // Parents for the next round come from this round's valid children and cover the most.
    assert!(!round.selection.parents.is_empty() && round.selection.parents.len() <= 4);
    assert!(round.selection.covered >= 8, "{:?}", round.selection);
    // The pool survives a save and load.
    let dir = tempfile::tempdir().unwrap();
    result.pool.save(dir.path()).unwrap();
    assert_eq!(
        harness_pool::SiblingPool::load(dir.path()).unwrap(),
        result.pool
    );
}

/// An editor that plants broken edits for some directions.
struct Saboteur;

#[async_trait]
impl Editor for Saboteur {
    fn name(&self) -> &str {
        "saboteur"
    }

    async fn propose(&self, request: &EditRequest<'_>) -> harness_evolve::Result<Option<Proposal>> {
        let op = match request.direction.id.as_str() {
            "g1-d1" => EditOp::set(
                "state.prompt_rules.dangling",
                json!({"slot": "no_such_slot", "text": "Keep requesting pages."}),
            ),
            "g1-d2" => EditOp::set(
                "state.hooks.moon",
                json!({"action": "warn", "condition": "moon_is_full", "event": "after_tool", "message": "Keep one action for the completion call.", "parameters": {}}),
            ),
            "g1-d3" => EditOp::set("state.limits.max_env_actions", json!(99)),
            _ => return BuiltinEditor.propose(request).await,
        };
        Ok(Some(Proposal {
            edit: HarnessEdit::new(vec![op], "broken on purpose"),
            brief: format!("broken edit for {}", request.direction.id),
        }))
    }
}

#[tokio::test]
async fn invalid_edits_are_excluded_with_their_reasons() {
    let evolution = evolution(Arc::new(Saboteur), 4);
    let result = evolution.run(base()).await.unwrap();
    let round = &result.rounds[0];
    let rejection = |id: &str| {
        round
            .candidates
            .iter()
            .find(|c| c.direction == id)
            .and_then(|c| match &c.outcome {
                CandidateOutcome::Invalid { rejection } => Some(rejection.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{id} was not rejected: {:#?}", round.candidates))
    };
    let dangling = rejection("g1-d1");
    assert_eq!(dangling.stage, Stage::References);
    assert!(
        dangling.reason.contains("missing slot `no_such_slot`"),
        "{}",
        dangling.reason
    );
    let moon = rejection("g1-d2");
    assert_eq!(moon.stage, Stage::References);
    assert!(
        moon.reason.contains("unknown condition `moon_is_full`"),
        "{}",
        moon.reason
    );
    let limits = rejection("g1-d3");
    assert_eq!(limits.stage, Stage::Protocol);
    assert_eq!(round.invalid.values().sum::<usize>(), 3);
    assert_eq!(round.valid, 1);
    // Invalid children never enter the pool.
    assert_eq!(result.pool.len(), 2);
    assert!(
        result
            .pool
            .members()
            .iter()
            .all(|h| !h.prompt_rules.contains_key("dangling"))
    );
}

#[tokio::test]
async fn reports_and_diversity_views_are_written() {
    let evolution = evolution(Arc::new(BuiltinEditor), 3);
    let result = evolution.run(base()).await.unwrap();
    let diversity = harness_evolve::diversity::measure(
        &evolution.executor,
        &result.pool,
        &result.validation_solved,
        &evolution.validation,
        evolution.validation_seed(),
        &harness_core::SamplingParams::default(),
    )
    .await
    .unwrap();
    assert_eq!(diversity.siblings.len(), result.pool.len() - 1);
    assert_eq!(diversity.tasks, 12);
    // H0 solves the 3 quirk-free validation tasks; children repair planted failures.
    assert_eq!(diversity.coverage.h0_solved, 3);
    assert!(diversity.union_repaired >= 8, "{diversity:?}");
    assert!(
        diversity.coverage.oracle_union
            >= diversity.siblings.iter().map(|s| s.solved).max().unwrap()
    );
    // The scripted policy is deterministic, so H0's pass@K equals its pass@1.
    assert_eq!(diversity.coverage.h0_pass_at_k, Some(3));

    let dir = tempfile::tempdir().unwrap();
    let written = harness_evolve::report::write_reports(dir.path(), &result, &diversity).unwrap();
    assert!(written.len() >= 9);
    for svg in ["figure1a.svg", "figure1b.svg", "figure5.svg"] {
        let text = std::fs::read_to_string(dir.path().join(svg)).unwrap();
        assert!(
            text.starts_with("<svg") && text.trim_end().ends_with("</svg>"),
            "{svg}"
        );
    }
    let rounds: Vec<harness_evolve::RoundReport> =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("rounds.json")).unwrap())
            .unwrap();
    assert_eq!(rounds, result.rounds);
    let again: harness_evolve::DiversityReport =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("diversity.json")).unwrap())
            .unwrap();
    assert_eq!(again, diversity);
    let pool = harness_pool::SiblingPool::load(dir.path().join("pool")).unwrap();
    assert!(pool.is_frozen());
    let summary = harness_evolve::report::round_summary(&result.rounds[0], 12);
    assert!(
        summary.contains("round 1") && summary.contains("selected (Eq. 3)"),
        "{summary}"
    );
}

#[tokio::test]
async fn an_executor_that_does_not_sample_as_the_settings_say_is_refused() {
    let mut evolution = evolution(Arc::new(BuiltinEditor), 1);
    evolution.executor.sampling = harness_core::SamplingParams::default();
    let err = evolution.run(base()).await.unwrap_err().to_string();
    assert!(
        err.contains("greedy") && err.contains("temperature 1"),
        "{err}"
    );
}
