//! Our trainable decoder computes the same forward pass as candle-transformers' (forward-only)
//! Qwen3, position by position, on a tiny random checkpoint saved through our HF writer.

use candle_core::{D, DType, Device, Tensor};
use candle_nn::{Activation, VarBuilder};
use candle_transformers::models::qwen3;
use grpo_candle::{PolicyModel, TinySpec};

#[test]
fn qwen3_matches_candle_transformers() {
    for tied in [true, false] {
        let spec = TinySpec {
            seed: 5,
            num_merges: 16,
            hidden_size: 32,
            intermediate_size: 48,
            head_dim: 8,
            num_heads: 4,
            num_kv_heads: 2,
            tie_word_embeddings: tied,
            ..TinySpec::default()
        };
        let pm = PolicyModel::tiny(&spec, DType::F32, &Device::Cpu).unwrap();
        // Larger weights than the 0.02 initialisation, and non-unit norms, so that logits differ.
        for (name, var) in pm.model.named_vars() {
            let t = var.as_tensor();
            let scaled = if name.ends_with("norm.weight") {
                let n = t.dim(0).unwrap() as u32;
                let wave = Tensor::arange(0u32, n, &Device::Cpu)
                    .unwrap()
                    .to_dtype(DType::F32)
                    .unwrap();
                (wave.sin().unwrap() * 0.3)
                    .unwrap()
                    .affine(1.0, 1.0)
                    .unwrap()
            } else {
                (t * 12.0).unwrap()
            };
            var.set(&scaled).unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        pm.save_hf(dir.path()).unwrap();
        let c = pm.model.config();
        let cfg = qwen3::Config {
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            intermediate_size: c.intermediate_size,
            num_hidden_layers: c.num_hidden_layers,
            num_attention_heads: c.num_attention_heads,
            head_dim: c.head_dim,
            attention_bias: c.attention_bias,
            num_key_value_heads: c.num_key_value_heads,
            max_position_embeddings: c.max_position_embeddings,
            sliding_window: None,
            max_window_layers: c.num_hidden_layers,
            tie_word_embeddings: c.tie_word_embeddings,
            rope_theta: c.rope_theta,
            rms_norm_eps: c.rms_norm_eps,
            use_sliding_window: false,
            hidden_act: Activation::Silu,
        };
        let bytes = std::fs::read(dir.path().join("model.safetensors")).unwrap();
        let vb = VarBuilder::from_buffered_safetensors(bytes, DType::F32, &Device::Cpu).unwrap();
        let mut reference = qwen3::ModelForCausalLM::new(&cfg, vb).unwrap();

        let ids: Vec<u32> = vec![1, 40, 7, 300, 12, 99, 3, 250, 8];
        // candle-transformers returns only the last position: feed the prompt, then one token at
        // a time through its KV cache.
        let mut want = Vec::new();
        let prompt = Tensor::new(&ids[..3], &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        want.push(reference.forward(&prompt, 0).unwrap().squeeze(0).unwrap());
        for (i, &t) in ids.iter().enumerate().skip(3) {
            let x = Tensor::new(&[t], &Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap();
            want.push(reference.forward(&x, i).unwrap().squeeze(0).unwrap());
        }
        let want = Tensor::cat(&want, 0).unwrap();

        let input = Tensor::new(ids.as_slice(), &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let ours = pm.model.forward_logits(&input).unwrap().squeeze(0).unwrap();
        let ours = ours.narrow(0, 2, ids.len() - 2).unwrap();
        let diff: f32 = (ours - &want)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        let scale: f32 = want
            .abs()
            .unwrap()
            .max(D::Minus1)
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        eprintln!("tied={tied}: max |logit difference| {diff:.2e} (logits up to {scale:.2})");
        assert!(diff < 2e-5, "tied={tied}: {diff}");
    }
}
