//! Test support: a pool of H0 and four siblings on harness-testkit's scripted environment, a
//! policy whose per-harness success is scripted by task family and phase, a labeller for the
//! scripted environment and a scripted chat model.

#![allow(dead_code)]

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use harness_core::{
    BehaviourFeature, ChatModel, ChatRequest, ChatResponse, Environment, GenericLabeller, Harness,
    HarnessId, PolicyRequest, Role, Split, Task, ToolCall, Trajectory, TrajectoryLabeller,
    TrajectoryLabels, Usage, steps,
};
use harness_pool::SiblingPool;
use harness_router::Environments;
use harness_testkit::{FnPolicy, ScriptedEnv};
use serde_json::json;

/// The sibling names, in pool order.
pub const SIBLINGS: [&str; 4] = ["S-A", "S-B", "S-C", "S-D"];

pub fn harness(name: &str) -> Harness {
    let mut h = Harness::new(name, format!("You solve tasks with tools. [{name}]"));
    h.description = format!("harness {name}");
    h
}

pub fn pool() -> SiblingPool {
    SiblingPool::starter(
        harness("H0"),
        SIBLINGS.iter().map(|n| harness(n)),
        serde_json::Value::Null,
    )
    .unwrap()
}

pub fn id_of(pool: &SiblingPool, name: &str) -> HarnessId {
    pool.members()
        .iter()
        .find(|h| h.name == name)
        .map(Harness::id)
        .unwrap()
}

/// A task of the scripted environment whose answer is "42"; `family` is `mail` or `pay`.
pub fn task(id: &str, split: Split, family: &str, i: u64) -> Task {
    let instruction = match family {
        "mail" => format!("Count the emails in the inbox folder, case {i}."),
        _ => format!("Transfer money and check the payment balance, case {i}."),
    };
    let mut t = Task::new(id, "scripted", split, instruction, i);
    t.metadata = json!({"answer": "42", "category": family, "difficulty": 1 + i % 2});
    t
}

/// Four mail and four payment validation tasks.
pub fn validation_tasks() -> Vec<Task> {
    (0..8)
        .map(|i| {
            let family = if i % 2 == 0 { "mail" } else { "pay" };
            task(&format!("val-{family}-{i}"), Split::Validation, family, i)
        })
        .collect()
}

pub fn envs() -> Environments {
    let env: Arc<dyn Environment> = Arc::new(ScriptedEnv::new(3));
    BTreeMap::from([("scripted".to_string(), env)])
}

/// Which harness a request runs under and which family its task is.
fn read_request(request: &PolicyRequest) -> (String, String, usize) {
    let system = &request.messages[0].content;
    let harness = ["H0", "S-A", "S-B", "S-C", "S-D"]
        .into_iter()
        .find(|n| system.contains(&format!("[{n}]")))
        .unwrap_or("H0")
        .to_string();
    let all: String = request
        .messages
        .iter()
        .map(|m| m.content.as_str())
        .collect();
    let family = if all.contains("inbox") { "mail" } else { "pay" }.to_string();
    let tool_messages = request
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .count();
    (harness, family, tool_messages)
}

/// Which (harness, family) pairs succeed in a phase.
pub type Script = fn(phase: u8, harness: &str, family: &str) -> bool;

/// Phase 0: S-A solves mail tasks, S-B solves payment tasks, H0 solves nothing.
/// Phase 1: the policy has learnt: H0 solves payments, S-C solves mail and S-D payments, S-A
/// and S-B break.
pub fn default_script(phase: u8, harness: &str, family: &str) -> bool {
    matches!(
        (phase, harness, family),
        (0, "S-A", "mail")
            | (0, "S-B", "pay")
            | (1, "S-C", "mail")
            | (1, "S-D", "pay")
            | (1, "H0", "pay")
    )
}

/// A policy that fetches two listing pages and submits the right answer under a harness the
/// script says succeeds, and submits a wrong answer at once otherwise.
pub fn phased_policy(
    phase: Arc<AtomicU8>,
    script: Script,
) -> FnPolicy<impl Fn(&PolicyRequest) -> String + Send + Sync> {
    FnPolicy::new("phased", move |request: &PolicyRequest| {
        let (harness, family, done) = read_request(request);
        let ok = script(phase.load(Ordering::SeqCst), &harness, &family);
        let call = if ok && done < 2 {
            ToolCall::new("list_items", json!({"page": done + 1}))
        } else {
            ToolCall::new("submit", json!({"answer": if ok { "42" } else { "0" }}))
        };
        call.to_tool_call_block()
    })
}

/// The scripted environment's labeller: listing pages on top of the generic features.
pub struct ScriptedLabeller;

impl TrajectoryLabeller for ScriptedLabeller {
    fn env(&self) -> &str {
        "scripted"
    }

    fn features(&self) -> Vec<BehaviourFeature> {
        let mut f = vec![BehaviourFeature::count(
            "pages_fetched",
            "listing pages fetched",
        )];
        f.extend(GenericLabeller::generic_features());
        f
    }

    fn label(&self, trajectory: &Trajectory) -> TrajectoryLabels {
        let mut labels = GenericLabeller::generic_labels(trajectory);
        let pages = steps(trajectory)
            .iter()
            .filter(|s| s.call.name == "list_items")
            .count();
        labels.insert("pages_fetched".into(), pages as f64);
        labels
    }
}

type Responder = dyn Fn(&ChatRequest) -> String + Send + Sync;

/// A chat model that answers from a queue (the last answer repeats), or from a closure over the
/// request, and records every request.
pub struct ScriptedChat {
    answers: Mutex<VecDeque<String>>,
    last: Mutex<String>,
    respond: Option<Box<Responder>>,
    pub requests: Mutex<Vec<ChatRequest>>,
    pub calls: AtomicUsize,
}

impl ScriptedChat {
    pub fn queue(answers: Vec<&str>) -> Self {
        ScriptedChat {
            answers: Mutex::new(answers.iter().map(|s| s.to_string()).collect()),
            last: Mutex::new(String::new()),
            respond: None,
            requests: Mutex::new(Vec::new()),
            calls: AtomicUsize::new(0),
        }
    }

    pub fn with(f: impl Fn(&ChatRequest) -> String + Send + Sync + 'static) -> Self {
        ScriptedChat {
            respond: Some(Box::new(f)),
            ..Self::queue(Vec::new())
        }
    }
}

#[async_trait]
impl ChatModel for ScriptedChat {
    fn name(&self) -> &str {
        "scripted-chat"
    }

    async fn complete(&self, request: ChatRequest) -> harness_core::Result<ChatResponse> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let text = match &self.respond {
            Some(f) => f(&request),
            None => {
                let next = self.answers.lock().unwrap().pop_front();
                let mut last = self.last.lock().unwrap();
                if let Some(n) = next {
                    *last = n;
                }
                last.clone()
            }
        };
        self.requests.lock().unwrap().push(request);
        Ok(ChatResponse {
            text,
            usage: Some(Usage {
                prompt_tokens: 100,
                completion_tokens: 10,
            }),
        })
    }
}
