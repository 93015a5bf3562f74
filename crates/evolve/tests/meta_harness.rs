//! The Meta-Harness comparison variant: a proposer reads the search history (every candidate,
//! its score and sampled traces, every proposal's outcome) and revises a candidate; one H_best
//! is kept by training score, within the budget.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use harness_core::{
    ChatModel, ChatRequest, ChatResponse, Harness, HarnessEdit, SamplingParams, Split, Task,
    Trajectory, Usage, run_episode,
};
use harness_evolve::exec::{Executor, SharedPolicy};
use harness_evolve::meta_harness::{
    AnalystEditorProposer, Attempt, AttemptOutcome, History, HistoryBounds, HistoryProposer,
    MetaCandidate, MetaHarnessSearch, Proposer,
};
use harness_evolve::{
    Analyst, BuiltinEditor, Cause, EditRequest, Editor, EvolveSettings, FailureAnalysis,
    LlmProposer, Proposal, RuleAnalyst,
};
use harness_testkit::ScriptedEnv;
use harness_testkit::harness_sensitive::{HarnessSensitivePolicy, Quirk, quirk_task};

/// `n` training tasks cycling through three quirks and a plain task.
fn training_tasks(env: &ScriptedEnv, n: usize) -> Vec<Task> {
    (0..n)
        .map(|i| {
            let quirk = [
                Some(Quirk::StopsAfterFirstPage),
                Some(Quirk::WastesBudget),
                Some(Quirk::RepeatsFailingCall),
                None,
            ][i % 4];
            let mut t = quirk_task(env, &format!("t{i}"), quirk);
            t.split = Split::Train;
            t
        })
        .collect()
}

#[tokio::test]
async fn the_search_keeps_one_best_harness_by_training_score() {
    let (env, policy, _) = scenario();
    let policy = policy.cured_by(Quirk::RepeatsFailingCall, &["do not repeat it"]);
    let train = training_tasks(&env, 12);
    let mut settings = EvolveSettings::paper();
    settings.proposal_budgets = vec![2, 2];
    settings.train_tasks_per_round = 12;
    settings.limits = Some(harness_core::Limits {
        max_env_actions: 10,
        ..harness_core::Limits::default()
    });
    let search = MetaHarnessSearch {
        settings: settings.clone(),
        max_unscored_in_a_row: 5,
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
    let result = search.run(h0()).await.unwrap();
    let scored = result.candidates.len() - 1;
    assert!(
        scored == 4 || (scored < 4 && result.stopped_unscored),
        "the budget is 2 + 2 scored candidates: {:#?}",
        result.attempts
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

/// A policy curing two quirks, its environment and eight training tasks (three quirks and
/// plain ones).
fn scenario() -> (ScriptedEnv, HarnessSensitivePolicy, Vec<Task>) {
    let env = ScriptedEnv::new(3);
    let policy = HarnessSensitivePolicy::new()
        .cured_by(Quirk::StopsAfterFirstPage, &["keep requesting pages"])
        .cured_by(
            Quirk::WastesBudget,
            &["keep one action for the completion call"],
        );
    let train = training_tasks(&env, 8);
    (env, policy, train)
}

fn h0() -> Harness {
    let mut base = Harness::new("H0", "Solve the task with tools.\n{action_guidance}");
    base.prompt
        .slots
        .insert("action_guidance".into(), "Call one tool at a time.".into());
    base.limits.max_env_actions = 10;
    base
}

/// Finds one cause per failed task, named by the harness it ran under; records how many
/// failures each call was given.
#[derive(Default)]
struct NamingAnalyst {
    seen: Mutex<Vec<(String, usize)>>,
}

#[async_trait]
impl Analyst for NamingAnalyst {
    fn name(&self) -> &str {
        "naming"
    }

    async fn analyse(
        &self,
        parent: &Harness,
        failures: &[Trajectory],
    ) -> harness_evolve::Result<FailureAnalysis> {
        self.seen
            .lock()
            .unwrap()
            .push((parent.name.clone(), failures.len()));
        Ok(FailureAnalysis {
            failures: failures.len(),
            causes: vec![Cause {
                kind: format!("cause-of-{}", parent.name),
                summary: "s".into(),
                tasks: failures.iter().map(|t| t.task_id.clone()).collect(),
                evidence: Vec::new(),
                tools: Vec::new(),
            }],
            unresolved: Vec::new(),
            skipped: Vec::new(),
        })
    }
}

/// Writes a rule naming the direction and its variant (nothing for the `refuse` direction);
/// records the variants it was asked for.
#[derive(Default)]
struct RuleEditor {
    variants: Mutex<Vec<(String, usize)>>,
    refuse: Option<String>,
}

#[async_trait]
impl Editor for RuleEditor {
    fn name(&self) -> &str {
        "rule"
    }

    async fn propose(&self, request: &EditRequest<'_>) -> harness_evolve::Result<Option<Proposal>> {
        let label = request.direction.label();
        let variant = request.direction.variant;
        self.variants.lock().unwrap().push((label.clone(), variant));
        if self.refuse.as_ref() == Some(&label) {
            return Ok(None);
        }
        let edit: HarnessEdit = serde_json::from_value(serde_json::json!({
            "ops": [{"path": format!("state.prompt.slots.action_guidance"),
                     "value": format!("{label} v{variant}")}],
            "rationale": label,
        }))
        .unwrap();
        Ok(Some(Proposal {
            edit,
            brief: format!("{label} v{variant}"),
        }))
    }
}

async fn runs(
    env: &ScriptedEnv,
    policy: &HarnessSensitivePolicy,
    h: &Harness,
    tasks: &[Task],
) -> Vec<Trajectory> {
    let mut out = Vec::new();
    for t in tasks {
        out.push(run_episode(policy, h, env, t, 7).await.unwrap());
    }
    out
}

#[tokio::test]
async fn the_history_proposer_reads_every_candidate_and_moves_down_the_ranking() {
    let (env, policy, train) = scenario();
    let base = h0();
    let mut child = base.clone();
    child.name = "meta-1".into();
    child
        .prompt
        .slots
        .insert("action_guidance".into(), "keep requesting pages".into());
    let base_runs = runs(&env, &policy, &base, &train).await;
    let child_runs = runs(&env, &policy, &child, &train).await;
    let solved = |r: &[Trajectory]| r.iter().filter(|t| t.is_success()).count();
    assert!(
        solved(&child_runs) > solved(&base_runs),
        "the child ranks first"
    );
    let candidates = vec![
        MetaCandidate {
            id: base.id(),
            name: base.name.clone(),
            parent: None,
            brief: "base harness".into(),
            solved: solved(&base_runs),
            tasks: train.len(),
        },
        MetaCandidate {
            id: child.id(),
            name: child.name.clone(),
            parent: Some(base.id()),
            brief: "pages".into(),
            solved: solved(&child_runs),
            tasks: train.len(),
        },
    ];
    let harnesses = BTreeMap::from([(base.id(), base.clone()), (child.id(), child.clone())]);
    let trajectories = BTreeMap::from([(base.id(), base_runs), (child.id(), child_runs)]);
    let tools = ScriptedEnv::tool_specs();
    let bounds = HistoryBounds {
        detailed_candidates: 2,
        traces_per_candidate: 2,
        trace_chars: 300,
    };
    let analyst = Arc::new(NamingAnalyst::default());
    let editor = Arc::new(RuleEditor::default());
    let mut settings = EvolveSettings::paper();
    settings.max_causes_per_direction = 1;
    let proposer = HistoryProposer::new(analyst.clone(), editor.clone(), settings, bounds);
    let attempt = |parent: &Harness, focus: &str| Attempt {
        slot: 1,
        parent: parent.id(),
        brief: "b".into(),
        focus: vec![focus.into()],
        outcome: AttemptOutcome::Rejected { reason: "r".into() },
    };
    let propose = |attempts: Vec<Attempt>| {
        let (candidates, harnesses, trajectories, tools) =
            (&candidates, &harnesses, &trajectories, &tools);
        let proposer = &proposer;
        async move {
            let history = History {
                candidates,
                harnesses,
                trajectories,
                attempts: &attempts,
                slot: attempts.len() + 1,
                tools,
                env: "scripted",
            };
            proposer.propose(&history).await.unwrap().unwrap()
        }
    };

    // Nothing tried yet: the best-ranked candidate along its own cause.
    let first = propose(vec![]).await;
    assert_eq!(first.parent, child.id());
    assert_eq!(first.focus, vec!["cause-of-meta-1"]);
    // Its cause was tried (a rejected proposal counts): the next candidate down the ranking.
    let second = propose(vec![attempt(&child, "cause-of-meta-1")]).await;
    assert_eq!(second.parent, base.id());
    assert_eq!(second.focus, vec!["cause-of-H0"]);
    // Both tried: a new variant along the best candidate's cause.
    let third = propose(vec![
        attempt(&child, "cause-of-meta-1"),
        attempt(&base, "cause-of-H0"),
    ])
    .await;
    assert_eq!(third.parent, child.id());
    assert_eq!(
        editor.variants.lock().unwrap().last().unwrap(),
        &("cause-of-meta-1".to_string(), 1)
    );
    // An editor with nothing for the best candidate's cause: the proposer moves on to the next
    // request in the same slot, and does not ask for the unanswered one again.
    let refusing = Arc::new(RuleEditor {
        refuse: Some("cause-of-meta-1".into()),
        ..RuleEditor::default()
    });
    let mut settings = EvolveSettings::paper();
    settings.max_causes_per_direction = 1;
    let picky = HistoryProposer::new(
        Arc::new(NamingAnalyst::default()),
        refusing.clone(),
        settings,
        bounds,
    );
    for slot in 1..=2 {
        let history = History {
            candidates: &candidates,
            harnesses: &harnesses,
            trajectories: &trajectories,
            attempts: &[],
            slot,
            tools: &tools,
            env: "scripted",
        };
        let p = picky.propose(&history).await.unwrap().unwrap();
        assert_eq!(
            (p.parent, p.focus),
            (base.id(), vec!["cause-of-H0".to_string()])
        );
    }
    assert_eq!(
        refusing.variants.lock().unwrap().clone(),
        vec![
            ("cause-of-meta-1".to_string(), 0),
            ("cause-of-H0".to_string(), 0),
            ("cause-of-H0".to_string(), 0)
        ],
        "the refused request is asked once"
    );

    // Each candidate's sample was analysed once, and only the bounded sample.
    let seen = analyst.seen.lock().unwrap().clone();
    assert_eq!(seen, vec![("meta-1".into(), 2), ("H0".into(), 2)]);

    // The rendered history lists both candidates with scores, their harnesses and at most
    // two traces each, and every proposal with its outcome.
    let attempts = vec![attempt(&child, "cause-of-meta-1")];
    let history = History {
        candidates: &candidates,
        harnesses: &harnesses,
        trajectories: &trajectories,
        attempts: &attempts,
        slot: 2,
        tools: &tools,
        env: "scripted",
    };
    let text = history.render(&bounds);
    for c in &candidates {
        assert!(
            text.contains(&format!("{} `{}`: solved {}/8", c.id, c.name, c.solved)),
            "{text}"
        );
        assert!(text.contains(&format!("## Candidate {}", c.id)), "{text}");
    }
    assert_eq!(text.matches("\ntask t").count(), 4, "{text}");
    assert!(
        text.contains("along [cause-of-meta-1]: b -> rejected: r"),
        "{text}"
    );
    assert_eq!(history.ranked()[0].id, child.id());
}

/// Answers from a list in order (the last again when it runs out); records every prompt.
struct RecordingChat {
    answers: Vec<String>,
    prompts: Mutex<Vec<(String, String)>>,
}

#[async_trait]
impl ChatModel for RecordingChat {
    fn name(&self) -> &str {
        "recording"
    }

    async fn complete(&self, request: ChatRequest) -> harness_core::Result<ChatResponse> {
        let mut prompts = self.prompts.lock().unwrap();
        let text = self.answers[prompts.len().min(self.answers.len() - 1)].clone();
        let last = request.messages.last().unwrap().content.clone();
        prompts.push((request.purpose.clone(), last));
        Ok(ChatResponse {
            text,
            usage: Some(Usage {
                prompt_tokens: 100,
                completion_tokens: 10,
            }),
        })
    }
}

#[tokio::test]
async fn the_llm_proposer_gets_the_whole_history_and_names_the_candidate_it_revises() {
    let (env, policy, train) = scenario();
    let base = h0();
    let edit = r#"{"parent": "PARENT", "brief": "pages rule", "focus": ["stopped-paging"],
        "ops": [{"path": "state.prompt.slots.action_guidance", "value": "keep requesting pages"}]}"#;
    let chat = Arc::new(RecordingChat {
        answers: vec![
            // Names no candidate: shown back with the reason and retried.
            edit.replace("PARENT", "0000000000000000"),
            edit.replace("PARENT", &base.id().to_string()),
            // The same edit again: a duplicate, rejected by the host.
            edit.replace("PARENT", &base.id().to_string()),
        ],
        prompts: Mutex::new(Vec::new()),
    });
    let mut settings = EvolveSettings::paper();
    settings.proposal_budgets = vec![2];
    settings.train_tasks_per_round = 8;
    settings.limits = None;
    let search = MetaHarnessSearch {
        settings,
        // The duplicate spends no budget; the search stops after it.
        max_unscored_in_a_row: 1,
        executor: Executor {
            policy: Arc::new(SharedPolicy(Arc::new(policy))),
            env: Arc::new(env),
            sampling: SamplingParams::greedy(),
            concurrency: 4,
        },
        proposer: Arc::new(LlmProposer::new(chat.clone(), 1, HistoryBounds::default())),
        train,
    };
    let result = search.run(base.clone()).await.unwrap();
    assert_eq!(result.candidates.len(), 2, "{:#?}", result.attempts);
    assert!(result.stopped_unscored, "one duplicate in a row ends it");
    let child = &result.candidates[1];
    assert!(child.solved > result.candidates[0].solved);
    assert_eq!(result.attempts.len(), 2);
    assert_eq!(result.attempts[0].parent, base.id());
    assert_eq!(result.attempts[0].focus, vec!["stopped-paging"]);
    assert_eq!(
        result.attempts[0].outcome,
        AttemptOutcome::Scored {
            id: child.id.clone()
        }
    );
    assert!(matches!(
        &result.attempts[1].outcome,
        AttemptOutcome::Rejected { reason } if reason.contains("already scored")
    ));
    let prompts = chat.prompts.lock().unwrap().clone();
    assert_eq!(prompts.len(), 3);
    assert!(prompts.iter().all(|(purpose, _)| purpose == "proposer"));
    assert!(
        prompts[1]
            .1
            .contains("is not a candidate whose harness was shown"),
        "{}",
        prompts[1].1
    );
    // The second slot's prompt holds both candidates, their scores and the first proposal's
    // outcome.
    let second = &prompts[2].1;
    for c in &result.candidates {
        assert!(
            second.contains(&format!("{} `{}`: solved {}/8", c.id, c.name, c.solved)),
            "{second}"
        );
    }
    assert!(
        second.contains(&format!("-> scored as {}", child.id)),
        "{second}"
    );
    let usage = &result.usage["proposer"];
    assert_eq!((usage.calls, usage.malformed), (3, 1));
}

/// Proposes a fixed list of rules for `action_guidance` from the base, in order, then nothing;
/// `None` in the list is a slot left empty.
struct ScriptedProposer {
    base: harness_core::HarnessId,
    rules: Vec<Option<&'static str>>,
    next: Mutex<usize>,
}

#[async_trait]
impl Proposer for ScriptedProposer {
    fn name(&self) -> &str {
        "scripted"
    }

    async fn propose(
        &self,
        _history: &History<'_>,
    ) -> harness_evolve::Result<Option<harness_evolve::meta_harness::MetaProposal>> {
        let mut next = self.next.lock().unwrap();
        let rule = self.rules.get(*next).copied().flatten();
        *next += 1;
        Ok(rule.map(|rule| harness_evolve::meta_harness::MetaProposal {
            parent: self.base.clone(),
            proposal: Proposal {
                edit: serde_json::from_value(serde_json::json!({
                    // A rule starting with `!` edits a component no harness has: refused.
                    "ops": [{"path": if rule.starts_with('!') {
                        "state.no_such_component"
                    } else {
                        "state.prompt.slots.action_guidance"
                    }, "value": rule}],
                    "rationale": rule,
                }))
                .unwrap(),
                brief: rule.to_string(),
            },
            focus: vec![rule.to_string()],
        }))
    }
}

/// A search over `rules` with a budget of `budget` scored candidates and the given stop; the
/// result and the rollouts its executor ran.
async fn scripted_search(
    rules: Vec<Option<&'static str>>,
    budget: usize,
    max_unscored_in_a_row: usize,
) -> (harness_evolve::meta_harness::MetaHarnessResult, usize) {
    let (env, policy, train) = scenario();
    let base = h0();
    let mut settings = EvolveSettings::paper();
    settings.proposal_budgets = vec![budget];
    settings.train_tasks_per_round = 8;
    settings.limits = None;
    let counted = Arc::new(CountingSource {
        policy: Arc::new(policy),
        episodes: Default::default(),
    });
    let search = MetaHarnessSearch {
        settings,
        max_unscored_in_a_row,
        executor: Executor {
            policy: counted.clone(),
            env: Arc::new(env),
            sampling: SamplingParams::greedy(),
            concurrency: 1,
        },
        proposer: Arc::new(ScriptedProposer {
            base: base.id(),
            rules,
            next: Mutex::new(0),
        }),
        train,
    };
    let result = search.run(base).await.unwrap();
    let episodes = counted.episodes.load(std::sync::atomic::Ordering::Relaxed);
    (result, episodes)
}

/// One policy for every task, counting the episodes it is asked for.
struct CountingSource {
    policy: Arc<dyn harness_core::Policy>,
    episodes: std::sync::atomic::AtomicUsize,
}

impl harness_evolve::exec::PolicySource for CountingSource {
    fn policy_for(&self, _task: &Task) -> harness_evolve::Result<Arc<dyn harness_core::Policy>> {
        self.episodes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(self.policy.clone())
    }

    fn name(&self) -> String {
        "counting".into()
    }
}

#[tokio::test]
async fn proposals_that_score_nothing_spend_no_budget_and_a_run_of_them_stops_the_search() {
    // A duplicate, an empty slot and a refused revision between scored candidates: the budget
    // counts scored candidates only, so both rules are scored and 8 tasks x 3 harnesses ran.
    let rules = vec![
        Some("keep requesting pages"),
        Some("keep requesting pages"),
        None,
        Some("!refused"),
        Some("keep one action for the completion call"),
    ];
    let (result, episodes) = scripted_search(rules.clone(), 2, 4).await;
    assert_eq!(result.candidates.len(), 3, "{:#?}", result.attempts);
    assert_eq!((result.rejected.len(), result.empty), (2, 1));
    assert!(
        result.rejected[0].reason.contains("already scored")
            && !result.rejected[1].reason.contains("already scored"),
        "{:?}",
        result.rejected
    );
    assert!(!result.stopped_unscored);
    assert_eq!(
        result.attempts.iter().map(|a| a.slot).collect::<Vec<_>>(),
        vec![1, 2, 4, 5],
        "empty slots count in the numbering"
    );
    assert_eq!(episodes, 3 * 8, "the base and two scored candidates");

    // Two proposals in a row that score nothing stop a search allowed two.
    let (result, episodes) = scripted_search(rules.clone(), 2, 2).await;
    assert_eq!(result.candidates.len(), 2);
    assert!(result.stopped_unscored);
    assert_eq!(episodes, 2 * 8);

    // A proposer that never proposes ends the search after the allowed run, not never.
    let (result, _) = scripted_search(vec![None; 100], 5, 4).await;
    assert_eq!((result.candidates.len(), result.empty), (1, 4));
    assert!(result.stopped_unscored);
}
