//! The built-in voter: profile-condition match and similar-task success decide, and each voter's
//! seeded perturbation makes voters differ on near ties while each stays deterministic.

use std::collections::{BTreeMap, BTreeSet};

use harness_core::{HarnessId, SelectionMode, Split, Task};
use harness_router::{
    BuiltinVoter, BuiltinVoterWeights, Candidate, Entry, FeatureSource, Profile, SimilarOutcome,
    VoteRequest, Voter,
};
use serde_json::json;

fn candidate(name: &str, success: f64, profile: Option<Profile>) -> Candidate {
    Candidate {
        id: HarnessId(name.into()),
        name: name.into(),
        description: String::new(),
        is_base: name == "h0",
        validation_success: success,
        profile,
    }
}

fn entry(when: &str) -> Entry {
    Entry::new(when, "some behaviour", vec!["v1".into(), "v2".into()])
}

fn request(candidates: Vec<Candidate>, similar: Vec<SimilarOutcome>, seed: u64) -> VoteRequest {
    let mut task = Task::new(
        "t",
        "appworld",
        Split::Train,
        "Count the emails in the inbox and the spam folder.",
        0,
    );
    task.metadata = json!({"template": "mail_count"});
    VoteRequest {
        task,
        mode: SelectionMode::Inference,
        candidates,
        similar,
        features: FeatureSource::Metadata,
        ballot_len: 4,
        seed,
        attempt: 0,
    }
}

async fn ballot(voter: &BuiltinVoter, request: &VoteRequest) -> Vec<String> {
    voter.vote(request).await.unwrap().ballot.unwrap()
}

#[tokio::test]
async fn profile_conditions_and_similar_success_order_the_ballot() {
    let prefer_mail = Profile {
        prefer: vec![entry("appworld, category mail_count")],
        avoid: vec![],
    };
    let avoid_mail = Profile {
        prefer: vec![],
        avoid: vec![entry("appworld, category mail_count")],
    };
    let prefer_other = Profile {
        prefer: vec![entry("dbbench, category counting")],
        avoid: vec![],
    };
    let candidates = vec![
        candidate("h0", 0.3, None),
        candidate("avoids", 0.3, Some(avoid_mail)),
        candidate("other", 0.3, Some(prefer_other)),
        candidate("prefers", 0.3, Some(prefer_mail)),
        candidate("similar", 0.3, None),
    ];
    // Only `similar` solved the similar validation task.
    let similar = vec![SimilarOutcome {
        task_id: "v9".into(),
        instruction: "Count emails".into(),
        similarity: 1.0,
        success: BTreeMap::from([(HarnessId("similar".into()), 1.0)]),
    }];
    let quiet = BuiltinVoter::new("quiet", 1).with_weights(BuiltinVoterWeights {
        noise: 0.0,
        ..BuiltinVoterWeights::default()
    });
    let got = ballot(&quiet, &request(candidates, similar, 1)).await;
    // prefers: 0.67 profile; similar: 1.0 similar success; avoids: -0.67.
    assert_eq!(got[0], "similar");
    assert_eq!(got[1], "prefers");
    assert_eq!(got.len(), 4);
    assert!(!got.contains(&"avoids".to_string()), "{got:?}");
}

#[tokio::test]
async fn seeded_perturbation_makes_voters_differ_and_each_deterministic() {
    // Eight candidates with the same evidence: only the perturbation orders them.
    let candidates: Vec<Candidate> = (0..8)
        .map(|i| candidate(&format!("c{i}"), 0.5, None))
        .collect();
    let req = request(candidates, Vec::new(), 42);
    let panel = BuiltinVoter::panel(4, 7);
    let mut ballots = BTreeSet::new();
    for voter in &panel {
        let first = ballot(voter, &req).await;
        assert_eq!(
            first,
            ballot(voter, &req).await,
            "{} is deterministic",
            voter.name()
        );
        assert_eq!(first.iter().collect::<BTreeSet<_>>().len(), 4);
        ballots.insert(first);
    }
    assert!(
        ballots.len() > 1,
        "voters with different seeds differ: {ballots:?}"
    );
    // The same voter draws another perturbation for another request seed.
    let mut by_seed = BTreeSet::new();
    for seed in 0..8 {
        by_seed.insert(
            ballot(
                &panel[0],
                &VoteRequest {
                    seed,
                    ..req.clone()
                },
            )
            .await,
        );
    }
    assert!(by_seed.len() > 1, "request seeds change the perturbation");
}
