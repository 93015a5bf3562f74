//! Running SkyRL's Tinker server (`skyrl-tx` 0.3.0, JAX backend on the CPU) as a child process
//! on a tiny checkpoint, and rescue-shaped groups sampled from that checkpoint: shared by the
//! end-to-end test (`tests/skyrl_e2e.rs`) and the learner comparison
//! (`examples/compare_learners.rs`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use grpo_candle::{CandlePolicy, PolicyModel, Qwen, TinySpec};
use harness_core::{
    ChatMessage, Group, GroupOrigin, Outcome, PolicyRequest, PolicyTurnRecord, Role,
    SamplingParams, Source, Split, Task, Termination, Trajectory, TrajectoryMessage, TurnSampling,
};

/// The environment variable naming the python of a venv with skyrl-tx 0.3.0 and CPU JAX.
pub const VAR: &str = "HARNESS_TINKER_PYTHON";

/// The API process (its engine is a child in the same process group) and its log.
pub struct Server {
    pub child: Child,
    pub log: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        // The API starts its engine as a child: end the whole process group.
        let _ = Command::new("kill")
            .args(["-TERM", "--", &format!("-{}", self.child.id())])
            .status();
        std::thread::sleep(Duration::from_millis(500));
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The API launches its engine with `uv run --extra tinker --extra jax -m tx.tinker.engine
/// ...`; this `uv` on PATH runs the module with the test's python instead.
pub fn write_uv_shim(dir: &Path, python: &str) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let uv = bin.join("uv");
    let script = format!(
        "#!/bin/sh\n# drop `run --extra ...` up to `-m`, then run the module\nwhile [ \"$#\" -gt 0 ] && [ \"$1\" != \"-m\" ]; do shift; done\nexec '{python}' \"$@\"\n"
    );
    std::fs::write(&uv, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&uv, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

/// skyrl-tx's JAX backend imports `peft` only to write `adapter_config.json` next to sampler
/// weights; `peft` pulls in torch (gigabytes from PyPI). Where `peft` is not importable, this
/// stand-in writes the same file.
pub fn peft_stand_in(dir: &Path, python: &str) -> Option<PathBuf> {
    let has_peft = Command::new(python)
        .args(["-c", "import peft"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if has_peft {
        return None;
    }
    let root = dir.join("pyshim");
    std::fs::create_dir_all(root.join("peft")).unwrap();
    std::fs::write(
        root.join("peft/__init__.py"),
        "import json, os\n\nclass LoraConfig:\n    def __init__(self, base_model_name_or_path=None, r=8, lora_alpha=8, **kw):\n        self.d = dict(base_model_name_or_path=base_model_name_or_path, r=r, lora_alpha=lora_alpha, peft_type='LORA', task_type='CAUSAL_LM', target_modules=None, **kw)\n\n    def save_pretrained(self, d):\n        with open(os.path.join(d, 'adapter_config.json'), 'w') as f:\n            json.dump(self.d, f)\n",
    )
    .unwrap();
    Some(root)
}

/// The tiny test model.
pub fn tiny_spec() -> TinySpec {
    TinySpec {
        seed: 3,
        num_merges: 64,
        hidden_size: 32,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 8,
        intermediate_size: 64,
        max_position_embeddings: 512,
        tie_word_embeddings: true,
    }
}

/// A checkpoint of `spec` written to `dir`, with `rope_theta` also at the top level of `config.json`
/// (transformers below 5 reads it there).
pub fn write_checkpoint(dir: &Path, spec: &TinySpec) -> PolicyModel {
    let model = PolicyModel::tiny(spec, DType::F32, &Device::Cpu).unwrap();
    model.save_hf(dir).unwrap();
    let path = dir.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    if cfg.get("rope_theta").is_none() {
        let theta = cfg["rope_parameters"]["rope_theta"].clone();
        cfg["rope_theta"] = if theta.is_null() { 1e6.into() } else { theta };
    }
    std::fs::write(&path, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
    model
}

pub fn start_server(python: &str, model_dir: &Path, work: &Path) -> (Server, String) {
    let port = free_port();
    let bin = write_uv_shim(work, python);
    let log = work.join("server.log");
    let out = std::fs::File::create(&log).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new(python);
    cmd.args([
        "-m",
        "tx.tinker.api",
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
    ])
    .arg("--base-model")
    .arg(model_dir)
    .args(["--backend", "jax"])
    .arg("--checkpoints-base")
    .arg(work.join("checkpoints"))
    .arg("--database-url")
    .arg(format!("sqlite:///{}", work.join("tinker.db").display()))
    .env("PATH", path)
    .env("JAX_PLATFORMS", "cpu")
    .env("PYTHONUNBUFFERED", "1")
    .current_dir(work)
    .stdout(out.try_clone().unwrap())
    .stderr(out);
    if let Some(shim) = peft_stand_in(work, python) {
        cmd.env("PYTHONPATH", shim);
    }
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {python}: {e}"));
    (Server { child, log }, format!("http://127.0.0.1:{port}"))
}

pub async fn wait_healthy(url: &str, server: &mut Server) {
    let start = Instant::now();
    let http = harness_openai::http_client();
    loop {
        if let Ok(r) = http.get(format!("{url}/api/v1/healthz")).send().await
            && r.status().is_success()
        {
            return;
        }
        if let Ok(Some(status)) = server.child.try_wait() {
            panic!(
                "the Tinker API exited with {status}:\n{}",
                std::fs::read_to_string(&server.log).unwrap_or_default()
            );
        }
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "the Tinker API did not come up in 180 s:\n{}",
            std::fs::read_to_string(&server.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Rescue-training-shaped groups sampled from the checkpoint itself (so `q` is the base
/// model's): per task, trajectories of two policy turns with a harness system prompt, the
/// task's instruction and an observation as context. Rewards are set here (half the
/// trajectories, the even-numbered ones, succeed) since a random tiny model solves nothing.
/// `new_tokens(j)` caps each turn of trajectory `j`.
pub fn groups(
    policy: &CandlePolicy,
    instructions: &[&str],
    per_task: u64,
    new_tokens: &dyn Fn(u64) -> usize,
) -> Vec<Group> {
    let msg = |role, source| TrajectoryMessage {
        role,
        source,
        content: String::new(),
        name: None,
        hook: None,
    };
    let sampling = TurnSampling {
        temperature: 1.0,
        top_p: 1.0,
        top_k: None,
        greedy: false,
    };
    let mut out = Vec::new();
    for (t, instruction) in instructions.iter().enumerate() {
        let mut trajectories = Vec::new();
        for j in 0..per_task {
            let mut messages = vec![
                ChatMessage::system("You solve database tasks with tools."),
                ChatMessage::user(*instruction),
            ];
            let mut turns = Vec::new();
            for k in 0..2u64 {
                let turn = policy
                    .generate_blocking(PolicyRequest {
                        messages: messages.clone(),
                        tools: vec![],
                        max_new_tokens: new_tokens(j),
                        max_context_tokens: 400,
                        sampling: SamplingParams::default(),
                        seed: 1000 * t as u64 + 10 * j + k,
                    })
                    .unwrap();
                messages.push(ChatMessage::assistant(turn.text.clone()));
                messages.push(ChatMessage::user("observation: 3 rows"));
                turns.push(PolicyTurnRecord {
                    message_index: Some(2 + 2 * k as usize),
                    context_tokens: turn.context_tokens,
                    tokens: turn.tokens,
                    logprobs: turn.logprobs,
                    finish: turn.finish,
                    sampling: Some(sampling),
                });
            }
            trajectories.push(Trajectory {
                task_id: format!("task{t}"),
                env: "db".into(),
                harness_id: harness_core::HarnessId(format!("S{j}")),
                harness_name: format!("S{j}"),
                seed: j,
                policy: "tiny".into(),
                messages: vec![
                    msg(Role::System, Source::Harness),
                    msg(Role::User, Source::Task),
                    msg(Role::Assistant, Source::Policy),
                    msg(Role::User, Source::Environment),
                    msg(Role::Assistant, Source::Policy),
                    msg(Role::User, Source::Environment),
                ],
                turns,
                final_answer: None,
                outcome: Outcome {
                    reward: (j % 2 == 0) as u8 as f32,
                    details: serde_json::Value::Null,
                },
                termination: Termination::PolicyFinished,
                policy_version: None,
                counts: Default::default(),
            });
        }
        out.push(Group {
            task: Task::new(format!("task{t}"), "db", Split::Train, *instruction, 0),
            trajectories,
            origin: GroupOrigin::Rescue,
        });
    }
    out
}

/// grpo-candle's log-prob of each scored token of the learner's sequences.
pub fn candle_logprobs(model: &Qwen, batch: &harness_tinker::Batch) -> Vec<f64> {
    let mut out = Vec::new();
    for s in &batch.sequences {
        let n = s.ids.len() - 1;
        let ids = Tensor::from_vec(s.ids[..n].to_vec(), (1, n), &Device::Cpu).unwrap();
        let hidden = model.forward_hidden(&ids).unwrap();
        let logits = model.logits(&hidden).unwrap().squeeze(0).unwrap();
        let lsm = candle_nn_log_softmax(&logits);
        for &p in &s.policy_pos {
            out.push(f64::from(lsm[p - 1][s.ids[p] as usize]));
        }
    }
    out
}

pub fn candle_nn_log_softmax(logits: &Tensor) -> Vec<Vec<f32>> {
    let rows: Vec<Vec<f32>> = logits.to_dtype(DType::F32).unwrap().to_vec2().unwrap();
    rows.into_iter()
        .map(|r| {
            let m = r.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let z = r.iter().map(|x| ((x - m) as f64).exp()).sum::<f64>().ln() as f32 + m;
            r.into_iter().map(|x| x - z).collect()
        })
        .collect()
}

/// Mean log-prob per trajectory (task, trajectory order) from per-token values in batch order.
pub fn per_trajectory_means(batch: &harness_tinker::Batch, v: &[f64]) -> Vec<(f64, f64)> {
    // (advantage, mean logp) per sequence; sequences of one trajectory share its advantage.
    let mut out = Vec::new();
    let mut k = 0;
    for s in &batch.sequences {
        let m = s.policy_pos.len();
        out.push((s.advantage, v[k..k + m].iter().sum::<f64>() / m as f64));
        k += m;
    }
    out
}
