//! The learner and client against an in-process fake Tinker server: the requests it sends, the
//! gradient its weights encode (checked against grpo-candle's autograd), and faults.

mod common;

use std::time::Duration;

use candle_core::{Device, Tensor, Var};
use common::{Fake, Fault, Reduction, fake_logprob, group};
use grpo_candle::objective::{GrpoConfig, TokenTerms, group_advantages, grpo_loss};
use harness_core::{Group, Learner};
use harness_rollout::{SyncRetry, sync_with_retry};
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
