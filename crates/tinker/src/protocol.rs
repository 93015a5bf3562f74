//! The Tinker REST protocol's request and response bodies (JSON), as the hosted service and
//! SkyRL's self-hosted server (`skyrl-tx` 0.3.0, `tx/tinker/api.py`) accept them.
//!
//! Every operation that touches the model (`create_model`, `forward`, `forward_backward`,
//! `optim_step`, `save_weights`, `save_weights_for_sampler`, `load_weights`) answers with a
//! future (`{"request_id": ...}`) whose result `retrieve_future` returns once it is done.
//! Servers ignore fields they do not know, so requests carry the union of what the two
//! servers read (e.g. `seq_id`, which only the hosted service uses).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `POST /api/v1/create_session`.
#[derive(Debug, Clone, Serialize)]
pub struct CreateSessionRequest {
    /// Free-form tags.
    pub tags: Vec<String>,
    /// Free-form metadata.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_metadata: Option<BTreeMap<String, String>>,
    /// The client's version string.
    pub sdk_version: String,
    /// Always `create_session`.
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// The answer of `create_session`.
#[derive(Debug, Clone, Deserialize)]
pub struct CreateSessionResponse {
    /// The new session's id.
    pub session_id: String,
    /// A notice from the server.
    #[serde(default)]
    pub info_message: Option<String>,
    /// A warning from the server.
    #[serde(default)]
    pub warning_message: Option<String>,
    /// An error from the server (the session is still created).
    #[serde(default)]
    pub error_message: Option<String>,
}

/// `POST /api/v1/session_heartbeat`.
#[derive(Debug, Clone, Serialize)]
pub struct SessionHeartbeatRequest {
    /// The session.
    pub session_id: String,
    /// Always `session_heartbeat`.
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// The LoRA adapter a model trains.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoraConfig {
    /// Rank of the adapter.
    pub rank: u32,
    /// Seed of the adapter's initialisation (`None`: the server draws one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Adapt the attention projections (hosted service).
    #[serde(default = "yes")]
    pub train_attn: bool,
    /// Adapt the MLP (hosted service).
    #[serde(default = "yes")]
    pub train_mlp: bool,
    /// Adapt the unembedding (hosted service).
    #[serde(default)]
    pub train_unembed: bool,
}

fn yes() -> bool {
    true
}

/// `POST /api/v1/create_model`.
#[derive(Debug, Clone, Serialize)]
pub struct CreateModelRequest {
    /// The session the model belongs to.
    pub session_id: String,
    /// The model's number within the session (hosted service).
    pub model_seq_id: u64,
    /// The base model's name as the server lists it in `get_server_capabilities`.
    pub base_model: String,
    /// The adapter.
    pub lora_config: LoraConfig,
    /// Always `create_model`.
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// The immediate answer of every future-returning operation.
#[derive(Debug, Clone, Deserialize)]
pub struct FutureResponse {
    /// The future's id, polled with `retrieve_future`.
    pub request_id: Value,
    /// The model the operation is about (`create_model` on SkyRL's server names it here).
    #[serde(default)]
    pub model_id: Option<String>,
}

/// A token sequence as the model reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInput {
    /// Chunks, concatenated.
    pub chunks: Vec<ModelInputChunk>,
}

/// One chunk of encoded text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInputChunk {
    /// Always `encoded_text`.
    #[serde(rename = "type", default = "encoded_text")]
    pub kind: String,
    /// Token ids.
    pub tokens: Vec<u32>,
}

fn encoded_text() -> String {
    "encoded_text".into()
}

impl ModelInput {
    /// One chunk of `tokens`.
    pub fn from_tokens(tokens: Vec<u32>) -> Self {
        ModelInput {
            chunks: vec![ModelInputChunk {
                kind: encoded_text(),
                tokens,
            }],
        }
    }

    /// All tokens, chunks concatenated.
    pub fn tokens(&self) -> Vec<u32> {
        self.chunks
            .iter()
            .flat_map(|c| c.tokens.iter().copied())
            .collect()
    }
}

/// A 1-D tensor in a loss function's inputs or outputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorData {
    /// The values.
    pub data: Vec<f64>,
    /// `int64` or `float32`.
    #[serde(default)]
    pub dtype: Option<String>,
    /// `[len]`.
    #[serde(default)]
    pub shape: Option<Vec<usize>>,
}

impl TensorData {
    /// Float values.
    pub fn floats(values: Vec<f64>) -> Self {
        let n = values.len();
        TensorData {
            data: values,
            dtype: Some("float32".into()),
            shape: Some(vec![n]),
        }
    }

    /// Integer values (token ids).
    pub fn ints(values: &[u32]) -> Self {
        TensorData {
            data: values.iter().map(|&v| f64::from(v)).collect(),
            dtype: Some("int64".into()),
            shape: Some(vec![values.len()]),
        }
    }
}

/// Serialises integer tensors as JSON integers (a server's `list[int] | list[float]` field
/// reads `5.0` as a float).
mod tensor_json {
    use super::TensorData;
    use serde::ser::SerializeStruct;
    use serde::{Serialize, Serializer};

    pub fn serialize<S: Serializer>(t: &TensorData, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("TensorData", 3)?;
        if t.dtype.as_deref() == Some("int64") {
            let ints: Vec<i64> = t.data.iter().map(|&v| v as i64).collect();
            st.serialize_field("data", &ints)?;
        } else {
            st.serialize_field("data", &t.data)?;
        }
        st.serialize_field("dtype", &t.dtype)?;
        st.serialize_field("shape", &t.shape)?;
        st.end()
    }

    #[derive(Serialize)]
    pub struct Wrapped<'a>(#[serde(serialize_with = "serialize")] pub &'a TensorData);
}

/// One training example: a sequence and its per-position loss inputs (`target_tokens`,
/// `weights`, and for the policy-gradient losses `logprobs` and `advantages`). Position `i`
/// of `model_input` predicts `target_tokens[i]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Datum {
    /// The input tokens.
    pub model_input: ModelInput,
    /// The loss function's inputs, by name.
    pub loss_fn_inputs: BTreeMap<String, TensorData>,
}

impl Serialize for Datum {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let inputs: BTreeMap<&str, tensor_json::Wrapped<'_>> = self
            .loss_fn_inputs
            .iter()
            .map(|(k, v)| (k.as_str(), tensor_json::Wrapped(v)))
            .collect();
        let mut st = s.serialize_struct("Datum", 2)?;
        st.serialize_field("model_input", &self.model_input)?;
        st.serialize_field("loss_fn_inputs", &inputs)?;
        st.end()
    }
}

impl<'de> Deserialize<'de> for Datum {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Raw {
            model_input: ModelInput,
            loss_fn_inputs: BTreeMap<String, TensorData>,
        }
        let raw = Raw::deserialize(d)?;
        Ok(Datum {
            model_input: raw.model_input,
            loss_fn_inputs: raw.loss_fn_inputs,
        })
    }
}

/// The built-in loss functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossFn {
    /// `-weights * logprobs` per position.
    CrossEntropy,
    /// `-exp(logprobs - sampling_logprobs) * advantages` per position.
    ImportanceSampling,
    /// The clipped version of `importance_sampling`.
    Ppo,
}

/// The body of `forward` (`forward_input`) and `forward_backward` (`forward_backward_input`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ForwardBackwardInput {
    /// The examples.
    pub data: Vec<Datum>,
    /// The loss.
    pub loss_fn: LossFn,
    /// The loss's settings (`clip_low_threshold`, `clip_high_threshold` for `ppo` on the
    /// hosted service).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_fn_config: Option<BTreeMap<String, f64>>,
}

/// `POST /api/v1/forward`.
#[derive(Debug, Clone, Serialize)]
pub struct ForwardRequest<'a> {
    /// The model.
    pub model_id: &'a str,
    /// The pass.
    pub forward_input: &'a ForwardBackwardInput,
    /// The request's number on this model (hosted service).
    pub seq_id: u64,
}

/// `POST /api/v1/forward_backward`.
#[derive(Debug, Clone, Serialize)]
pub struct ForwardBackwardRequest<'a> {
    /// The model.
    pub model_id: &'a str,
    /// The pass.
    pub forward_backward_input: &'a ForwardBackwardInput,
    /// The request's number on this model (hosted service).
    pub seq_id: u64,
}

/// The result of `forward` and `forward_backward`: per example, the output tensors
/// (`logprobs` of the targets, and `elementwise_loss` on SkyRL's server).
#[derive(Debug, Clone, Deserialize)]
pub struct ForwardBackwardOutput {
    /// E.g. `scalar`.
    #[serde(default)]
    pub loss_fn_output_type: Option<String>,
    /// One map per example, in request order.
    pub loss_fn_outputs: Vec<BTreeMap<String, TensorData>>,
    /// Server metrics (the hosted service reports `loss:sum`).
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
}

/// Adam's settings for one `optim_step`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdamParams {
    /// Step size.
    pub learning_rate: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
}

impl Default for AdamParams {
    /// grpo-candle's AdamW defaults (beta 0.9 / 0.999, eps 1e-8, weight decay 0.01) at its
    /// default learning rate 1e-6.
    fn default() -> Self {
        AdamParams {
            learning_rate: 1e-6,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

/// `POST /api/v1/optim_step`.
#[derive(Debug, Clone, Serialize)]
pub struct OptimStepRequest<'a> {
    /// The model.
    pub model_id: &'a str,
    /// The optimizer's settings.
    pub adam_params: AdamParams,
    /// The request's number on this model (hosted service).
    pub seq_id: u64,
}

/// `POST /api/v1/save_weights`, `save_weights_for_sampler`.
#[derive(Debug, Clone, Serialize)]
pub struct SaveWeightsRequest<'a> {
    /// The model.
    pub model_id: &'a str,
    /// The checkpoint's name (letters, digits, `_`, `-`).
    pub path: &'a str,
    /// The request's number on this model (hosted service).
    pub seq_id: u64,
    /// `save_weights` or `save_weights_for_sampler`.
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// `POST /api/v1/load_weights`.
#[derive(Debug, Clone, Serialize)]
pub struct LoadWeightsRequest<'a> {
    /// The model that receives the weights.
    pub model_id: &'a str,
    /// `tinker://<model>/weights/<checkpoint>`, as `save_weights` returned it.
    pub path: &'a str,
    /// The request's number on this model (hosted service).
    pub seq_id: u64,
    /// Always `load_weights`.
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// The result of `save_weights` and `save_weights_for_sampler`.
#[derive(Debug, Clone, Deserialize)]
pub struct SaveWeightsOutput {
    /// `tinker://<model>/weights/<name>` or `tinker://<model>/<name>` (sampler weights).
    pub path: Option<String>,
    /// A sampling session the weights were loaded into, when the server made one.
    #[serde(default)]
    pub sampling_session_id: Option<String>,
}

/// `POST /api/v1/retrieve_future`.
#[derive(Debug, Clone, Serialize)]
pub struct RetrieveFutureRequest<'a> {
    /// The future.
    pub request_id: &'a str,
}

/// `GET /api/v1/get_server_capabilities`.
#[derive(Debug, Clone, Deserialize)]
pub struct ServerCapabilities {
    /// The base models the server trains.
    pub supported_models: Vec<SupportedModel>,
}

/// One base model.
#[derive(Debug, Clone, Deserialize)]
pub struct SupportedModel {
    /// Its name, as `create_model` takes it.
    #[serde(default)]
    pub model_name: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datum_serialises_token_ids_as_integers_and_weights_as_floats() {
        let mut inputs = BTreeMap::new();
        inputs.insert("target_tokens".to_string(), TensorData::ints(&[5, 6]));
        inputs.insert("weights".to_string(), TensorData::floats(vec![0.0, 0.5]));
        let d = Datum {
            model_input: ModelInput::from_tokens(vec![1, 5]),
            loss_fn_inputs: inputs,
        };
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["model_input"]["chunks"][0]["type"], "encoded_text");
        assert_eq!(
            v["model_input"]["chunks"][0]["tokens"],
            serde_json::json!([1, 5])
        );
        assert_eq!(
            v["loss_fn_inputs"]["target_tokens"]["data"],
            serde_json::json!([5, 6])
        );
        assert!(v["loss_fn_inputs"]["target_tokens"]["data"][0].is_i64());
        assert_eq!(
            v["loss_fn_inputs"]["weights"]["data"],
            serde_json::json!([0.0, 0.5])
        );
        let back: Datum = serde_json::from_value(v).unwrap();
        assert_eq!(back, d);
    }
}
