//! An [`Analyst`] over a [`ChatModel`]: the paper's attribution prompt, a validated JSON answer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use async_trait::async_trait;
use harness_core::{ChatMessage, ChatModel, Harness, Trajectory};
use serde_json::Value;

use crate::analyst::Analyst;
use crate::cause::{CAUSE_KINDS, Cause, FailureAnalysis, cause_info};
use crate::error::Result;
use crate::llm::{Ask, ask_json};
use crate::trace::digest;
use crate::usage::{RoleUsage, UsageCell};

/// The role name under which the analyst's tokens are counted.
pub const ANALYST_ROLE: &str = "analyst";

/// An LLM failure analyst. Failures are sent in batches; each answer must be
/// `{"groups": [{"cause", "summary", "tasks", "evidence"}], "unresolved": [task ids]}` naming
/// every failure of the batch exactly once. A batch whose answers stay malformed after the retry
/// budget is skipped: its failures are listed in [`FailureAnalysis::skipped`] and counted.
pub struct LlmAnalyst {
    model: Arc<dyn ChatModel>,
    retries: usize,
    batch: usize,
    temperature: f32,
    seed: u64,
    max_tokens: Option<usize>,
    usage: UsageCell,
}

impl LlmAnalyst {
    /// An analyst asking `model`, retrying a malformed answer `retries` times.
    pub fn new(model: Arc<dyn ChatModel>, retries: usize) -> Self {
        LlmAnalyst {
            model,
            retries,
            batch: 20,
            temperature: 0.6,
            seed: 42,
            max_tokens: None,
            usage: UsageCell::default(),
        }
    }

    /// Failures per request (at least 1).
    pub fn with_batch(mut self, batch: usize) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// Cap on each answer's tokens (`None`: 4,096).
    pub fn with_max_tokens(mut self, max_tokens: Option<usize>) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    /// Temperature and seed of the requests.
    pub fn with_sampling(mut self, temperature: f32, seed: u64) -> Self {
        self.temperature = temperature;
        self.seed = seed;
        self
    }
}

fn system_prompt() -> String {
    let mut catalogue = String::new();
    for c in CAUSE_KINDS {
        catalogue.push_str(&format!("- {}: {}\n", c.kind, c.description));
    }
    format!(
        "You analyse failed episodes of an agent acting through a harness. For EACH failure, follow \
         the earliest decision or tool result explaining the failed check, then inspect the later \
         effect. Group every failure by root cause or mark it unresolved; the evidence decides how \
         many groups there are.\n\nKnown causes (use these names when they fit; otherwise a short \
         new name of lowercase letters, digits and dashes):\n{catalogue}\nAnswer with one JSON object: \
         {{\"groups\": [{{\"cause\": name, \"summary\": one sentence, \"tasks\": [task ids], \
         \"evidence\": one line}}], \"unresolved\": [task ids]}}. Every task id of the request \
         appears exactly once."
    )
}

/// Check an answer against the batch's task ids.
pub fn validate_answer(
    value: &Value,
    ids: &BTreeSet<String>,
) -> std::result::Result<FailureAnalysis, String> {
    let object = value.as_object().ok_or("expected a JSON object")?;
    if let Some(extra) = object.keys().find(|k| *k != "groups" && *k != "unresolved") {
        return Err(format!(
            "unexpected field `{extra}`; expected `groups` and `unresolved`"
        ));
    }
    let groups = object
        .get("groups")
        .and_then(Value::as_array)
        .ok_or("`groups` must be a list")?;
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut take = |id: &Value, at: &str| -> std::result::Result<String, String> {
        let id = id
            .as_str()
            .ok_or(format!("{at}: task ids must be strings"))?;
        if !ids.contains(id) {
            return Err(format!("{at}: `{id}` is not one of the failures given"));
        }
        if !seen.insert(id.to_string()) {
            return Err(format!("{at}: `{id}` appears more than once"));
        }
        Ok(id.to_string())
    };
    let mut causes: BTreeMap<String, Cause> = BTreeMap::new();
    for (i, group) in groups.iter().enumerate() {
        let at = format!("groups[{i}]");
        let kind = group
            .get("cause")
            .and_then(Value::as_str)
            .filter(|k| {
                !k.is_empty()
                    && k.len() <= 60
                    && k.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            })
            .ok_or(format!(
                "{at}.cause must be a name of lowercase letters, digits and dashes"
            ))?;
        let summary = group
            .get("summary")
            .and_then(Value::as_str)
            .unwrap_or("")
            .trim();
        let tasks = group
            .get("tasks")
            .and_then(Value::as_array)
            .filter(|t| !t.is_empty())
            .ok_or(format!("{at}.tasks must be a non-empty list"))?;
        let evidence = group
            .get("evidence")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let cause = causes.entry(kind.to_string()).or_insert_with(|| Cause {
            kind: kind.to_string(),
            summary: if summary.is_empty() {
                cause_info(kind).map_or(kind.to_string(), |c| c.description.to_string())
            } else {
                summary.to_string()
            },
            tasks: Vec::new(),
            evidence: Vec::new(),
            tools: Vec::new(),
        });
        for (j, id) in tasks.iter().enumerate() {
            let id = take(id, &format!("{at}.tasks[{j}]"))?;
            cause.evidence.push(format!("{id}: {evidence}"));
            cause.tasks.push(id);
        }
    }
    let mut unresolved = Vec::new();
    if let Some(list) = object.get("unresolved") {
        let list = list.as_array().ok_or("`unresolved` must be a list")?;
        for (j, id) in list.iter().enumerate() {
            unresolved.push(take(id, &format!("unresolved[{j}]"))?);
        }
    }
    if let Some(missing) = ids.iter().find(|id| !seen.contains(*id)) {
        return Err(format!(
            "task `{missing}` is neither grouped nor marked unresolved"
        ));
    }
    let mut analysis = FailureAnalysis {
        failures: ids.len(),
        causes: causes.into_values().collect(),
        unresolved,
        skipped: Vec::new(),
    };
    analysis.normalise();
    Ok(analysis)
}

#[async_trait]
impl Analyst for LlmAnalyst {
    fn name(&self) -> &str {
        "llm-analyst"
    }

    async fn analyse(&self, parent: &Harness, failures: &[Trajectory]) -> Result<FailureAnalysis> {
        let failures: Vec<&Trajectory> = failures.iter().filter(|t| !t.is_success()).collect();
        let mut merged: BTreeMap<String, Cause> = BTreeMap::new();
        let mut total = FailureAnalysis::default();
        for (b, batch) in failures.chunks(self.batch).enumerate() {
            let ids: BTreeSet<String> = batch.iter().map(|t| t.task_id.clone()).collect();
            let mut body = format!(
                "Parent harness `{}`:\n{}\n\nFailures:\n",
                parent.name,
                parent.to_json_pretty()
            );
            for t in batch {
                body.push_str(&digest(t, 2500));
                body.push('\n');
            }
            let ask = Ask {
                role: ANALYST_ROLE,
                messages: vec![
                    ChatMessage::system(system_prompt()),
                    ChatMessage::user(body),
                ],
                retries: self.retries,
                temperature: self.temperature,
                seed: Some(self.seed.wrapping_add(b as u64 * 1000)),
                max_tokens: self.max_tokens,
                usage: &self.usage,
            };
            total.failures += batch.len();
            match ask_json(self.model.as_ref(), ask, |v| validate_answer(v, &ids)).await {
                Some(analysis) => {
                    for cause in analysis.causes {
                        let entry = merged.entry(cause.kind.clone()).or_insert_with(|| Cause {
                            tasks: Vec::new(),
                            evidence: Vec::new(),
                            ..cause.clone()
                        });
                        entry.tasks.extend(cause.tasks);
                        entry.evidence.extend(cause.evidence);
                    }
                    total.unresolved.extend(analysis.unresolved);
                }
                None => {
                    tracing::warn!(
                        "analyst batch {b} skipped after malformed answers; {} failures unjudged",
                        ids.len()
                    );
                    total.skipped.extend(ids);
                }
            }
        }
        total.causes = merged.into_values().collect();
        total.normalise();
        Ok(total)
    }

    fn usage(&self) -> RoleUsage {
        self.usage.get()
    }
}
