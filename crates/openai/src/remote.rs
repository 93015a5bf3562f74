//! [`RemotePolicy`]: a [`Policy`] sampled on a serving engine (vLLM or SGLang) with token-level
//! fidelity, and weight sync after a training step.
//!
//! # Log-prob mode
//! The importance weight of Eq. 16 needs `q`, the probability under which the rollout engine
//! actually drew each token. Ask the engine for that distribution:
//! - **vLLM**: start it with `--logprobs-mode processed_logprobs` whenever you sample with
//!   temperature != 1 (or top-p/top-k): the default `raw_logprobs` reports the model's
//!   distribution before temperature and filtering, which is not the one sampled from.
//! - **SGLang**: recent versions report log-probs after temperature scaling; do not set
//!   `SGLANG_RETURN_ORIGINAL_LOGPROB=1` when sampling with temperature != 1.
//!
//! The trainer must score `pi_old` in the same mode (grpo-candle's sampler reports the processed
//! distribution); with temperature 1 and no top-p/top-k the two modes agree. Greedy decoding
//! (temperature 0) is the exception to avoid for training: grpo-candle reports 0 (a point mass)
//! while engines report the model's log-prob of the argmax token. grpo-candle's trainer scores
//! `pi_old` at one temperature over the full vocabulary, so it accepts only rollouts sampled at
//! that temperature without top-p or top-k, and refuses greedy ones (the episode records each
//! turn's settings).
//!
//! # Weight sync
//! After a training step, write the HF checkpoint (safetensors + config + tokenizer) and call
//! [`RemotePolicy::sync_weights`]:
//! - **SGLang**: `POST /update_weights_from_disk {"model_path": <dir>}` loads any directory in
//!   place; the answer's `success` is checked.
//! - **vLLM**: there is no stable public "load weights from this path" endpoint. With the server
//!   started with `VLLM_SERVER_DEV_MODE=1` and serving the checkpoint directory itself
//!   (`vllm serve <dir>`), overwrite that directory and call `POST /collective_rpc
//!   {"method": "reload_weights"}` followed by `POST /reset_prefix_cache`, which is what
//!   [`ReloadMethod::VllmReloadInPlace`] does (the directory must be the one vLLM serves). Without
//!   dev mode, restart `vllm serve <dir>` on the new checkpoint ([`ReloadMethod::Restart`] leaves it
//!   to the caller).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use harness_core::{FinishReason, Policy, PolicyRequest, PolicyTurn};
use serde_json::{Map, Value, json};

use crate::engine::{PromptEncoder, TokenOutput, TurnMemory, check_output, overflow_turn};
use crate::error::{Error, Result};
use crate::protocol::{
    CompletionRequest, CompletionResponse, PromptField, SglangGenerateRequest,
    SglangGenerateResponse, SglangSamplingParams, StopField, sglang_logprobs,
};
use crate::transport::{EndpointConfig, Transport};

/// Which serving engine's API to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// vLLM's `/v1/completions` with token-id prompts, `logprobs`, `return_token_ids` and
    /// `return_tokens_as_token_ids` (the local [`crate::server`] speaks it too).
    Vllm,
    /// SGLang's native `/generate` with `input_ids` and `return_logprob` (the local server speaks
    /// it too).
    Sglang,
}

/// How new weights reach the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadMethod {
    /// SGLang's `POST /update_weights_from_disk`.
    SglangFromDisk,
    /// vLLM dev mode: `POST /collective_rpc {"method": "reload_weights"}` then
    /// `POST /reset_prefix_cache`; the checkpoint must overwrite the directory vLLM serves.
    VllmReloadInPlace,
    /// The engine cannot reload: the caller restarts it on the new checkpoint.
    Restart,
}

/// Configuration of a [`RemotePolicy`].
#[derive(Debug, Clone)]
pub struct RemotePolicyConfig {
    /// The engine; `base_url` is the server root (`http://127.0.0.1:8000`, no `/v1`).
    pub endpoint: EndpointConfig,
    /// The served model's name (vLLM's `--served-model-name`; SGLang ignores it).
    pub model: String,
    /// The engine's API.
    pub engine: EngineKind,
    /// How [`RemotePolicy::sync_weights`] reaches the engine.
    pub weight_sync: ReloadMethod,
    /// The per-attempt timeout of a weight reload.
    pub reload_timeout: Duration,
    /// vLLM and SGLang accept seeds in the signed 64-bit range only: clear the top bit of each
    /// seed before sending it (the default). Tests that compare bit-exactly with an in-process
    /// sampler on arbitrary `u64` seeds against the local server switch it off.
    pub fold_seed_to_i63: bool,
    /// Extra fields merged into every generation request (e.g. `{"repetition_penalty": 1.0}`).
    pub extra_body: Map<String, Value>,
    /// How many recent turns are remembered so that later prompts reuse their exact tokens
    /// (see [`PromptEncoder::encode_continuation`]); 0 re-tokenizes every prompt.
    pub remembered_turns: usize,
}

impl RemotePolicyConfig {
    /// A policy on `engine` at `base_url` serving `model`, with the engine's usual reload.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>, engine: EngineKind) -> Self {
        RemotePolicyConfig {
            endpoint: EndpointConfig::new(base_url),
            model: model.into(),
            engine,
            weight_sync: match engine {
                EngineKind::Vllm => ReloadMethod::VllmReloadInPlace,
                EngineKind::Sglang => ReloadMethod::SglangFromDisk,
            },
            reload_timeout: Duration::from_secs(600),
            fold_seed_to_i63: true,
            extra_body: Map::new(),
            remembered_turns: 4096,
        }
    }
}

/// A [`Policy`] that renders and tokenizes locally (through a [`PromptEncoder`]) and samples on
/// a serving engine, returning the engine's generated token ids and their log-probs.
///
/// The prompt ids sent are exactly the `context_tokens` reported, so the trainer recomputes
/// `pi_old` in the generating context. A prompt over `max_context_tokens` is answered with a
/// [`FinishReason::ContextOverflow`] turn without calling the engine. Failures after the
/// configured retries are `Err` ([`harness_core::Error::Policy`]), never an empty turn, and a
/// retried request yields exactly one turn.
pub struct RemotePolicy {
    name: String,
    config: RemotePolicyConfig,
    transport: Transport,
    encoder: Arc<dyn PromptEncoder>,
    memory: TurnMemory,
}

impl std::fmt::Debug for RemotePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemotePolicy")
            .field("name", &self.name)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl RemotePolicy {
    /// A remote policy; `encoder` must be the checkpoint's own chat template and tokenizer.
    pub fn new(config: RemotePolicyConfig, encoder: Arc<dyn PromptEncoder>) -> Result<Self> {
        if config.model.trim().is_empty() && config.engine == EngineKind::Vllm {
            return Err(Error::config("model", "must name the served model"));
        }
        let transport = Transport::new(config.endpoint.clone())?;
        let engine = match config.engine {
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
        };
        Ok(RemotePolicy {
            name: format!("{engine}:{} at {}", config.model, transport.url("")),
            memory: TurnMemory::new(config.remembered_turns),
            config,
            transport,
            encoder,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &RemotePolicyConfig {
        &self.config
    }

    fn seed(&self, seed: u64) -> u64 {
        if self.config.fold_seed_to_i63 {
            seed & (i64::MAX as u64)
        } else {
            seed
        }
    }

    /// Sample from `prompt` on the engine.
    pub async fn generate_tokens(
        &self,
        prompt: &[u32],
        request: &PolicyRequest,
    ) -> Result<TokenOutput> {
        match self.config.engine {
            EngineKind::Vllm => self.generate_vllm(prompt, request).await,
            EngineKind::Sglang => self.generate_sglang(prompt, request).await,
        }
    }

    async fn generate_vllm(&self, prompt: &[u32], request: &PolicyRequest) -> Result<TokenOutput> {
        let s = &request.sampling;
        let body = CompletionRequest {
            model: self.config.model.clone(),
            prompt: PromptField::Tokens(prompt.to_vec()),
            max_tokens: Some(request.max_new_tokens.min(i64::MAX as usize) as i64),
            temperature: Some(s.temperature),
            top_p: Some(s.top_p),
            top_k: s.top_k.map(|k| k.min(i64::MAX as usize) as i64),
            seed: Some(self.seed(request.seed)),
            stop: (!s.stop.is_empty()).then(|| StopField::Many(s.stop.clone())),
            n: Some(1),
            stream: None,
            echo: None,
            logprobs: Some(1),
            return_token_ids: Some(true),
            return_tokens_as_token_ids: Some(true),
            include_stop_str_in_output: Some(true),
            extra: self.config.extra_body.clone(),
        };
        let path = "/v1/completions";
        let reply = self
            .transport
            .post_json::<_, CompletionResponse>(path, &body, None)
            .await?;
        let endpoint = || self.transport.url(path);
        let choice = reply
            .value
            .choices
            .into_iter()
            .next()
            .ok_or_else(|| Error::Protocol {
                endpoint: endpoint(),
                message: "the answer has no choices".into(),
            })?;
        let logprobs = choice.logprobs.ok_or_else(|| Error::Protocol {
            endpoint: endpoint(),
            message: "choices[0].logprobs is missing (the server ignored `logprobs`)".into(),
        })?;
        let lps: Vec<f32> = logprobs
            .token_logprobs
            .iter()
            .enumerate()
            .map(|(i, lp)| {
                lp.ok_or_else(|| Error::Protocol {
                    endpoint: endpoint(),
                    message: format!("choices[0].logprobs.token_logprobs[{i}] is null"),
                })
            })
            .collect::<Result<_>>()?;
        // Token ids: `token_ids` (vLLM >= 0.10.2 with return_token_ids), else the
        // `token_id:<id>` strings of return_tokens_as_token_ids.
        let tokens = match choice.token_ids {
            Some(ids) => ids,
            None => logprobs
                .tokens
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    t.strip_prefix("token_id:")
                        .and_then(|x| x.parse::<u32>().ok())
                        .ok_or_else(|| Error::Protocol {
                            endpoint: endpoint(),
                            message: format!(
                                "choices[0].token_ids is missing and logprobs.tokens[{i}] = `{t}` is not `token_id:<id>`"
                            ),
                        })
                })
                .collect::<Result<_>>()?,
        };
        let finish = match choice.finish_reason.as_deref() {
            Some("length") => FinishReason::Length,
            Some("stop") | None => FinishReason::Stop,
            Some(other) => {
                return Err(Error::Protocol {
                    endpoint: endpoint(),
                    message: format!("unexpected finish_reason `{other}`"),
                });
            }
        };
        Ok(TokenOutput {
            tokens,
            logprobs: lps,
            finish,
        })
    }

    async fn generate_sglang(
        &self,
        prompt: &[u32],
        request: &PolicyRequest,
    ) -> Result<TokenOutput> {
        let s = &request.sampling;
        let body = SglangGenerateRequest {
            input_ids: prompt.to_vec(),
            sampling_params: SglangSamplingParams {
                max_new_tokens: request.max_new_tokens.min(i64::MAX as usize) as i64,
                temperature: s.temperature,
                top_p: s.top_p,
                top_k: s.top_k.map_or(-1, |k| k.min(i64::MAX as usize) as i64),
                stop: s.stop.clone(),
                no_stop_trim: true,
                sampling_seed: Some(self.seed(request.seed)),
            },
            return_logprob: true,
            stream: false,
        };
        let mut value = serde_json::to_value(&body).map_err(|e| Error::Protocol {
            endpoint: self.transport.url("/generate"),
            message: format!("cannot encode the request: {e}"),
        })?;
        if let Value::Object(map) = &mut value {
            for (k, v) in &self.config.extra_body {
                map.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        let path = "/generate";
        let reply = self
            .transport
            .post_json::<_, SglangGenerateResponse>(path, &value, None)
            .await?;
        let endpoint = self.transport.url(path);
        let meta = reply.value.meta_info;
        let pairs =
            sglang_logprobs(&meta.output_token_logprobs).map_err(|message| Error::Protocol {
                endpoint: endpoint.clone(),
                message,
            })?;
        let tokens: Vec<u32> = pairs.iter().map(|p| p.1).collect();
        if let Some(ids) = &reply.value.output_ids
            && *ids != tokens
        {
            return Err(Error::Protocol {
                endpoint,
                message: "output_ids disagree with the ids in output_token_logprobs".into(),
            });
        }
        let kind = meta
            .finish_reason
            .as_ref()
            .and_then(|f| f.get("type").and_then(Value::as_str).or(f.as_str()))
            .unwrap_or("stop");
        let finish = match kind {
            "length" => FinishReason::Length,
            "stop" => FinishReason::Stop,
            other => {
                return Err(Error::Protocol {
                    endpoint,
                    message: format!("generation ended with finish_reason `{other}`"),
                });
            }
        };
        Ok(TokenOutput {
            tokens,
            logprobs: pairs.iter().map(|p| p.0).collect(),
            finish,
        })
    }

    /// Tell the engine to load the HF checkpoint in `checkpoint_dir` (see the module docs).
    pub async fn reload_weights(&self, checkpoint_dir: &Path) -> Result<()> {
        let dir = checkpoint_dir.to_string_lossy().to_string();
        let timeout = Some(self.config.reload_timeout);
        match self.config.weight_sync {
            ReloadMethod::SglangFromDisk => {
                let path = "/update_weights_from_disk";
                let reply = self
                    .transport
                    .post_json::<_, Value>(path, &json!({ "model_path": dir }), timeout)
                    .await?;
                if reply.value.get("success").and_then(Value::as_bool) == Some(false) {
                    return Err(Error::Protocol {
                        endpoint: self.transport.url(path),
                        message: format!(
                            "the engine refused to load `{dir}`: {}",
                            reply
                                .value
                                .get("message")
                                .and_then(Value::as_str)
                                .unwrap_or("(no message)")
                        ),
                    });
                }
                Ok(())
            }
            ReloadMethod::VllmReloadInPlace => {
                self.transport
                    .post_json::<_, Value>(
                        "/collective_rpc",
                        &json!({ "method": "reload_weights" }),
                        timeout,
                    )
                    .await?;
                // vLLM answers with an empty body, which reads as `null`.
                self.transport
                    .post_json::<_, Value>("/reset_prefix_cache", &json!({}), timeout)
                    .await?;
                Ok(())
            }
            ReloadMethod::Restart => Err(Error::config(
                "weight_sync",
                format!(
                    "this engine cannot reload weights: restart it on `{dir}` (ReloadMethod::Restart)"
                ),
            )),
        }
    }

    /// Save the new weights with `save` (which writes an HF checkpoint into the directory it is
    /// given) and make the engine load them.
    pub async fn sync_weights<F>(&self, checkpoint_dir: &Path, save: F) -> Result<()>
    where
        F: FnOnce(&Path) -> harness_core::Result<()>,
    {
        save(checkpoint_dir)?;
        self.reload_weights(checkpoint_dir).await
    }
}

#[async_trait]
impl Policy for RemotePolicy {
    fn name(&self) -> &str {
        &self.name
    }

    async fn generate(&self, request: PolicyRequest) -> harness_core::Result<PolicyTurn> {
        let context = self
            .memory
            .encode(&*self.encoder, &request.messages, &request.tools)?;
        if context.len() > request.max_context_tokens {
            return Ok(overflow_turn(context));
        }
        let out = self
            .generate_tokens(&context, &request)
            .await
            .map_err(|e| e.into_policy(&self.name))?;
        check_output(&out, request.max_new_tokens, None).map_err(|message| {
            harness_core::Error::Policy {
                policy: self.name.clone(),
                message: format!("the engine broke the token contract: {message}"),
            }
        })?;
        let turn = PolicyTurn {
            text: self.encoder.decode(&out.tokens)?,
            context_tokens: context,
            tokens: out.tokens,
            logprobs: out.logprobs,
            finish: out.finish,
        };
        self.memory
            .remember(&request.messages, &request.tools, &turn);
        Ok(turn)
    }
}
