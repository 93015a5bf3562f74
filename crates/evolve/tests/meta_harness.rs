//! The Meta-Harness comparison variant: a proposer revises the best candidate so far from its
//! scores and trajectories; one H_best is kept by training score, within the same budgets.

use std::sync::Arc;

use harness_core::{Harness, SamplingParams, Split, Task};
use harness_evolve::exec::{Executor, SharedPolicy};
use harness_evolve::meta_harness::{AnalystEditorProposer, MetaHarnessSearch};
use harness_evolve::{BuiltinEditor, EvolveSettings, RuleAnalyst};
use harness_testkit::ScriptedEnv;
use harness_testkit::harness_sensitive::{HarnessSensitivePolicy, Quirk, quirk_task};

#[tokio::test]
async fn the_search_keeps_one_best_harness_by_training_score() {
    let env = ScriptedEnv::new(3);
    let policy = HarnessSensitivePolicy::new()
        .cured_by(Quirk::StopsAfterFirstPage, &["keep requesting pages"])
        .cured_by(
            Quirk::WastesBudget,
            &["keep one action for the completion call"],
        )
        .cured_by(Quirk::RepeatsFailingCall, &["do not repeat it"]);
    let train: Vec<Task> = (0..12)
        .map(|i| {
            let quirk = [
                Some(Quirk::StopsAfterFirstPage),
                Some(Quirk::WastesBudget),
                Some(Quirk::RepeatsFailingCall),
                None,
            ][i % 4];
            let mut t = quirk_task(&env, &format!("t{i}"), quirk);
            t.split = Split::Train;
            t
        })
        .collect();
    let mut settings = EvolveSettings::paper();
    settings.proposal_budgets = vec![2, 2];
    settings.train_tasks_per_round = 12;
    settings.limits = Some(harness_core::Limits {
        max_env_actions: 10,
        ..harness_core::Limits::default()
    });
    let search = MetaHarnessSearch {
        settings: settings.clone(),
        executor: Executor {
            policy: Arc::new(SharedPolicy(Arc::new(policy))),
            env: Arc::new(env),
            sampling: SamplingParams::greedy(),
            concurrency: 4,
        },
        proposer: Arc::new(AnalystEditorProposer {
            analyst: Arc::new(RuleAnalyst),
            editor: Arc::new(BuiltinEditor),
            settings,
        }),
        train,
    };
    let mut base = Harness::new("H0", "Solve the task with tools.\n{action_guidance}");
    base.prompt
        .slots
        .insert("action_guidance".into(), "Call one tool at a time.".into());
    let result = search.run(base).await.unwrap();
    let scored = result.candidates.len() - 1;
    assert_eq!(
        scored + result.rejected.len() + result.empty,
        4,
        "the budget is 2 + 2 proposals"
    );
    assert_eq!(result.candidates[0].solved, 3);
    let best = result
        .candidates
        .iter()
        .find(|c| c.id == result.best.id())
        .unwrap();
    assert!(result.candidates.iter().all(|c| c.score() <= best.score()));
    assert_eq!(best.solved, 12, "{:#?}", result.candidates);
    // Every revision revises an earlier candidate.
    for (i, c) in result.candidates.iter().enumerate().skip(1) {
        let parent = c.parent.as_ref().unwrap();
        assert!(result.candidates[..i].iter().any(|p| &p.id == parent));
    }
    assert_eq!(result.usage["proposer"].calls, 0);
}
