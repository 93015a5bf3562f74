//! Test support for the rescue loop: an oracle policy whose success is a function of
//! (harness, task, seed), a scripted learner with a checkpointable state, recording selectors,
//! calibrators and environments.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use harness_core::{
    Calibrate, CalibrationPoint, CalibrationSummary, EnvSession, Environment, Group, Harness,
    HarnessId, HarnessSelector, Learner, Observation, Outcome, PolicyRequest, Result, Role,
    SelectionRequest, Split, Task, ToolCall, ToolKind, ToolSpec, UpdateReport,
};
use harness_pool::SiblingPool;
use harness_rollout::seed::mix;
use harness_testkit::{FnPolicy, ScriptedEnv};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The answer every test task accepts.
pub const ANSWER: &str = "ok";

/// A harness whose system prompt names it, so the oracle policy can tell where it runs.
pub fn harness(name: &str) -> Harness {
    Harness::new(name, format!("harness={name}. Solve the task."))
}

/// H0 and `n` siblings S1..Sn, frozen.
pub fn pool(n: usize) -> SiblingPool {
    SiblingPool::starter(
        harness("H0"),
        (1..=n).map(|i| harness(&format!("S{i}"))),
        serde_json::Value::Null,
    )
    .expect("a valid pool")
}

/// `n` training tasks `t0..` of the scripted environment.
pub fn tasks(n: usize) -> Vec<Task> {
    let env = ScriptedEnv::new(1);
    (0..n)
        .map(|i| {
            let mut t = env.task(&format!("t{i}"), ANSWER);
            t.split = Split::Train;
            t
        })
        .collect()
}

/// What the oracle sees of an episode: the harness's name, the task id and the episode seed.
pub fn parse_request(request: &PolicyRequest) -> (String, String, u64) {
    let system = &request.messages[0].content;
    let harness = system
        .strip_prefix("harness=")
        .and_then(|s| s.split('.').next())
        .unwrap_or("?")
        .to_string();
    let user = request
        .messages
        .iter()
        .find(|m| m.role == Role::User)
        .map(|m| m.content.clone())
        .unwrap_or_default();
    let task = user
        .split("answer for ")
        .nth(1)
        .and_then(|s| s.split('.').next())
        .unwrap_or("?")
        .to_string();
    let seed = request
        .messages
        .iter()
        .find_map(|m| {
            m.content
                .split("Episode seed ")
                .nth(1)
                .and_then(|s| s.trim_end_matches('.').trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    (harness, task, seed)
}

/// A policy that submits the right answer iff `succeeds(harness, task, seed)`.
pub fn oracle(
    succeeds: impl Fn(&str, &str, u64) -> bool + Send + Sync + 'static,
) -> Arc<dyn harness_core::Policy> {
    Arc::new(FnPolicy::new("oracle", move |request: &PolicyRequest| {
        let (h, t, s) = parse_request(request);
        let answer = if succeeds(&h, &t, s) { ANSWER } else { "wrong" };
        ToolCall::new("submit", json!({ "answer": answer })).to_tool_call_block()
    }))
}

/// A success pattern from a salt: a pseudo-random bit per (harness, task, seed) with success
/// probability `p_base` under H0 and `p_sibling` under siblings.
pub fn hashed(
    salt: u64,
    p_base: f64,
    p_sibling: f64,
) -> impl Fn(&str, &str, u64) -> bool + Send + Sync {
    move |h, t, s| {
        let x = mix(salt
            ^ mix(
                harness_rollout::seed::task_hash(h) ^ mix(harness_rollout::seed::task_hash(t) ^ s)
            ));
        let p = if h == "H0" { p_base } else { p_sibling };
        (x as f64 / u64::MAX as f64) < p
    }
}

/// The scripted environment, counting resets.
#[derive(Default)]
pub struct CountingEnv {
    inner: Option<ScriptedEnv>,
    /// `(task id, seed)` of every reset, in order.
    pub resets: Mutex<Vec<(String, u64)>>,
}

impl CountingEnv {
    pub fn new() -> Self {
        CountingEnv {
            inner: Some(ScriptedEnv::new(1)),
            resets: Mutex::new(Vec::new()),
        }
    }
}

#[async_trait]
impl Environment for CountingEnv {
    fn name(&self) -> &str {
        "scripted"
    }

    async fn reset(&self, task: &Task, seed: u64) -> Result<Box<dyn EnvSession>> {
        self.resets.lock().unwrap().push((task.id.clone(), seed));
        self.inner.as_ref().unwrap().reset(task, seed).await
    }
}

/// Where the scripted learner pauses (for the SIGKILL tests): it writes `marker` and sleeps.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Pauses {
    /// Pause inside the update that would produce this policy version.
    pub in_update: Option<u64>,
    /// Pause inside the checkpoint write at this policy version (after part of it is written).
    pub in_checkpoint: Option<u64>,
    /// The file written when pausing.
    pub marker: Option<PathBuf>,
}

/// The learner's whole state: a version and a digest of every group it saw, so two runs agree
/// on it only if they fed it the same groups in the same order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LearnerState {
    pub version: u64,
    pub digest: u64,
    pub tokens: u64,
}

/// A learner that digests groups instead of training.
#[derive(Default)]
pub struct ScriptedLearner {
    pub state: LearnerState,
    pub seen: Arc<Mutex<Vec<Vec<Group>>>>,
    pub pauses: Pauses,
}

fn pause(marker: &Option<PathBuf>) {
    if let Some(m) = marker {
        std::fs::write(m, b"paused").unwrap();
    }
    std::thread::sleep(std::time::Duration::from_secs(120));
}

#[async_trait]
impl Learner for ScriptedLearner {
    fn name(&self) -> &str {
        "scripted"
    }

    async fn update(&mut self, groups: &[Group]) -> Result<UpdateReport> {
        if self.pauses.in_update == Some(self.state.version + 1) {
            pause(&self.pauses.marker);
        }
        let mut d = self.state.digest;
        let mut tokens = 0;
        for g in groups {
            d = mix(d ^ harness_rollout::seed::task_hash(&g.task.id));
            for t in &g.trajectories {
                d = mix(d
                    ^ t.seed
                    ^ (t.reward() as u64)
                    ^ harness_rollout::seed::task_hash(&t.harness_id.0));
                tokens += t.policy_tokens();
            }
        }
        self.state.digest = d;
        self.state.version += 1;
        self.state.tokens += tokens as u64;
        self.seen.lock().unwrap().push(groups.to_vec());
        Ok(UpdateReport {
            applied: true,
            optimizer_steps: self.state.version,
            policy_version: self.state.version,
            loss: (d % 1000) as f64 / 1000.0,
            grad_norm: 1.0,
            lr: 1e-6,
            policy_tokens: tokens,
            weight_mean: 1.0,
            ..UpdateReport::default()
        })
    }

    fn save_checkpoint(&self, dir: &Path) -> Result<()> {
        let json = serde_json::to_vec(&self.state).unwrap();
        std::fs::write(dir.join("half.json"), &json).unwrap();
        if self.pauses.in_checkpoint == Some(self.state.version) {
            pause(&self.pauses.marker);
        }
        std::fs::write(dir.join("learner.json"), json).unwrap();
        Ok(())
    }

    fn load_checkpoint(&mut self, dir: &Path) -> Result<()> {
        let text = std::fs::read_to_string(dir.join("learner.json"))
            .map_err(|e| harness_core::Error::io(dir, e))?;
        self.state = serde_json::from_str(&text).unwrap();
        Ok(())
    }
}

/// A selector answering with a closure over the request, recording every request.
pub struct ScriptedSelector<F> {
    pub f: F,
    pub requests: Mutex<Vec<SelectionRequest>>,
}

impl<F> ScriptedSelector<F> {
    pub fn new(f: F) -> Self {
        ScriptedSelector {
            f,
            requests: Mutex::new(Vec::new()),
        }
    }
}

#[async_trait]
impl<F> HarnessSelector for ScriptedSelector<F>
where
    F: Fn(&SelectionRequest) -> Vec<HarnessId> + Send + Sync,
{
    fn name(&self) -> &str {
        "scripted-selector"
    }

    async fn select(&self, request: &SelectionRequest) -> Result<Vec<HarnessId>> {
        self.requests.lock().unwrap().push(request.clone());
        Ok((self.f)(request))
    }
}

/// A calibrator that counts its calls and keeps a snapshot of them.
#[derive(Default)]
pub struct RecordingCalibrator {
    pub points: Mutex<Vec<CalibrationPoint>>,
}

#[async_trait]
impl Calibrate for RecordingCalibrator {
    fn name(&self) -> &str {
        "recording"
    }

    async fn calibrate(&self, point: &CalibrationPoint) -> Result<CalibrationSummary> {
        self.points.lock().unwrap().push(point.clone());
        let mut usage = std::collections::BTreeMap::new();
        usage.insert(
            "profiler".to_string(),
            harness_core::Usage {
                prompt_tokens: 100,
                completion_tokens: 10,
            },
        );
        Ok(CalibrationSummary {
            index: point.index,
            update: point.update,
            rollouts: 4,
            usage,
            ..CalibrationSummary::default()
        })
    }

    fn snapshot(&self) -> Result<serde_json::Value> {
        Ok(json!({ "calls": self.points.lock().unwrap().len() }))
    }

    fn restore(&self, snapshot: &serde_json::Value) -> Result<()> {
        let calls = snapshot["calls"].as_u64().unwrap_or(0) as usize;
        let mut points = self.points.lock().unwrap();
        points.truncate(calls);
        while points.len() < calls {
            let index = points.len() as u32;
            points.push(CalibrationPoint {
                index,
                update: 0,
                is_final: false,
                seed: 0,
                checkpoint: None,
            });
        }
        Ok(())
    }
}

/// Read a JSONL file as JSON values.
pub fn jsonl(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The same lines with every wall-clock field (`*seconds`) removed.
pub fn without_timings(lines: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    lines
        .into_iter()
        .map(|mut v| {
            if let Some(o) = v.as_object_mut() {
                o.retain(|k, _| !k.ends_with("seconds"));
            }
            v
        })
        .collect()
}

/// An environment whose verifier flips a seeded coin, so a random tiny model still gets mixed
/// rewards (and so non-zero advantages and a real gradient).
pub struct CoinEnv;

pub struct CoinSession {
    seed: u64,
}

#[async_trait]
impl Environment for CoinEnv {
    fn name(&self) -> &str {
        "coin"
    }

    async fn reset(&self, _task: &Task, seed: u64) -> Result<Box<dyn EnvSession>> {
        Ok(Box::new(CoinSession { seed }))
    }
}

#[async_trait]
impl EnvSession for CoinSession {
    fn tools(&self) -> Vec<ToolSpec> {
        vec![
            ToolSpec::new(
                "submit",
                "Submit.",
                json!({"type": "object", "properties": {}, "required": []}),
            )
            .with_kind(ToolKind::Submit),
        ]
    }

    async fn step(&mut self, _call: &ToolCall) -> Result<Observation> {
        Ok(Observation::ok("Submitted.").finished())
    }

    async fn verify(&mut self, _answer: Option<&str>) -> Result<Outcome> {
        Ok(if mix(self.seed).is_multiple_of(3) {
            Outcome::success(json!({}))
        } else {
            Outcome::failure(json!({}))
        })
    }
}
