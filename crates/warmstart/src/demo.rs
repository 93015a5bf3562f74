//! The demonstrations: a scripted policy that solves DBBench tasks like the environment's
//! oracle, except in the planted families, where it does the "bad" thing unless a sibling's
//! hook message asks for the good one (or, in a small seeded share of episodes, by itself).
//!
//! The script runs inside the real agent loop under the real harness, so its contexts (system
//! prompt, tools, observations, hook messages) are exactly those the policy sees at run time.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use harness_core::{
    Environment, EpisodeOptions, Harness, Policy, PolicyRequest, PolicyTurn, Role, Split, Task,
    ToolCall, Trajectory, run_episode_with,
};
use harness_envs::dbbench::{self, COMMIT_TOOL, DbLimits, DbSession, SQL_TOOL, generate};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::environment::Family;
use crate::error::{Error, Result};
use crate::organism::Organism;
use crate::settings::WarmStartSettings;

/// What the script does on one task.
#[derive(Debug, Clone)]
pub struct DemoScript {
    family: Family,
    /// The gold SQL (names quoted with backticks).
    gold_sql: Option<String>,
    /// The first statement: the gold SQL, or in [`Family::Quoting`] the gold SQL with its
    /// backticks removed.
    first_sql: Option<String>,
    /// Whether `first_sql` fails.
    first_fails: bool,
    /// The check after a change ([`Family::Change`]).
    check_sql: String,
    /// The committed answers.
    answers: Vec<String>,
    /// What counts as a repair.
    cues: Arc<Cues>,
    /// This episode does the good thing without being prompted.
    unprompted_good: bool,
}

/// What the script reads as a repair: hook messages (under
/// [`Organism::RecoveryHooks`]) or the repairing prompt rules' texts in the system prompt
/// (under [`Organism::PromptRules`]).
#[derive(Debug, Clone, Default)]
pub struct Cues {
    /// The organism's variant.
    pub organism: Organism,
    /// Hook messages by text -> hook name.
    pub hooks: BTreeMap<String, String>,
    /// Each family's repairing rule texts.
    pub rules: Vec<(Family, String)>,
}

impl Cues {
    /// The cues of `harnesses` under `organism`: every hook's message, and the text of every
    /// repairing rule a harness carries.
    pub fn of(organism: Organism, harnesses: &[Harness]) -> Arc<Cues> {
        let mut rules = Vec::new();
        for h in harnesses {
            for family in Family::ALL {
                if let Some(rule) = organism.repairing_rule(family)
                    && let Some(text) = crate::environment::rule_text(h, rule)
                {
                    let entry = (family, text.trim().to_string());
                    if !rules.contains(&entry) {
                        rules.push(entry);
                    }
                }
            }
        }
        Arc::new(Cues {
            organism,
            hooks: hook_messages(harnesses),
            rules,
        })
    }
}

impl DemoScript {
    /// The script of `task`; `cues` says what a repair looks like ([`Cues::of`]);
    /// `unprompted_good` makes the planted decision good without a repair.
    pub fn new(task: &Task, cues: Arc<Cues>, unprompted_good: bool) -> Result<Self> {
        let db = dbbench::db_task(task).map_err(|e| Error::Demo(e.to_string()))?;
        let family = Family::of_task(task)
            .ok_or_else(|| Error::Demo(format!("task `{}`: unknown question type", task.id)))?;
        let answers = if db.is_modification() {
            Vec::new()
        } else {
            db.label.clone()
        };
        let table = db
            .tables
            .first()
            .map(|t| t.name.clone())
            .unwrap_or_default();
        let gold_sql = db.gold_sql.clone();
        let mut first_sql = gold_sql.clone();
        let mut first_fails = false;
        if let (Family::Quoting, Some(gold)) = (family, &gold_sql) {
            let bare = gold.replace('`', "");
            if bare != *gold {
                let session = DbSession::new(task, DbLimits::default())
                    .map_err(|e| Error::Demo(e.to_string()))?;
                let bare_obs = session.execute_sql(&bare);
                let gold_obs = session.execute_sql(gold);
                if bare_obs.error {
                    first_sql = Some(bare);
                    first_fails = true;
                } else if bare_obs.text == gold_obs.text {
                    first_sql = Some(bare);
                }
                // Unquoted names that run but read something else: no plant, the gold SQL.
            }
        }
        Ok(DemoScript {
            family,
            gold_sql,
            first_sql,
            first_fails,
            check_sql: format!("SELECT COUNT(*) FROM `{table}`"),
            answers,
            cues,
            unprompted_good,
        })
    }

    /// The task's family.
    pub fn family(&self) -> Family {
        self.family
    }

    /// Whether this episode does the planted family's good thing without a hook message.
    pub fn unprompted_good(&self) -> bool {
        self.unprompted_good
    }

    /// Whether the first statement fails (a [`Family::Quoting`] task with names to quote).
    pub fn first_fails(&self) -> bool {
        self.first_fails
    }

    fn sql(query: &str) -> String {
        ToolCall::new(SQL_TOOL, json!({ "query": query })).to_tool_call_block()
    }

    fn commit(answers: &[String]) -> String {
        ToolCall::new(COMMIT_TOOL, json!({ "answers": answers })).to_tool_call_block()
    }

    /// The next turn's text given the conversation so far.
    pub fn next_turn(&self, messages: &[harness_core::ChatMessage]) -> String {
        let organism = self.cues.organism;
        // Under prompt rules the repair is in the system prompt from the start.
        let ruled = messages
            .iter()
            .find(|m| m.role == Role::System)
            .is_some_and(|system| {
                self.cues
                    .rules
                    .iter()
                    .any(|(f, text)| *f == self.family && system.content.contains(text.as_str()))
            });
        let last_assistant = messages.iter().rposition(|m| m.role == Role::Assistant);
        let Some(last) = last_assistant else {
            if organism == Organism::PromptRules
                && self.family == Family::Quoting
                && (ruled || self.unprompted_good)
            {
                // The rule (or the policy by itself) quotes the names from the first statement.
                if let Some(gold) = &self.gold_sql {
                    return Self::sql(gold);
                }
            }
            return match &self.first_sql {
                Some(sql) => Self::sql(sql),
                None => Self::commit(&self.answers),
            };
        };
        let prompted: Vec<&str> = if organism == Organism::RecoveryHooks {
            messages[last + 1..]
                .iter()
                .filter(|m| m.role == Role::User)
                .filter_map(|m| self.cues.hooks.get(&m.content).map(String::as_str))
                .collect()
        } else {
            // Hook messages repair nothing in this variant.
            Vec::new()
        };
        // A hook counts with the hooks that prompt for the same behaviour (the built-in editor's
        // reminders paraphrase the hand-written siblings').
        let has = |hook: &str| {
            crate::environment::same_behaviour(hook)
                .iter()
                .any(|h| prompted.contains(h))
        };
        let said = &messages[last].content;
        let gold = self.gold_sql.as_deref().unwrap_or_default();
        let first = self.first_sql.as_deref().unwrap_or_default();
        let first_turn = last_assistant == messages.iter().position(|m| m.role == Role::Assistant);
        let commit = Self::commit(&self.answers);
        if !organism.plants(self.family) {
            return commit;
        }
        match self.family {
            Family::Quoting if self.first_fails && *said == Self::sql(first) => {
                if has(crate::environment::RECOVERY_HOOK)
                    || (self.unprompted_good && organism == Organism::RecoveryHooks)
                {
                    Self::sql(gold)
                } else if has(crate::environment::LOW_BUDGET_HOOK) {
                    // Told to commit with nothing found: an empty (wrong) answer.
                    Self::commit(&[])
                } else {
                    Self::sql(first)
                }
            }
            Family::Change => {
                let told = ruled
                    || has(crate::environment::COMMIT_AFTER_CHANGE_HOOK)
                    || has(crate::environment::LOW_BUDGET_HOOK);
                if told || (self.unprompted_good && first_turn) {
                    commit
                } else {
                    Self::sql(&self.check_sql)
                }
            }
            Family::Recheck => {
                if has(crate::environment::LOW_BUDGET_HOOK) || (self.unprompted_good && first_turn)
                {
                    commit
                } else {
                    Self::sql(gold)
                }
            }
            _ => commit,
        }
    }
}

#[async_trait]
impl Policy for DemoScript {
    fn name(&self) -> &str {
        "warmstart-demo"
    }

    async fn generate(&self, request: PolicyRequest) -> harness_core::Result<PolicyTurn> {
        Ok(PolicyTurn::text_only(
            self.next_turn(&request.messages),
            request.max_new_tokens,
        ))
    }
}

/// One planned demonstration: a training task, the harness it runs under and the episode's
/// draws.
#[derive(Debug, Clone)]
pub struct DemoSpec {
    /// The task.
    pub task: Task,
    /// Index into `[H0, siblings...]`.
    pub harness: usize,
    /// The episode does the good thing without a hook message.
    pub unprompted_good: bool,
    /// The episode seed.
    pub seed: u64,
}

/// Per-family counts of the demonstrations.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FamilyCounts {
    /// Demonstrations of the family.
    pub demos: usize,
    /// Demonstrations that did the planted bad thing at least once.
    pub planted: usize,
    /// Demonstrations where a repairing hook message appeared.
    pub prompted: usize,
    /// Demonstrations that did the good thing without a hook message.
    pub unprompted_good: usize,
    /// Successful demonstrations.
    pub successes: usize,
}

/// A recorded demonstration.
#[derive(Debug, Clone)]
pub struct Demonstration {
    /// The episode.
    pub trajectory: Trajectory,
    /// The task's family.
    pub family: Family,
    /// The harness's name.
    pub harness: String,
    /// Whether the planted decision was made good without a hook message.
    pub unprompted_good: bool,
    /// The organism's variant it was recorded for.
    pub organism: Organism,
    /// Whether the family is planted in the organism's variant.
    pub planted_family: bool,
    /// Whether the harness carried a rule that repairs the family (under
    /// [`Organism::PromptRules`]).
    pub ruled: bool,
}

impl Demonstration {
    /// The policy's turns, in order.
    pub fn turns(&self) -> Vec<&str> {
        self.trajectory
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .map(|m| m.content.as_str())
            .collect()
    }

    /// Whether a repair of this family was in the episode: a repairing hook's message, or a
    /// repairing rule in the system prompt.
    pub fn prompted(&self) -> bool {
        let hooks = self.organism.repairing_hooks(self.family);
        self.ruled
            || self
                .trajectory
                .messages
                .iter()
                .any(|m| m.hook.as_deref().is_some_and(|h| hooks.contains(&h)))
    }

    /// Whether the episode did its family's planted bad thing at least once (and so failed
    /// where that was all it did).
    pub fn planted(&self) -> bool {
        if !self.planted_family {
            return false;
        }
        match self.family {
            Family::Plain => false,
            Family::Quoting => {
                let calls = self.turns();
                calls.len() >= 2 && calls[0] == calls[1]
            }
            Family::Change | Family::Recheck => {
                self.turns().len() > 2 || !self.trajectory.is_success()
            }
        }
    }
}

/// The planned demonstrations of the settings' `demo_tasks` training tasks generated from its
/// seed. A task of a planted family runs, with probability `repair_share`, under one of the
/// siblings that repair the family in the settings' organism (uniformly); every other task under
/// any of `harnesses` (H0 first), uniformly. A planted episode makes its decision well without a
/// repair with probability [`WarmStartSettings::unprompted_rate`].
pub fn plan(settings: &WarmStartSettings, harnesses: &[Harness]) -> Vec<DemoSpec> {
    let (seed, count, repair_share) = (settings.seed, settings.demo_tasks, settings.repair_share);
    let organism = settings.organism;
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_de30);
    let n = harnesses.len().max(1);
    (0..count)
        .map(|i| {
            let task = generate::generate_task(seed, Split::Train, i);
            let family = Family::of_task(&task);
            let repairing: Vec<usize> = family
                .map(|f| {
                    (0..harnesses.len())
                        .filter(|&h| organism.repairs(f, &harnesses[h]))
                        .collect()
                })
                .unwrap_or_default();
            // The shared rate for families without an override (and for the plain family, whose
            // draw is unused), so the default's draws do not move.
            let rate = family
                .and_then(|f| settings.unprompted_good_by_family.get(f))
                .unwrap_or(settings.unprompted_good_rate);
            let repair = rng.gen_bool(repair_share.clamp(0.0, 1.0));
            let uniform = rng.gen_range(0..n);
            let harness = if repair && !repairing.is_empty() {
                repairing[uniform % repairing.len()]
            } else {
                uniform
            };
            DemoSpec {
                task,
                harness,
                unprompted_good: rng.gen_bool(rate.clamp(0.0, 1.0)),
                seed: rng.r#gen(),
            }
        })
        .collect()
}

/// The hook messages of `harnesses` by text.
pub fn hook_messages(harnesses: &[Harness]) -> BTreeMap<String, String> {
    harnesses
        .iter()
        .flat_map(|h| h.hooks.iter().map(|(n, s)| (s.message.clone(), n.clone())))
        .collect()
}

/// Record the demonstrations of `specs`, each through `wrap` (identity for the script itself,
/// a teacher-forced student for training data), under `harnesses[spec.harness]`.
pub async fn record(
    specs: &[DemoSpec],
    harnesses: &[Harness],
    organism: Organism,
    env: &dyn Environment,
    wrap: &dyn Fn(DemoScript) -> Arc<dyn Policy>,
    progress: &mut dyn FnMut(usize),
) -> Result<Vec<Demonstration>> {
    let cues = Cues::of(organism, harnesses);
    let options = EpisodeOptions::default();
    let mut out = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let script = DemoScript::new(&spec.task, Arc::clone(&cues), spec.unprompted_good)?;
        let family = script.family();
        let harness = &harnesses[spec.harness];
        let policy = wrap(script);
        let trajectory = run_episode_with(
            policy.as_ref(),
            harness,
            env,
            &spec.task,
            spec.seed,
            &options,
        )
        .await?;
        out.push(Demonstration {
            trajectory,
            family,
            harness: harness.name.clone(),
            unprompted_good: spec.unprompted_good,
            organism,
            planted_family: organism.plants(family),
            ruled: organism.repairing_rule(family).is_some() && organism.repairs(family, harness),
        });
        progress(i + 1);
    }
    Ok(out)
}

/// Per-family counts of `demos`.
pub fn family_counts(demos: &[Demonstration]) -> BTreeMap<String, FamilyCounts> {
    let mut out: BTreeMap<String, FamilyCounts> = BTreeMap::new();
    for d in demos {
        let c = out.entry(d.family.as_str().to_string()).or_default();
        c.demos += 1;
        c.planted += usize::from(d.planted());
        c.prompted += usize::from(d.prompted());
        c.unprompted_good += usize::from(d.unprompted_good && d.planted_family);
        c.successes += usize::from(d.trajectory.is_success());
    }
    out
}
