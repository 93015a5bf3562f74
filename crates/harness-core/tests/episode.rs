//! The agent loop: hooks, limits, memory, context and the tool view on the scripted environment.

use futures::executor::block_on;
use harness_core::{
    EditOp, Error, Harness, HarnessEdit, Role, Source, Termination, ToolCall, Trajectory,
    append_jsonl, read_jsonl, run_episode,
};
use harness_testkit::{ScriptedEnv, ScriptedPolicy};
use serde_json::json;

fn call(name: &str, args: serde_json::Value) -> String {
    ToolCall::new(name, args).to_tool_call_block()
}

fn run(harness: &Harness, turns: Vec<String>) -> Trajectory {
    let env = ScriptedEnv::new(3);
    let task = env.task("t", "8");
    let policy = ScriptedPolicy::new(turns);
    block_on(run_episode(&policy, harness, &env, &task, 1)).expect("episode runs")
}

fn base() -> Harness {
    Harness::from_json(
        r#"{"name": "H0",
            "prompt": {"system": "Tools: use them. {guidance}", "slots": {"guidance": "Be careful."}}}"#,
    )
    .expect("valid")
}

fn with_hook(harness: &Harness, name: &str, hook: serde_json::Value) -> Harness {
    HarnessEdit::new(vec![EditOp::set(format!("state.hooks.{name}"), hook)], "")
        .apply(harness)
        .expect("edit applies")
}

fn hook_messages(t: &Trajectory, hook: &str) -> Vec<usize> {
    t.messages
        .iter()
        .enumerate()
        .filter(|(_, m)| m.hook.as_deref() == Some(hook))
        .map(|(i, _)| i)
        .collect()
}

#[test]
fn oracle_run_records_sources_tokens_and_outcome() {
    let t = run(
        &base(),
        vec![
            call("list_items", json!({"page": 1})),
            call("list_items", json!({"page": 2})),
            call("list_items", json!({"page": 3})),
            call("submit", json!({"answer": "8"})),
        ],
    );
    assert!(t.is_success(), "{}", t.transcript());
    assert_eq!(t.termination, Termination::EnvDone);
    assert_eq!(t.counts.env_actions, 4);
    assert_eq!(t.counts.model_calls, 4);
    assert_eq!(t.messages[0].source, Source::Harness);
    assert_eq!(t.messages[0].content, "Tools: use them. Be careful.");
    assert_eq!(t.messages[1].source, Source::Task);
    assert_eq!(
        t.messages[2].source,
        Source::Environment,
        "initial observation"
    );
    // Every policy turn points at its assistant message and its context extends the previous one.
    for pair in t.turns.windows(2) {
        let mut prefix = pair[0].context_tokens.clone();
        prefix.extend(&pair[0].tokens);
        assert!(pair[1].context_tokens.starts_with(&prefix));
    }
    for turn in &t.turns {
        let m = &t.messages[turn.message_index.expect("generated")];
        assert_eq!((m.role, m.source), (Role::Assistant, Source::Policy));
        assert_eq!(turn.tokens.len(), turn.logprobs.len());
    }
    assert_eq!(t.counts.policy_tokens as usize, t.policy_tokens());
}

#[test]
fn unparseable_turn_is_a_failed_step_not_a_crash() {
    let t = run(
        &base(),
        vec![
            "<tool_call>{oops".into(),
            call("submit", json!({"answer": "8"})),
        ],
    );
    assert_eq!(t.counts.parse_failures, 1);
    assert!(t.is_success());
    let error = &t.messages[4];
    assert_eq!(error.source, Source::Harness);
    assert!(
        error.content.contains("could not be read as an action"),
        "{}",
        error.content
    );
}

#[test]
fn final_answer_is_verified() {
    let t = run(&base(), vec!["<think>count</think>8".into()]);
    assert_eq!(t.termination, Termination::PolicyFinished);
    assert_eq!(t.final_answer.as_deref(), Some("8"));
    assert!(t.is_success());
}

#[test]
fn block_hook_refuses_the_action_and_env_never_sees_it() {
    let h = with_hook(
        &base(),
        "no-fail",
        json!({"action": "block", "condition": "tool_is", "event": "before_tool",
               "message": "Do not call fail.", "parameters": {"name": "fail"}}),
    );
    let t = run(
        &h,
        vec![
            call("fail", json!({})),
            call("submit", json!({"answer": "8"})),
        ],
    );
    assert_eq!(t.counts.refused_actions, 1);
    assert_eq!(
        t.counts.env_actions, 1,
        "only submit reached the environment"
    );
    assert_eq!(t.counts.tool_errors, 0);
    assert_eq!(hook_messages(&t, "no-fail").len(), 1);
}

#[test]
fn require_hook_refuses_to_finish_until_condition_holds() {
    let h = with_hook(
        &base(),
        "read-docs-first",
        json!({"action": "require", "condition": "tool_called", "event": "before_finish",
               "message": "Read the docs before submitting.", "parameters": {"name": "docs"}}),
    );
    let t = run(
        &h,
        vec![
            call("submit", json!({"answer": "8"})),
            call("docs", json!({})),
            call("submit", json!({"answer": "8"})),
        ],
    );
    assert_eq!(t.counts.refused_finishes, 1);
    assert_eq!(hook_messages(&t, "read-docs-first").len(), 1);
    assert!(t.is_success());
    // The same holds for a plain final answer.
    let t = run(&h, vec!["8".into(), call("docs", json!({})), "8".into()]);
    assert_eq!(t.counts.refused_finishes, 1);
    assert_eq!(t.termination, Termination::PolicyFinished);
}

#[test]
fn on_error_and_before_model_hooks() {
    let h = with_hook(
        &base(),
        "err",
        json!({"action": "warn", "condition": "always", "event": "on_error", "message": "That failed."}),
    );
    let h = with_hook(
        &h,
        "budget",
        json!({"action": "warn", "condition": "remaining_calls_lte", "event": "before_model",
               "message": "Last call.", "parameters": {"threshold": 1}}),
    );
    let mut h = h;
    h.limits.max_model_calls = 3;
    let t = run(
        &h,
        vec![
            call("fail", json!({})),
            "garbage </tool_call>".into(),
            "8".into(),
        ],
    );
    assert_eq!(
        hook_messages(&t, "err").len(),
        2,
        "tool error and parse failure"
    );
    assert_eq!(hook_messages(&t, "budget").len(), 1, "{}", t.transcript());
}

#[test]
fn limits_stop_the_episode() {
    let mut h = base();
    h.limits.max_env_actions = 2;
    let t = run(&h, vec![call("echo", json!({"text": "a"}))]);
    assert_eq!(t.termination, Termination::MaxEnvActions);
    assert_eq!(t.counts.env_actions, 2);
    let mut h = base();
    h.limits.max_model_calls = 3;
    let t = run(&h, vec!["<tool_call>bad</tool_call>".into()]);
    assert_eq!(t.termination, Termination::MaxModelCalls);
    assert_eq!(t.counts.model_calls, 3);
    let mut h = base();
    h.limits.max_context_tokens = 20;
    let t = run(&h, vec!["8".into()]);
    assert_eq!(t.termination, Termination::ContextLimit);
    assert!(!t.is_success());
    let mut h = base();
    h.limits.max_output_tokens = 5;
    let t = run(&h, vec!["a long answer that will be cut".into()]);
    assert!(t.turns.iter().all(|turn| turn.tokens.len() <= 5));
}

#[test]
fn tool_view_hides_documents_and_cuts() {
    let mut h = base();
    h.tool_view.hide = vec!["fail".into()];
    h.tool_view
        .docs
        .insert("echo".into(), "Echo is free.".into());
    h.tool_view.max_observation_chars = Some(16);
    let env = ScriptedEnv::new(3);
    let task = env.task("t", "8");
    let policy = harness_testkit::FnPolicy::new("inspect", |req: &harness_core::PolicyRequest| {
        assert!(req.tools.iter().all(|t| t.name != "fail"));
        let echo = req
            .tools
            .iter()
            .find(|t| t.name == "echo")
            .expect("echo shown");
        assert!(echo.description.ends_with("Echo is free."));
        if req.messages.len() < 5 {
            ToolCall::new("fail", json!({})).to_tool_call_block()
        } else if req.messages.len() < 7 {
            ToolCall::new("echo", json!({"text": "x".repeat(100)})).to_tool_call_block()
        } else {
            "done".into()
        }
    });
    let t = block_on(run_episode(&policy, &h, &env, &task, 1)).expect("runs");
    assert_eq!(t.counts.refused_actions, 1, "hidden tool refused");
    let echoed = t
        .messages
        .iter()
        .find(|m| m.source == Source::Environment && m.role == Role::Tool)
        .expect("echo ran");
    assert!(
        echoed.content.starts_with(&"x".repeat(16))
            && echoed.content.contains("84 more characters cut")
    );
}

#[test]
fn memory_notes_and_context_elision() {
    let h: Harness = Harness::from_json(
        r#"{"name": "mem", "prompt": {"system": "Go."},
            "memory": {"enabled": true, "auto_notes": true, "note_tool": true, "max_notes": 2},
            "context": {"keep_last_observations": 1}}"#,
    )
    .expect("valid");
    h.validate().expect("valid");
    let env = ScriptedEnv::new(3);
    let task = env.task("t", "8");
    let seen = std::sync::Mutex::new(Vec::new());
    let policy = harness_testkit::FnPolicy::new("p", |req: &harness_core::PolicyRequest| {
        seen.lock().expect("lock").push(req.messages.clone());
        let n = req
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        match n {
            0 => ToolCall::new("note", json!({"text": "start"})).to_tool_call_block(),
            1 => ToolCall::new("list_items", json!({"page": 1})).to_tool_call_block(),
            2 => ToolCall::new("list_items", json!({"page": 2})).to_tool_call_block(),
            _ => "8".into(),
        }
    });
    let t = block_on(run_episode(&policy, &h, &env, &task, 1)).expect("runs");
    assert!(t.is_success());
    assert_eq!(
        t.counts.env_actions, 2,
        "the note tool is the harness's, not the environment's"
    );
    let notes: Vec<&str> = t
        .messages
        .iter()
        .filter(|m| m.hook.as_deref() == Some("memory"))
        .map(|m| m.content.as_str())
        .collect();
    let last = notes.last().expect("notes shown");
    assert!(
        !last.contains("start"),
        "max_notes=2 dropped the oldest note: {last}"
    );
    assert!(last.contains("list_items({\"page\":2}) -> ok"), "{last}");
    let last_request = seen.lock().expect("lock").last().cloned().expect("called");
    let observations: Vec<&str> = last_request
        .iter()
        .filter(|m| m.role == Role::Tool && m.name.as_deref() == Some("list_items"))
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(observations[0], "[earlier observation omitted]");
    assert!(observations[1].starts_with("page 2"));
}

#[test]
fn harness_invalid_for_environment_is_an_error() {
    let mut h = base();
    h.tool_view.include = Some(vec!["nope".into()]);
    let env = ScriptedEnv::new(1);
    let task = env.task("t", "1");
    let err = block_on(run_episode(
        &ScriptedPolicy::new(vec![]),
        &h,
        &env,
        &task,
        0,
    ))
    .expect_err("invalid");
    assert!(
        err.to_string().contains("tool_view.include[0]")
            && err.to_string().contains("unknown tool `nope`"),
        "{err}"
    );
    let mut h = base();
    h.tool_view.format = "dbbench_text".into();
    let err = block_on(run_episode(
        &ScriptedPolicy::new(vec![]),
        &h,
        &env,
        &task,
        0,
    ))
    .expect_err("invalid");
    assert!(
        matches!(err, Error::Invalid { .. }) && err.to_string().contains("no action format"),
        "{err}"
    );
}

#[test]
fn trajectories_round_trip_through_jsonl_and_render() {
    let t = run(
        &base(),
        vec![call("list_items", json!({"page": 1})), "8".into()],
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("runs.jsonl");
    append_jsonl(&path, &[t.clone(), t.clone()]).expect("write");
    let back = read_jsonl(&path).expect("read");
    assert_eq!(back, vec![t.clone(), t.clone()]);
    let text = t.transcript();
    assert!(
        text.contains("environment (list_items)") && text.contains("reward 1"),
        "{text}"
    );
    std::fs::write(&path, "{\"task_id\": 3}\n").expect("write");
    let err = read_jsonl(&path).expect_err("bad line");
    assert!(
        err.to_string().contains("runs.jsonl") && err.to_string().contains("line 1"),
        "{err}"
    );
}

#[test]
fn same_seed_same_trajectory() {
    let turns = vec![call("list_items", json!({"page": 1})), "8".into()];
    assert_eq!(run(&base(), turns.clone()), run(&base(), turns));
}

#[test]
fn every_turn_records_its_sampling_settings_and_old_records_still_read() {
    use harness_core::{EpisodeOptions, SamplingParams, TurnSampling, run_episode_with};
    let env = ScriptedEnv::new(3);
    let task = env.task("t", "8");
    let policy = ScriptedPolicy::new(vec![call("list_items", json!({"page": 1})), "8".into()]);
    let options = EpisodeOptions {
        sampling: SamplingParams {
            temperature: 0.7,
            top_p: 0.9,
            top_k: Some(20),
            stop: Vec::new(),
        },
    };
    let t = block_on(run_episode_with(&policy, &base(), &env, &task, 1, &options)).expect("runs");
    let want = TurnSampling {
        temperature: 0.7,
        top_p: 0.9,
        top_k: Some(20),
        greedy: false,
    };
    assert_eq!(t.turns.len(), 2);
    assert!(t.turns.iter().all(|turn| turn.sampling == Some(want)));
    assert!(want.is_truncated());
    // Greedy decoding is recorded as such (its log q is 0: a point mass).
    let greedy = EpisodeOptions {
        sampling: SamplingParams::greedy(),
    };
    let g = block_on(run_episode_with(&policy, &base(), &env, &task, 1, &greedy)).expect("runs");
    let s = g.turns[0].sampling.expect("recorded");
    assert!(s.greedy && !s.is_truncated());

    // A trajectory written before the settings were recorded reads back with `None`.
    let mut value = serde_json::to_value(&t).expect("serialises");
    for turn in value["turns"].as_array_mut().expect("turns") {
        turn.as_object_mut().expect("object").remove("sampling");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("old.jsonl");
    std::fs::write(&path, format!("{value}\n")).expect("write");
    let back = read_jsonl(&path).expect("old records read");
    assert!(back[0].turns.iter().all(|turn| turn.sampling.is_none()));
}
