//! The settings of a Directional Harness Evolution run, with the paper's Table 8 as the preset.

use harness_core::Limits;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// One validated configuration of an evolution run. [`EvolveSettings::paper`] holds the values
/// of the paper's Table 8 ("Selected settings for the AppWorld directional evolution run"); every
/// field names the row it comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvolveSettings {
    /// Proposal budget per round, one entry per round, so `T` = its length (Table 8, "Search":
    /// 3 rounds; proposal budgets 7 / 8 / 8). Budgets bound proposals, not accepted variants.
    pub proposal_budgets: Vec<usize>,
    /// B, the parent slots of Eq. 3 (Table 8, "Search": 4 parent slots).
    pub parent_slots: usize,
    /// Fewest related root causes in one direction (Table 8, "Repair direction": 2-3).
    pub min_causes_per_direction: usize,
    /// Most related root causes in one direction (Table 8, "Repair direction": 2-3).
    pub max_causes_per_direction: usize,
    /// Distinct failed tasks a cause needs before an edit may target it (Table 8, "Repair
    /// direction": at least 2 distinct failed tasks per cause).
    pub min_failed_tasks_per_cause: usize,
    /// Tasks of one local evaluation (Table 8, "Local evaluation": at most 30 tasks).
    pub local_eval_tasks: usize,
    /// Successful controls among them (Table 8, "Local evaluation": at most 10 successful
    /// controls).
    pub local_eval_controls: usize,
    /// Revisions after the initial candidate (Table 8, "Revision budget": initial candidate plus
    /// at most one revision).
    pub revisions: usize,
    /// Greedy decoding for every executor rollout (Table 8, "Policy sampling": greedy decoding).
    pub greedy: bool,
    /// Rollouts per task and harness (Table 8, "Policy sampling": one rollout per task).
    pub rollouts_per_task: usize,
    /// The run's seed; round and episode seeds derive from it (Table 8, "Policy sampling":
    /// seed 42).
    pub seed: u64,
    /// Execution limits set on the base harness, so every candidate shares them (Table 8,
    /// "Execution limits": 32 model calls and 30 environment actions; 65,532 context tokens and
    /// 8,192 output tokens per call). `None` keeps the base harness's own limits (DBBench's
    /// AgentBench protocol has 15 rounds, for example).
    pub limits: Option<Limits>,
    /// Fresh training tasks each parent runs on per round (Table 8, "Development tasks":
    /// sampled from the training set; the table gives no count, the preset samples 40).
    pub train_tasks_per_round: usize,
    /// Malformed LLM answers retried before the item is skipped (not in Table 8: a safety
    /// budget of ours).
    pub llm_retries: usize,
    /// Episodes run at once (not in Table 8: a resource setting).
    pub concurrency: usize,
}

impl EvolveSettings {
    /// The paper's Table 8.
    pub fn paper() -> Self {
        EvolveSettings {
            proposal_budgets: vec![7, 8, 8],
            parent_slots: 4,
            min_causes_per_direction: 2,
            max_causes_per_direction: 3,
            min_failed_tasks_per_cause: 2,
            local_eval_tasks: 30,
            local_eval_controls: 10,
            revisions: 1,
            greedy: true,
            rollouts_per_task: 1,
            seed: 42,
            limits: Some(Limits {
                max_model_calls: 32,
                max_env_actions: 30,
                max_context_tokens: 65_532,
                max_output_tokens: 8_192,
            }),
            train_tasks_per_round: 40,
            llm_retries: 2,
            concurrency: 8,
        }
    }

    /// T, the number of rounds.
    pub fn rounds(&self) -> usize {
        self.proposal_budgets.len()
    }

    /// Check every field; errors name the field and the expected range.
    pub fn validate(&self) -> Result<()> {
        if self.proposal_budgets.is_empty() {
            return Err(Error::settings(
                "proposal_budgets",
                "expected at least one round (Table 8: [7, 8, 8])",
            ));
        }
        if let Some(i) = self.proposal_budgets.iter().position(|b| *b == 0) {
            return Err(Error::settings(
                format!("proposal_budgets[{i}]"),
                "expected a budget of at least 1 proposal",
            ));
        }
        if self.parent_slots == 0 {
            return Err(Error::settings(
                "parent_slots",
                "expected at least 1 (Table 8: 4)",
            ));
        }
        if self.min_causes_per_direction == 0
            || self.min_causes_per_direction > self.max_causes_per_direction
        {
            return Err(Error::settings(
                "min_causes_per_direction",
                format!(
                    "expected 1 <= min_causes_per_direction <= max_causes_per_direction ({}); Table 8: 2-3",
                    self.max_causes_per_direction
                ),
            ));
        }
        if self.min_failed_tasks_per_cause == 0 {
            return Err(Error::settings(
                "min_failed_tasks_per_cause",
                "expected at least 1 (Table 8: 2)",
            ));
        }
        if self.local_eval_tasks == 0 {
            return Err(Error::settings(
                "local_eval_tasks",
                "expected at least 1 (Table 8: 30)",
            ));
        }
        if self.local_eval_controls > self.local_eval_tasks {
            return Err(Error::settings(
                "local_eval_controls",
                format!(
                    "expected at most local_eval_tasks ({}); Table 8: 10 of 30",
                    self.local_eval_tasks
                ),
            ));
        }
        if self.train_tasks_per_round == 0 {
            return Err(Error::settings(
                "train_tasks_per_round",
                "expected at least 1",
            ));
        }
        if self.concurrency == 0 {
            return Err(Error::settings("concurrency", "expected at least 1"));
        }
        if self.revisions > 1 {
            return Err(Error::settings(
                "revisions",
                format!(
                    "expected 0 or 1, found {}: a candidate gets at most one revision (Table 8)",
                    self.revisions
                ),
            ));
        }
        if self.rollouts_per_task != 1 {
            return Err(Error::settings(
                "rollouts_per_task",
                "expected 1: a round analyses one greedy rollout per task (Table 8)",
            ));
        }
        if let Some(limits) = &self.limits {
            let limits = [
                ("limits.max_model_calls", limits.max_model_calls),
                ("limits.max_env_actions", limits.max_env_actions),
                ("limits.max_context_tokens", limits.max_context_tokens),
                ("limits.max_output_tokens", limits.max_output_tokens),
            ];
            for (field, value) in limits {
                if value == 0 {
                    return Err(Error::settings(field, "expected a limit of at least 1"));
                }
            }
        }
        Ok(())
    }

    /// Parse settings from JSON and validate them; errors name the field.
    pub fn from_json(text: &str) -> Result<Self> {
        let deserializer = &mut serde_json::Deserializer::from_str(text);
        let settings: EvolveSettings = serde_path_to_error::deserialize(deserializer)
            .map_err(|e| Error::settings(e.path().to_string(), e.into_inner().to_string()))?;
        settings.validate()?;
        Ok(settings)
    }

    /// The seed of round `g` (1-based), derived from the run seed.
    pub fn round_seed(&self, round: usize) -> u64 {
        harness_core::call_seed(self.seed, round as u32)
    }
}

impl Default for EvolveSettings {
    fn default() -> Self {
        Self::paper()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paper_preset_is_table_8_and_valid() {
        let s = EvolveSettings::paper();
        s.validate().unwrap();
        assert_eq!(s.rounds(), 3);
        assert_eq!(s.proposal_budgets, vec![7, 8, 8]);
        assert_eq!(s.parent_slots, 4);
        assert_eq!(
            (s.min_causes_per_direction, s.max_causes_per_direction),
            (2, 3)
        );
        assert_eq!(s.min_failed_tasks_per_cause, 2);
        assert_eq!((s.local_eval_tasks, s.local_eval_controls), (30, 10));
        assert_eq!(s.revisions, 1);
        assert!(s.greedy);
        assert_eq!((s.rollouts_per_task, s.seed), (1, 42));
        let limits = s.limits.unwrap();
        assert_eq!(
            (
                limits.max_model_calls,
                limits.max_env_actions,
                limits.max_context_tokens,
                limits.max_output_tokens
            ),
            (32, 30, 65_532, 8_192)
        );
    }

    #[test]
    fn invalid_settings_name_the_field() {
        let mut s = EvolveSettings::paper();
        s.proposal_budgets = vec![7, 0, 8];
        assert!(
            s.validate()
                .unwrap_err()
                .to_string()
                .contains("proposal_budgets[1]")
        );
        let mut s = EvolveSettings::paper();
        s.local_eval_controls = 31;
        assert!(
            s.validate()
                .unwrap_err()
                .to_string()
                .contains("local_eval_controls")
        );
        let mut s = EvolveSettings::paper();
        s.min_causes_per_direction = 4;
        assert!(
            s.validate()
                .unwrap_err()
                .to_string()
                .contains("min_causes_per_direction")
        );
        let mut s = EvolveSettings::paper();
        s.revisions = 2;
        assert!(s.validate().unwrap_err().to_string().contains("revisions"));
        let err = EvolveSettings::from_json(r#"{"proposal_budgets": [1]}"#).unwrap_err();
        assert!(err.to_string().contains("parent_slots"), "{err}");
    }

    #[test]
    fn settings_round_trip_through_json() {
        let s = EvolveSettings::paper();
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(EvolveSettings::from_json(&text).unwrap(), s);
    }
}
