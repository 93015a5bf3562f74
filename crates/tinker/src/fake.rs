//! An in-process fake Tinker server (axum; feature `fake`) for tests: it records every
//! request, emulates the loss reductions of hosted Tinker and SkyRL's server, serves sampler
//! checkpoints as real PEFT archives (tar.gz with `adapter_config.json` and
//! `adapter_model.safetensors`), and injects faults.
//!
//! The fake's model is a fixed function: log-probs follow [`fake_logprob`], and the adapter of
//! a sampler checkpoint saved after `s` optimizer steps has `lora_A` = [`lora_a_value`] and
//! `lora_B` = [`lora_b_value`] (0 at `s = 0`, so version 0 is exactly the base model), so a
//! test can predict both.
//!
//! ```no_run
//! # async fn demo() {
//! use harness_tinker::fake::{Fake, Reduction};
//! let fake = Fake::start(Reduction::Skyrl).await;
//! let url = fake.url(); // http://127.0.0.1:<port>
//! # let _ = url; }
//! ```

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

/// How the fake reduces per-token losses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    /// Hosted Tinker: sums, `loss:sum` in the metrics.
    Sum,
    /// SkyRL: per example divided by the sum of weights; `elementwise_loss` outputs.
    Skyrl,
}

/// A fault injected into the next request of an endpoint ([`Fake::inject`]): a POST
/// endpoint's name (`forward_backward`, ...) or `archive` for the sampler-weights download
/// (the archive GET and the download it leads to).
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Answer with this status without applying the request.
    Status(u16),
    /// Apply the request, then cut the answer's body (a dropped connection). For `archive`:
    /// the download's body is cut halfway.
    DropAfterApply,
    /// Sleep this long before handling (past the client's timeout).
    Delay(Duration),
    /// Accept the request, but its future fails with this message.
    FailFuture(String),
    /// Accept the request, but its future never completes.
    NeverComplete,
    /// The server restarts at this request: models, sessions and futures are dropped (saved
    /// checkpoints stay) and the request is answered 404 `Model not found`.
    Restart,
    /// `archive`: the download serves garbage instead of a tar.gz.
    CorruptArchive,
    /// `archive`: the tar also holds a regular file at this path (written raw, e.g. `../x`).
    HostileEntry(String),
    /// `archive`: the tar also holds a symlink at this path pointing to `/etc/passwd`.
    SymlinkEntry(String),
    /// `archive`: the tar lacks this file (`adapter_config.json` or
    /// `adapter_model.safetensors`).
    MissingFile(String),
    /// `archive`: every `lora_A` has one column more than the module's input size.
    WrongShape,
}

/// The adapter a sampler checkpoint's archive holds: one LoRA pair per module.
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterSpec {
    /// `(Hugging Face module name, out features, in features)`, e.g.
    /// `("model.layers.0.self_attn.q_proj", 64, 64)`.
    pub modules: Vec<(String, usize, usize)>,
    /// `lora_alpha` in `adapter_config.json`.
    pub alpha: f64,
}

impl Default for AdapterSpec {
    /// One 8 x 8 module, `model.layers.0.self_attn.q_proj`, alpha 16.
    fn default() -> Self {
        AdapterSpec {
            modules: vec![("model.layers.0.self_attn.q_proj".into(), 8, 8)],
            alpha: 16.0,
        }
    }
}

/// How the fake is set up.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeOptions {
    /// The base models `get_server_capabilities` lists.
    pub supported_models: Vec<String>,
    /// The adapter archives hold (`None`: [`AdapterSpec::default`]).
    pub adapter: Option<AdapterSpec>,
}

impl Default for FakeOptions {
    /// `tiny-base` and the default adapter.
    fn default() -> Self {
        FakeOptions {
            supported_models: vec!["tiny-base".into()],
            adapter: None,
        }
    }
}

/// What the fake remembers of a sampler checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SamplerCheckpoint {
    /// The model's optimizer steps when it was saved.
    pub steps: usize,
    /// The model's LoRA rank.
    pub rank: u32,
}

/// The largest LoRA rank `create_model` accepts (SkyRL's `max_lora_rank` default).
pub const MAX_LORA_RANK: u64 = 32;

#[derive(Debug, Clone)]
enum FutureEntry {
    Done(Value),
    Failed(String),
    Never,
}

/// One model on the fake.
#[derive(Debug, Default)]
pub struct ModelState {
    /// forward_backward calls applied.
    pub fb_applied: usize,
    /// optim steps applied.
    pub steps: usize,
    /// Data accumulated since the last step.
    pub pending: usize,
    /// The LoRA rank it was created with.
    pub rank: u32,
}

/// Everything the fake holds and has seen.
#[derive(Default)]
pub struct FakeState {
    /// How losses are reduced.
    pub reduction: Option<Reduction>,
    /// Every request: (endpoint, body). GETs of the sampler weights are logged as `archive`
    /// and `download` with `{"model", "id", "x-api-key", "authorization"}` (the headers as
    /// received, or null).
    pub log: Vec<(String, Value)>,
    /// Faults queued per endpoint.
    pub faults: HashMap<String, VecDeque<Fault>>,
    futures: HashMap<u64, FutureEntry>,
    /// Models by id.
    pub models: HashMap<String, ModelState>,
    /// Session ids.
    pub sessions: Vec<String>,
    /// Heartbeats received.
    pub heartbeats: usize,
    /// Saved checkpoints (both kinds): tinker path -> steps at save.
    pub checkpoints: BTreeMap<String, usize>,
    /// Sampler checkpoints: tinker path -> what their archive holds.
    pub sampler: BTreeMap<String, SamplerCheckpoint>,
    /// What `get_server_capabilities` lists.
    pub supported_models: Vec<String>,
    /// The adapter archives hold.
    pub adapter: AdapterSpec,
    /// When set, the archive GET answers 200 `{"url": this}` instead of redirecting.
    pub archive_url: Option<String>,
    /// Body faults taken by the archive GET for the download that follows.
    download_faults: VecDeque<Fault>,
    next_id: u64,
}

/// A running fake server. Cheap to clone; stops when [`Fake::restart`] is called (or with
/// the runtime).
#[derive(Clone)]
pub struct Fake {
    /// The state, shared with the handlers.
    pub state: Arc<Mutex<FakeState>>,
    /// Where it listens.
    pub addr: SocketAddr,
    shutdown: Arc<Mutex<Option<tokio::sync::oneshot::Sender<()>>>>,
}

/// The fake's log-prob of `target` at position `i` for a model with `steps` updates: a fixed
/// function, so tests can predict it.
pub fn fake_logprob(target: u32, i: usize, steps: usize) -> f64 {
    -1.0 - 0.05 * f64::from(target % 11) - 0.01 * (i % 5) as f64 + 0.001 * steps as f64
}

/// splitmix64.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A value in `[-1, 1]` fixed by `module`, `salt`, `row` and `col`.
fn pattern(module: &str, salt: u64, row: usize, col: usize) -> f64 {
    // FNV-1a of the name.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in module.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let h = mix(h ^ mix(salt ^ mix(((row as u64) << 32) | col as u64)));
    (h % 2001) as f64 / 1000.0 - 1.0
}

/// `lora_A[row][col]` of `module` in every archive: small, fixed, nonzero almost everywhere.
pub fn lora_a_value(module: &str, row: usize, col: usize) -> f32 {
    (0.01 * pattern(module, 1, row, col)) as f32
}

/// `lora_B[row][col]` of `module` after `steps` optimizer steps: `1e-3 * steps * pattern`
/// (0 before the first step, as a fresh LoRA).
pub fn lora_b_value(module: &str, row: usize, col: usize, steps: usize) -> f32 {
    (1e-3 * steps as f64 * pattern(module, 2, row, col)) as f32
}

/// A safetensors file of f32 tensors, written by hand (8-byte little-endian header length,
/// JSON header padded with spaces to 8 bytes, raw little-endian data).
pub fn safetensors_f32(tensors: &[(String, Vec<usize>, Vec<f32>)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut data = Vec::new();
    for (name, shape, values) in tensors {
        let start = data.len();
        for v in values {
            data.extend_from_slice(&v.to_le_bytes());
        }
        header.insert(
            name.clone(),
            json!({"dtype": "F32", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let mut h = serde_json::to_vec(&Value::Object(header)).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    out
}

/// The archive of a sampler checkpoint of rank `rank` saved after `steps` steps, with `fault`
/// (one of the `archive` body faults) applied.
pub fn adapter_archive(
    spec: &AdapterSpec,
    rank: u32,
    steps: usize,
    fault: Option<&Fault>,
) -> Vec<u8> {
    if fault == Some(&Fault::CorruptArchive) {
        let mut junk = vec![0x1f, 0x8b];
        junk.extend((0..2000u64).map(|i| (mix(i) & 0xff) as u8));
        return junk;
    }
    let r = rank as usize;
    let extra = usize::from(fault == Some(&Fault::WrongShape));
    let mut targets: Vec<String> = Vec::new();
    let mut tensors = Vec::new();
    for (module, out, inp) in &spec.modules {
        let leaf = module.rsplit('.').next().unwrap_or(module).to_string();
        if !targets.contains(&leaf) {
            targets.push(leaf);
        }
        let cols = inp + extra;
        let a: Vec<f32> = (0..r)
            .flat_map(|i| (0..cols).map(move |j| (i, j)))
            .map(|(i, j)| lora_a_value(module, i, j))
            .collect();
        let b: Vec<f32> = (0..*out)
            .flat_map(|i| (0..r).map(move |j| (i, j)))
            .map(|(i, j)| lora_b_value(module, i, j, steps))
            .collect();
        tensors.push((
            format!("base_model.model.{module}.lora_A.weight"),
            vec![r, cols],
            a,
        ));
        tensors.push((
            format!("base_model.model.{module}.lora_B.weight"),
            vec![*out, r],
            b,
        ));
    }
    let config = serde_json::to_vec_pretty(&json!({
        "r": rank,
        "lora_alpha": spec.alpha,
        "peft_type": "LORA",
        "target_modules": targets,
        "bias": "none",
    }))
    .unwrap();
    let weights = safetensors_f32(&tensors);
    let enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(enc);
    for (name, data) in [
        ("adapter_config.json", config),
        ("adapter_model.safetensors", weights),
    ] {
        if fault == Some(&Fault::MissingFile(name.to_string())) {
            continue;
        }
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(0);
        tar.append_data(&mut h, name, data.as_slice()).unwrap();
    }
    let raw = |path: &str, kind: tar::EntryType| {
        let mut h = tar::Header::new_gnu();
        let name = &mut h.as_gnu_mut().unwrap().name;
        name[..path.len()].copy_from_slice(path.as_bytes());
        h.set_entry_type(kind);
        h.set_mode(0o644);
        h.set_mtime(0);
        h
    };
    match fault {
        Some(Fault::HostileEntry(path)) => {
            let mut h = raw(path, tar::EntryType::Regular);
            h.set_size(3);
            h.set_cksum();
            tar.append(&h, &b"pwn"[..]).unwrap();
        }
        Some(Fault::SymlinkEntry(path)) => {
            let mut h = raw(path, tar::EntryType::Symlink);
            h.set_size(0);
            h.set_link_name("/etc/passwd").unwrap();
            h.set_cksum();
            tar.append(&h, std::io::empty()).unwrap();
        }
        _ => {}
    }
    tar.into_inner().unwrap().finish().unwrap()
}

impl Fake {
    /// A fake reducing losses as `reduction`, listing `tiny-base`, with the default adapter.
    pub async fn start(reduction: Reduction) -> Fake {
        Self::start_with(reduction, FakeOptions::default()).await
    }

    /// A fake reducing losses as `reduction`, set up by `options`.
    pub async fn start_with(reduction: Reduction, options: FakeOptions) -> Fake {
        let state = Arc::new(Mutex::new(FakeState {
            reduction: Some(reduction),
            supported_models: options.supported_models,
            adapter: options.adapter.unwrap_or_default(),
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
            .route(
                "/api/v1/training_runs/{model}/checkpoints/{*rest}",
                get(checkpoint_get),
            )
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

    /// `http://<addr>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Queue `fault` for the next request of `endpoint` (a POST endpoint's name, or `archive`).
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

    /// `(forward_backward calls applied, optimizer steps)` of model `id`.
    pub fn model(&self, id: &str) -> (usize, usize) {
        let s = self.state.lock().unwrap();
        let m = &s.models[id];
        (m.fb_applied, m.steps)
    }

    /// Forget every saved checkpoint (as a server restarted on another checkpoint store):
    /// `load_weights` and archive downloads of them then answer 404.
    pub fn forget_checkpoints(&self) {
        let mut s = self.state.lock().unwrap();
        s.checkpoints.clear();
        s.sampler.clear();
    }

    /// Answer the archive GET with 200 `{"url": url}` (a signed storage URL, hosted Tinker's
    /// way) instead of a redirect to the fake's own download; `None` restores the redirect.
    pub fn serve_archive_from(&self, url: Option<String>) {
        self.state.lock().unwrap().archive_url = url;
    }

    /// Stop, forget models, sessions and futures (saved checkpoints stay), and come back on
    /// the same port after `down`.
    pub async fn restart(&self, down: Duration) -> Fake {
        if let Some(tx) = self.shutdown.lock().unwrap().take() {
            let _ = tx.send(());
        }
        forget_runtime(&mut self.state.lock().unwrap());
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
    let mut s = state.lock().unwrap();
    s.log.push(("get_server_capabilities".into(), Value::Null));
    let models: Vec<Value> = s
        .supported_models
        .iter()
        .map(|m| json!({"model_name": m}))
        .collect();
    Json(json!({"supported_models": models}))
}

fn err(status: u16, detail: &str) -> Response {
    (
        StatusCode::from_u16(status).unwrap(),
        Json(json!({"detail": detail})),
    )
        .into_response()
}

fn cut_body() -> Response {
    cut(b"{\"request_id\": ".to_vec(), 100, "application/json")
}

/// The head goes out (announcing `length` bytes), then `head` and the stream fails: the client
/// sees the connection drop.
fn cut(head: Vec<u8>, length: usize, content_type: &str) -> Response {
    let stream = futures::stream::iter(vec![
        Ok::<Bytes, std::io::Error>(Bytes::from(head)),
        Err(std::io::Error::other("injected: connection dropped")),
    ]);
    Response::builder()
        .status(200)
        .header("content-type", content_type)
        .header("content-length", length.to_string())
        .body(Body::from_stream(stream))
        .unwrap()
}

/// Models, sessions and futures dropped, as a restarted server.
fn forget_runtime(s: &mut FakeState) {
    s.models.clear();
    s.futures.clear();
    s.sessions.clear();
}

/// `GET .../training_runs/{model}/checkpoints/{id}/archive` (302 to `.../download`, or 200
/// `{"url"}`) and `.../download` (the tar.gz).
async fn checkpoint_get(
    State(state): State<Arc<Mutex<FakeState>>>,
    Path((model, rest)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let Some((id, op)) = rest.rsplit_once('/') else {
        return err(404, "Not Found");
    };
    if op != "archive" && op != "download" {
        return err(404, "Not Found");
    }
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map_or(Value::Null, |v| json!(v))
    };
    let fault = {
        let mut s = state.lock().unwrap();
        s.log.push((
            op.to_string(),
            json!({"model": model, "id": id, "x-api-key": header("x-api-key"),
                   "authorization": header("authorization")}),
        ));
        if op == "archive" {
            s.faults.get_mut("archive").and_then(|q| q.pop_front())
        } else {
            s.download_faults.pop_front()
        }
    };
    let mut body_fault = None;
    match fault {
        Some(Fault::Status(code)) => return err(code, "injected failure"),
        Some(Fault::Delay(d)) => tokio::time::sleep(d).await,
        Some(Fault::Restart) => {
            forget_runtime(&mut state.lock().unwrap());
            return err(404, "Model not found");
        }
        Some(f) if op == "archive" => state.lock().unwrap().download_faults.push_back(f),
        Some(f) => body_fault = Some(f),
        None => {}
    }
    let s = state.lock().unwrap();
    let plain = id.strip_prefix("sampler_weights/").unwrap_or(id);
    let Some(ckpt) = [id, plain]
        .iter()
        .find_map(|i| s.sampler.get(&format!("tinker://{model}/{i}")))
        .copied()
    else {
        return err(404, &format!("Checkpoint not found: {model}/{id}"));
    };
    if op == "archive" {
        if let Some(u) = &s.archive_url {
            return Json(json!({"url": u, "expires_at": "2100-01-01T00:00:00Z"})).into_response();
        }
        return Response::builder()
            .status(302)
            .header(
                "location",
                format!("/api/v1/training_runs/{model}/checkpoints/{id}/download"),
            )
            .body(Body::empty())
            .unwrap();
    }
    let bytes = adapter_archive(&s.adapter, ckpt.rank, ckpt.steps, body_fault.as_ref());
    drop(s);
    if body_fault == Some(Fault::DropAfterApply) {
        let half = bytes[..bytes.len() / 2].to_vec();
        return cut(half, bytes.len(), "application/gzip");
    }
    Response::builder()
        .status(200)
        .header("content-type", "application/gzip")
        .body(Body::from(bytes))
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
        Some(Fault::Restart) => {
            forget_runtime(&mut state.lock().unwrap());
            return err(404, "Model not found");
        }
        // Archive faults mean nothing to a POST endpoint.
        Some(_) | None => {}
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
            let rank = body["lora_config"]["rank"].as_u64().unwrap_or(0);
            if rank > MAX_LORA_RANK {
                future_fault = Some(Fault::FailFuture(format!(
                    "LoRA rank {rank} exceeds max_lora_rank {MAX_LORA_RANK}"
                )));
            }
            let id = format!("model_{}", s.models.len() + s.log.len());
            s.models.insert(
                id.clone(),
                ModelState {
                    rank: rank as u32,
                    ..ModelState::default()
                },
            );
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
            let (steps, rank) = (s.models[&mid].steps, s.models[&mid].rank);
            s.checkpoints.insert(path.clone(), steps);
            if endpoint == "save_weights_for_sampler" {
                s.sampler
                    .insert(path.clone(), SamplerCheckpoint { steps, rank });
            }
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
