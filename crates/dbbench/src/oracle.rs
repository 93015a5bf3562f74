//! The reference solver of DBBench tasks: the gold SQL (for tasks that have one), then the
//! label committed as the answer. It scores 1.0 on every task whose label and hash are right,
//! which is what `dbbench_check` and the conformance suite rely on.

use async_trait::async_trait;
use harness_core::{Policy, PolicyRequest, PolicyTurn, Result, Role, Task, ToolCall};
use serde_json::json;

use super::{COMMIT_TOOL, SQL_TOOL, db_task};

/// The oracle's turns for `task`, in the `<tool_call>` format or the classic text format.
pub fn oracle_turns(task: &Task, text_format: bool) -> Result<Vec<String>> {
    let db_task = db_task(task).map_err(harness_core::Error::from)?;
    let answers: Vec<String> = if db_task.is_modification() {
        Vec::new()
    } else {
        db_task.label.clone()
    };
    let mut turns = Vec::new();
    if let Some(sql) = &db_task.gold_sql {
        turns.push(if text_format {
            format!("I will run the query.\nAction: Operation\n```sql\n{sql}\n```")
        } else {
            ToolCall::new(SQL_TOOL, json!({ "query": sql })).to_tool_call_block()
        });
    }
    turns.push(if text_format {
        format!("Done.\nAction: Answer\nFinal Answer: {}", json!(answers))
    } else {
        ToolCall::new(COMMIT_TOOL, json!({ "answers": answers })).to_tool_call_block()
    });
    Ok(turns)
}

/// A policy that says [`oracle_turns`] one per turn. Stateless (the turn index is the number of
/// earlier assistant messages), so one value serves concurrent episodes of its task.
#[derive(Debug, Clone)]
pub struct OraclePolicy {
    turns: Vec<String>,
}

impl OraclePolicy {
    /// The oracle of `task` in the `<tool_call>` format.
    pub fn new(task: &Task) -> Result<Self> {
        Ok(OraclePolicy {
            turns: oracle_turns(task, false)?,
        })
    }

    /// The oracle of `task` in the classic text format.
    pub fn text_format(task: &Task) -> Result<Self> {
        Ok(OraclePolicy {
            turns: oracle_turns(task, true)?,
        })
    }
}

#[async_trait]
impl Policy for OraclePolicy {
    fn name(&self) -> &str {
        "dbbench-oracle"
    }

    async fn generate(&self, request: PolicyRequest) -> Result<PolicyTurn> {
        let done = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        let text = self
            .turns
            .get(done)
            .cloned()
            .unwrap_or_else(|| "The answer is committed.".into());
        Ok(PolicyTurn::text_only(text, request.max_new_tokens))
    }
}
