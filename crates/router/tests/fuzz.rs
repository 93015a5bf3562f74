//! Fuzzed ballots and profiler answers: not JSON, unknown ids, duplicates, wrong lengths, huge
//! strings. Everything is rejected with a reason and counted; nothing panics, and routing with
//! voters that only write garbage still returns K distinct ids (filled by validation success).

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::AtomicU8;

use async_trait::async_trait;
use common::*;
use harness_core::{CalibrationPoint, HarnessId, Policy, SelectionMode, Split, TrajectoryLabeller};
use harness_router::{
    AdaptiveRouter, BallotError, BallotRules, BuiltinProfiler, Calibrator, CalibratorSettings,
    EvidenceCell, RouterSettings, VoteAnswer, VoteRequest, Voter, parse_ballot_text,
    parse_profile_answer,
};
use proptest::prelude::*;
use serde_json::json;

fn candidates() -> Vec<HarnessId> {
    ["h0", "a", "b", "c", "d", "e"]
        .iter()
        .map(|s| HarnessId(s.to_string()))
        .collect()
}

/// Answers a fuzzer writes: garbage text, JSON of the wrong shape, ballots with unknown or
/// repeated ids, of the wrong length, naming H0, and huge strings.
fn answer() -> impl Strategy<Value = String> {
    let id = prop_oneof![
        Just("h0".to_string()),
        Just("a".to_string()),
        Just("b".to_string()),
        Just("c".to_string()),
        Just("d".to_string()),
        Just("e".to_string()),
        "[a-z0-9]{0,12}",
        Just("x".repeat(100_000)),
    ];
    prop_oneof![
        any::<String>(),
        "[\\[\\]{}\",:a-e ]{0,40}",
        proptest::collection::vec(id.clone(), 0..7)
            .prop_map(|ids| json!({"ranking": ids}).to_string()),
        proptest::collection::vec(id, 0..7)
            .prop_map(|ids| format!("Here you go:\n```json\n{}\n```", json!(ids))),
        Just(format!("{{\"ranking\": [\"{}\"]}}", "y".repeat(300_000))),
        Just("{\"ranking\": [1, 2, 3, 4]}".to_string()),
        Just("[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[".repeat(2000)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn fuzzed_ballots_are_rejected_with_a_reason_or_are_valid(text in answer()) {
        let candidates = candidates();
        let rules = BallotRules { candidates: &candidates, excluded_base: Some(&candidates[0]), len: 4 };
        match parse_ballot_text(&text).and_then(|b| rules.check(&b)) {
            Ok(ballot) => {
                prop_assert_eq!(ballot.len(), 4);
                prop_assert!(!ballot.contains(&candidates[0]));
                prop_assert_eq!(ballot.iter().collect::<BTreeSet<_>>().len(), 4);
            }
            Err(e) => {
                // Every rejection says why, and stays short enough to log.
                let message = e.to_string();
                prop_assert!(!message.is_empty());
                prop_assert!(message.len() < 1000, "{}", message.len());
            }
        }
    }

    #[test]
    fn fuzzed_profiler_answers_never_panic_and_valid_ones_cite_shown_tasks(
        text in prop_oneof![
            any::<String>(),
            "[\\[\\]{}\",:a-z ]{0,60}",
            (any::<bool>(), "[a-z]{0,5}", "[a-z -]{0,20}").prop_map(|(ok, when, task)| {
                let support = if ok { json!(["t1"]) } else { json!([task]) };
                json!({"prefer": [{"when": when, "behavior": "reads back", "support": support}], "avoid": []}).to_string()
            }),
            Just(json!({"prefer": [{"when": "w".repeat(5000), "behavior": "b", "support": ["t1"]}], "avoid": []}).to_string()),
            Just(json!({"prefer": [], "avoid": [{"when": "w", "behavior": "b", "support": []}]}).to_string()),
            Just(json!({"prefer": (0..40).map(|_| json!({"when": "w", "behavior": "b", "support": ["t1"]})).collect::<Vec<_>>(), "avoid": []}).to_string()),
            Just(json!({"prefer": []}).to_string()),
        ]
    ) {
        let allowed: BTreeSet<String> = ["t1".to_string(), "t2".to_string()].into();
        if let Ok(profile) = parse_profile_answer(&text, &allowed) {
            for e in profile.prefer.iter().chain(&profile.avoid) {
                prop_assert!(!e.when.is_empty() && !e.behavior.is_empty());
                prop_assert!(!e.support.is_empty());
                prop_assert!(e.support.iter().all(|t| allowed.contains(t)));
            }
        }
    }
}

/// A voter that writes whatever it is given, in turn.
struct GarbageVoter {
    answers: Vec<String>,
}

#[async_trait]
impl Voter for GarbageVoter {
    fn name(&self) -> &str {
        "garbage"
    }

    async fn vote(&self, request: &VoteRequest) -> harness_router::Result<VoteAnswer> {
        let text = &self.answers[request.attempt as usize % self.answers.len()];
        Ok(VoteAnswer {
            ballot: parse_ballot_text(text),
            usage: None,
        })
    }
}

#[tokio::test]
async fn garbage_voters_are_dropped_counted_and_the_selection_is_filled() {
    let pool = Arc::new(pool());
    let labeller: Arc<dyn TrajectoryLabeller> = Arc::new(ScriptedLabeller);
    let policy: Arc<dyn Policy> =
        Arc::new(phased_policy(Arc::new(AtomicU8::new(0)), default_script));
    let evidence = EvidenceCell::new();
    let calibrator = Calibrator::new(
        pool.clone(),
        policy,
        envs(),
        validation_tasks(),
        Arc::new(BuiltinProfiler::new([labeller])),
        evidence.clone(),
        CalibratorSettings::default(),
    )
    .unwrap();
    calibrator
        .run(&CalibrationPoint {
            index: 0,
            update: 0,
            is_final: false,
            seed: 1,
            checkpoint: None,
        })
        .await
        .unwrap();
    let base = pool.base_id().0.clone();
    let a = id_of(&pool, "S-A").0;
    let voters: Vec<Arc<dyn Voter>> = vec![
        Arc::new(GarbageVoter {
            answers: vec![
                "not json at all".into(),
                json!({"ranking": [base, a, a, a]}).to_string(),
                json!({"ranking": ["nope", "x", "y", "z"]}).to_string(),
            ],
        }),
        Arc::new(GarbageVoter {
            answers: vec![json!({"ranking": [a]}).to_string(), "z".repeat(1 << 20)],
        }),
    ];
    let router = AdaptiveRouter::new(evidence, voters, RouterSettings::default()).unwrap();
    let routed = router
        .route(
            &task("t", Split::Train, "pay", 3),
            4,
            SelectionMode::Rescue,
            9,
        )
        .await
        .unwrap();
    assert_eq!(routed.dropped, 2);
    assert_eq!(routed.rejected, 6, "3 attempts per voter, all rejected");
    assert!(routed.ballots.is_empty());
    assert_eq!(routed.selection.ids.len(), 4);
    assert_eq!(
        routed.selection.filled, routed.selection.ids,
        "all filled by validation success"
    );
    assert!(!routed.selection.ids.contains(pool.base_id()));
    let stats = router.stats();
    assert_eq!(stats.dropped, 2);
    assert_eq!(stats.filled_selections, 1);
    for reason in ["unreadable", "base_in_rescue", "unknown_id", "wrong_length"] {
        assert!(
            stats.rejected.get(reason).copied().unwrap_or(0) >= 1,
            "{reason}: {stats:?}"
        );
    }
    assert_eq!(stats.rejected.values().sum::<u64>(), 6);
    assert!(matches!(
        parse_ballot_text(&"z".repeat(1 << 20)),
        Err(BallotError::Unreadable { .. })
    ));
}

/// A voter that writes the ballot it is given for its attempt (then repeats the last one).
struct ListVoter {
    ballots: Vec<Vec<String>>,
}

#[async_trait]
impl Voter for ListVoter {
    fn name(&self) -> &str {
        "list"
    }

    async fn vote(&self, request: &VoteRequest) -> harness_router::Result<VoteAnswer> {
        let i = (request.attempt as usize).min(self.ballots.len().saturating_sub(1));
        Ok(VoteAnswer {
            ballot: Ok(self.ballots.get(i).cloned().unwrap_or_default()),
            usage: None,
        })
    }
}

/// Evidence from one real paired calibration, shared by every property case.
fn evidence() -> (EvidenceCell, Vec<String>, String) {
    static ONCE: std::sync::OnceLock<(EvidenceCell, Vec<String>, String)> =
        std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        let pool = Arc::new(pool());
        let policy: Arc<dyn Policy> =
            Arc::new(phased_policy(Arc::new(AtomicU8::new(0)), default_script));
        let labeller: Arc<dyn TrajectoryLabeller> = Arc::new(ScriptedLabeller);
        let cell = EvidenceCell::new();
        let calibrator = Calibrator::new(
            pool.clone(),
            policy,
            envs(),
            validation_tasks(),
            Arc::new(BuiltinProfiler::new([labeller])),
            cell.clone(),
            CalibratorSettings::default(),
        )
        .unwrap();
        futures::executor::block_on(calibrator.run(&CalibrationPoint {
            index: 0,
            update: 0,
            is_final: false,
            seed: 1,
            checkpoint: None,
        }))
        .unwrap();
        let ids = pool.ids().into_iter().map(|i| i.0).collect();
        (cell, ids, pool.base_id().0.clone())
    })
    .clone()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn routed_rescue_never_returns_h0_and_always_k_distinct_ids(
        // Ballots drawn from member indices (0 = H0) and a junk id, of any length.
        raw in proptest::collection::vec(
            proptest::collection::vec(proptest::collection::vec(0usize..6, 0..6), 1..4),
            1..4,
        ),
        k in 1usize..5,
        seed in any::<u64>(),
    ) {
        let (cell, ids, base) = evidence();
        let name = |i: usize| ids.get(i).cloned().unwrap_or_else(|| "junk".into());
        let voters: Vec<Arc<dyn Voter>> = raw
            .iter()
            .map(|attempts| {
                Arc::new(ListVoter {
                    ballots: attempts.iter().map(|b| b.iter().map(|i| name(*i)).collect()).collect(),
                }) as Arc<dyn Voter>
            })
            .collect();
        let router = AdaptiveRouter::new(cell, voters, RouterSettings::default()).unwrap();
        let routed = futures::executor::block_on(router.route(
            &task("t", Split::Train, "mail", 1),
            k,
            SelectionMode::Rescue,
            seed,
        ))
        .unwrap();
        let picked: Vec<String> = routed.selection.ids.iter().map(|i| i.0.clone()).collect();
        prop_assert_eq!(picked.len(), k);
        prop_assert!(!picked.contains(&base));
        prop_assert_eq!(picked.iter().collect::<BTreeSet<_>>().len(), k);
        prop_assert_eq!(routed.ballots.len() + routed.dropped, raw.len());
        for ballot in &routed.ballots {
            prop_assert_eq!(ballot.len(), 4);
            prop_assert!(!ballot.iter().any(|i| i.0 == base));
        }
    }
}
