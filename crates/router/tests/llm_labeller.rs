//! The LLM labeller of Table 3 against a scripted chat model: the prompt lists every behaviour
//! and holds the complete transcript; a malformed answer is sent back and retried; an answer
//! that stays unusable leaves the trajectory unlabelled and is counted; tokens are counted
//! under the labeller's role.

mod common;

use std::sync::Arc;
use std::sync::atomic::AtomicU8;

use common::*;
use harness_core::{Split, TrajectoryLabeller, run_episode};
use harness_router::{LABELLER_ROLE, LlmLabeller, LlmLabellerSettings, TokenCounter};
use harness_testkit::ScriptedEnv;

#[tokio::test]
async fn the_llm_labeller_labels_every_behaviour_or_leaves_the_trajectory_unlabelled() {
    let policy = phased_policy(Arc::new(AtomicU8::new(0)), default_script);
    let env = ScriptedEnv::new(3);
    let task = task("t-mail-0", Split::Test, "mail", 0);
    let trajectory = run_episode(&policy, &harness("S-A"), &env, &task, 5)
        .await
        .unwrap();
    let features = ScriptedLabeller.features();
    let all_true: String = format!(
        "{{{}}}",
        features
            .iter()
            .map(|f| format!("\"{}\": true", f.name))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let chat = Arc::new(ScriptedChat::queue(vec!["they paged, I think", &all_true]));
    let tokens = TokenCounter::new();
    let labeller = LlmLabeller::new(chat.clone(), LlmLabellerSettings::default(), tokens.clone());
    let labels = labeller.label(&features, &trajectory).await.unwrap();
    assert_eq!(labels.len(), features.len());
    assert!(labels.values().all(|&v| v == 1.0));
    assert_eq!((labeller.rejected_answers(), labeller.failures()), (1, 0));
    let requests = chat.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 2);
    let prompt = &requests[0].messages[1].content;
    for f in &features {
        assert!(prompt.contains(&format!("- {}:", f.name)), "{prompt}");
    }
    assert!(
        prompt.contains("t-mail-0") && prompt.contains("list_items"),
        "{prompt}"
    );
    assert!(
        requests[1].messages.len() > requests[0].messages.len(),
        "the problem was shown back"
    );
    assert_eq!(tokens.role(LABELLER_ROLE).requests, 2);

    // Answers that stay unusable: no labels, one failure, every attempt spent.
    let chat = Arc::new(ScriptedChat::queue(vec!["{\"submitted\": \"maybe\"}"]));
    let labeller = LlmLabeller::new(chat.clone(), LlmLabellerSettings::default(), tokens.clone());
    assert!(labeller.label(&features, &trajectory).await.is_none());
    assert_eq!((labeller.rejected_answers(), labeller.failures()), (3, 1));
    assert_eq!(tokens.role(LABELLER_ROLE).requests, 5);
}
