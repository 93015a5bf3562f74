//! The built-in profiler on constructed paired trajectories: repeated observations of a family
//! are consolidated, single-task observations keep their full condition, tasks where the
//! outcomes agree yield nothing.

mod common;

use std::sync::Arc;

use common::{ScriptedLabeller, harness, task};
use harness_core::{
    Counts, HarnessId, Outcome, Role, Source, Split, Termination, ToolCall, Trajectory,
    TrajectoryLabeller, TrajectoryMessage,
};
use harness_router::{BuiltinProfiler, Entry, FeatureSource, PairedTask, ProfileInput, Profiler};
use serde_json::json;

fn trajectory(
    task_id: &str,
    calls: &[ToolCall],
    success: bool,
    termination: Termination,
    errors: u32,
) -> Trajectory {
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
        task_id: task_id.into(),
        env: "scripted".into(),
        harness_id: HarnessId("h".into()),
        harness_name: "h".into(),
        seed: 0,
        policy: "constructed".into(),
        messages,
        turns: Vec::new(),
        final_answer: None,
        outcome: if success {
            Outcome::success(json!(null))
        } else {
            Outcome::failure(json!(null))
        },
        termination,
        policy_version: None,
        counts: Counts {
            env_actions: calls.len() as u32,
            tool_errors: errors,
            ..Counts::default()
        },
    }
}

fn page(n: u64) -> ToolCall {
    ToolCall::new("list_items", json!({"page": n}))
}

fn submit(answer: &str) -> ToolCall {
    ToolCall::new("submit", json!({"answer": answer}))
}

#[tokio::test]
async fn builtin_profiler_yields_the_expected_prefer_and_avoid_entries() {
    let tasks = [
        task("mail-1", Split::Validation, "mail", 1),
        task("mail-2", Split::Validation, "mail", 2),
        task("pay-3", Split::Validation, "pay", 3),
        task("pay-4", Split::Validation, "pay", 4),
    ];
    // mail-1, mail-2: the sibling paginates and succeeds, H0 submits at once and fails.
    let sib_mail: Vec<Vec<Trajectory>> = ["mail-1", "mail-2"]
        .iter()
        .map(|id| {
            vec![trajectory(
                id,
                &[page(1), page(2), submit("42")],
                true,
                Termination::EnvDone,
                0,
            )]
        })
        .collect();
    let h0_mail: Vec<Vec<Trajectory>> = ["mail-1", "mail-2"]
        .iter()
        .map(|id| {
            vec![trajectory(
                id,
                &[submit("0")],
                false,
                Termination::EnvDone,
                0,
            )]
        })
        .collect();
    // pay-3: the sibling hits tool errors and runs out of budget; H0 submits and succeeds.
    let fail = ToolCall::new("fail", json!({}));
    let sib_pay3 = vec![trajectory(
        "pay-3",
        &[fail.clone(), fail.clone(), fail],
        false,
        Termination::MaxEnvActions,
        3,
    )];
    let h0_pay3 = vec![trajectory(
        "pay-3",
        &[submit("42")],
        true,
        Termination::EnvDone,
        0,
    )];
    // pay-4: both succeed the same way: no evidence.
    let both = vec![trajectory(
        "pay-4",
        &[submit("42")],
        true,
        Termination::EnvDone,
        0,
    )];

    let base = harness("H0");
    let sibling = harness("S-A");
    let input = ProfileInput {
        base: &base,
        sibling: &sibling,
        pairs: vec![
            PairedTask {
                task: &tasks[0],
                sibling: &sib_mail[0],
                base: &h0_mail[0],
            },
            PairedTask {
                task: &tasks[1],
                sibling: &sib_mail[1],
                base: &h0_mail[1],
            },
            PairedTask {
                task: &tasks[2],
                sibling: &sib_pay3,
                base: &h0_pay3,
            },
            PairedTask {
                task: &tasks[3],
                sibling: &both,
                base: &both,
            },
        ],
        features: FeatureSource::Metadata,
    };
    let labeller: Arc<dyn TrajectoryLabeller> = Arc::new(ScriptedLabeller);
    let outcome = BuiltinProfiler::new([labeller])
        .profile(&input)
        .await
        .unwrap();
    assert!(!outcome.failed);
    let profile = outcome.profile;
    assert_eq!(
        profile.prefer,
        vec![Entry::new(
            "scripted, category mail",
            "more listing pages fetched than H0; more environment actions than H0",
            vec!["mail-1".into(), "mail-2".into()],
        )],
        "two tasks of one family with one behaviour consolidate into one family entry"
    );
    assert_eq!(
        profile.avoid,
        vec![Entry::new(
            "scripted, category pay, difficulty-2, keywords transfer money check payment balance case",
            "H0 submits through the submit tool, the sibling does not; runs out of its execution budget, H0 does not; more tool errors than H0",
            vec!["pay-3".into()],
        )],
        "a single-task observation keeps its full condition"
    );

    // Without an environment labeller the generic features still describe the difference.
    let generic = BuiltinProfiler::new([])
        .with_max_behaviours(1)
        .build(&input);
    assert_eq!(
        generic.prefer[0].behavior,
        "more environment actions than H0"
    );
    assert_eq!(generic.prefer[0].support.len(), 2);
}

fn appworld_trajectory(
    task_id: &str,
    calls: &[ToolCall],
    success: bool,
    termination: Termination,
) -> Trajectory {
    let mut t = trajectory(task_id, calls, success, termination, 0);
    t.env = "appworld".into();
    t
}

#[tokio::test]
async fn appworld_labels_give_table_7_style_entries() {
    use harness_envs::appworld::tool;
    let mut mail = harness_core::Task::new(
        "appworld/validation-001-mail_count-d2",
        "appworld",
        Split::Validation,
        "How many emails did Ann send me across my inbox, spam and archive?",
        1,
    );
    mail.metadata = json!({"template": "mail_count", "difficulty": 2});
    let list = |folder: &str, page: u64| {
        ToolCall::new(
            tool::CALL_API,
            json!({"app": "mail", "api": "list_emails", "arguments": {"folder": folder, "page": page}}),
        )
    };
    let done = ToolCall::new(tool::COMPLETE_TASK, json!({"answer": "5"}));
    // Case 1 and 3 of Table 7: the sibling paginates through every folder and submits with
    // complete_task; H0 reads the first inbox page and answers in prose.
    let sibling = vec![appworld_trajectory(
        &mail.id,
        &[
            list("inbox", 1),
            list("inbox", 2),
            list("spam", 1),
            list("archive", 1),
            done,
        ],
        true,
        Termination::EnvDone,
    )];
    let base_run = vec![appworld_trajectory(
        &mail.id,
        &[list("inbox", 1)],
        false,
        Termination::PolicyFinished,
    )];
    let (h0, s6) = (harness("H0"), harness("S6"));
    let input = ProfileInput {
        base: &h0,
        sibling: &s6,
        pairs: vec![PairedTask {
            task: &mail,
            sibling: &sibling,
            base: &base_run,
        }],
        features: FeatureSource::Metadata,
    };
    let profiler =
        BuiltinProfiler::new(harness_envs::labels::builtin_labellers()).with_max_behaviours(6);
    let profile = profiler.build(&input);
    assert_eq!(profile.prefer.len(), 1);
    let entry = &profile.prefer[0];
    assert!(
        entry
            .when
            .starts_with("appworld, category mail_count, difficulty-2"),
        "{}",
        entry.when
    );
    for phrase in [
        "submits through complete_task, H0 does not",
        "submits through the submit tool, H0 does not",
        "more mail folders searched than H0",
        "more listing pages fetched than H0",
        "more pages beyond the first fetched than H0",
    ] {
        assert!(
            entry.behavior.contains(phrase),
            "{phrase}: {}",
            entry.behavior
        );
    }
    assert_eq!(entry.support, vec![mail.id.clone()]);
}
