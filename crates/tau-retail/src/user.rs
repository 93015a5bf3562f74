//! The customer: the conversation protocol, the [`UserSimulator`] seam and the built-in
//! [`ScriptedUser`].
//!
//! ## Protocol
//! The conversation opens with the customer's first message, which is the task's instruction
//! ([`opening_message`]: the scenario's reason for the call in the customer's voice, without
//! the sentences that tell the simulated customer how to treat the agent). The agent speaks
//! to the customer only through the `respond{content}` tool; the tool's observation is the
//! customer's reply. When the customer ends the conversation, that observation ends the
//! episode. A turn without a tool call is the agent's closing message: it ends the
//! conversation too and counts as said to the customer. Every customer turn is an observation
//! (or the task instruction), never a policy token.
//!
//! ## The scripted customer
//! [`ScriptedUser`] is offline and deterministic: its replies depend only on the task and the
//! conversation so far. It
//! - discloses what the scenario's text holds when asked for it (email, name, zip code, user
//!   id, order ids, the payment method it wants) and says that it does not know the rest
//!   (in the words of the scenario's `unknown_info` where that covers it);
//! - answers a confirmation request "yes" only when it names exactly one of the task's
//!   pending gold writes: the action, its order id, every item id (old and new), its payment
//!   method id, its cancellation reason or its new address, and no other order, item or
//!   payment method id ([`confirmation_request`] writes such a request); any other proposal
//!   is refused;
//! - ends the conversation once every gold write has been made, every string the agent must
//!   communicate has been said, and the agent speaks again without asking anything; it also
//!   leaves after [`PATIENCE`] replies.
//!
//! It reads ids, not descriptions: "the blue lamp" does not name an item, `5320792178` does.
//! This makes it much stricter than the benchmark's LLM customer, which plugs in through
//! [`UserSimulator`]: `harness_pipeline::tau::LlmCustomer` drives the same protocol from the
//! scenario's instructions over the LLM roles' client (`env.tau_user = "llm"`); it lives
//! outside this crate, since environments never call a model.

use std::collections::BTreeSet;
use std::sync::LazyLock;

use async_trait::async_trait;
use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::tasks::{GoldAction, RetailTask};
use super::tools::name;

/// The scripted customer leaves after this many replies.
pub const PATIENCE: usize = 25;

/// One turn of the conversation as the customer side sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Turn {
    /// The customer said something.
    Customer {
        /// The text.
        text: String,
    },
    /// The agent said something to the customer (`respond`, or its closing text).
    Agent {
        /// The text.
        text: String,
    },
    /// The agent called a domain tool (the customer does not see these, but a simulator may
    /// use them to know what was done).
    Tool {
        /// The tool.
        name: String,
        /// Its arguments.
        arguments: Value,
        /// Whether it succeeded.
        ok: bool,
    },
}

/// The conversation so far, the opening message first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Conversation {
    /// The turns in order.
    pub turns: Vec<Turn>,
}

impl Conversation {
    /// What the agent has told the customer, message by message.
    pub fn agent_messages(&self) -> impl Iterator<Item = &str> {
        self.turns.iter().filter_map(|t| match t {
            Turn::Agent { text } => Some(text.as_str()),
            _ => None,
        })
    }

    /// The customer's replies after the opening message.
    pub fn replies(&self) -> usize {
        self.turns
            .iter()
            .filter(|t| matches!(t, Turn::Customer { .. }))
            .count()
            .saturating_sub(1)
    }

    /// Whether a tool call with exactly this name and these arguments was made.
    pub fn called(&self, action: &GoldAction) -> bool {
        self.turns.iter().any(|t| {
            matches!(t, Turn::Tool { name, arguments, .. }
                if *name == action.name && *arguments == action.arguments)
        })
    }
}

/// What the customer answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserReply {
    /// The text the agent sees.
    pub text: String,
    /// The customer ends the conversation with this reply.
    pub ends: bool,
}

impl UserReply {
    fn say(text: impl Into<String>) -> Self {
        UserReply {
            text: text.into(),
            ends: false,
        }
    }

    fn bye(text: impl Into<String>) -> Self {
        UserReply {
            text: text.into(),
            ends: true,
        }
    }
}

/// The customer's side of a conversation.
///
/// # Design
/// Stateless over explicit data: the reply depends on the task and the conversation, which
/// the session keeps, so one simulator serves concurrent episodes and a replayed episode
/// gets the same replies. The task carries ground truth (gold actions) that a scripted
/// customer needs and an LLM customer must not see; an LLM implementation should read only
/// `task.user_scenario`. The opening message is the task's instruction, so simulators answer
/// from the second customer turn on.
#[async_trait]
pub trait UserSimulator: Send + Sync {
    /// A short name for transcripts and outcome details.
    fn name(&self) -> &str;

    /// The reply to the agent's last message (the conversation's last [`Turn::Agent`]).
    async fn reply(
        &self,
        task: &RetailTask,
        conversation: &Conversation,
    ) -> harness_core::Result<UserReply>;
}

/// The built-in scripted customer (see the module documentation).
#[derive(Debug, Clone, Copy, Default)]
pub struct ScriptedUser;

static SENTENCE_END: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"[.!?]+(\s+|$)").expect("valid regex"));
static SECOND_PERSON: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\b(you are|you were|you're|you've|you'd|you'll|yourself|yours|your|you)\b")
        .expect("valid regex")
});
static ORDER_ID: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i)#?\bW(\d{7})\b").expect("valid regex"));
static ITEM_ID: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\b\d{10}\b").expect("valid regex"));
static PAYMENT_ID: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\b(?:credit_card|gift_card|paypal)_\d+\b").expect("valid regex")
});
static EMAIL: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+").expect("valid regex"));
static ZIP: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\b\d{5}\b").expect("valid regex"));

fn sentences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    for m in SENTENCE_END.find_iter(text) {
        out.push(text[start..m.end()].trim());
        start = m.end();
    }
    if start < text.len() {
        out.push(text[start..].trim());
    }
    out.into_iter().filter(|s| !s.is_empty()).collect()
}

const SUBJECT_BEFORE: [&str; 22] = [
    "if", "and", "but", "that", "when", "because", "so", "or", "then", "as", "since", "unless",
    "until", "while", "where", "what", "how", "why", "though", "although", "whether", "once",
];
const SUBJECT_AFTER: [&str; 30] = [
    "want", "wants", "have", "had", "do", "did", "don't", "didn't", "can", "cannot", "can't",
    "will", "would", "should", "must", "need", "received", "ordered", "wish", "prefer", "like",
    "think", "know", "remember", "just", "also", "only", "still", "recently", "live",
];

/// The scenario's second-person text in the customer's voice ("You received your order" ->
/// "I received my order").
pub fn first_person(text: &str) -> String {
    let mut out = String::new();
    let mut last = 0;
    for m in SECOND_PERSON.find_iter(text) {
        out.push_str(&text[last..m.start()]);
        let matched = m.as_str();
        let lower = matched.to_lowercase();
        let replacement = match lower.as_str() {
            "you are" => "I am",
            "you were" => "I was",
            "you're" => "I'm",
            "you've" => "I've",
            "you'd" => "I'd",
            "you'll" => "I'll",
            "yourself" => "myself",
            "yours" => "mine",
            "your" => "my",
            _ => {
                let before = text[..m.start()].trim_end();
                let previous = before
                    .rsplit(|c: char| !c.is_alphanumeric() && c != '\'')
                    .next()
                    .unwrap_or("")
                    .to_lowercase();
                let next = text[m.end()..]
                    .trim_start()
                    .split(|c: char| !c.is_alphanumeric() && c != '\'')
                    .next()
                    .unwrap_or("")
                    .to_lowercase();
                let sentence_start =
                    before.is_empty() || before.ends_with(['.', '!', '?', ',', ';', ':']);
                if sentence_start
                    || SUBJECT_BEFORE.contains(&previous.as_str())
                    || SUBJECT_AFTER.contains(&next.as_str())
                {
                    "I"
                } else {
                    "me"
                }
            }
        };
        let capital = matched.starts_with(|c: char| c.is_uppercase());
        if capital
            && replacement != "I"
            && !replacement.starts_with("I'")
            && !replacement.starts_with("I ")
        {
            let mut chars = replacement.chars();
            if let Some(first) = chars.next() {
                out.extend(first.to_uppercase());
                out.push_str(chars.as_str());
            }
        } else {
            out.push_str(replacement);
        }
        last = m.end();
    }
    out.push_str(&text[last..]);
    out
}

/// The customer's request: the reason for the call in the first person, without the
/// sentences about how to treat the agent.
fn request(task: &RetailTask) -> String {
    let reason = &task.user_scenario.instructions.reason_for_call;
    let kept: Vec<&str> = sentences(reason)
        .into_iter()
        .filter(|s| !s.to_lowercase().contains("agent"))
        .collect();
    let text = if kept.is_empty() {
        reason.trim().to_string()
    } else {
        kept.join(" ")
    };
    first_person(&text)
}

/// The customer's first message: the task's instruction.
pub fn opening_message(task: &RetailTask) -> String {
    format!("Hi! {}", request(task))
}

/// The confirmation request the scripted customer says yes to for `action` (a gold write):
/// the action, its ids, its reason or address, and a yes/no question.
pub fn confirmation_request(action: &GoldAction) -> String {
    let arg = |k: &str| {
        action
            .arguments
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let list = |k: &str| {
        action
            .arguments
            .get(k)
            .and_then(Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    };
    let address = || {
        ["address1", "address2", "city", "state", "country", "zip"]
            .iter()
            .map(|k| arg(k))
            .filter(|v| !v.is_empty())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let what = match action.name.as_str() {
        name::CANCEL_PENDING_ORDER => format!(
            "cancel order {} with the reason '{}'",
            arg("order_id"),
            arg("reason")
        ),
        name::EXCHANGE_DELIVERED_ORDER_ITEMS => format!(
            "exchange items {} of order {} for items {}, with the price difference settled through {}",
            list("item_ids"),
            arg("order_id"),
            list("new_item_ids"),
            arg("payment_method_id")
        ),
        name::MODIFY_PENDING_ORDER_ITEMS => format!(
            "modify items {} of order {} to items {}, with the price difference settled through {}",
            list("item_ids"),
            arg("order_id"),
            list("new_item_ids"),
            arg("payment_method_id")
        ),
        name::RETURN_DELIVERED_ORDER_ITEMS => format!(
            "return items {} of order {} with the refund to {}",
            list("item_ids"),
            arg("order_id"),
            arg("payment_method_id")
        ),
        name::MODIFY_PENDING_ORDER_PAYMENT => format!(
            "change the payment of order {} to {}",
            arg("order_id"),
            arg("payment_method_id")
        ),
        name::MODIFY_PENDING_ORDER_ADDRESS => format!(
            "change the shipping address of order {} to {}",
            arg("order_id"),
            address()
        ),
        name::MODIFY_USER_ADDRESS => {
            format!(
                "change the default address of your account to {}",
                address()
            )
        }
        other => format!("call {other} with {}", action.arguments),
    };
    format!("I will {what}. Do you confirm (yes/no)?")
}

/// The ids a text names: order ids (as `#W...`), ten-digit item ids, payment method ids.
#[derive(Debug, Default, PartialEq, Eq)]
struct Ids {
    orders: BTreeSet<String>,
    items: BTreeSet<String>,
    payments: BTreeSet<String>,
}

fn ids_in(text: &str) -> Ids {
    Ids {
        orders: ORDER_ID
            .captures_iter(text)
            .map(|c| format!("#W{}", &c[1]))
            .collect(),
        items: ITEM_ID
            .find_iter(text)
            .map(|m| m.as_str().to_string())
            .collect(),
        payments: PAYMENT_ID
            .find_iter(text)
            .map(|m| m.as_str().to_lowercase())
            .collect(),
    }
}

fn action_ids(action: &GoldAction) -> Ids {
    let arg = |k: &str| action.arguments.get(k).and_then(Value::as_str);
    let list = |k: &str| -> Vec<String> {
        action
            .arguments
            .get(k)
            .and_then(Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut items: BTreeSet<String> = list("item_ids").into_iter().collect();
    items.extend(list("new_item_ids"));
    Ids {
        orders: arg("order_id").map(str::to_string).into_iter().collect(),
        items,
        payments: arg("payment_method_id")
            .map(str::to_lowercase)
            .into_iter()
            .collect(),
    }
}

/// Whether `message` (lowercased) proposes exactly `action`.
fn proposes(message: &str, action: &GoldAction) -> bool {
    if ids_in(message) != action_ids(action) {
        return false;
    }
    let has = |words: &[&str]| words.iter().any(|w| message.contains(w));
    let arg = |k: &str| {
        action
            .arguments
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_lowercase()
    };
    let address_named = || {
        ["address1", "address2", "city", "state", "country", "zip"]
            .iter()
            .map(|k| arg(k))
            .all(|v| v.is_empty() || message.contains(&v))
    };
    match action.name.as_str() {
        name::CANCEL_PENDING_ORDER => has(&["cancel"]) && message.contains(&arg("reason")),
        name::EXCHANGE_DELIVERED_ORDER_ITEMS => has(&["exchange"]),
        name::MODIFY_PENDING_ORDER_ITEMS => has(&[
            "modify", "change", "exchange", "swap", "replace", "switch", "update",
        ]),
        name::RETURN_DELIVERED_ORDER_ITEMS => has(&["return"]),
        name::MODIFY_PENDING_ORDER_PAYMENT => has(&["pay"]),
        name::MODIFY_PENDING_ORDER_ADDRESS => has(&["address"]) && address_named(),
        name::MODIFY_USER_ADDRESS => {
            has(&["address"]) && has(&["default", "account", "profile"]) && address_named()
        }
        _ => false,
    }
}

const CONFIRM_CUES: [&str; 12] = [
    "confirm",
    "proceed",
    "yes/no",
    "yes or no",
    "shall i",
    "should i",
    "would you like me to",
    "do you want me to",
    "go ahead",
    "is that correct",
    "is this correct",
    "is that right",
];

const WRITE_WORDS: [&str; 10] = [
    "cancel", "return", "exchange", "modify", "change", "update", "swap", "replace", "refund",
    "switch",
];

/// A fact the agent can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fact {
    Email,
    Name,
    Zip,
    UserId,
    OrderId,
    Payment,
}

impl Fact {
    fn asked(self, message: &str) -> bool {
        let has = |words: &[&str]| words.iter().any(|w| message.contains(w));
        match self {
            Fact::Email => has(&["email", "e-mail"]),
            Fact::Name => {
                has(&["name"]) && !has(&["user name", "username"]) || has(&["who am i speaking"])
            }
            Fact::Zip => has(&["zip", "postal", "postcode"]),
            Fact::UserId => has(&["user id", "username", "user name"]),
            Fact::OrderId => has(&[
                "order id",
                "order number",
                "order #",
                "which order",
                "order ids",
            ]),
            Fact::Payment => has(&[
                "payment method",
                "which card",
                "how would you like to pay",
                "refund to",
                "refunded to",
                "pay for",
            ]),
        }
    }

    /// The word the scenario's `unknown_info` would use for it.
    fn keyword(self) -> &'static str {
        match self {
            Fact::Email => "email",
            Fact::Name => "name",
            Fact::Zip => "zip",
            Fact::UserId => "user id",
            Fact::OrderId => "order",
            Fact::Payment => "payment",
        }
    }

    fn unknown(self) -> &'static str {
        match self {
            Fact::Email => "I don't know my email address.",
            Fact::Name => "I'd rather not say my name.",
            Fact::Zip => "I don't know my zip code.",
            Fact::UserId => "I don't know my user id.",
            Fact::OrderId => "I don't know the order id.",
            Fact::Payment => "I'd like to use the original payment method.",
        }
    }
}

const FACTS: [Fact; 6] = [
    Fact::Name,
    Fact::Zip,
    Fact::Email,
    Fact::UserId,
    Fact::OrderId,
    Fact::Payment,
];

fn words_of(text: &str) -> Vec<String> {
    text.to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

fn join_and(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

impl ScriptedUser {
    /// The scenario's answer for `fact`, or `None` when the scenario does not hold it.
    fn disclose(&self, task: &RetailTask, fact: Fact) -> Option<String> {
        let text = task.scenario_text();
        let lower = text.to_lowercase();
        let words = words_of(&text);
        let customer = task.customer.as_ref();
        match fact {
            Fact::Email => {
                let emails: Vec<String> = EMAIL
                    .find_iter(&text)
                    .map(|m| m.as_str().trim_end_matches('.').to_string())
                    .collect();
                match emails.as_slice() {
                    [] => None,
                    [one] => Some(format!("My email is {one}.")),
                    many => Some(format!("My emails are {}.", join_and(many))),
                }
            }
            Fact::Name => {
                let c = customer?;
                let known = words.contains(&c.first_name.to_lowercase())
                    && words.contains(&c.last_name.to_lowercase());
                known.then(|| format!("My name is {} {}.", c.first_name, c.last_name))
            }
            Fact::Zip => {
                let zips: Vec<&str> = ZIP.find_iter(&text).map(|m| m.as_str()).collect();
                let zip = customer
                    .map(|c| c.zip.as_str())
                    .filter(|z| zips.contains(z))
                    .or_else(|| zips.first().copied())?;
                Some(format!("My zip code is {zip}."))
            }
            Fact::UserId => {
                let c = customer?;
                lower
                    .contains(&c.user_id.to_lowercase())
                    .then(|| format!("My user id is {}.", c.user_id))
            }
            Fact::OrderId => {
                let orders: Vec<String> = ids_in(&text).orders.into_iter().collect();
                match orders.as_slice() {
                    [] => None,
                    [one] => Some(format!("The order id is {one}.")),
                    many => Some(format!("The order ids are {}.", join_and(many))),
                }
            }
            Fact::Payment => {
                let kinds = [
                    ("paypal", "paypal", "PayPal account"),
                    ("gift_card", "gift card", "gift card"),
                    ("credit_card", "credit card", "credit card"),
                ];
                let wanted = task.gold_writes().find_map(|a| {
                    a.arguments
                        .get("payment_method_id")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                })?;
                kinds
                    .iter()
                    .find(|(prefix, word, _)| wanted.starts_with(prefix) && lower.contains(word))
                    .map(|(_, _, said)| format!("Please use my {said}."))
            }
        }
    }

    /// What the customer says about a fact the scenario does not hold.
    fn not_known(&self, task: &RetailTask, fact: Fact) -> String {
        let unknown = task
            .user_scenario
            .instructions
            .unknown_info
            .as_deref()
            .unwrap_or_default();
        sentences(unknown)
            .into_iter()
            .find(|s| s.to_lowercase().contains(fact.keyword()))
            .map(|s| {
                let s = first_person(s);
                if s.ends_with(['.', '!', '?']) {
                    s
                } else {
                    format!("{s}.")
                }
            })
            .unwrap_or_else(|| fact.unknown().to_string())
    }

    /// The scripted reply (see the module documentation).
    pub fn reply_to(&self, task: &RetailTask, conversation: &Conversation) -> UserReply {
        let message = conversation
            .agent_messages()
            .last()
            .unwrap_or_default()
            .to_lowercase();
        if conversation.replies() + 1 >= PATIENCE {
            return UserReply::bye("I have to go now. Goodbye.");
        }
        let pending: Vec<&GoldAction> = task
            .gold_writes()
            .filter(|a| !conversation.called(a))
            .collect();
        let asks_confirmation = CONFIRM_CUES.iter().any(|c| message.contains(c));
        let proposes_write =
            WRITE_WORDS.iter().any(|w| message.contains(w)) || ids_in(&message) != Ids::default();
        if asks_confirmation && proposes_write {
            if pending.iter().any(|a| proposes(&message, a)) {
                return UserReply::say("Yes, please go ahead.");
            }
            if ids_in(&message) == Ids::default() && !message.contains("address") {
                return UserReply::say(
                    "Before I say yes, please list the exact details: the order id, the item ids and the payment method id.",
                );
            }
            return UserReply::say("No, that is not what I want.");
        }
        let asked: Vec<Fact> = FACTS.into_iter().filter(|f| f.asked(&message)).collect();
        if (!asked.is_empty() && message.contains('?')) || asked.len() > 1 {
            let answers: Vec<String> = asked
                .iter()
                .map(|f| {
                    self.disclose(task, *f)
                        .unwrap_or_else(|| self.not_known(task, *f))
                })
                .collect();
            return UserReply::say(answers.join(" "));
        }
        if asks_confirmation {
            // An offer that changes nothing (a lookup, an explanation): accept it.
            return UserReply::say("Yes, please.");
        }
        let said_all = task
            .evaluation_criteria
            .communicate_info
            .iter()
            .all(|info| {
                let info = info.to_lowercase();
                conversation
                    .agent_messages()
                    .any(|m| m.to_lowercase().replace(',', "").contains(&info))
            });
        let transfer_pending = task
            .evaluation_criteria
            .actions
            .iter()
            .any(|a| a.name == name::TRANSFER_TO_HUMAN_AGENTS && !conversation.called(a));
        if pending.is_empty() && said_all && !transfer_pending {
            return UserReply::bye("Thank you, that's all I needed. Goodbye!");
        }
        if transfer_pending && pending.is_empty() && said_all {
            return UserReply::say("I'd like to talk to a human agent, please.");
        }
        UserReply::say(format!(
            "I still need help with my request. {}",
            request(task)
        ))
    }
}

#[async_trait]
impl UserSimulator for ScriptedUser {
    fn name(&self) -> &str {
        "scripted"
    }

    async fn reply(
        &self,
        task: &RetailTask,
        conversation: &Conversation,
    ) -> harness_core::Result<UserReply> {
        Ok(self.reply_to(task, conversation))
    }
}

/// Whether a customer's reply accepts a proposal ("Yes, please go ahead.").
pub fn is_affirmative(reply: &str) -> bool {
    let lower = reply.trim_start().to_lowercase();
    [
        "yes",
        "yeah",
        "yep",
        "sure",
        "ok",
        "okay",
        "please do",
        "go ahead",
        "confirmed",
        "i confirm",
    ]
    .iter()
    .any(|w| lower.starts_with(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_person_becomes_first_person() {
        assert_eq!(
            first_person("You received your order #W1 and wish to exchange it."),
            "I received my order #W1 and wish to exchange it."
        );
        assert_eq!(
            first_person("You do not remember your email address"),
            "I do not remember my email address"
        );
        assert_eq!(
            first_person("Your name is Ann, and you live in 46236."),
            "My name is Ann, and I live in 46236."
        );
        assert_eq!(
            first_person("It is yours; they told you."),
            "It is mine; they told me."
        );
    }

    #[test]
    fn ids_are_read_from_text() {
        let ids = ids_in(
            "Order #W2378156 (or w1234567): items 1151293680 and 4983901480 via credit_card_9513926, zip 19122.",
        );
        assert_eq!(ids.orders.len(), 2);
        assert!(ids.orders.contains("#W2378156") && ids.orders.contains("#W1234567"));
        assert_eq!(ids.items.len(), 2);
        assert_eq!(ids.payments.iter().next().unwrap(), "credit_card_9513926");
    }
}
