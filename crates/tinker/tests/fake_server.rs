//! The learner and client against an in-process fake Tinker server: the requests it sends, the
//! gradient its weights encode (checked against grpo-candle's autograd), and faults.

mod common;

use std::time::Duration;

use candle_core::{Device, Tensor, Var};
use common::{
    AdapterSpec, Fake, FakeOptions, Fault, Reduction, adapter_archive, fake_logprob, group,
    lora_a_value, lora_b_value, read_safetensors,
};
use grpo_candle::train::objective::{GrpoConfig, TokenTerms, group_advantages, grpo_loss};
use harness_core::{Group, Learner, RescueObjective, TokenScoring};
use harness_rollout::{SyncRetry, WeightSync, sync_with_retry};
use harness_tinker::{
    Error, ObjectiveMode, RetryPolicy, ServerKind, SyncTarget, TinkerClient, TinkerConfig,
    TinkerLearner, TinkerLearnerConfig, TinkerWeightSync, build_batch,
};
use serde_json::Value;

fn client(fake: &Fake) -> TinkerClient {
    let mut cfg = TinkerConfig::new(fake.url());
    cfg.timeout = Duration::from_millis(400);
    cfg.poll_request_timeout = Duration::from_millis(400);
    cfg.poll_interval = Duration::from_millis(5);
    cfg.future_timeout = Duration::from_millis(600);
    cfg.retry = RetryPolicy {
        max_attempts: 3,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(40),
    };
    TinkerClient::new(cfg).unwrap()
}

fn learner_cfg(server: ServerKind) -> TinkerLearnerConfig {
    let mut cfg = TinkerLearnerConfig::new("tiny-base", server);
    cfg.lora.rank = 4;
    cfg.adam.learning_rate = 1e-3;
    cfg.heartbeat_seconds = 0.05;
    cfg
}

fn batch() -> Vec<Group> {
    vec![
        group("a", &[1.0, 0.0, 0.0], 100),
        group("b", &[0.0, 0.0], 200), // uniform: zero advantage
        group("c", &[1.0, 0.0], 300),
    ]
}

fn floats(v: &Value) -> Vec<f64> {
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// The reference: `d(-J)/d logp_new` per scored token from grpo-candle's objective by candle
/// autograd, with `pi_old = pi_theta =` the fake's log-probs (the learner's first update is
/// taken at the pre-update policy), in the batch's token order.
fn candle_gradient(groups: &[Group]) -> (f64, Vec<f64>) {
    let cfg = GrpoConfig::default();
    let b = build_batch(groups, &Default::default()).unwrap();
    let (mut lp, mut q, mut adv, mut coef) = (vec![], vec![], vec![], vec![]);
    for s in &b.sequences {
        let a = group_advantages(&groups[s.task].rewards(), cfg.adv_eps);
        // Which trajectory: by advantage value within the group is ambiguous, so recompute
        // from the sequence's own advantage (checked equal to grpo-candle's below).
        assert!(a.iter().any(|&x| (f64::from(x) - s.advantage).abs() < 1e-6));
        for (&p, &lq) in s.policy_pos.iter().zip(&s.rollout_logp) {
            lp.push(fake_logprob(s.ids[p], p - 1, 0) as f32);
            q.push(lq as f32);
            adv.push(s.advantage as f32);
            coef.push((1.0 / (groups.len() as f64 * b.task_tokens[s.task] as f64)) as f32);
        }
    }
    let t = lp.len();
    let dev = Device::Cpu;
    let mk = |v: Vec<f32>| Tensor::from_vec(v, t, &dev).unwrap();
    let new = Var::from_tensor(&mk(lp.clone())).unwrap();
    let terms = TokenTerms {
        logp_old: mk(lp),
        logp_rollout: mk(q),
        advantage: mk(adv),
        coef: mk(coef),
    };
    let (loss, _) = grpo_loss(new.as_tensor(), &terms, &cfg).unwrap();
    let grads = loss.backward().unwrap();
    let g: Vec<f32> = grads.get(new.as_tensor()).unwrap().to_vec1().unwrap();
    (
        f64::from(loss.to_scalar::<f32>().unwrap()),
        g.into_iter().map(f64::from).collect(),
    )
}

/// Per scored token, in batch order, the value of per-position tensor `key` of the request.
fn scored_inputs(groups: &[Group], data: &[Value], key: &str) -> Vec<f64> {
    let b = build_batch(groups, &Default::default()).unwrap();
    assert_eq!(data.len(), b.sequences.len());
    let mut out = vec![];
    for (s, d) in b.sequences.iter().zip(data) {
        let v = floats(&d["loss_fn_inputs"][key]);
        assert_eq!(v.len(), s.ids.len() - 1);
        // Every position that is not a generated token has weight/advantage 0.
        for (i, x) in v.iter().enumerate() {
            if !s.policy_pos.contains(&(i + 1)) && key != "logprobs" {
                assert_eq!(*x, 0.0, "position {i} is context, not a policy token");
            }
        }
        out.extend(s.policy_pos.iter().map(|&p| v[p - 1]));
    }
    out
}

#[tokio::test]
async fn the_tinker_learner_refuses_the_rescue_objectives_beyond_the_paper() {
    let fake = Fake::start(Reduction::Sum).await;
    let mut learner = TinkerLearner::connect(client(&fake), learner_cfg(ServerKind::Tinker))
        .await
        .unwrap();
    for objective in [RescueObjective::Masked, RescueObjective::H0] {
        let err = learner
            .check_rescue_objective(objective)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("rescue_objective = \"{objective}\""))
                && err.contains("generating")
                && err.contains(learner.name()),
            "{err}"
        );
    }
    // Control: the paper's objective is accepted.
    learner
        .check_rescue_objective(RescueObjective::Generating)
        .unwrap();
    // A masked scoring handed over anyway is refused before anything is sent...
    let groups = batch();
    let mut scoring: Vec<Vec<TokenScoring>> = groups
        .iter()
        .map(|g| vec![TokenScoring::Generating; g.trajectories.len()])
        .collect();
    scoring[0][0] = TokenScoring::FromTurn { first_turn: 1 };
    let sent = fake.endpoints().len();
    assert!(learner.update_scored(&groups, &scoring).await.is_err());
    assert_eq!(fake.endpoints().len(), sent);
    // ...and the paper's scoring goes through as an ordinary update.
    scoring[0][0] = TokenScoring::Generating;
    assert!(
        learner
            .update_scored(&groups, &scoring)
            .await
            .unwrap()
            .applied
    );
}

#[tokio::test]
async fn hosted_tinker_gets_cross_entropy_weights_equal_to_minus_the_eq15_gradient() {
    let fake = Fake::start(Reduction::Sum).await;
    let mut learner = TinkerLearner::connect(client(&fake), learner_cfg(ServerKind::Tinker))
        .await
        .unwrap();
    let groups = batch();
    let report = learner.update(&groups).await.unwrap();
    assert_eq!(
        fake.endpoints(),
        [
            "get_server_capabilities",
            "create_session",
            "create_model",
            "forward",
            "forward_backward",
            "optim_step"
        ]
    );
    // The forward pass scores exactly the generated tokens: weight 1 there, 0 on context.
    let fwd = &fake.requests("forward")[0]["forward_input"];
    assert_eq!(fwd["loss_fn"], "cross_entropy");
    let mask = scored_inputs(&groups, fwd["data"].as_array().unwrap(), "weights");
    assert!(mask.iter().all(|&w| w == 1.0));
    // 3 tasks; a: 3 trajectories x 2 sequences, b: 2 x 2, c: 2 x 2; 5 scored tokens each.
    assert_eq!(fwd["data"].as_array().unwrap().len(), 14);
    assert_eq!(report.policy_tokens, 35);
    let fb = &fake.requests("forward_backward")[0]["forward_backward_input"];
    assert_eq!(fb["loss_fn"], "cross_entropy");
    let weights = scored_inputs(&groups, fb["data"].as_array().unwrap(), "weights");
    let (candle_loss, grad) = candle_gradient(&groups);
    assert_eq!(weights.len(), grad.len());
    for (k, (w, g)) in weights.iter().zip(&grad).enumerate() {
        assert!(
            (w + g).abs() < 1e-6,
            "token {k}: weight {w}, candle gradient {g}"
        );
    }
    // The uniform group contributes nothing.
    assert!(weights[15..25].iter().all(|&w| w == 0.0));
    assert!(
        (report.loss - candle_loss).abs() < 1e-6,
        "{} vs {candle_loss}",
        report.loss
    );
    // The server's loss is sum -w logp: what the learner predicted.
    let (s, e) = (
        report.extra["server_surrogate"],
        report.extra["expected_surrogate"],
    );
    assert!((s - e).abs() < 1e-9, "{s} vs {e}");
    assert_eq!(report.extra["logprob_drift"], 0.0);
    assert!(report.applied);
    assert_eq!((report.optimizer_steps, report.policy_version), (1, 1));
    let adam = &fake.requests("optim_step")[0]["adam_params"];
    assert_eq!(adam["learning_rate"], 1e-3);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(
        fake.state.lock().unwrap().heartbeats >= 1,
        "the session is kept alive"
    );
}

#[tokio::test]
async fn skyrl_gets_importance_sampling_that_undoes_its_per_example_normalisation() {
    let fake = Fake::start(Reduction::Skyrl).await;
    let mut learner = TinkerLearner::connect(client(&fake), learner_cfg(ServerKind::SkyrlTx))
        .await
        .unwrap();
    let groups = batch();
    let report = learner.update(&groups).await.unwrap();
    let fb = &fake.requests("forward_backward")[0]["forward_backward_input"];
    assert_eq!(fb["loss_fn"], "importance_sampling");
    let data = fb["data"].as_array().unwrap();
    let b = build_batch(&groups, &Default::default()).unwrap();
    let n = data.len() as f64;
    let adv = scored_inputs(&groups, data, "advantages");
    let mask = scored_inputs(&groups, data, "weights");
    let sampling = scored_inputs(&groups, data, "logprobs");
    let (candle_loss, grad) = candle_gradient(&groups);
    let mut k = 0;
    for s in &b.sequences {
        let m = s.policy_pos.len() as f64;
        for &p in &s.policy_pos {
            // SkyRL's gradient of this token: -mask * ratio * adv / (sum mask) / N, ratio 1.
            let applied = -mask[k] * adv[k] / m / n;
            assert!(
                (applied - grad[k]).abs() < 1e-6,
                "token {k}: {applied} vs {}",
                grad[k]
            );
            assert!((sampling[k] - fake_logprob(s.ids[p], p - 1, 0)).abs() < 1e-12);
            k += 1;
        }
    }
    // On-policy, the surrogate SkyRL reports is -J itself.
    let s = report.extra["server_surrogate"];
    assert!(
        (s - report.loss).abs() < 1e-9 && (s - candle_loss).abs() < 1e-6,
        "{s} vs {}",
        report.loss
    );
}

#[tokio::test]
async fn server_ppo_sends_asymmetric_thresholds_and_is_refused_on_skyrl() {
    let mut cfg = learner_cfg(ServerKind::SkyrlTx);
    cfg.objective = ObjectiveMode::ServerPpo;
    let e = cfg.validate().unwrap_err().to_string();
    assert!(e.contains("objective") && e.contains("0.8 / 1.2"), "{e}");

    let fake = Fake::start(Reduction::Sum).await;
    let mut cfg = learner_cfg(ServerKind::Tinker);
    cfg.objective = ObjectiveMode::ServerPpo;
    let mut learner = TinkerLearner::connect(client(&fake), cfg).await.unwrap();
    let groups = batch();
    let report = learner.update(&groups).await.unwrap();
    assert_eq!(fake.requests("forward").len(), 0, "one call fewer");
    let fb = &fake.requests("forward_backward")[0]["forward_backward_input"];
    assert_eq!(fb["loss_fn"], "ppo");
    let th = |k: &str| fb["loss_fn_config"][k].as_f64().unwrap();
    assert!((th("clip_low_threshold") - 0.80).abs() < 1e-12);
    assert!((th("clip_high_threshold") - 1.28).abs() < 1e-12);
    let data = fb["data"].as_array().unwrap();
    let q = scored_inputs(&groups, data, "logprobs");
    let b = build_batch(&groups, &Default::default()).unwrap();
    let want_q: Vec<f64> = b
        .sequences
        .iter()
        .flat_map(|s| s.rollout_logp.clone())
        .collect();
    assert_eq!(
        q, want_q,
        "ppo's ratio is taken against the rollout log-probs"
    );
    assert!(report.applied && report.loss.is_finite());
}

#[tokio::test]
async fn a_500_is_retried_and_the_gradient_is_applied_once() {
    let fake = Fake::start(Reduction::Sum).await;
    let mut learner = TinkerLearner::connect(client(&fake), learner_cfg(ServerKind::Tinker))
        .await
        .unwrap();
    fake.inject("forward_backward", Fault::Status(500));
    fake.inject("optim_step", Fault::Status(503));
    let report = learner.update(&batch()).await.unwrap();
    assert!(report.applied);
    assert_eq!(fake.requests("forward_backward").len(), 2);
    let model = learner.model().model_id();
    assert_eq!(fake.model(&model), (1, 1), "one gradient, one step");
}

#[tokio::test]
async fn retries_run_out_with_a_clear_error_and_no_step() {
    let fake = Fake::start(Reduction::Sum).await;
    let mut learner = TinkerLearner::connect(client(&fake), learner_cfg(ServerKind::Tinker))
        .await
        .unwrap();
    for _ in 0..3 {
        fake.inject("forward_backward", Fault::Status(500));
    }
    let e = learner.update(&batch()).await.unwrap_err().to_string();
    assert!(
        e.contains("forward_backward") && e.contains("HTTP 500") && e.contains("3 attempt"),
        "{e}"
    );
    assert_eq!(learner.optimizer_steps(), 0);
    assert_eq!(fake.model(&learner.model().model_id()), (0, 0));
}

#[tokio::test]
async fn a_dropped_answer_is_retried_only_where_it_cannot_apply_twice() {
    let fake = Fake::start(Reduction::Sum).await;
    let mut learner = TinkerLearner::connect(client(&fake), learner_cfg(ServerKind::Tinker))
        .await
        .unwrap();
    // forward changes nothing: retried.
    fake.inject("forward", Fault::DropAfterApply);
    learner.update(&batch()).await.unwrap();
    assert_eq!(fake.requests("forward").len(), 2);
    // forward_backward was applied but its answer lost: not retried, clear error.
    fake.inject("forward_backward", Fault::DropAfterApply);
    let e = learner.update(&batch()).await.unwrap_err();
    assert!(matches!(e, harness_core::Error::Learner { .. }));
    let e = e.to_string();
    assert!(
        e.contains("forward_backward") && e.contains("not retried"),
        "{e}"
    );
    let model = learner.model().model_id();
    assert_eq!(
        fake.model(&model),
        (2, 1),
        "the lost call was applied once, never twice"
    );
    assert_eq!(
        learner.optimizer_steps(),
        1,
        "no step counted for the failed update"
    );
}

#[tokio::test]
async fn a_timeout_is_retried_for_forward_and_fatal_for_optim_step() {
    let fake = Fake::start(Reduction::Sum).await;
    let mut learner = TinkerLearner::connect(client(&fake), learner_cfg(ServerKind::Tinker))
        .await
        .unwrap();
    fake.inject("forward", Fault::Delay(Duration::from_millis(700)));
    fake.inject("optim_step", Fault::Delay(Duration::from_millis(700)));
    let e = learner.update(&batch()).await.unwrap_err().to_string();
    assert_eq!(
        fake.requests("forward").len(),
        2,
        "the slow forward was retried"
    );
    assert!(
        e.contains("optim_step") && e.contains("timeout") && e.contains("not retried"),
        "{e}"
    );
    assert_eq!(learner.optimizer_steps(), 0);
}

#[tokio::test]
async fn failed_and_endless_futures_end_in_clear_errors() {
    let fake = Fake::start(Reduction::Sum).await;
    let mut learner = TinkerLearner::connect(client(&fake), learner_cfg(ServerKind::Tinker))
        .await
        .unwrap();
    fake.inject("optim_step", Fault::FailFuture("adapter exploded".into()));
    let e = learner.update(&batch()).await.unwrap_err().to_string();
    assert!(
        e.contains("optim_step")
            && e.contains("failed on the server")
            && e.contains("adapter exploded"),
        "{e}"
    );
    assert_eq!(learner.optimizer_steps(), 0);
    // The failed update's gradient may still be on the server: this learner takes no more.
    let n = fake.requests("forward_backward").len();
    let e = learner.update(&batch()).await.unwrap_err().to_string();
    assert!(
        e.contains("no update after a failed one") && e.contains("load the latest checkpoint"),
        "{e}"
    );
    assert_eq!(
        fake.requests("forward_backward").len(),
        n,
        "nothing was sent"
    );

    let mut learner = TinkerLearner::connect(client(&fake), learner_cfg(ServerKind::Tinker))
        .await
        .unwrap();
    fake.inject("forward", Fault::NeverComplete);
    let e = learner.update(&batch()).await.unwrap_err().to_string();
    assert!(
        e.contains("forward") && e.contains("did not complete within"),
        "{e}"
    );
    assert_eq!(learner.optimizer_steps(), 0);
}

#[tokio::test]
async fn a_server_that_reduces_the_loss_otherwise_is_refused_before_its_optimizer_step() {
    // Hosted Tinker's reduction (sums, `loss:sum`) behind a learner configured for SkyRL's.
    let fake = Fake::start(Reduction::Sum).await;
    let mut learner = TinkerLearner::connect(client(&fake), learner_cfg(ServerKind::SkyrlTx))
        .await
        .unwrap();
    let e = learner.update(&batch()).await.unwrap_err().to_string();
    assert!(
        e.contains("does not reduce the loss")
            && e.contains("SkyrlTx")
            && e.contains("no optimizer step"),
        "{e}"
    );
    let model = learner.model().model_id();
    assert_eq!(fake.model(&model), (1, 0), "a gradient but no step");
    assert_eq!(learner.optimizer_steps(), 0);
    assert!(learner.update(&batch()).await.is_err());
    assert_eq!(fake.model(&model), (1, 0), "and nothing more");
}

#[tokio::test]
async fn a_restarted_server_is_waited_for_and_then_reported_not_skipped() {
    let fake = Fake::start(Reduction::Sum).await;
    let mut c = client(&fake);
    let mut learner = TinkerLearner::connect(c.clone(), learner_cfg(ServerKind::Tinker))
        .await
        .unwrap();
    learner.update(&batch()).await.unwrap();
    // Down for a moment (connections refused, retried), back without the model.
    let fake2 = fake.restart(Duration::from_millis(30)).await;
    let e = learner.update(&batch()).await.unwrap_err().to_string();
    assert!(
        e.contains("forward") && e.contains("Model not found") && e.contains("404"),
        "{e}"
    );
    assert_eq!(learner.optimizer_steps(), 1);
    // The client rides out a short outage.
    c = c.detached().unwrap();
    let caps = c.get_server_capabilities().await.unwrap();
    assert_eq!(caps.supported_models.len(), 1);
    drop(fake2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_save_on_the_server_and_resume_into_a_new_model() {
    let fake = Fake::start(Reduction::Sum).await;
    let mut a = TinkerLearner::connect(client(&fake), learner_cfg(ServerKind::Tinker))
        .await
        .unwrap();
    a.update(&batch()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    a.save_checkpoint(dir.path()).unwrap();
    let saved: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("tinker_learner.json")).unwrap())
            .unwrap();
    let path = saved["weights_path"].as_str().unwrap().to_string();
    assert!(
        path.starts_with(&format!(
            "tinker://{}/weights/harness-step1-",
            a.model().model_id()
        )),
        "{path}"
    );

    let mut b = TinkerLearner::connect(client(&fake), learner_cfg(ServerKind::Tinker))
        .await
        .unwrap();
    b.load_checkpoint(dir.path()).unwrap();
    assert_eq!((b.optimizer_steps(), b.policy_version()), (1, 1));
    assert_eq!(fake.requests("load_weights")[0]["path"], path.as_str());
    assert_eq!(
        fake.model(&b.model().model_id()).1,
        1,
        "the server restored the weights"
    );
    let r = b.update(&batch()).await.unwrap();
    assert_eq!(r.policy_version, 2);

    // A damaged file is named.
    std::fs::write(dir.path().join("tinker_learner.json"), "{").unwrap();
    let e = b.load_checkpoint(dir.path()).unwrap_err().to_string();
    assert!(e.contains("tinker_learner.json"), "{e}");
}

#[test]
fn checkpoints_work_from_a_current_thread_runtime_too() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let fake = Fake::start(Reduction::Skyrl).await;
        let mut a = TinkerLearner::connect(client(&fake), learner_cfg(ServerKind::SkyrlTx))
            .await
            .unwrap();
        a.update(&batch()).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        // The fake runs on this runtime's thread, which the sync call holds: the save must
        // run on a runtime of its own. Serve the fake from another runtime for this.
        let (tx, rx) = std::sync::mpsc::channel();
        let path = dir.path().to_path_buf();
        let handle = std::thread::spawn(move || {
            let r = a.save_checkpoint(&path);
            tx.send(()).unwrap();
            (a, r)
        });
        while rx.try_recv().is_err() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (_a, r) = handle.join().unwrap();
        r.unwrap();
        assert!(dir.path().join("tinker_learner.json").is_file());
    });
}

#[tokio::test]
async fn weight_sync_saves_each_version_for_the_sampler_and_a_failure_stops_the_run() {
    let fake = Fake::start(Reduction::Skyrl).await;
    let mut learner = TinkerLearner::connect(client(&fake), learner_cfg(ServerKind::SkyrlTx))
        .await
        .unwrap();
    let reloaded = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = reloaded.clone();
    let sync = TinkerWeightSync::new(learner.model().clone(), SyncTarget::Sampler, "rollout")
        .with_reload(move |w| {
            log.lock().unwrap().push(w.version);
            Box::pin(async { Ok(()) })
        });
    let r = learner.update(&batch()).await.unwrap();
    sync_with_retry(&sync, r.policy_version, SyncRetry::default())
        .await
        .unwrap();
    let latest = sync.latest().unwrap();
    assert_eq!(latest.version, 1);
    assert!(latest.path.starts_with(&format!(
        "tinker://{}/rollout-v1-",
        learner.model().model_id()
    )));
    assert_eq!(*reloaded.lock().unwrap(), vec![1]);
    assert_eq!(fake.requests("save_weights_for_sampler").len(), 1);

    for _ in 0..9 {
        fake.inject("save_weights_for_sampler", Fault::Status(500));
    }
    let retry = SyncRetry {
        attempts: 2,
        backoff_ms: 1,
    };
    let e = sync_with_retry(&sync, 2, retry)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("version 2") && e.contains("save_weights_for_sampler"),
        "{e}"
    );
    assert_eq!(
        sync.history().len(),
        1,
        "no version recorded for the failed sync"
    );
}

#[tokio::test]
async fn a_base_model_the_server_does_not_train_is_refused() {
    let fake = Fake::start(Reduction::Sum).await;
    let e = TinkerLearner::connect(
        client(&fake),
        TinkerLearnerConfig::new("other", ServerKind::Tinker),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, Error::Config { .. }));
    assert!(e.to_string().contains("tiny-base"), "{e}");
}

fn keyed_client(fake: &Fake) -> TinkerClient {
    let mut cfg = client(fake).config().clone();
    cfg.api_key = Some("sekret".into());
    TinkerClient::new(cfg).unwrap()
}

fn two_modules() -> FakeOptions {
    FakeOptions {
        adapter: Some(AdapterSpec {
            modules: vec![
                ("model.layers.0.self_attn.q_proj".into(), 6, 5),
                ("model.layers.0.mlp.down_proj".into(), 5, 7),
            ],
            alpha: 8.0,
        }),
        ..FakeOptions::default()
    }
}

/// A learner after one update and the `tinker://` path of its sampler weights.
async fn trained_and_saved(fake: &Fake, c: TinkerClient) -> (TinkerLearner, String) {
    let mut learner = TinkerLearner::connect(c, learner_cfg(ServerKind::Tinker))
        .await
        .unwrap();
    learner.update(&batch()).await.unwrap();
    let model = learner.model().model_id();
    let out = learner
        .model()
        .client()
        .save_weights_for_sampler(&model, "s1")
        .await
        .unwrap();
    assert_eq!(fake.requests("save_weights_for_sampler").len(), 1);
    (learner, out.path.unwrap())
}

fn names_in(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn sampler_weights_download_through_the_redirect_with_the_key_and_unpack() {
    let fake = Fake::start_with(Reduction::Sum, two_modules()).await;
    let (learner, path) = trained_and_saved(&fake, keyed_client(&fake)).await;
    let c = learner.model().client();
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("adapter");
    std::fs::create_dir_all(dest.join("stale")).unwrap();
    // A 503 and a cut body are retried (the GET changes nothing).
    fake.inject("archive", Fault::Status(503));
    fake.inject("archive", Fault::DropAfterApply);
    c.download_sampler_weights(&path, &dest, 1 << 20)
        .await
        .unwrap();
    assert_eq!(fake.requests("archive").len(), 2);
    assert_eq!(fake.requests("download").len(), 2);
    assert_eq!(
        names_in(&dest),
        ["adapter_config.json", "adapter_model.safetensors"],
        "the old folder was replaced whole"
    );
    assert_eq!(
        names_in(tmp.path()),
        ["adapter"],
        "no temporary folder is left"
    );
    // Same origin: the key went along on both hops.
    for r in fake
        .requests("archive")
        .iter()
        .chain(&fake.requests("download"))
    {
        assert_eq!(r["x-api-key"], "sekret");
        assert_eq!(r["authorization"], "Bearer sekret");
    }
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(dest.join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!(cfg["r"], 4);
    assert_eq!(cfg["lora_alpha"], 8.0);
    assert_eq!(cfg["peft_type"], "LORA");
    let t = read_safetensors(&std::fs::read(dest.join("adapter_model.safetensors")).unwrap());
    assert_eq!(t.len(), 4);
    let (shape, a) = &t["base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"];
    assert_eq!(shape, &[4, 7]);
    assert_eq!(a[7 + 2], lora_a_value("model.layers.0.mlp.down_proj", 1, 2));
    let (shape, b) = &t["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"];
    assert_eq!(shape, &[6, 4]);
    assert_eq!(
        b[4 * 5 + 3],
        lora_b_value("model.layers.0.self_attn.q_proj", 5, 3, 1)
    );
    assert!(b.iter().any(|&x| x != 0.0));

    // Hosted Tinker's form of the path names the same checkpoint.
    let model = learner.model().model_id();
    let hosted = path.replace(&model, &format!("{model}/sampler_weights"));
    c.download_sampler_weights(&hosted, &tmp.path().join("h"), 1 << 20)
        .await
        .unwrap();
    let last = fake.requests("archive").pop().unwrap();
    assert_eq!(last["id"], "sampler_weights/s1");

    // Only sampler weights have archives.
    let e = c
        .download_sampler_weights(
            &format!("tinker://{model}/nope"),
            &tmp.path().join("n"),
            1 << 20,
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no archive of tinker://") && e.contains("404"),
        "{e}"
    );
}

#[tokio::test]
async fn the_key_is_not_sent_to_another_origin() {
    use axum::http::HeaderMap;
    let fake = Fake::start(Reduction::Sum).await;
    let (learner, path) = trained_and_saved(&fake, keyed_client(&fake)).await;
    // Storage elsewhere (another port: another origin) that records the headers it gets.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<HeaderMap>::new()));
    let bytes = adapter_archive(&AdapterSpec::default(), 4, 1, None);
    let app = {
        let seen = seen.clone();
        axum::Router::new().route(
            "/blob",
            axum::routing::get(move |h: HeaderMap| {
                let (seen, bytes) = (seen.clone(), bytes.clone());
                async move {
                    seen.lock().unwrap().push(h);
                    bytes
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let other = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    fake.serve_archive_from(Some(format!("http://{other}/blob?sig=s3cr3t")));
    let tmp = tempfile::tempdir().unwrap();
    learner
        .model()
        .client()
        .download_sampler_weights(&path, &tmp.path().join("a"), 1 << 20)
        .await
        .unwrap();
    assert_eq!(fake.requests("archive")[0]["x-api-key"], "sekret");
    assert!(fake.requests("download").is_empty());
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].get("x-api-key").is_none());
    assert!(seen[0].get("authorization").is_none());
    assert!(tmp.path().join("a/adapter_model.safetensors").is_file());
}

#[tokio::test]
async fn hostile_or_broken_archives_are_refused_naming_the_entry() {
    let fake = Fake::start(Reduction::Sum).await;
    let (learner, path) = trained_and_saved(&fake, client(&fake)).await;
    let c = learner.model().client();
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("adapter");
    c.download_sampler_weights(&path, &dest, 1 << 20)
        .await
        .unwrap();
    let cases = [
        (Fault::CorruptArchive, vec!["not a readable tar archive"]),
        (Fault::HostileEntry("../x".into()), vec!["`../x`", "`..`"]),
        (
            Fault::HostileEntry("/etc/x".into()),
            vec!["`/etc/x`", "absolute"],
        ),
        (
            Fault::HostileEntry("notes.txt".into()),
            vec!["unexpected file `notes.txt`"],
        ),
        (
            Fault::SymlinkEntry("evil".into()),
            vec!["`evil`", "Symlink", "links"],
        ),
        (
            Fault::MissingFile("adapter_config.json".into()),
            vec!["no `adapter_config.json`"],
        ),
        (
            Fault::MissingFile("adapter_model.safetensors".into()),
            vec!["no `adapter_model.safetensors`"],
        ),
    ];
    for (fault, wants) in cases {
        fake.inject("archive", fault.clone());
        let e = c
            .download_sampler_weights(&path, &dest, 1 << 20)
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Protocol(_)), "{fault:?}: {e}");
        let e = e.to_string();
        for w in wants {
            assert!(e.contains(w) && e.contains(&path), "{fault:?}: {e}");
        }
        assert_eq!(
            names_in(&dest),
            ["adapter_config.json", "adapter_model.safetensors"],
            "{fault:?}: the previous adapter is untouched"
        );
        assert_eq!(
            names_in(tmp.path()),
            ["adapter"],
            "{fault:?}: nothing left over"
        );
    }
    assert!(!tmp.path().join("x").exists());

    // The body cap names the URL and the cap.
    let e = c
        .download_sampler_weights(&path, &dest, 100)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("/download") && e.contains("cap of 100 bytes"),
        "{e}"
    );

    // A wrong shape is the loader's business: it arrives as served.
    fake.inject("archive", Fault::WrongShape);
    c.download_sampler_weights(&path, &dest, 1 << 20)
        .await
        .unwrap();
    let t = read_safetensors(&std::fs::read(dest.join("adapter_model.safetensors")).unwrap());
    assert_eq!(
        t["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].0,
        [4, 9]
    );
}

#[tokio::test]
async fn weight_sync_downloads_each_version_before_the_hook_and_keeps_two() {
    let fake = Fake::start(Reduction::Skyrl).await;
    let mut learner = TinkerLearner::connect(client(&fake), learner_cfg(ServerKind::SkyrlTx))
        .await
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("weights");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let sync = TinkerWeightSync::new(learner.model().clone(), SyncTarget::Sampler, "rollout")
        .with_download(dir.clone(), 1 << 20)
        .with_reload(move |w| {
            let d = w.local_dir.clone().unwrap();
            let b = read_safetensors(&std::fs::read(d.join("adapter_model.safetensors")).unwrap())
                ["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
                .1
                .clone();
            log.lock().unwrap().push((w.version, d, b));
            Box::pin(async { Ok(()) })
        });
    sync.sync(0).await.unwrap();
    for v in 1..=3 {
        let r = learner.update(&batch()).await.unwrap();
        assert_eq!(r.policy_version, v);
        sync.sync(v).await.unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 4);
    for (v, d, _) in seen.iter() {
        assert_eq!(d, &dir.join(format!("v{v}")));
    }
    assert!(
        seen[0].2.iter().all(|&x| x == 0.0),
        "version 0 is the base model"
    );
    assert_ne!(seen[1].2, seen[2].2, "each update changes the adapter");
    assert_ne!(seen[2].2, seen[3].2);
    assert_eq!(names_in(&dir), ["v2", "v3"]);
    let latest = sync.latest().unwrap();
    assert_eq!(latest.local_dir, Some(dir.join("v3")));
    assert!(latest.save_seconds >= 0.0 && latest.download_seconds > 0.0);
    assert_eq!(fake.requests("download").len(), 4);

    // A failed download fails the sync: nothing recorded, the hook not run.
    fake.inject("archive", Fault::CorruptArchive);
    let e = sync.sync(4).await.unwrap_err().to_string();
    assert!(e.contains("version 4") && e.contains("downloading"), "{e}");
    assert_eq!(sync.history().len(), 4);

    // Training checkpoints have no archive: the combination is refused at sync.
    let bad = TinkerWeightSync::new(learner.model().clone(), SyncTarget::Training, "x")
        .with_download(dir.clone(), 1 << 20);
    let e = bad.sync(5).await.unwrap_err().to_string();
    assert!(e.contains("SyncTarget::Sampler"), "{e}");
    assert!(fake.requests("save_weights").is_empty(), "nothing saved");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_of_other_settings_or_one_the_server_forgot_is_refused() {
    let fake = Fake::start(Reduction::Sum).await;
    let mut a = TinkerLearner::connect(client(&fake), learner_cfg(ServerKind::Tinker))
        .await
        .unwrap();
    a.update(&batch()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    a.save_checkpoint(dir.path()).unwrap();
    let saved = harness_tinker::read_saved(dir.path()).unwrap();
    assert_eq!((saved.policy_version, saved.optimizer_steps), (1, 1));
    assert_eq!(saved.settings.as_ref().unwrap().lora.rank, 4);

    let mut cfg = learner_cfg(ServerKind::Tinker);
    cfg.lora.rank = 8;
    let mut b = TinkerLearner::connect(client(&fake), cfg).await.unwrap();
    let e = b.load_checkpoint(dir.path()).unwrap_err().to_string();
    assert!(
        e.contains("`lora.rank`: 4 in") && e.contains("8 now") && e.contains("tinker_learner.json"),
        "{e}"
    );
    let mut cfg = learner_cfg(ServerKind::Tinker);
    cfg.grpo.clip_high = 0.3;
    let mut b = TinkerLearner::connect(client(&fake), cfg).await.unwrap();
    let e = b.load_checkpoint(dir.path()).unwrap_err().to_string();
    assert!(e.contains("`grpo.clip_high`: 0.28 in"), "{e}");
    assert!(
        fake.requests("load_weights").is_empty(),
        "refused before loading"
    );

    // Timeouts and the heartbeat may change.
    let mut cfg = learner_cfg(ServerKind::Tinker);
    cfg.heartbeat_seconds = 1.0;
    let mut b = TinkerLearner::connect(client(&fake), cfg).await.unwrap();
    b.load_checkpoint(dir.path()).unwrap();

    // A file of an older version (no settings) still loads.
    let mut old: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("tinker_learner.json")).unwrap())
            .unwrap();
    old.as_object_mut().unwrap().remove("settings");
    std::fs::write(dir.path().join("tinker_learner.json"), old.to_string()).unwrap();
    b.load_checkpoint(dir.path()).unwrap();

    fake.forget_checkpoints();
    let e = b.load_checkpoint(dir.path()).unwrap_err().to_string();
    assert!(
        e.contains("no longer holds") && e.contains(&saved.weights_path),
        "{e}"
    );
}

#[tokio::test]
async fn logprobs_score_every_target_and_ranks_past_32_are_refused() {
    let fake = Fake::start(Reduction::Sum).await;
    let learner = TinkerLearner::connect(client(&fake), learner_cfg(ServerKind::Tinker))
        .await
        .unwrap();
    let ids = [5, 17, 3, 42, 8];
    let lp = learner.model().logprobs(&ids).await.unwrap();
    assert_eq!(lp.len(), 4);
    for (i, x) in lp.iter().enumerate() {
        assert!((x - fake_logprob(ids[i + 1], i, 0)).abs() < 1e-12);
    }
    assert!(learner.model().logprobs(&[5]).await.unwrap().is_empty());
    assert_eq!(fake.requests("forward").len(), 1, "nothing sent for one id");

    let mut cfg = learner_cfg(ServerKind::Tinker);
    cfg.lora.rank = 64;
    let e = TinkerLearner::connect(client(&fake), cfg)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("max_lora_rank 32"), "{e}");
}

#[tokio::test]
async fn a_restart_mid_run_loses_the_model_and_says_so() {
    let fake = Fake::start_with(
        Reduction::Sum,
        FakeOptions {
            supported_models: vec!["tiny-base".into(), "other-base".into()],
            adapter: None,
        },
    )
    .await;
    let caps = client(&fake).get_server_capabilities().await.unwrap();
    assert_eq!(caps.supported_models.len(), 2);
    let mut learner = TinkerLearner::connect(client(&fake), learner_cfg(ServerKind::Tinker))
        .await
        .unwrap();
    fake.inject("forward_backward", Fault::Restart);
    let e = learner.update(&batch()).await.unwrap_err().to_string();
    assert!(e.contains("Model not found"), "{e}");
    assert!(fake.state.lock().unwrap().models.is_empty());
}
