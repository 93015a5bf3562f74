//! The LLM profiler and voter against a scripted chat model: prompts, seeded candidate
//! shuffling, validated answers, retries within the budget, an empty profile and a counted
//! failure after it, and tokens counted per role.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use common::*;
use harness_core::{
    CalibrationPoint, ChatModel, ChatRequest, HarnessId, Policy, SelectionMode, Split,
};
use harness_router::{
    AdaptiveRouter, Calibrator, CalibratorSettings, EvidenceCell, LlmProfiler, LlmProfilerSettings,
    LlmVoter, LlmVoterSettings, PROFILER_ROLE, RouterSettings, TokenCounter, VOTER_ROLE, Voter,
};
use serde_json::json;

fn point() -> CalibrationPoint {
    CalibrationPoint {
        index: 0,
        update: 0,
        is_final: false,
        seed: 3,
        checkpoint: None,
    }
}

/// The candidate ids a voter prompt lists, in the order shown.
fn shown_ids(request: &ChatRequest) -> Vec<String> {
    request.messages[1]
        .content
        .lines()
        .filter_map(|l| l.strip_prefix("- id "))
        .map(|l| l.split_whitespace().next().unwrap_or_default().to_string())
        .collect()
}

/// Task ids a profiler prompt shows.
fn shown_tasks(request: &ChatRequest) -> Vec<String> {
    request.messages[1]
        .content
        .lines()
        .filter_map(|l| l.strip_prefix("=== task "))
        .map(|l| l.split_whitespace().next().unwrap_or_default().to_string())
        .collect()
}

async fn calibrated(
    profiler_model: Arc<dyn ChatModel>,
    tokens: TokenCounter,
    attempts: u32,
) -> (
    Arc<harness_pool::SiblingPool>,
    EvidenceCell,
    Arc<LlmProfiler>,
    harness_router::Calibration,
) {
    let pool = Arc::new(pool());
    let policy: Arc<dyn Policy> =
        Arc::new(phased_policy(Arc::new(AtomicU8::new(0)), default_script));
    let settings = LlmProfilerSettings {
        attempts,
        ..LlmProfilerSettings::default()
    };
    let profiler = Arc::new(LlmProfiler::new(profiler_model, settings, tokens));
    let evidence = EvidenceCell::new();
    let calibrator = Calibrator::new(
        pool.clone(),
        policy,
        envs(),
        validation_tasks(),
        profiler.clone(),
        evidence.clone(),
        CalibratorSettings::default(),
    )
    .unwrap();
    let (calibration, _) = calibrator.run(&point()).await.unwrap();
    (pool, evidence, profiler, calibration)
}

#[tokio::test]
async fn llm_profiler_validates_answers_and_builds_profiles() {
    // The model cites the first task it was shown as a mail success.
    let chat = Arc::new(ScriptedChat::with(|request| {
        let tasks = shown_tasks(request);
        json!({
            "prefer": [{"when": "counting emails in a folder", "behavior": "fetches every page before answering", "support": [tasks[0]]}],
            "avoid": []
        })
        .to_string()
    }));
    let tokens = TokenCounter::new();
    let (pool, _, profiler, calibration) = calibrated(chat.clone(), tokens.clone(), 3).await;
    // Only S-A and S-B differ from H0 in phase 0, so only they were sent to the model.
    assert_eq!(chat.calls.load(Ordering::SeqCst), 2);
    let a = id_of(&pool, "S-A");
    let profile = &calibration.profiles[&a];
    assert_eq!(
        profile.prefer[0].behavior,
        "fetches every page before answering"
    );
    assert!(profile.prefer[0].support[0].starts_with("val-mail"));
    assert!(calibration.profiles[&id_of(&pool, "S-C")].is_empty());
    assert_eq!(calibration.profiler.failures, 0);
    assert_eq!(profiler.failures(), 0);
    // The prompt pairs both harnesses' transcripts of the same task.
    let requests = chat.requests.lock().unwrap();
    let prompt = &requests[0].messages[1].content;
    assert!(prompt.contains("--- S transcript") && prompt.contains("--- H0 transcript"));
    assert!(requests.iter().all(|r| r.purpose == PROFILER_ROLE));
    drop(requests);
    assert_eq!(tokens.role(PROFILER_ROLE).requests, 2);
    assert_eq!(tokens.role(PROFILER_ROLE).usage.prompt_tokens, 200);
    assert_eq!(calibration.profiler.usage.completion_tokens, 20);
}

#[tokio::test]
async fn llm_profiler_retries_then_leaves_an_empty_profile_and_counts_the_failure() {
    // First answer not JSON, then (repeated from then on) one citing a task it was never
    // shown: with a budget of 2 attempts both differing siblings give up.
    let answers = vec![
        "I think S helps with pagination.",
        r#"{"prefer": [{"when": "w", "behavior": "b", "support": ["not-a-task"]}], "avoid": []}"#,
    ];
    let chat = Arc::new(ScriptedChat::queue(answers));
    let tokens = TokenCounter::new();
    let (pool, _, profiler, calibration) = calibrated(chat.clone(), tokens.clone(), 2).await;
    assert_eq!(
        calibration.profiler.failures, 2,
        "both differing siblings gave up"
    );
    assert_eq!(profiler.failures(), 2);
    assert_eq!(profiler.rejected_answers(), 4);
    assert_eq!(calibration.profiler.rejected_answers, 4);
    assert!(calibration.profiles[&id_of(&pool, "S-A")].is_empty());
    assert_eq!(chat.calls.load(Ordering::SeqCst), 4);
    // The retry told the model what was wrong.
    let requests = chat.requests.lock().unwrap();
    let retry = requests
        .iter()
        .find(|r| r.messages.len() == 4)
        .expect("a retry carries the rejected answer and the problem");
    assert!(retry.messages[3].content.contains("not a valid profile"));
    assert_eq!(tokens.role(PROFILER_ROLE).requests, 4);
}

#[tokio::test]
async fn llm_voters_shuffle_candidates_by_seed_and_ballots_are_validated() {
    let chat = Arc::new(ScriptedChat::queue(vec!["{}"]));
    let tokens = TokenCounter::new();
    let (pool, evidence, _, _) = calibrated(chat, tokens.clone(), 1).await;
    let a = id_of(&pool, "S-A");

    // A voter model that puts S-A first when it is shown and otherwise keeps the shown order.
    let a_text = a.0.clone();
    let voter_model = Arc::new(ScriptedChat::with(move |request| {
        let mut ids = shown_ids(request);
        ids.sort_by_key(|i| *i != a_text);
        json!({"ranking": ids.into_iter().take(4).collect::<Vec<_>>()}).to_string()
    }));
    let voters: Vec<Arc<dyn Voter>> = (0..3)
        .map(|v| {
            Arc::new(LlmVoter::new(
                format!("llm-{v}"),
                voter_model.clone(),
                100 + v,
                LlmVoterSettings::default(),
                tokens.clone(),
            )) as Arc<dyn Voter>
        })
        .collect();
    let router = AdaptiveRouter::new(evidence, voters, RouterSettings::default()).unwrap();
    let routed = router
        .route(
            &task("train-mail", Split::Train, "mail", 50),
            2,
            SelectionMode::Rescue,
            1,
        )
        .await
        .unwrap();
    assert_eq!(routed.selection.ids[0], a);
    assert_eq!(routed.ballots.len(), 3);
    assert_eq!(routed.dropped, 0);
    let requests = voter_model.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 3);
    // H0 is no candidate in rescue; every voter saw the same four siblings in its own order.
    let orders: BTreeSet<Vec<String>> = requests.iter().map(shown_ids).collect();
    for order in &orders {
        assert_eq!(order.len(), 4);
        assert!(!order.contains(&pool.base_id().0));
    }
    assert!(
        orders.len() > 1,
        "candidate order varies across calls: {orders:?}"
    );
    let prompt = &requests[0].messages[1].content;
    assert!(prompt.contains("Similar validation tasks"), "{prompt}");
    assert!(prompt.contains("validation success 0.50"));
    assert!(requests.iter().all(|r| r.purpose == VOTER_ROLE));
    assert_eq!(tokens.role(VOTER_ROLE).requests, 3);
    assert_eq!(tokens.role(VOTER_ROLE).usage.completion_tokens, 30);
    assert_eq!(router.stats().voter_usage.completion_tokens, 30);
    // The same figures reach the rescue loop's cost accounting through the selector seam.
    assert_eq!(
        harness_core::HarnessSelector::usage(&router)[VOTER_ROLE],
        router.stats().voter_usage
    );

    // Inference shows H0 too; a voter that names an unknown id is retried, then dropped.
    let bad_model = Arc::new(ScriptedChat::queue(vec![
        r#"{"ranking": ["x", "y", "z", "w"]}"#,
    ]));
    let bad: Vec<Arc<dyn Voter>> = vec![Arc::new(LlmVoter::new(
        "bad",
        bad_model.clone(),
        1,
        LlmVoterSettings::default(),
        tokens.clone(),
    ))];
    let router =
        AdaptiveRouter::new(router.evidence().clone(), bad, RouterSettings::default()).unwrap();
    let routed = router
        .route(
            &task("t", Split::Test, "mail", 1),
            5,
            SelectionMode::Inference,
            1,
        )
        .await
        .unwrap();
    assert_eq!(routed.dropped, 1);
    assert_eq!(routed.rejected, 3);
    assert_eq!(routed.selection.filled.len(), 5);
    let shown = shown_ids(&bad_model.requests.lock().unwrap()[0]);
    assert!(shown.contains(&pool.base_id().0));
    assert_eq!(router.stats().rejected["unknown_id"], 3);
    let _: HarnessId = routed.selection.ids[0].clone();
}
