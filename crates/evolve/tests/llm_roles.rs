//! The LLM analyst and editor against a scripted chat model that answers malformed JSON,
//! unknown paths and invalid edits: such answers are retried within the budget, then skipped
//! and counted; nothing panics and the round goes on.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use harness_core::{
    ChatModel, ChatRequest, ChatResponse, Harness, Split, Trajectory, Usage, run_episode,
};
use harness_evolve::analyst::Analyst;
use harness_evolve::cause::Cause;
use harness_evolve::direction::Direction;
use harness_evolve::editor::{EditRequest, Editor};
use harness_evolve::exec::{Executor, SharedPolicy};
use harness_evolve::{
    CandidateOutcome, Evolution, EvolveSettings, LlmAnalyst, LlmEditor, RuleAnalyst,
};
use harness_testkit::ScriptedEnv;
use harness_testkit::harness_sensitive::{HarnessSensitivePolicy, Quirk, quirk_task};

/// Answers from a list in order (the last one again when it runs out), 100 prompt and 10
/// completion tokens each; records the purposes it was asked for.
struct ScriptedChat {
    answers: Vec<String>,
    next: Mutex<usize>,
    purposes: Mutex<Vec<String>>,
}

impl ScriptedChat {
    fn new(answers: &[&str]) -> Arc<Self> {
        Arc::new(ScriptedChat {
            answers: answers.iter().map(|s| s.to_string()).collect(),
            next: Mutex::new(0),
            purposes: Mutex::new(Vec::new()),
        })
    }
}

#[async_trait]
impl ChatModel for ScriptedChat {
    fn name(&self) -> &str {
        "scripted-chat"
    }

    async fn complete(&self, request: ChatRequest) -> harness_core::Result<ChatResponse> {
        self.purposes.lock().unwrap().push(request.purpose.clone());
        let mut next = self.next.lock().unwrap();
        let text = self.answers[(*next).min(self.answers.len() - 1)].clone();
        *next += 1;
        Ok(ChatResponse {
            text,
            usage: Some(Usage {
                prompt_tokens: 100,
                completion_tokens: 10,
            }),
        })
    }
}

fn base() -> Harness {
    let mut h = Harness::new("H0", "Solve the task with tools.\n{action_guidance}");
    h.prompt
        .slots
        .insert("action_guidance".into(), "Call one tool at a time.".into());
    h.limits.max_env_actions = 10;
    h
}

async fn failures() -> Vec<Trajectory> {
    let env = ScriptedEnv::new(3);
    let policy = HarnessSensitivePolicy::new();
    let mut out = Vec::new();
    for id in ["p-0", "p-1"] {
        let task = quirk_task(&env, id, Some(Quirk::StopsAfterFirstPage));
        out.push(run_episode(&policy, &base(), &env, &task, 1).await.unwrap());
    }
    out
}

#[tokio::test]
async fn analyst_retries_malformed_answers_then_accepts_a_valid_one() {
    let chat = ScriptedChat::new(&[
        "I think the agent stopped paging.",
        r#"{"groups": [{"cause": "stopped-paging", "tasks": ["p-0", "no-such-task"]}], "unresolved": []}"#,
        r#"{"groups": [{"cause": "stopped-paging", "summary": "read one page", "tasks": ["p-0", "p-1"], "evidence": "page 1 of 3"}], "unresolved": []}"#,
    ]);
    let analyst = LlmAnalyst::new(chat.clone(), 2);
    let analysis = analyst.analyse(&base(), &failures().await).await.unwrap();
    assert_eq!(analysis.causes.len(), 1);
    assert_eq!(analysis.causes[0].tasks, vec!["p-0", "p-1"]);
    let usage = analyst.usage();
    assert_eq!((usage.calls, usage.malformed, usage.skipped), (3, 2, 0));
    assert_eq!(usage.total_tokens(), 330);
    assert!(chat.purposes.lock().unwrap().iter().all(|p| p == "analyst"));
}

#[tokio::test]
async fn analyst_skips_a_batch_whose_answers_stay_malformed() {
    let chat = ScriptedChat::new(&[
        "{not json",
        r#"{"groups": "everything"}"#,
        r#"{"groups": [{"cause": "Bad Name!", "tasks": ["p-0"]}], "unresolved": ["p-1"]}"#,
        r#"{"groups": [], "unresolved": ["p-0"]}"#,
    ]);
    let analyst = LlmAnalyst::new(chat, 3);
    let analysis = analyst.analyse(&base(), &failures().await).await.unwrap();
    assert!(analysis.causes.is_empty());
    assert_eq!(analysis.skipped, vec!["p-0", "p-1"]);
    let usage = analyst.usage();
    assert_eq!((usage.calls, usage.malformed, usage.skipped), (4, 4, 1));
}

fn direction() -> Direction {
    Direction {
        id: "g1-d1".into(),
        parent: base().id(),
        causes: vec![Cause {
            kind: "stopped-paging".into(),
            summary: "stopped paging".into(),
            tasks: vec!["p-0".into(), "p-1".into()],
            evidence: vec!["p-0: page 1 of 3".into()],
            tools: vec!["list_items".into()],
        }],
        variant: 0,
    }
}

#[tokio::test]
async fn editor_skips_unknown_paths_and_invalid_edits_with_counts() {
    let chat = ScriptedChat::new(&[
        "Here is my edit: add a hook.",
        r#"{"brief": "raise the budget", "ops": [{"path": "state.limits.max_env_actions", "value": 99}]}"#,
        r#"{"brief": "a new component", "ops": [{"path": "state.wishes.more", "value": true}]}"#,
        r#"{"brief": "moon hook", "ops": [{"path": "state.hooks.moon", "value": {"action": "warn", "condition": "moon_is_full", "event": "after_tool", "message": "m"}}]}"#,
        r#"{"brief": "dangling rule", "ops": [{"path": "state.prompt_rules.r", "value": {"slot": "nowhere", "text": "t"}}]}"#,
    ]);
    let editor = LlmEditor::new(chat, 4);
    let parent = base();
    let direction = direction();
    let tools = ScriptedEnv::tool_specs();
    let request = EditRequest {
        parent: &parent,
        direction: &direction,
        other_briefs: &[],
        tools: &tools,
        env: "scripted",
    };
    assert!(editor.propose(&request).await.unwrap().is_none());
    let usage = editor.usage();
    assert_eq!((usage.calls, usage.malformed, usage.skipped), (5, 5, 1));
    assert_eq!(usage.total_tokens(), 550);
}

#[tokio::test]
async fn editor_accepts_a_valid_structured_edit_after_a_bad_one() {
    let chat = ScriptedChat::new(&[
        r#"{"brief": "bad", "ops": []}"#,
        r#"```json
{"brief": "pagination hook", "ops": [{"path": "state.hooks.pages", "value": {"action": "warn", "condition": "pagination_present", "event": "after_tool", "message": "Keep requesting pages.", "parameters": {}}}]}
```"#,
    ]);
    let editor = LlmEditor::new(chat, 1);
    let parent = base();
    let direction = direction();
    let tools = ScriptedEnv::tool_specs();
    let request = EditRequest {
        parent: &parent,
        direction: &direction,
        other_briefs: &["edit H0: skill:complete-listing for stopped-paging".into()],
        tools: &tools,
        env: "scripted",
    };
    let proposal = editor.propose(&request).await.unwrap().unwrap();
    assert_eq!(proposal.components(), vec!["hooks"]);
    assert!(
        proposal
            .edit
            .apply(&parent)
            .unwrap()
            .hooks
            .contains_key("pages")
    );
    assert_eq!(editor.usage().malformed, 1);
}

fn evolution(analyst: Arc<dyn Analyst>, editor: Arc<dyn Editor>) -> Evolution {
    let env = ScriptedEnv::new(3);
    let tasks = |split: Split| {
        (0..6)
            .map(|i| {
                let quirk = if i % 2 == 0 {
                    Quirk::StopsAfterFirstPage
                } else {
                    Quirk::WastesBudget
                };
                let mut t = quirk_task(&env, &format!("{split}-{i}"), Some(quirk));
                t.split = split;
                t
            })
            .collect::<Vec<_>>()
    };
    let mut settings = EvolveSettings::paper();
    settings.proposal_budgets = vec![2, 2];
    settings.limits = None;
    Evolution {
        settings,
        executor: Executor {
            policy: Arc::new(SharedPolicy(Arc::new(HarnessSensitivePolicy::new()))),
            env: Arc::new(env.clone()),
            sampling: harness_core::SamplingParams::greedy(),
            concurrency: 2,
        },
        analyst,
        editor,
        train: tasks(Split::Train),
        validation: tasks(Split::Validation),
    }
}

#[tokio::test]
async fn rounds_go_on_when_every_llm_answer_is_unusable() {
    // An editor that never answers usably: every direction ends without a proposal.
    let chat = ScriptedChat::new(&["no json at all"]);
    let run = evolution(Arc::new(RuleAnalyst), Arc::new(LlmEditor::new(chat, 1)));
    let result = run.run(base()).await.unwrap();
    assert_eq!(result.rounds.len(), 2);
    for round in &result.rounds {
        assert_eq!(round.proposed, 2);
        assert_eq!(round.no_proposal, 2);
        assert!(
            round
                .candidates
                .iter()
                .all(|c| c.outcome == CandidateOutcome::NoProposal)
        );
        let editor = round.usage["editor"];
        assert_eq!((editor.calls, editor.malformed, editor.skipped), (4, 4, 2));
        assert_eq!(editor.total_tokens(), 440);
    }
    assert_eq!(result.usage["editor"].skipped, 4);
    assert_eq!(result.pool.len(), 1);

    // An analyst that never answers usably: failures are skipped, so no direction forms.
    let chat = ScriptedChat::new(&["[]"]);
    let run = evolution(
        Arc::new(LlmAnalyst::new(chat, 0)),
        Arc::new(harness_evolve::BuiltinEditor),
    );
    let result = run.run(base()).await.unwrap();
    let round = &result.rounds[0];
    assert_eq!(round.parents[0].analysis.skipped.len(), 6);
    assert_eq!(round.proposed, 0);
    assert_eq!(round.usage["analyst"].skipped, 1);
}
