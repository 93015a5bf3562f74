//! Smoke test of `examples/rescue_router.rs`: rescue training with the Adaptive Harness Router
//! on a reduced configuration (one update of one task, two rollouts, one validation task, one
//! short call per episode), with the built-in profiler and voters, and with an LLM profiler and
//! LLM voters on harness-openai's own OpenAI-compatible server started in this process with a
//! scripted backend. Each run checks the rollout run files and the router's calibrations.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use async_trait::async_trait;
use common::{example_binary, fresh_dir, jsonl};
use harness_core::{ChatMessage, FinishReason, ToolSpec};
use harness_openai::{
    PromptEncoder, ServerConfig, ServerHandle, ServerState, TokenGenerator, TokenOutput,
    TokenRequest,
};
use serde_json::json;

/// Runs the example in a fresh `name` folder with `extra` flags; returns its stdout and the
/// run directory.
fn run_example(name: &str, extra: &[String]) -> (String, std::path::PathBuf) {
    let out = fresh_dir(name);
    // One update with the calibration before it and the one with the final policy; Top-2 of
    // the app world's three siblings rescue a task whose two H0 rollouts fail.
    let config = json!({
        "seed": 7,
        "updates": 1,
        "group_size": 2,
        "batch_tasks": 1,
        "strategy": {"kind": "router", "allocation": {"kind": "top_k"}},
        "calibrate_every": 0,
        "eval_every": 0,
        "checkpoint_every": 1,
        "concurrency": 4
    });
    let config_path = out.join("rescue.json");
    std::fs::write(&config_path, config.to_string()).expect("write the config");
    let run_dir = out.join("run");
    let run = Command::new(example_binary("rescue_router"))
        .arg("--config")
        .arg(&config_path)
        .arg("--run-dir")
        .arg(&run_dir)
        .args(["--tasks", "1", "--validation-tasks", "1", "--voters", "2"])
        .args(["--max-calls", "1", "--max-output", "4"])
        .args(extra)
        .env("RUST_LOG", "warn")
        .output()
        .expect("the example runs");
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(
        run.status.success(),
        "rescue_router failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    (stdout, run_dir)
}

/// The run files, the update and calibration lines, the calibrations and the summary.
fn check_run(stdout: &str, run_dir: &Path) {
    let metrics = jsonl(&run_dir.join("metrics.jsonl"));
    let updates: Vec<_> = metrics.iter().filter(|m| m["kind"] == "update").collect();
    assert_eq!(updates.len(), 1, "{metrics:?}");
    assert!(updates[0]["eg_rate"].is_number(), "{}", updates[0]);
    assert!(
        updates[0]["rescue_trigger_rate"].is_number(),
        "{}",
        updates[0]
    );
    let calibrations = metrics
        .iter()
        .filter(|m| m["kind"] == "calibration")
        .count();
    assert_eq!(calibrations, 2, "before training and with the final policy");
    for file in [
        "groups.jsonl",
        "trajectories.jsonl",
        "cost.json",
        "calibrations/calibration-0000.json",
        "calibrations/calibration-0001.json",
        "checkpoints/latest",
    ] {
        assert!(run_dir.join(file).exists(), "the run lacks {file}");
    }
    assert!(stdout.contains("rescue_trigger_rate"), "{stdout}");
    assert!(stdout.contains("calibrations: 2"), "{stdout}");
}

#[test]
fn rescue_router_trains_with_builtin_profiler_and_voters() {
    let (stdout, run_dir) = run_example("rescue_router_builtin", &[]);
    check_run(&stdout, &run_dir);
}

/// One token per byte; messages as `<|role|>content\n`, then `<|assistant|>`.
struct Bytes;

impl PromptEncoder for Bytes {
    fn encode(
        &self,
        messages: &[ChatMessage],
        _tools: &[ToolSpec],
    ) -> harness_core::Result<Vec<u32>> {
        let mut text = String::new();
        for m in messages {
            text.push_str(&format!("<|{:?}|>{}\n", m.role, m.content));
        }
        text.push_str("<|assistant|>");
        Ok(text.bytes().map(u32::from).collect())
    }

    fn decode(&self, tokens: &[u32]) -> harness_core::Result<String> {
        let bytes: Vec<u8> = tokens
            .iter()
            .filter_map(|t| u8::try_from(*t).ok())
            .collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// Answers a voter prompt with its candidates in the order shown and a profiler prompt with
/// one entry citing the first task shown.
struct RouterRoles;

fn answer(prompt: &str) -> String {
    let ids: Vec<&str> = prompt
        .lines()
        .filter_map(|l| l.strip_prefix("- id "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    if !ids.is_empty() {
        return json!({"ranking": ids.into_iter().take(4).collect::<Vec<_>>()}).to_string();
    }
    let task = prompt
        .lines()
        .find_map(|l| l.strip_prefix("=== task "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_default();
    json!({"prefer": [{"when": "a listing spans pages", "behavior": "reads every page", "support": [task]}], "avoid": []})
        .to_string()
}

#[async_trait]
impl TokenGenerator for RouterRoles {
    fn vocab_size(&self) -> usize {
        256
    }

    async fn generate(&self, request: TokenRequest) -> harness_core::Result<TokenOutput> {
        let mut tokens: Vec<u32> = answer(&Bytes.decode(&request.prompt)?)
            .bytes()
            .map(u32::from)
            .collect();
        let finish = if tokens.len() > request.max_new_tokens {
            tokens.truncate(request.max_new_tokens);
            FinishReason::Length
        } else {
            FinishReason::Stop
        };
        Ok(TokenOutput {
            logprobs: vec![-0.1; tokens.len()],
            tokens,
            finish,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rescue_router_trains_with_llm_voters_on_a_local_openai_compatible_server() {
    const MODEL: &str = "scripted-router-model";
    let state = Arc::new(ServerState::new(
        ServerConfig::new(MODEL, 1 << 20),
        Arc::new(Bytes),
        Arc::new(RouterRoles),
    ));
    let server = ServerHandle::spawn(SocketAddr::from(([127, 0, 0, 1], 0)), state.clone())
        .await
        .expect("bind 127.0.0.1");
    let extra = vec![
        "--llm".to_string(),
        format!("{}/v1", server.base_url()),
        "--llm-model".to_string(),
        MODEL.to_string(),
        // No key in this variable: the client sends no auth header.
        "--llm-key-env".to_string(),
        "HARNESS_S_SMOKE_NO_SUCH_API_KEY".to_string(),
    ];
    let (stdout, run_dir) =
        tokio::task::spawn_blocking(move || run_example("rescue_router_llm", &extra))
            .await
            .expect("the run's thread");
    check_run(&stdout, &run_dir);
    // The all-failure task was routed by the LLM voters over HTTP.
    assert!(state.stats().requests > 0, "{stdout}");
    assert!(stdout.contains(r#""voter":{"requests":"#), "{stdout}");
    server.shutdown().await.expect("server stops");
}
