//! A Meta-Harness [`Proposer`] over a [`ChatModel`]: the whole search history in (every
//! candidate's harness, score and sampled traces, every proposal with its outcome, as
//! [`History::render`] writes it); the candidate to revise and a validated structured edit out.

use std::sync::Arc;

use async_trait::async_trait;
use harness_core::{ChatMessage, ChatModel, HarnessId};
use serde_json::Value;

use crate::error::Result;
use crate::llm::{Ask, ask_json};
use crate::llm_editor::{editable_components, validate_edit};
use crate::meta_harness::{History, HistoryBounds, MetaProposal, Proposer};
use crate::usage::{RoleUsage, UsageCell};

/// The role name under which the proposer's tokens are counted.
pub const PROPOSER_ROLE: &str = "proposer";

/// An LLM Meta-Harness proposer. Its answer must be `{"parent": candidate id, "brief": text,
/// "focus": [what it targets], "ops": [{"path", "value"}]}`; an answer that names no candidate
/// whose harness the prompt showed, does not parse, edits outside the six editable components or yields an invalid
/// harness is shown back with the reason and retried within the budget, then the slot is left
/// empty and counted. Temperature 0.6 like the harness editor (Table 8; the paper gives no
/// proposer setting of its own).
pub struct LlmProposer {
    model: Arc<dyn ChatModel>,
    retries: usize,
    bounds: HistoryBounds,
    temperature: f32,
    seed: u64,
    max_tokens: Option<usize>,
    usage: UsageCell,
}

impl LlmProposer {
    /// A proposer asking `model` with the history cut to `bounds`, retrying an unusable answer
    /// `retries` times.
    pub fn new(model: Arc<dyn ChatModel>, retries: usize, bounds: HistoryBounds) -> Self {
        LlmProposer {
            model,
            retries,
            bounds,
            temperature: 0.6,
            seed: 42,
            max_tokens: None,
            usage: UsageCell::default(),
        }
    }

    /// Cap on each answer's tokens (`None`: 4,096).
    pub fn with_max_tokens(mut self, max_tokens: Option<usize>) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    /// Temperature and seed of the requests (the seed advances with every proposal slot).
    pub fn with_sampling(mut self, temperature: f32, seed: u64) -> Self {
        self.temperature = temperature;
        self.seed = seed;
        self
    }
}

fn system_prompt() -> String {
    format!(
        "You search for a better agent harness. You read the whole search so far: every candidate \
         harness with its training score, the harness and traces of the best ones, and every earlier \
         proposal with what became of it. Pick any candidate whose harness is shown to revise (not \
         only the best) and write \
         one revision that is not a repeat of an earlier proposal. {}\n\
         Limits are fixed. Answer with one JSON object: {{\"parent\": the candidate id, \"brief\": \
         one line naming the mechanism and what it repairs, \"focus\": [short names of the failure \
         causes it targets], \"ops\": [{{\"path\": \"state....\", \"value\": JSON or null to remove}}]}}.",
        editable_components()
    )
}

/// Check a proposer answer against the history: a candidate the prompt showed in detail
/// ([`History::detailed`]) as parent, an optional list of strings as focus, and an edit
/// [`validate_edit`] accepts for that parent.
pub fn validate_answer(
    value: &Value,
    history: &History<'_>,
    bounds: &HistoryBounds,
) -> std::result::Result<MetaProposal, String> {
    let parent = value
        .get("parent")
        .and_then(Value::as_str)
        .ok_or("`parent` must be the id of a scored candidate")?;
    let parent = HarnessId(parent.trim().to_string());
    // Only a candidate whose harness the prompt showed can be revised.
    let shown: Vec<&HarnessId> = history
        .detailed(bounds)
        .into_iter()
        .map(|c| &c.id)
        .collect();
    let harness = match history.harnesses.get(&parent) {
        Some(h) if shown.contains(&&parent) => h,
        _ => {
            let ids: Vec<String> = shown.iter().map(|id| id.to_string()).collect();
            return Err(format!(
                "`parent` {parent} is not a candidate whose harness was shown; expected one of {ids:?}"
            ));
        }
    };
    let focus = match value.get("focus") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or("`focus` must be a list of strings")
            })
            .collect::<std::result::Result<_, _>>()?,
        Some(_) => return Err("`focus` must be a list of strings".into()),
    };
    let proposal = validate_edit(value, harness, history.tools)?;
    Ok(MetaProposal {
        parent,
        proposal,
        focus,
    })
}

#[async_trait]
impl Proposer for LlmProposer {
    fn name(&self) -> &str {
        "llm-proposer"
    }

    async fn propose(&self, history: &History<'_>) -> Result<Option<MetaProposal>> {
        let ask = Ask {
            role: PROPOSER_ROLE,
            messages: vec![
                ChatMessage::system(system_prompt()),
                ChatMessage::user(history.render(&self.bounds)),
            ],
            retries: self.retries,
            temperature: self.temperature,
            seed: Some(self.seed.wrapping_add(1_000 * history.slot as u64)),
            max_tokens: self.max_tokens,
            usage: &self.usage,
        };
        let proposal = ask_json(self.model.as_ref(), ask, |v| {
            validate_answer(v, history, &self.bounds)
        })
        .await;
        if proposal.is_none() {
            tracing::warn!(
                slot = history.slot,
                "proposer answer skipped after the retry budget"
            );
        }
        Ok(proposal)
    }

    fn usage(&self) -> RoleUsage {
        self.usage.get()
    }
}
