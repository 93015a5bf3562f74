//! Your own policy: implement [`Policy`] over whatever produces the next turn (a model you
//! serve yourself, a rule-based baseline, a bandit), and run episodes with it.
//!
//! ```text
//! cargo run --release --example custom_policy
//! ```
//!
//! The policy here is a softmax over a small menu of whole actions, one logit per (context,
//! action): a policy with a real sampling distribution, so its turns carry the exact tokens
//! sampled and their log-probabilities, as a trainer needs (the `custom_learner` example trains
//! it). What a [`Policy`] must honour:
//!
//! - `generate` returns the text of the turn, the tokens it sampled (`tokens`), the prompt
//!   tokens it conditioned on (`context_tokens`) and each sampled token's log-probability under
//!   the distribution it was drawn from (`logprobs`, at the request's temperature);
//! - it samples with the request's `seed`, so an episode is reproducible, and stops at
//!   `max_new_tokens` (here every action is one token);
//! - it may be called from many episodes at once: keep shared state behind a lock.
//!
//! A model behind an HTTP server needs no code: harness-openai's `OpenAiPolicy` speaks the
//! OpenAI-compatible API (vLLM, SGLang), and grpo-candle's `CandlePolicy` runs a checkpoint in
//! process.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use harness_core::{
    Environment, FinishReason, Harness, Policy, PolicyRequest, PolicyTurn, Result, Role, Split,
    Task, ToolCall, pass_and_avg_at_k, run_episode,
};
use harness_testkit::ScriptedEnv;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

/// The menu's logits, keyed by the context (the task's instruction) and then by action.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Logits {
    /// One logit per action of the menu, per context.
    pub by_context: HashMap<String, Vec<f64>>,
}

/// A softmax policy over whole actions. Token `i` is the menu's `i`-th action.
pub struct MenuPolicy {
    /// The actions, as the text the policy says (a tool-call block each).
    pub menu: Vec<String>,
    /// The initial logits of a context not seen before.
    pub prior: Vec<f64>,
    /// Shared with whatever trains the policy.
    pub logits: Arc<RwLock<Logits>>,
}

impl MenuPolicy {
    /// The context key of a request: the task's instruction, the first user message.
    pub fn context(request: &PolicyRequest) -> String {
        request
            .messages
            .iter()
            .find(|m| m.role == Role::User)
            .map(|m| m.content.clone())
            .unwrap_or_default()
    }

    /// The action probabilities of a context at `temperature` (> 0).
    pub fn probabilities(&self, context: &str, temperature: f64) -> Vec<f64> {
        let logits = self.logits.read().unwrap_or_else(|e| e.into_inner());
        let row = logits.by_context.get(context).unwrap_or(&self.prior);
        softmax(row, temperature)
    }
}

/// `softmax(logits / temperature)`.
pub fn softmax(logits: &[f64], temperature: f64) -> Vec<f64> {
    let t = temperature.max(1e-6);
    let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let exp: Vec<f64> = logits.iter().map(|l| ((l - max) / t).exp()).collect();
    let sum: f64 = exp.iter().sum();
    exp.into_iter().map(|e| e / sum).collect()
}

#[async_trait]
impl Policy for MenuPolicy {
    fn name(&self) -> &str {
        "menu"
    }

    async fn generate(&self, request: PolicyRequest) -> Result<PolicyTurn> {
        let context = MenuPolicy::context(&request);
        // The prompt tokens this turn conditioned on: here the context's bytes (a language
        // model reports the ids of its rendered chat template).
        let context_tokens: Vec<u32> = context.bytes().map(u32::from).collect();
        if request.max_new_tokens == 0 {
            return Ok(PolicyTurn {
                text: String::new(),
                context_tokens,
                tokens: Vec::new(),
                logprobs: Vec::new(),
                finish: FinishReason::Length,
            });
        }
        let temperature = f64::from(request.sampling.temperature);
        let (action, logprob) = if temperature <= 0.0 {
            // Greedy: a point mass, so the recorded log q is 0.
            let p = self.probabilities(&context, 1.0);
            let best = (0..p.len())
                .max_by(|a, b| p[*a].total_cmp(&p[*b]))
                .unwrap_or(0);
            (best, 0.0)
        } else {
            let p = self.probabilities(&context, temperature);
            let mut rng = ChaCha8Rng::seed_from_u64(request.seed);
            let mut u: f64 = rng.r#gen();
            let mut chosen = p.len() - 1;
            for (i, pi) in p.iter().enumerate() {
                if u < *pi {
                    chosen = i;
                    break;
                }
                u -= pi;
            }
            (chosen, p[chosen].ln() as f32)
        };
        Ok(PolicyTurn {
            text: self.menu[action].clone(),
            context_tokens,
            tokens: vec![action as u32],
            logprobs: vec![logprob],
            finish: FinishReason::Stop,
        })
    }
}

/// A menu for the scripted environment's tasks: submit the right answer (`ok`) or one of two
/// wrong ones. The prior favours the wrong answers: about one episode in five succeeds.
pub fn answer_menu() -> MenuPolicy {
    let submit =
        |answer: &str| ToolCall::new("submit", json!({ "answer": answer })).to_tool_call_block();
    MenuPolicy {
        menu: vec![submit("ok"), submit("maybe"), submit("no")],
        prior: vec![0.0, 0.7, 0.7],
        logits: Arc::new(RwLock::new(Logits::default())),
    }
}

/// `n` tasks of the scripted environment whose accepted answer is `ok`.
pub fn tasks(n: usize, split: Split) -> Vec<Task> {
    let env = ScriptedEnv::new(1);
    (0..n)
        .map(|i| {
            let mut task = env.task(&format!("{split}-{i}"), "ok");
            task.split = split;
            task
        })
        .collect()
}

/// Pass@k and Avg@k (fractions) of `policy` on `tasks` under `harness`, `k` episodes per task.
pub async fn evaluate(
    policy: &dyn Policy,
    harness: &Harness,
    tasks: &[Task],
    k: u64,
) -> Result<(f64, f64)> {
    let env = ScriptedEnv::new(1);
    let mut successes = Vec::new();
    for (i, task) in tasks.iter().enumerate() {
        let mut row = Vec::new();
        for attempt in 0..k {
            // A seed of its own per task and attempt.
            let seed = 1000 * (i as u64 + 1) + attempt;
            let t = run_episode(policy, harness, &env, task, seed).await?;
            row.push(t.reward());
        }
        successes.push(row);
    }
    Ok(pass_and_avg_at_k(&successes))
}

/// Sample a few episodes with the menu policy and report Pass@3 / Avg@3.
pub async fn run() -> anyhow::Result<(f64, f64)> {
    let policy = answer_menu();
    let harness = Harness::new("H0", "Answer with the submit tool.");
    let tasks = tasks(8, Split::Test);
    // The same seed samples the same turn.
    let env = ScriptedEnv::new(1);
    let a = run_episode(&policy, &harness, &env, &tasks[0], 5).await?;
    let b = run_episode(&policy, &harness, &env, &tasks[0], 5).await?;
    anyhow::ensure!(
        a.turns[0].tokens == b.turns[0].tokens,
        "sampling is not seeded"
    );
    Ok(evaluate(&policy, &harness, &tasks, 3).await?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (pass, avg) = run().await?;
    let env = ScriptedEnv::new(1);
    println!(
        "menu policy on 8 tasks of `{}`: Pass@3 {:.1}, Avg@3 {:.1}",
        env.name(),
        pass * 100.0,
        avg * 100.0
    );
    Ok(())
}
