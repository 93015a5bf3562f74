//! Remote rollouts: episodes sample from a served model (harness-openai's `RemotePolicy`
//! against its local OpenAI-compatible server, the SGLang API, backed by the tiny candle
//! model), the learner trains an in-process copy, and after each update the loop saves the
//! weights and makes the engine reload them. Each rollout records the version it came from, and
//! afterwards the engine samples exactly like the trained weights.

#[path = "../../openai/examples/support/candle.rs"]
mod candle;
mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use candle_core::{DType, Device};
use common::CoinEnv;
use futures::FutureExt;
use grpo_candle::train::learner::CandleLearner;
use grpo_candle::train::trainer::TrainerConfig;
use grpo_candle::{CandlePolicy, PolicyModel, PolicyOptions, TinySpec};
use harness_core::{ChatMessage, Harness, Policy, PolicyRequest, SamplingParams, Split, Task};
use harness_openai::{
    EngineKind, RemotePolicy, RemotePolicyConfig, ServerConfig, ServerHandle, ServerState,
};
use harness_pool::SiblingPool;
use harness_rollout::{GroupRecord, RescueConfig, RescueTrainer, SaveAndReload, TrainingSetup};

fn tiny() -> PolicyModel {
    let spec = TinySpec {
        num_merges: 16,
        hidden_size: 32,
        num_layers: 1,
        intermediate_size: 64,
        head_dim: 8,
        seed: 3,
        ..TinySpec::default()
    };
    PolicyModel::tiny(&spec, DType::F32, &Device::Cpu).unwrap()
}

fn harness(name: &str) -> Harness {
    let mut h = Harness::new(name, format!("You are {name}. Call submit."));
    h.limits.max_model_calls = 1;
    h.limits.max_output_tokens = 6;
    h
}

fn probe() -> PolicyRequest {
    PolicyRequest {
        messages: vec![ChatMessage::user("Say something.")],
        tools: Vec::new(),
        max_new_tokens: 8,
        max_context_tokens: 4096,
        sampling: SamplingParams::default(),
        seed: 17,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_rollouts_sync_weights_after_every_update_and_record_their_version() {
    let served = tiny();
    let generator = Arc::new(candle::CandleGenerator::new(served.clone(), 16));
    let mut server_config =
        ServerConfig::new("tiny", served.model.config().max_position_embeddings);
    // The trainer saves its checkpoints in a temporary folder.
    server_config.reload_root = Some(std::env::temp_dir());
    let state = ServerState::new(
        server_config,
        Arc::new(candle::CandleEncoder::new(served.clone())),
        generator.clone(),
    )
    .with_loader(Arc::new(candle::CandleLoader(generator)));
    let server = ServerHandle::spawn(SocketAddr::from(([127, 0, 0, 1], 0)), Arc::new(state))
        .await
        .unwrap();
    let mut config = RemotePolicyConfig::new(server.base_url(), "tiny", EngineKind::Sglang);
    config.endpoint.timeout = Duration::from_secs(60);
    let remote = Arc::new(
        RemotePolicy::new(config, Arc::new(candle::CandleEncoder::new(served.clone()))).unwrap(),
    );

    // The trainer's copy of the same weights.
    let trained = Arc::new(CandlePolicy::new(tiny(), PolicyOptions::default()));
    let weights = tempfile::tempdir().unwrap();
    let (saver, reloader) = (trained.clone(), remote.clone());
    let sync = SaveAndReload::new(
        "sglang-reload",
        weights.path(),
        move |dir| {
            saver.save_hf(dir).map_err(|e| harness_core::Error::Policy {
                policy: "candle".into(),
                message: e.to_string(),
            })
        },
        move |dir| {
            let remote = reloader.clone();
            async move {
                remote
                    .reload_weights(&dir)
                    .await
                    .map_err(|e| e.into_policy("remote"))
            }
            .boxed()
        },
    );

    let pool = SiblingPool::starter(harness("H0"), [], serde_json::Value::Null).unwrap();
    let tasks: Vec<Task> = (0..2)
        .map(|i| Task::new(format!("c{i}"), "coin", Split::Train, "Submit.", i))
        .collect();
    let cfg = RescueConfig::from_json(
        r#"{"seed": 2, "updates": 2, "group_size": 4, "batch_tasks": 2, "checkpoint_every": 0,
            "strategy": {"kind": "grpo"}}"#,
        None,
    )
    .unwrap();
    let setup = TrainingSetup {
        policy: remote.clone(),
        environments: vec![Arc::new(CoinEnv)],
        pool,
        train_tasks: tasks,
        validation_tasks: Vec::new(),
        learner: Box::new(CandleLearner::new(trained.clone(), TrainerConfig::default()).unwrap()),
        selector: None,
        calibrator: None,
        weight_sync: Some(Arc::new(sync)),
    };
    let dir = tempfile::tempdir().unwrap();
    let before = remote.generate(probe()).await.unwrap();
    let mut trainer = RescueTrainer::new(cfg, setup, dir.path()).unwrap();
    trainer.run().await.unwrap();

    let groups: Vec<GroupRecord> = std::fs::read_to_string(dir.path().join("groups.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let versions: Vec<u64> = groups.iter().map(|g| g.policy_version).collect();
    assert_eq!(versions, vec![0, 0, 1, 1]);
    assert_eq!(trainer.policy_version(), 2);
    // The engine now serves the trained weights.
    let after = remote.generate(probe()).await.unwrap();
    let want = trained.generate(probe()).await.unwrap();
    assert_eq!(after.tokens, want.tokens);
    assert_ne!(
        after.logprobs, before.logprobs,
        "the reload changed nothing"
    );
    for (a, b) in after.logprobs.iter().zip(&want.logprobs) {
        assert!((a - b).abs() <= 1e-4, "{a} vs {b}");
    }
    server.shutdown().await.unwrap();
}
