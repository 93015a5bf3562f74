//! An in-process fake Tinker server (axum) that records every request, emulates the loss
//! reductions of hosted Tinker and SkyRL's server, and injects faults.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use harness_core::{
    FinishReason, Group, GroupOrigin, Outcome, PolicyTurnRecord, Role, Source, Split, Task,
    Termination, Trajectory, TrajectoryMessage, TurnSampling,
};
use serde_json::{Value, json};

/// How the fake reduces per-token losses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    /// Hosted Tinker: sums, `loss:sum` in the metrics.
    Sum,
    /// SkyRL: per example divided by the sum of weights; `elementwise_loss` outputs.
    Skyrl,
}

/// A fault injected into the next request of an endpoint.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Answer with this status without applying the request.
    Status(u16),
    /// Apply the request, then cut the answer's body (a dropped connection).
    DropAfterApply,
    /// Sleep this long before handling (past the client's timeout).
    Delay(Duration),
    /// Accept the request, but its future fails with this message.
    FailFuture(String),
    /// Accept the request, but its future never completes.
    NeverComplete,
}

#[derive(Debug, Clone)]
enum FutureEntry {
    Done(Value),
    Failed(String),
    Never,
}

#[derive(Debug, Default)]
pub struct ModelState {
    /// forward_backward calls applied.
    pub fb_applied: usize,
    /// optim steps applied.
    pub steps: usize,
    /// Data accumulated since the last step.
    pub pending: usize,
}

#[derive(Default)]
pub struct FakeState {
    pub reduction: Option<Reduction>,
    /// Every request: (endpoint, body).
    pub log: Vec<(String, Value)>,
    pub faults: HashMap<String, VecDeque<Fault>>,
    futures: HashMap<u64, FutureEntry>,
    pub models: HashMap<String, ModelState>,
    pub sessions: Vec<String>,
    pub heartbeats: usize,
    /// Saved checkpoints: tinker path -> steps at save.
    pub checkpoints: BTreeMap<String, usize>,
    next_id: u64,
}

#[derive(Clone)]
pub struct Fake {
    pub state: Arc<Mutex<FakeState>>,
    pub addr: SocketAddr,
    shutdown: Arc<Mutex<Option<tokio::sync::oneshot::Sender<()>>>>,
}

/// The fake's log-prob of `target` at position `i` for a model with `steps` updates: a fixed
/// function, so tests can predict it.
pub fn fake_logprob(target: u32, i: usize, steps: usize) -> f64 {
    -1.0 - 0.05 * f64::from(target % 11) - 0.01 * (i % 5) as f64 + 0.001 * steps as f64
}

impl Fake {
    pub async fn start(reduction: Reduction) -> Fake {
        let state = Arc::new(Mutex::new(FakeState {
            reduction: Some(reduction),
            ..FakeState::default()
        }));
        Self::serve(state, "127.0.0.1:0".parse().unwrap()).await
    }

    async fn serve(state: Arc<Mutex<FakeState>>, addr: SocketAddr) -> Fake {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new()
            .route("/api/v1/get_server_capabilities", get(capabilities))
            .route("/api/v1/{endpoint}", post(handle))
            .with_state(state.clone());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await
                .unwrap();
        });
        Fake {
            state,
            addr,
            shutdown: Arc::new(Mutex::new(Some(tx))),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn inject(&self, endpoint: &str, fault: Fault) {
        self.state
            .lock()
            .unwrap()
            .faults
            .entry(endpoint.to_string())
            .or_default()
            .push_back(fault);
    }

    /// Requests to `endpoint`, in order.
    pub fn requests(&self, endpoint: &str) -> Vec<Value> {
        self.state
            .lock()
            .unwrap()
            .log
            .iter()
            .filter(|(e, _)| e == endpoint)
            .map(|(_, b)| b.clone())
            .collect()
    }

    /// Endpoints requested, in order (polls left out).
    pub fn endpoints(&self) -> Vec<String> {
        self.state
            .lock()
            .unwrap()
            .log
            .iter()
            .map(|(e, _)| e.clone())
            .filter(|e| e != "retrieve_future" && e != "session_heartbeat")
            .collect()
    }

    pub fn model(&self, id: &str) -> (usize, usize) {
        let s = self.state.lock().unwrap();
        let m = &s.models[id];
        (m.fb_applied, m.steps)
    }

    /// Stop, forget everything but the log, and come back on the same port after `down`.
    pub async fn restart(&self, down: Duration) -> Fake {
        if let Some(tx) = self.shutdown.lock().unwrap().take() {
            let _ = tx.send(());
        }
        {
            let mut s = self.state.lock().unwrap();
            s.models.clear();
            s.futures.clear();
            s.sessions.clear();
        }
        tokio::time::sleep(down).await;
        let mut tries = 0;
        loop {
            match tokio::net::TcpListener::bind(self.addr).await {
                Ok(l) => {
                    drop(l);
                    break;
                }
                Err(_) if tries < 50 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("cannot rebind {}: {e}", self.addr),
            }
        }
        Self::serve(self.state.clone(), self.addr).await
    }
}

async fn capabilities(State(state): State<Arc<Mutex<FakeState>>>) -> Json<Value> {
    state
        .lock()
        .unwrap()
        .log
        .push(("get_server_capabilities".into(), Value::Null));
    Json(json!({"supported_models": [{"model_name": "tiny-base"}]}))
}

fn err(status: u16, detail: &str) -> Response {
    (
        StatusCode::from_u16(status).unwrap(),
        Json(json!({"detail": detail})),
    )
        .into_response()
}

fn cut_body() -> Response {
    // The head goes out, then the body stream fails: the client sees the connection drop.
    let stream = futures::stream::iter(vec![
        Ok::<Bytes, std::io::Error>(Bytes::from_static(b"{\"request_id\": ")),
        Err(std::io::Error::other("injected: connection dropped")),
    ]);
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .header("content-length", "100")
        .body(Body::from_stream(stream))
        .unwrap()
}

fn floats(v: &Value) -> Vec<f64> {
    v["data"]
        .as_array()
        .map(|a| a.iter().map(|x| x.as_f64().unwrap()).collect())
        .unwrap_or_default()
}

/// The fake model pass: log-probs of the targets, per-token losses per the loss function.
fn model_pass(body: &Value, steps: usize, reduction: Reduction) -> Value {
    let data = body["data"].as_array().unwrap();
    let loss_fn = body["loss_fn"].as_str().unwrap();
    let mut outputs = Vec::new();
    let mut total = 0.0;
    for d in data {
        let inputs = &d["loss_fn_inputs"];
        let targets: Vec<u32> = inputs["target_tokens"]["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().expect("target tokens are integers") as u32)
            .collect();
        let n = targets.len();
        let weights = if inputs.get("weights").is_some() {
            floats(&inputs["weights"])
        } else {
            vec![1.0; n]
        };
        let sampling = floats(&inputs["logprobs"]);
        let adv = floats(&inputs["advantages"]);
        let logp: Vec<f64> = targets
            .iter()
            .enumerate()
            .map(|(i, &t)| fake_logprob(t, i, steps))
            .collect();
        let per: Vec<f64> = (0..n)
            .map(|i| match loss_fn {
                "cross_entropy" => -weights[i] * logp[i],
                "importance_sampling" => -weights[i] * (logp[i] - sampling[i]).exp() * adv[i],
                "ppo" => {
                    let r = (logp[i] - sampling[i]).exp();
                    let cfg = &body["loss_fn_config"];
                    let lo = cfg["clip_low_threshold"].as_f64().unwrap_or(0.8);
                    let hi = cfg["clip_high_threshold"].as_f64().unwrap_or(1.2);
                    -weights[i] * (r * adv[i]).min(r.clamp(lo, hi) * adv[i])
                }
                other => panic!("unknown loss {other}"),
            })
            .collect();
        let s: f64 = per.iter().sum();
        total += match reduction {
            Reduction::Sum => s,
            Reduction::Skyrl => s / weights.iter().sum::<f64>().max(1e-9),
        };
        outputs.push(json!({
            "logprobs": {"data": logp, "dtype": "float32", "shape": [n]},
            "elementwise_loss": {"data": per, "dtype": "float32", "shape": [n]},
        }));
    }
    let metrics = match reduction {
        Reduction::Sum => json!({"loss:sum": total}),
        Reduction::Skyrl => json!({}),
    };
    json!({"loss_fn_output_type": "scalar", "loss_fn_outputs": outputs, "metrics": metrics})
}

async fn handle(
    State(state): State<Arc<Mutex<FakeState>>>,
    Path(endpoint): Path<String>,
    Json(body): Json<Value>,
) -> Response {
    let fault = {
        let mut s = state.lock().unwrap();
        s.log.push((endpoint.clone(), body.clone()));
        s.faults.get_mut(&endpoint).and_then(|q| q.pop_front())
    };
    let mut drop_after = false;
    let mut future_fault = None;
    match fault {
        Some(Fault::Status(code)) => return err(code, "injected failure"),
        Some(Fault::Delay(d)) => tokio::time::sleep(d).await,
        Some(Fault::DropAfterApply) => drop_after = true,
        Some(f @ (Fault::FailFuture(_) | Fault::NeverComplete)) => future_fault = Some(f),
        None => {}
    }
    let mut s = state.lock().unwrap();
    let reduction = s.reduction.unwrap();
    let model_id = body["model_id"].as_str().map(str::to_string);
    let known = |s: &FakeState| model_id.as_ref().is_some_and(|m| s.models.contains_key(m));
    let result: Value = match endpoint.as_str() {
        "create_session" => {
            let id = format!("session_{}", s.sessions.len());
            s.sessions.push(id.clone());
            return Json(json!({"type": "create_session", "session_id": id})).into_response();
        }
        "session_heartbeat" => {
            if !s
                .sessions
                .iter()
                .any(|x| Some(x.as_str()) == body["session_id"].as_str())
            {
                return err(404, "Session not found");
            }
            s.heartbeats += 1;
            return Json(json!({"type": "session_heartbeat"})).into_response();
        }
        "create_model" => {
            let id = format!("model_{}", s.models.len() + s.log.len());
            s.models.insert(id.clone(), ModelState::default());
            json!({"model_id": id, "base_model": body["base_model"], "lora_config": body["lora_config"]})
        }
        "retrieve_future" => {
            let id: u64 = body["request_id"].as_str().unwrap().parse().unwrap();
            return match s.futures.get(&id) {
                None => err(404, "Future not found"),
                Some(FutureEntry::Done(v)) => Json(v.clone()).into_response(),
                Some(FutureEntry::Failed(m)) => err(400, m),
                Some(FutureEntry::Never) => {
                    Json(json!({"type": "try_again", "request_id": id.to_string()})).into_response()
                }
            };
        }
        _ if !known(&s) => return err(404, "Model not found"),
        "forward" => {
            let m = &s.models[model_id.as_ref().unwrap()];
            model_pass(&body["forward_input"], m.steps, reduction)
        }
        "forward_backward" => {
            let steps = s.models[model_id.as_ref().unwrap()].steps;
            let out = model_pass(&body["forward_backward_input"], steps, reduction);
            let m = s.models.get_mut(model_id.as_ref().unwrap()).unwrap();
            m.fb_applied += 1;
            m.pending += body["forward_backward_input"]["data"]
                .as_array()
                .unwrap()
                .len();
            out
        }
        "optim_step" => {
            let m = s.models.get_mut(model_id.as_ref().unwrap()).unwrap();
            if m.pending > 0 {
                m.steps += 1;
                m.pending = 0;
            }
            json!({"metrics": {}})
        }
        "save_weights" | "save_weights_for_sampler" => {
            let mid = model_id.clone().unwrap();
            let name = body["path"].as_str().unwrap();
            let path = if endpoint == "save_weights" {
                format!("tinker://{mid}/weights/{name}")
            } else {
                format!("tinker://{mid}/{name}")
            };
            let steps = s.models[&mid].steps;
            s.checkpoints.insert(path.clone(), steps);
            json!({"path": path, "type": endpoint})
        }
        "load_weights" => {
            let path = body["path"].as_str().unwrap().to_string();
            let Some(&steps) = s.checkpoints.get(&path) else {
                return err(404, &format!("Checkpoint not found: {path}"));
            };
            s.models.get_mut(model_id.as_ref().unwrap()).unwrap().steps = steps;
            json!({"type": "load_weights"})
        }
        other => return err(404, &format!("no route {other}")),
    };
    s.next_id += 1;
    let id = s.next_id;
    let entry = match future_fault {
        Some(Fault::FailFuture(m)) => FutureEntry::Failed(m),
        Some(Fault::NeverComplete) => FutureEntry::Never,
        _ => FutureEntry::Done(result),
    };
    s.futures.insert(id, entry);
    drop(s);
    if drop_after {
        return cut_body();
    }
    let mut reply =
        json!({"request_id": id.to_string(), "future_id": id.to_string(), "status": "pending"});
    if let Some(m) = model_id {
        reply["model_id"] = json!(m);
    }
    Json(reply).into_response()
}

/// One trajectory: a harness system turn and an observation as context, then policy turns.
/// Turn 2's context extends turn 1's context + tokens (packed); turn 3 starts afresh.
pub fn trajectory(seed: u64, reward: f32, base: u32) -> Trajectory {
    let msg = |source, role| TrajectoryMessage {
        role,
        source,
        content: String::new(),
        name: None,
        hook: None,
    };
    let turn = |context: Vec<u32>, tokens: Vec<u32>, q: Vec<f32>| PolicyTurnRecord {
        message_index: Some(1),
        context_tokens: context,
        tokens,
        logprobs: q,
        finish: FinishReason::Stop,
        sampling: Some(TurnSampling {
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            greedy: false,
        }),
    };
    let c1 = vec![1, 2, 3, base];
    let t1 = vec![base + 1, base + 2];
    let mut c2 = c1.clone();
    c2.extend(&t1);
    c2.extend([7, 8]); // an observation: context, never scored
    let t2 = vec![base + 3];
    let c3 = vec![9, 9, base];
    let t3 = vec![base + 4, base + 5];
    Trajectory {
        task_id: "t".into(),
        env: "e".into(),
        harness_id: harness_core::HarnessId(format!("h{seed}")),
        harness_name: "H0".into(),
        seed,
        policy: "fake".into(),
        messages: vec![
            msg(Source::Harness, Role::System),
            msg(Source::Policy, Role::Assistant),
        ],
        turns: vec![
            turn(c1, t1, vec![-1.2, -0.9]),
            turn(c2, t2, vec![-1.5]),
            turn(c3, t3, vec![-0.7, -2.5]),
        ],
        final_answer: None,
        outcome: Outcome {
            reward,
            details: Value::Null,
        },
        termination: Termination::PolicyFinished,
        counts: Default::default(),
    }
}

pub fn group(id: &str, rewards: &[f32], base: u32) -> Group {
    Group {
        task: Task::new(id, "e", Split::Train, "do it", 0),
        trajectories: rewards
            .iter()
            .enumerate()
            .map(|(i, &r)| trajectory(i as u64, r, base + 10 * i as u32))
            .collect(),
        origin: GroupOrigin::Rescue,
    }
}
