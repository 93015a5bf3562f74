//! Integration tests of the app world: conformance, oracle coverage, robustness, collateral
//! damage, and the failure modes the paper's sibling harnesses repair.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use harness_appworld::apps::APIS;
use harness_appworld::{
    AppWorld, AppWorldConfig, OraclePolicy, base_harness, table7_siblings, tool, tool_specs,
};
use harness_core::{
    Environment, FinishReason, Harness, HookAction, HookEvent, HookSpec, Policy, PolicyRequest,
    PolicyTurn, Role, Source, Split, Task, Termination, ToolCall, Trajectory, run_episode,
};
use harness_testkit::FnPolicy;
use harness_testkit::conformance::{ConformanceConfig, check_environment};
use proptest::prelude::*;
use serde_json::{Value, json};

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    futures::executor::block_on(f)
}

fn run(policy: &dyn Policy, harness: &Harness, env: &AppWorld, task: &Task) -> Trajectory {
    block_on(run_episode(policy, harness, env, task, 11)).expect("the episode runs")
}

fn template_of(task: &Task) -> &str {
    task.metadata["template"].as_str().unwrap_or_default()
}

fn sibling(name: &str) -> Harness {
    table7_siblings()
        .into_iter()
        .find(|h| h.name.starts_with(name))
        .expect("the sibling exists")
}

fn turn(text: String) -> PolicyTurn {
    let tokens: Vec<u32> = text.bytes().map(u32::from).collect();
    PolicyTurn {
        logprobs: vec![-0.1; tokens.len()],
        text,
        context_tokens: Vec::new(),
        tokens,
        finish: FinishReason::Stop,
    }
}

fn api_call(app: &str, api: &str, arguments: Value) -> String {
    ToolCall::new(
        tool::CALL_API,
        json!({"app": app, "api": api, "arguments": arguments}),
    )
    .to_tool_call_block()
}

fn complete(answer: &str) -> String {
    ToolCall::new(tool::COMPLETE_TASK, json!({"answer": answer})).to_tool_call_block()
}

/// Every template at every difficulty in every split.
fn sample_of_every_kind(env: &AppWorld) -> Vec<Task> {
    // Indices 0..18 cover the six templates at the three difficulties.
    Split::ALL
        .into_iter()
        .flat_map(|split| (0..18).map(move |i| env.task(split, i)))
        .collect()
}

#[test]
fn splits_have_the_documented_sizes_and_distinct_tasks() {
    let env = AppWorld::new();
    let config = env.config();
    let mut ids = BTreeSet::new();
    let mut seeds = BTreeSet::new();
    for (split, want) in [
        (Split::Train, config.train),
        (Split::Validation, config.validation),
        (Split::Test, config.test),
    ] {
        let tasks = env.tasks(split).expect("tasks");
        assert_eq!(tasks.len(), want);
        assert!(
            tasks
                .iter()
                .all(|t| t.split == split && t.env == "appworld")
        );
        for t in &tasks {
            assert!(ids.insert(t.id.clone()), "duplicate id {}", t.id);
            assert!(seeds.insert(t.seed), "duplicate seed in {}", t.id);
        }
        let kinds: BTreeSet<(String, u64)> = tasks
            .iter()
            .map(|t| {
                (
                    template_of(t).to_string(),
                    t.metadata["difficulty"].as_u64().unwrap_or(0),
                )
            })
            .collect();
        assert_eq!(kinds.len(), 18, "every template at every difficulty");
    }
    assert_eq!(
        env.tasks(Split::Test).expect("tasks"),
        env.tasks(Split::Test).expect("tasks")
    );
    let other = AppWorld::with_config(AppWorldConfig {
        base_seed: 5,
        ..AppWorldConfig::default()
    });
    assert_ne!(
        other.tasks(Split::Test).expect("tasks")[0].seed,
        env.tasks(Split::Test).expect("tasks")[0].seed
    );
}

#[test]
fn base_harness_is_valid_with_the_paper_limits() {
    let h0 = base_harness();
    h0.validate().expect("valid");
    h0.validate_for_tools(&tool_specs())
        .expect("valid for the tools");
    assert_eq!(h0.limits.max_model_calls, 32);
    assert_eq!(h0.limits.max_env_actions, 30);
    assert!(h0.prompt.slots.contains_key("action_guidance"));
    for s in table7_siblings() {
        s.validate().expect("sibling valid");
        assert_ne!(s.id(), h0.id());
    }
}

#[test]
fn oracle_solves_every_builtin_task() {
    let env = AppWorld::new();
    let harness = base_harness();
    // One thread per split keeps this under a few seconds on small machines.
    let results: Vec<(usize, Vec<String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = Split::ALL
            .into_iter()
            .map(|split| {
                let (env, harness) = (&env, &harness);
                scope.spawn(move || {
                    let tasks = env.tasks(split).expect("tasks");
                    let failures: Vec<String> = tasks
                        .iter()
                        .filter_map(|task| {
                            let t = run(&OraclePolicy::new(task), harness, env, task);
                            (!t.is_success()).then(|| {
                                format!("{}: {:?} {}", task.id, t.termination, t.outcome.details)
                            })
                        })
                        .collect();
                    (tasks.len(), failures)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("no panic"))
            .collect()
    });
    let total: usize = results.iter().map(|(n, _)| n).sum();
    let failures: Vec<String> = results.into_iter().flat_map(|(_, f)| f).collect();
    assert!(total >= 500, "only {total} tasks");
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A careful agent that keeps the default page size of 5 still fits the paper's budget of 30
/// actions, with room for a few documentation lookups on the hardest tasks.
#[test]
fn every_task_fits_the_budget_at_the_default_page_size() {
    let env = AppWorld::new();
    let mut most = 0;
    for split in [Split::Validation, Split::Test] {
        for task in env.tasks(split).expect("tasks") {
            let oracle = OraclePolicy::new(&task).with_page_size(5);
            let t = run(&oracle, &base_harness(), &env, &task);
            assert!(t.is_success(), "{}: {}", task.id, t.outcome.details);
            most = most.max(t.counts.env_actions);
        }
    }
    assert!(
        (15..=26).contains(&most),
        "the hardest task takes {most} actions"
    );
}

#[test]
fn conformance_suite_passes_with_the_oracle() {
    let env = AppWorld::new();
    let tasks = sample_of_every_kind(&env);
    let config = ConformanceConfig {
        harness: base_harness(),
        ..ConformanceConfig::default()
    };
    let oracle = |task: &Task| -> Box<dyn Policy> { Box::new(OraclePolicy::new(task)) };
    let report = block_on(check_environment(&env, &tasks, &oracle, &config));
    assert!(report.failures.is_empty(), "{:#?}", report.failures);
    assert!(report.episodes >= tasks.len() * 3);
}

#[test]
fn immediate_submission_scores_zero() {
    let env = AppWorld::new();
    for task in sample_of_every_kind(&env) {
        for text in [complete(""), complete("42"), "I am done.".to_string()] {
            let policy = FnPolicy::new("quitter", move |_: &PolicyRequest| text.clone());
            let t = run(&policy, &base_harness(), &env, &task);
            assert_eq!(t.reward(), 0.0, "{}", task.id);
            assert!(
                !t.outcome.details["failed"]
                    .as_array()
                    .expect("failed list")
                    .is_empty()
            );
        }
    }
}

#[test]
fn sixteen_concurrent_episodes_match_their_sequential_runs() {
    let env = Arc::new(AppWorld::new());
    let tasks: Vec<Task> = env
        .tasks(Split::Train)
        .expect("tasks")
        .into_iter()
        .take(16)
        .collect();
    let sequential: Vec<Trajectory> = tasks
        .iter()
        .map(|t| run(&OraclePolicy::new(t), &base_harness(), &env, t))
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .build()
        .expect("runtime");
    let concurrent: Vec<Trajectory> = runtime.block_on(async {
        let handles: Vec<_> = tasks
            .iter()
            .cloned()
            .map(|task| {
                let env = Arc::clone(&env);
                tokio::spawn(async move {
                    let oracle = OraclePolicy::new(&task);
                    run_episode(&oracle, &base_harness(), env.as_ref(), &task, 11).await
                })
            })
            .collect();
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await.expect("joined").expect("episode"));
        }
        out
    });
    for (a, b) in sequential.iter().zip(&concurrent) {
        assert!(a.is_success(), "{}", a.task_id);
        assert_eq!(a.messages, b.messages, "{}", a.task_id);
        assert_eq!(a.outcome, b.outcome);
    }
}

/// Forwards to the oracle, but first makes one extra write the task did not ask for; the
/// oracle never sees that call's observation.
struct ExtraWrite {
    oracle: OraclePolicy,
    extra: String,
    sent: Mutex<bool>,
}

#[async_trait]
impl Policy for ExtraWrite {
    fn name(&self) -> &str {
        "extra-write"
    }

    async fn generate(&self, mut request: PolicyRequest) -> harness_core::Result<PolicyTurn> {
        {
            let mut sent = self.sent.lock().expect("lock");
            if !*sent {
                *sent = true;
                return Ok(turn(self.extra.clone()));
            }
        }
        if let Some(first_tool) = request.messages.iter().position(|m| m.role == Role::Tool) {
            request.messages.remove(first_tool);
        }
        self.oracle.generate(request).await
    }
}

#[test]
fn an_extra_write_fails_the_task_as_collateral_damage() {
    let env = AppWorld::new();
    let extras = [
        api_call(
            "supervisor",
            "update_account_password",
            json!({"app": "music", "password": "hunter22"}),
        ),
        api_call(
            "mail",
            "send_email",
            json!({"to": "someone@example.com", "subject": "hi", "body": "hello"}),
        ),
        api_call("music", "create_playlist", json!({"name": "Unasked For"})),
    ];
    for task in sample_of_every_kind(&env).iter().take(18) {
        for extra in &extras {
            let policy = ExtraWrite {
                oracle: OraclePolicy::new(task),
                extra: extra.clone(),
                sent: Mutex::new(false),
            };
            let t = run(&policy, &base_harness(), &env, task);
            assert_eq!(
                t.reward(),
                0.0,
                "{} with {extra}: {}",
                task.id,
                t.outcome.details
            );
            let failed = t.outcome.details["failed"].to_string();
            assert!(
                failed.contains("collateral")
                    || failed.contains("email")
                    || failed.contains("playlist"),
                "{}: {failed}",
                task.id
            );
        }
    }
}

/// Reads only the first page of each folder unless a harness message says to keep paging.
struct FirstPageReader {
    sender: String,
    folders: Vec<String>,
    state: Mutex<(usize, u32, usize, bool)>,
}

impl FirstPageReader {
    fn new(task: &Task) -> Self {
        let spec = &task.metadata["spec"];
        FirstPageReader {
            sender: spec["sender_email"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            folders: spec["folders"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f.as_str().map(String::from))
                .collect(),
            state: Mutex::new((0, 1, 0, false)),
        }
    }
}

#[async_trait]
impl Policy for FirstPageReader {
    fn name(&self) -> &str {
        "first-page-reader"
    }

    async fn generate(&self, request: PolicyRequest) -> harness_core::Result<PolicyTurn> {
        let mut state = self.state.lock().expect("lock");
        let (folder, page, count, started) = &mut *state;
        if *started {
            let last_tool = request
                .messages
                .iter()
                .rposition(|m| m.role == Role::Tool)
                .unwrap_or(0);
            let listing: Value =
                serde_json::from_str(&request.messages[last_tool].content).unwrap_or(Value::Null);
            let emails = listing["emails"].as_array().cloned().unwrap_or_default();
            *count += emails
                .iter()
                .filter(|e| e["from"] == self.sender.as_str())
                .count();
            let warned = request.messages[last_tool + 1..]
                .iter()
                .any(|m| m.role == Role::User && m.content.contains("page"));
            if warned && emails.len() == 5 {
                *page += 1;
            } else {
                *folder += 1;
                *page = 1;
            }
        }
        *started = true;
        let text = match self.folders.get(*folder) {
            Some(name) => api_call(
                "mail",
                "list_emails",
                json!({"folder": name, "page": *page}),
            ),
            None => complete(&count.to_string()),
        };
        Ok(turn(text))
    }
}

#[test]
fn first_page_readers_fail_and_the_pagination_hook_repairs_them() {
    let env = AppWorld::new();
    let s6 = sibling("S6");
    let tasks: Vec<Task> = env
        .tasks(Split::Validation)
        .expect("tasks")
        .into_iter()
        .filter(|t| template_of(t) == "mail_count")
        .collect();
    assert!(tasks.len() >= 15);
    for task in &tasks {
        let under_h0 = run(&FirstPageReader::new(task), &base_harness(), &env, task);
        assert_eq!(under_h0.reward(), 0.0, "{}", task.id);
        assert_eq!(under_h0.counts.hook_messages, 0);

        let under_s6 = run(&FirstPageReader::new(task), &s6, &env, task);
        let warnings: Vec<_> = under_s6
            .messages
            .iter()
            .filter(|m| {
                m.source == Source::Harness
                    && m.hook.as_deref() == Some("pagination-completion-guidance")
            })
            .collect();
        assert!(!warnings.is_empty(), "{}", task.id);
        assert!(
            warnings
                .iter()
                .all(|m| m.role == Role::User && m.content.contains("page"))
        );
        assert!(
            under_s6.is_success(),
            "{}: {}",
            task.id,
            under_s6.outcome.details
        );
    }
}

#[test]
fn listings_flag_pagination_only_when_there_are_several_pages() {
    let env = AppWorld::new();
    let task = env.task(Split::Train, 0);
    let mut session = block_on(env.reset(&task, 1)).expect("reset");
    let mut step = |call: ToolCall| block_on(session.step(&call)).expect("step");
    let list = |page: u32, size: u32| {
        ToolCall::new(
            tool::CALL_API,
            json!({"app": "mail", "api": "list_emails", "arguments": {"folder": "inbox", "page": page, "page_size": size}}),
        )
    };
    let first = step(list(1, 5));
    assert!(first.pagination && !first.error, "{}", first.text);
    assert!(!first.text.contains("total"));
    let whole = step(list(1, 20));
    assert!(!whole.pagination, "{}", whole.text);
    let beyond = step(list(9, 5));
    assert!(!beyond.pagination && !beyond.error);
    assert!(beyond.text.contains("\"emails\":[]"));
    let bad = step(list(0, 50));
    assert!(bad.error);
}

#[test]
fn schema_lookup_hook_sees_the_docs_tools_as_lookups() {
    let env = AppWorld::new();
    let task = env.task(Split::Validation, 0);
    let mut harness = base_harness();
    harness.hooks.insert(
        "lookup-first".into(),
        HookSpec {
            action: HookAction::Warn,
            condition: "no_schema_lookup_before_first_call".into(),
            event: HookEvent::AfterTool,
            message: "Read an API's documentation before calling it.".into(),
            parameters: Default::default(),
        },
    );
    let fired = |t: &Trajectory| {
        t.messages
            .iter()
            .filter(|m| m.hook.as_deref() == Some("lookup-first"))
            .count()
    };
    // The oracle calls APIs without reading docs: the hook fires once, after the first call.
    let t = run(&OraclePolicy::new(&task), &harness, &env, &task);
    assert!(t.is_success());
    assert_eq!(fired(&t), 1);
    // A policy that reads the schema first does not trigger it.
    let script = vec![
        ToolCall::new(tool::SHOW_API, json!({"app": "mail", "api": "list_emails"}))
            .to_tool_call_block(),
        api_call("mail", "list_emails", json!({"folder": "inbox"})),
        complete("0"),
    ];
    let policy = harness_testkit::ScriptedPolicy::new(script);
    let t = run(&policy, &harness, &env, &task);
    assert_eq!(fired(&t), 0);
    let doc: Value = serde_json::from_str(
        &t.messages
            .iter()
            .find(|m| m.role == Role::Tool)
            .expect("doc")
            .content,
    )
    .expect("json");
    assert_eq!(doc["parameters"]["required"], json!(["folder"]));
    assert!(doc["parameters"]["properties"]["page_size"].is_object());
}

#[test]
fn a_union_instead_of_an_intersection_fails_with_the_extra_titles_named() {
    let env = AppWorld::new();
    for task in env
        .tasks(Split::Test)
        .expect("tasks")
        .iter()
        .filter(|t| template_of(t) == "liked_intersection")
        .take(6)
    {
        let mut session = block_on(env.reset(task, 3)).expect("reset");
        let spec = &task.metadata["spec"];
        let mut titles = BTreeSet::new();
        for (api, args) in [
            ("list_liked_songs", json!({"page_size": 20})),
            ("list_liked_songs", json!({"page_size": 20, "page": 2})),
            (
                "show_playlist",
                json!({"page_size": 20, "playlist_id": spec["playlist_id"]}),
            ),
        ] {
            let call = ToolCall::new(
                tool::CALL_API,
                json!({"app": "music", "api": api, "arguments": args}),
            );
            let obs = block_on(session.step(&call)).expect("step");
            let v: Value = serde_json::from_str(&obs.text).expect("json");
            for s in v["songs"].as_array().into_iter().flatten() {
                titles.insert(s["title"].as_str().unwrap_or_default().to_string());
            }
        }
        let union: Vec<String> = titles.into_iter().collect();
        let submit = ToolCall::new(tool::COMPLETE_TASK, json!({"answer": union.join(", ")}));
        assert!(block_on(session.step(&submit)).expect("step").done);
        let outcome = block_on(session.verify(None)).expect("verify");
        assert_eq!(outcome.reward, 0.0);
        let answer = outcome.details["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .find(|c| c["check"] == "answer")
            .expect("answer check")
            .clone();
        assert!(
            !answer["detail"]["extra"]
                .as_array()
                .expect("extra")
                .is_empty(),
            "{answer}"
        );
    }
}

#[test]
fn computing_the_balance_instead_of_reading_it_back_fails() {
    let env = AppWorld::new();
    let task = env
        .tasks(Split::Train)
        .expect("tasks")
        .into_iter()
        .find(|t| template_of(t) == "transfer_readback" && t.metadata["difficulty"] == 1)
        .expect("a direct transfer task");
    let spec = &task.metadata["spec"]["transfer"];
    let mut session = block_on(env.reset(&task, 5)).expect("reset");
    let mut step =
        |name: &str, args: Value| block_on(session.step(&ToolCall::new(name, args))).expect("step");
    let call = |api: &str, arguments: Value| json!({"app": "payments", "api": api, "arguments": arguments});
    let profile: Value = serde_json::from_str(
        &step(
            tool::CALL_API,
            json!({"app": "supervisor", "api": "show_profile"}),
        )
        .text,
    )
    .expect("json");
    let passwords: Value = serde_json::from_str(
        &step(
            tool::CALL_API,
            json!({"app": "supervisor", "api": "show_account_passwords", "arguments": {}}),
        )
        .text,
    )
    .expect("json");
    let password = passwords["passwords"][0]["password"].clone();
    let login: Value = serde_json::from_str(
        &step(
            tool::CALL_API,
            call(
                "login",
                json!({"email": profile["email"], "password": password}),
            ),
        )
        .text,
    )
    .expect("json");
    let token = login["access_token"].clone();
    let before: Value = serde_json::from_str(
        &step(
            tool::CALL_API,
            call("show_balance", json!({"access_token": token})),
        )
        .text,
    )
    .expect("json");
    let amount = spec["amount_cents"].as_f64().expect("amount") / 100.0;
    let sent = step(
        tool::CALL_API,
        call(
            "send_money",
            json!({"access_token": token, "to_email": spec["to_email"], "amount": amount, "note": task.metadata["spec"]["note"]}),
        ),
    );
    assert!(!sent.error, "{}", sent.text);
    let guessed = before["balance"].as_f64().expect("balance") - amount;
    step(
        tool::COMPLETE_TASK,
        json!({"answer": format!("{guessed:.2}")}),
    );
    let outcome = block_on(session.verify(None)).expect("verify");
    assert_eq!(
        outcome.reward, 0.0,
        "the fee makes the guess wrong: {}",
        outcome.details
    );
    assert_eq!(outcome.details["failed"], json!(["answer"]));
}

#[test]
fn running_out_of_budget_without_complete_task_fails_and_s8_warns() {
    let env = AppWorld::new();
    let task = env.task(Split::Validation, 0);
    let wanderer = || {
        FnPolicy::new("wanderer", |_: &PolicyRequest| {
            ToolCall::new(tool::LIST_APPS, json!({})).to_tool_call_block()
        })
    };
    let t = run(&wanderer(), &base_harness(), &env, &task);
    assert_eq!(t.termination, Termination::MaxEnvActions);
    assert_eq!(t.reward(), 0.0);
    assert!(
        t.outcome.details["failed"]
            .to_string()
            .contains("complete_task")
    );
    let t = run(&wanderer(), &sibling("S8"), &env, &task);
    let warnings = t
        .messages
        .iter()
        .filter(|m| m.hook.as_deref() == Some("low-budget-completion"))
        .count();
    assert_eq!(
        warnings, 4,
        "after the actions that leave 3, 2, 1 and 0 steps"
    );
}

#[test]
fn account_recovery_needs_the_newest_code() {
    let env = AppWorld::new();
    let task = env
        .tasks(Split::Train)
        .expect("tasks")
        .into_iter()
        .find(|t| template_of(t) == "account_recovery" && t.metadata["difficulty"] == 3)
        .expect("a hard recovery task");
    let app = task.metadata["spec"]["app"]
        .as_str()
        .expect("app")
        .to_string();
    let mut session = block_on(env.reset(&task, 9)).expect("reset");
    let mut call = |app: &str, api: &str, arguments: Value| {
        block_on(session.step(&ToolCall::new(
            tool::CALL_API,
            json!({"app": app, "api": api, "arguments": arguments}),
        )))
        .expect("step")
    };
    let email = serde_json::from_str::<Value>(&call("supervisor", "show_profile", json!({})).text)
        .expect("json")["email"]
        .clone();
    let stale = call("supervisor", "show_account_passwords", json!({}));
    assert!(!stale.error);
    assert!(!call(&app, "send_password_reset_code", json!({"email": email})).error);
    // The inbox only holds stale codes; the new one was filtered into spam.
    let inbox: Value = serde_json::from_str(
        &call(
            "mail",
            "list_emails",
            json!({"folder": "inbox", "page_size": 20}),
        )
        .text,
    )
    .expect("json");
    let stale_id = inbox["emails"]
        .as_array()
        .expect("emails")
        .iter()
        .find(|e| e["from"].as_str().is_some_and(|f| f.contains(&app)))
        .expect("stale code")["email_id"]
        .clone();
    let body = serde_json::from_str::<Value>(
        &call("mail", "show_email", json!({"email_id": stale_id})).text,
    )
    .expect("json")["body"]
        .as_str()
        .expect("body")
        .to_string();
    let code: String = body.chars().filter(char::is_ascii_digit).collect();
    let reset = call(
        &app,
        "reset_password",
        json!({"email": email, "code": code, "new_password": "whatever-123"}),
    );
    assert!(
        reset.error && reset.text.contains("most recently"),
        "{}",
        reset.text
    );
    let spam = call("mail", "list_emails", json!({"folder": "spam"}));
    assert!(spam.text.contains(&format!("no-reply@{app}")));
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,40}".prop_map(Value::String),
        prop_oneof![
            Just("mail"),
            Just("music"),
            Just("payments"),
            Just("shopping"),
            Just("supervisor"),
            Just("list_emails"),
            Just("show_playlist"),
            Just("send_money"),
            Just("login"),
            Just("reset_password"),
            Just("inbox"),
            Just("spam"),
            Just("complete_task"),
        ]
        .prop_map(|s| Value::String(s.to_string())),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("app".to_string()),
                    Just("api".to_string()),
                    Just("arguments".to_string()),
                    Just("page".to_string()),
                    Just("page_size".to_string()),
                    Just("folder".to_string()),
                    Just("answer".to_string()),
                    Just("amount".to_string()),
                    Just("song_id".to_string()),
                    "[a-z_]{1,12}",
                ],
                inner,
                0..5,
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn arb_call() -> impl Strategy<Value = ToolCall> {
    let names = prop_oneof![
        Just(tool::CALL_API.to_string()),
        Just(tool::CALL_API.to_string()),
        Just(tool::LIST_APPS.to_string()),
        Just(tool::LIST_APIS.to_string()),
        Just(tool::SHOW_API.to_string()),
        Just(tool::COMPLETE_TASK.to_string()),
        ".{0,20}",
    ];
    (names, arb_json()).prop_map(|(name, arguments)| ToolCall::new(name, arguments))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn fuzzed_tool_calls_never_panic(calls in prop::collection::vec(arb_call(), 1..12), pick in 0usize..18) {
        let env = AppWorld::new();
        let task = env.task(Split::Train, pick);
        let mut session = block_on(env.reset(&task, 1)).expect("reset");
        let mut done = false;
        for call in &calls {
            let obs = block_on(session.step(call)).expect("a step never fails as infrastructure");
            if done {
                prop_assert!(obs.error);
            }
            done |= obs.done;
        }
        let outcome = block_on(session.verify(None)).expect("verify");
        prop_assert!(outcome.reward == 0.0 || outcome.reward == 1.0);
    }
}

/// A call of a real API with arguments named after its parameters but with arbitrary values,
/// sometimes with a valid access token.
fn arb_api_call() -> impl Strategy<Value = (usize, Vec<(usize, Value)>, bool)> {
    (
        0..APIS.len(),
        prop::collection::vec((0usize..6, arb_json()), 0..5),
        any::<bool>(),
    )
}

fn login_tokens(session: &mut dyn harness_core::EnvSession) -> Vec<(String, String)> {
    let mut step = |app: &str, api: &str, arguments: Value| -> Value {
        let call = ToolCall::new(
            tool::CALL_API,
            json!({"app": app, "api": api, "arguments": arguments}),
        );
        serde_json::from_str(&block_on(session.step(&call)).expect("step").text)
            .unwrap_or(Value::Null)
    };
    let email = step("supervisor", "show_profile", json!({}))["email"].clone();
    let passwords = step("supervisor", "show_account_passwords", json!({}));
    let mut tokens = Vec::new();
    for entry in passwords["passwords"].as_array().into_iter().flatten() {
        let app = entry["app"].as_str().unwrap_or_default().to_string();
        let login = step(
            &app,
            "login",
            json!({"email": email, "password": entry["password"]}),
        );
        if let Some(token) = login["access_token"].as_str() {
            tokens.push((app, token.to_string()));
        }
    }
    tokens
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn fuzzed_api_arguments_never_panic(calls in prop::collection::vec(arb_api_call(), 1..10), pick in 0usize..18) {
        let env = AppWorld::new();
        let task = env.task(Split::Test, pick);
        let mut session = block_on(env.reset(&task, 2)).expect("reset");
        let tokens = login_tokens(session.as_mut());
        for (api_index, values, with_token) in calls {
            let api = &APIS[api_index];
            let params = api.all_params();
            let mut arguments = serde_json::Map::new();
            for (slot, value) in values {
                if let Some(p) = params.get(slot) {
                    arguments.insert(p.name.to_string(), value);
                }
            }
            if with_token && let Some((_, token)) = tokens.iter().find(|(app, _)| app == api.app) {
                arguments.insert("access_token".into(), json!(token));
            }
            let call = ToolCall::new(tool::CALL_API, json!({"app": api.app, "api": api.name, "arguments": arguments}));
            let obs = block_on(session.step(&call)).expect("a step never fails as infrastructure");
            prop_assert!(!obs.done);
            prop_assert!(obs.error || serde_json::from_str::<Value>(&obs.text).is_ok(), "{}", obs.text);
        }
        let outcome = block_on(session.verify(None)).expect("verify");
        prop_assert_eq!(outcome.reward, 0.0);
    }
}

#[test]
fn a_task_without_app_world_metadata_is_a_clear_error() {
    let env = AppWorld::new();
    let mut task = env.task(Split::Train, 0);
    task.metadata = json!({"template": "no_such_template", "difficulty": 1});
    let err = block_on(env.reset(&task, 1)).err().expect("an error");
    let text = err.to_string();
    assert!(
        text.contains("metadata.template") && text.contains("mail_count"),
        "{text}"
    );
    task.metadata = json!({"template": "mail_count", "difficulty": 7});
    let err = block_on(env.reset(&task, 1)).err().expect("an error");
    assert!(err.to_string().contains("metadata.difficulty"), "{err}");
}
