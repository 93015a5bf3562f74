//! The reward, as the benchmark computes it.
//!
//! An episode scores 1 when
//! 1. the conversation ended properly: the customer ended it, the agent closed it (a turn
//!    without a tool call) or transferred the customer (the benchmark scores 0 for a
//!    conversation stopped by a limit, and so do we);
//! 2. the database equals the one the task's gold actions leave when replayed on a fresh copy
//!    of the initial database (gold actions that fail are skipped, as the benchmark skips
//!    them); and
//! 3. every `communicate_info` string appears in one of the agent's messages to the customer
//!    (case-insensitive, with the message's commas removed, as the benchmark matches it).
//!
//! The benchmark repository's tasks weigh the database and NL assertions (`reward_basis`), and
//! an LLM judges the assertions; the PyPI wheel's tasks leave `reward_basis` out, which means
//! the database and the communicated information, and their assertions are not weighed. Those are not checked unless an [`NlJudge`] is injected
//! ([`super::TauRetail::with_judge`]); the outcome's details say so. The communicate check is
//! this project's stand-in for the assertions that ask whether the agent told the customer a
//! figure, and is always applied.
//!
//! The details name what failed: `failed` lists the checks (`conversation`, `db`,
//! `communicate`, `nl_assertions`), `db.first_difference` gives the first differing field with
//! its expected and found values, `communicate.missing` the strings never said. They also list
//! the protocol's `policy_violations` (a write before any successful user lookup, a write not
//! right after the customer's yes), which do not change the reward, as they do not in the
//! benchmark's database check.

use std::sync::Arc;

use async_trait::async_trait;
use harness_core::Outcome;
use serde_json::{Value, json};

use super::db::RetailDb;
use super::tasks::RetailTask;
use super::tools;
use super::user::Conversation;

/// A judge of the benchmark's NL assertions (an LLM over the conversation, in the benchmark).
///
/// # Design
/// Environments never call a model: an implementation that asks an LLM lives outside this
/// crate (with the roles' OpenAI-compatible client: `harness_pipeline::tau::LlmJudge`) and is
/// injected as a trait object.
#[async_trait]
pub trait NlJudge: Send + Sync {
    /// A short name for outcome details.
    fn name(&self) -> &str;

    /// Whether each of `task`'s NL assertions holds of the conversation, in order.
    async fn judge(
        &self,
        task: &RetailTask,
        conversation: &Conversation,
    ) -> harness_core::Result<Vec<bool>>;
}

/// How the conversation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The customer ended it.
    Customer,
    /// The agent closed it with a turn without a tool call.
    Agent,
    /// The agent transferred the customer to a human.
    Transfer,
}

impl Ending {
    fn as_str(self) -> &'static str {
        match self {
            Ending::Customer => "customer",
            Ending::Agent => "agent",
            Ending::Transfer => "transfer",
        }
    }
}

/// The database the task's gold actions leave, with the gold actions that failed.
pub fn gold_database(task: &RetailTask, initial: &RetailDb) -> (RetailDb, Vec<Value>) {
    let mut db = initial.clone();
    let mut failures = Vec::new();
    for action in &task.evaluation_criteria.actions {
        if let Err(message) = tools::call(&mut db, &action.name, &action.arguments) {
            failures.push(json!({"action_id": action.action_id, "error": message}));
        }
    }
    (db, failures)
}

/// The `communicate_info` strings no agent message contains.
pub fn missing_information(task: &RetailTask, conversation: &Conversation) -> Vec<String> {
    let messages: Vec<String> = conversation
        .agent_messages()
        .map(|m| m.to_lowercase().replace(',', ""))
        .collect();
    task.evaluation_criteria
        .communicate_info
        .iter()
        .filter(|info| {
            let info = info.to_lowercase();
            !messages.iter().any(|m| m.contains(&info))
        })
        .cloned()
        .collect()
}

/// Everything the verifier looks at.
pub struct Episode<'a> {
    /// The task.
    pub task: &'a RetailTask,
    /// The database every episode starts from.
    pub initial: &'a RetailDb,
    /// The database the episode left.
    pub db: &'a RetailDb,
    /// The conversation.
    pub conversation: &'a Conversation,
    /// How it ended, if it did.
    pub ending: Option<Ending>,
    /// Protocol violations the session recorded.
    pub violations: &'a [Value],
}

/// Judge an episode (see the module documentation).
pub async fn judge(
    episode: Episode<'_>,
    nl_judge: Option<&Arc<dyn NlJudge>>,
) -> harness_core::Result<Outcome> {
    let task = episode.task;
    let mut failed = Vec::new();
    if episode.ending.is_none() {
        failed.push("conversation");
    }
    let (gold, gold_failures) = gold_database(task, episode.initial);
    let difference = episode.db.first_difference(&gold);
    if difference.is_some() {
        failed.push("db");
    }
    let missing = missing_information(task, episode.conversation);
    if !missing.is_empty() {
        failed.push("communicate");
    }
    let criteria = &task.evaluation_criteria;
    let assertions = criteria.nl_assertions.clone().unwrap_or_default();
    let weighed = criteria.reward_basis.iter().any(|b| b == "NL_ASSERTION");
    let nl = match nl_judge {
        Some(judge) if !assertions.is_empty() && weighed => {
            let verdicts = judge.judge(task, episode.conversation).await?;
            let held = verdicts.len() == assertions.len() && verdicts.iter().all(|v| *v);
            if !held {
                failed.push("nl_assertions");
            }
            json!({"judge": judge.name(), "assertions": assertions, "verdicts": verdicts})
        }
        _ if assertions.is_empty() => json!("the task has no NL assertions"),
        _ if !weighed => json!(format!(
            "not checked: the task's reward_basis {:?} does not weigh its {} NL assertion(s)",
            criteria.reward_basis,
            assertions.len()
        )),
        _ => json!(format!(
            "not checked: no judge was given; the benchmark's LLM judge would check {} statement(s)",
            assertions.len()
        )),
    };
    let details = json!({
        "failed": failed,
        "ended_by": episode.ending.map(Ending::as_str),
        "db": {
            "match": difference.is_none(),
            "first_difference": difference,
            "gold_action_errors": gold_failures,
        },
        "communicate": {
            "required": criteria.communicate_info,
            "missing": missing,
        },
        "nl_assertions": nl,
        "reward_basis": criteria.reward_basis,
        "policy_violations": episode.violations,
    });
    Ok(if failed.is_empty() {
        Outcome::success(details)
    } else {
        Outcome::failure(details)
    })
}
