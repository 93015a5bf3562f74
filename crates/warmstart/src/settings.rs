//! The warm start's settings: one seed, the demonstrations, the tokenizer, the model's shape, the
//! episode limits of the compact H0 and the fine-tuning schedule.

use serde::{Deserialize, Serialize};

use crate::environment::{EpisodeLimits, Family};
use crate::error::{Error, Result};
use crate::organism::{FamilyRates, Organism};

/// The shape of the tiny Qwen3 policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelShape {
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (divides `num_heads`).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Width of the MLP.
    pub intermediate_size: usize,
    /// Longest sequence (at least the limits' `max_context_tokens`).
    pub max_position_embeddings: usize,
}

impl Default for ModelShape {
    fn default() -> Self {
        ModelShape {
            hidden_size: 128,
            num_layers: 3,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 32,
            intermediate_size: 256,
            max_position_embeddings: 1024,
        }
    }
}

/// Every setting of a warm start. A JSON document may give any subset; unknown fields are
/// errors. The defaults are this crate's own (a release build on two CPU cores trains them in
/// about fifteen minutes, and the result ships), not the paper's: the paper starts from a
/// pretrained Qwen3.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WarmStartSettings {
    /// The one seed: task generation, the demonstrations' harnesses and draws, the tokenizer's
    /// corpus order, the model's initial weights and the fine-tuning batches. Default 0.
    pub seed: u64,
    /// Training tasks demonstrated (the first ones of the generator's training split), each
    /// once, under H0 or one sibling (see `repair_share`). Default 3200.
    pub demo_tasks: usize,
    /// Share of planted-family demonstrations recorded under a sibling whose hook repairs the
    /// family (so the prompted behaviour has enough examples); the others, and every plain
    /// task, run under H0 or any sibling uniformly. Default 0.5.
    pub repair_share: f64,
    /// Share of demonstrations in the planted families that make the planted decision well
    /// without a hook message (so H0 is not at 0% there and GRPO sees some successes).
    /// Default 0.1.
    pub unprompted_good_rate: f64,
    /// Per-family overrides of `unprompted_good_rate` (`{"change": 0.0, "quoting": 0.1}`);
    /// a family left out uses the shared rate.
    #[serde(skip_serializing_if = "FamilyRates::is_empty")]
    pub unprompted_good_by_family: FamilyRates,
    /// The organism's variant: which siblings repair which planted family
    /// ([`Organism`]; default `recovery_hooks`).
    #[serde(skip_serializing_if = "Organism::is_default")]
    pub organism: Organism,
    /// Tokens of the fitted tokenizer (specials included). Default 2048.
    pub vocab_size: usize,
    /// The model's shape.
    pub model: ModelShape,
    /// The compact H0's episode limits (the siblings share them).
    pub limits: EpisodeLimits,
    /// Fine-tuning updates. Default 2800.
    pub sft_steps: usize,
    /// Demonstration sequences per update. Default 8.
    pub batch_sequences: usize,
    /// Peak learning rate of AdamW. Default 1e-2.
    pub learning_rate: f64,
    /// Linear warmup updates. Default 30.
    pub warmup_steps: usize,
    /// Final learning rate of the cosine decay, as a fraction of the peak. Default 0.1.
    pub min_lr_ratio: f64,
}

impl Default for WarmStartSettings {
    fn default() -> Self {
        WarmStartSettings {
            seed: 0,
            demo_tasks: 3200,
            repair_share: 0.5,
            unprompted_good_rate: 0.1,
            unprompted_good_by_family: FamilyRates::default(),
            organism: Organism::default(),
            vocab_size: 2048,
            model: ModelShape::default(),
            limits: EpisodeLimits::default(),
            sft_steps: 2800,
            batch_sequences: 8,
            learning_rate: 1e-2,
            warmup_steps: 30,
            min_lr_ratio: 0.1,
        }
    }
}

impl WarmStartSettings {
    /// A preset that runs in seconds even in a debug build (tests, smoke runs): a few
    /// demonstrations, a one-layer model, a few updates. Its policy is not useful.
    pub fn tiny() -> Self {
        WarmStartSettings {
            demo_tasks: 22,
            vocab_size: 400,
            model: ModelShape {
                hidden_size: 32,
                num_layers: 1,
                num_heads: 2,
                num_kv_heads: 1,
                head_dim: 16,
                intermediate_size: 64,
                max_position_embeddings: 1024,
            },
            sft_steps: 3,
            batch_sequences: 4,
            warmup_steps: 1,
            ..WarmStartSettings::default()
        }
    }

    /// The share of `family`'s demonstrations that make the planted decision well without a
    /// repair: its override, else the shared rate; 1 for a family the organism does not plant.
    pub fn unprompted_rate(&self, family: Family) -> f64 {
        if !self.organism.plants(family) {
            return 1.0;
        }
        self.unprompted_good_by_family
            .get(family)
            .unwrap_or(self.unprompted_good_rate)
    }

    /// Parse settings from JSON; errors name the field.
    pub fn from_json(text: &str) -> Result<Self> {
        let settings: WarmStartSettings = serde_json::from_str(text)
            .map_err(|e| Error::setting("(document)", format!("not valid settings: {e}")))?;
        settings.validate()?;
        Ok(settings)
    }

    /// Check every field; the error names the first bad one and what was expected.
    pub fn validate(&self) -> Result<()> {
        let positive = |field: &str, v: usize| {
            if v == 0 {
                Err(Error::setting(field, "must be at least 1"))
            } else {
                Ok(())
            }
        };
        positive("demo_tasks", self.demo_tasks)?;
        positive("sft_steps", self.sft_steps)?;
        positive("batch_sequences", self.batch_sequences)?;
        if !(0.0..=1.0).contains(&self.repair_share) {
            return Err(Error::setting(
                "repair_share",
                format!("{} is not a share in [0, 1]", self.repair_share),
            ));
        }
        if !(0.0..=1.0).contains(&self.unprompted_good_rate) {
            return Err(Error::setting(
                "unprompted_good_rate",
                format!("{} is not a share in [0, 1]", self.unprompted_good_rate),
            ));
        }
        for (family, rate) in self.unprompted_good_by_family.fields() {
            if let Some(rate) = rate
                && !(0.0..=1.0).contains(&rate)
            {
                return Err(Error::setting(
                    &format!("unprompted_good_by_family.{family}"),
                    format!("{rate} is not a share in [0, 1]"),
                ));
            }
        }
        if !(300..=65_536).contains(&self.vocab_size) {
            return Err(Error::setting(
                "vocab_size",
                format!(
                    "{} is outside 300..=65536 (256 bytes + specials + merges)",
                    self.vocab_size
                ),
            ));
        }
        if !(self.learning_rate.is_finite() && self.learning_rate > 0.0) {
            return Err(Error::setting(
                "learning_rate",
                format!("{} must be a positive number", self.learning_rate),
            ));
        }
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return Err(Error::setting(
                "min_lr_ratio",
                format!("{} is not a fraction in [0, 1]", self.min_lr_ratio),
            ));
        }
        let m = &self.model;
        positive("model.hidden_size", m.hidden_size)?;
        positive("model.num_layers", m.num_layers)?;
        positive("model.num_heads", m.num_heads)?;
        positive("model.num_kv_heads", m.num_kv_heads)?;
        positive("model.head_dim", m.head_dim)?;
        positive("model.intermediate_size", m.intermediate_size)?;
        if !m.num_heads.is_multiple_of(m.num_kv_heads) {
            return Err(Error::setting(
                "model.num_kv_heads",
                format!(
                    "{} does not divide model.num_heads = {}",
                    m.num_kv_heads, m.num_heads
                ),
            ));
        }
        if !m.head_dim.is_multiple_of(2) {
            return Err(Error::setting(
                "model.head_dim",
                format!("{} must be even (rotary embedding)", m.head_dim),
            ));
        }
        let l = &self.limits;
        positive("limits.max_model_calls", l.max_model_calls as usize)?;
        positive("limits.max_env_actions", l.max_env_actions as usize)?;
        positive("limits.max_output_tokens", l.max_output_tokens as usize)?;
        if (l.max_context_tokens as usize) > m.max_position_embeddings {
            return Err(Error::setting(
                "limits.max_context_tokens",
                format!(
                    "{} is over model.max_position_embeddings = {}",
                    l.max_context_tokens, m.max_position_embeddings
                ),
            ));
        }
        if l.max_context_tokens <= l.max_output_tokens {
            return Err(Error::setting(
                "limits.max_context_tokens",
                format!(
                    "{} must exceed limits.max_output_tokens = {}",
                    l.max_context_tokens, l.max_output_tokens
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_tiny_validate_and_round_trip() {
        for s in [WarmStartSettings::default(), WarmStartSettings::tiny()] {
            s.validate().unwrap();
            let text = serde_json::to_string(&s).unwrap();
            assert_eq!(WarmStartSettings::from_json(&text).unwrap(), s);
        }
        assert_eq!(
            WarmStartSettings::from_json(r#"{"seed": 4}"#).unwrap().seed,
            4
        );
    }

    #[test]
    fn the_default_variant_keeps_the_default_cache_name_and_rates_resolve_per_family() {
        // The new fields are left out of the serialised default, so the shipped default's
        // cache name (a hash of the settings) does not move.
        let text = serde_json::to_string(&WarmStartSettings::default()).unwrap();
        assert!(
            !text.contains("organism") && !text.contains("by_family"),
            "{text}"
        );
        let s = WarmStartSettings::from_json(
            r#"{"organism": "prompt_rules", "unprompted_good_rate": 0.1, "unprompted_good_by_family": {"change": 0.0}}"#,
        )
        .unwrap();
        assert_eq!(s.unprompted_rate(Family::Change), 0.0);
        assert_eq!(s.unprompted_rate(Family::Quoting), 0.1);
        // Not planted in this variant: the good decision always.
        assert_eq!(s.unprompted_rate(Family::Recheck), 1.0);
        assert_eq!(s.unprompted_rate(Family::Plain), 1.0);
        assert_ne!(
            crate::cache_dir_name(&s),
            crate::cache_dir_name(&WarmStartSettings::default())
        );
    }

    #[test]
    fn bad_settings_name_the_field() {
        let cases = [
            (r#"{"demo_tasks": 0}"#, "demo_tasks"),
            (r#"{"unprompted_good_rate": 1.5}"#, "unprompted_good_rate"),
            (r#"{"vocab_size": 10}"#, "vocab_size"),
            (r#"{"learning_rate": -1}"#, "learning_rate"),
            (r#"{"model": {"num_kv_heads": 3}}"#, "model.num_kv_heads"),
            (
                r#"{"limits": {"max_context_tokens": 4096}}"#,
                "limits.max_context_tokens",
            ),
            (r#"{"sft_step": 3}"#, "sft_step"),
            (
                r#"{"unprompted_good_by_family": {"change": 2}}"#,
                "unprompted_good_by_family.change",
            ),
            (r#"{"unprompted_good_by_family": {"plain": 0.5}}"#, "plain"),
            (r#"{"organism": "hooks_after"}"#, "hooks_after"),
            (r#"{"model": {"hidden": 3}}"#, "hidden"),
        ];
        for (json, field) in cases {
            let err = WarmStartSettings::from_json(json).unwrap_err().to_string();
            assert!(err.contains(field), "{json}: {err}");
        }
    }
}
