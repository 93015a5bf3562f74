//! The environment of the embedded default: generated DBBench tasks behind compact tool
//! documentation, the compact base harness H0, its siblings, and the task families the warm
//! start plants failures in.

use std::sync::Arc;

use async_trait::async_trait;
use harness_core::{
    ActionParser, EnvSession, Environment, Harness, Observation, Outcome, Split, Task, ToolCall,
    ToolKind, ToolSpec,
};
use harness_envs::dbbench::{
    self, COMMIT_TOOL, DbBench, GeneratorConfig, QuestionType, SQL_TOOL, TOOL_FORMAT,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Training tasks of [`default_environment`] (the warm start demonstrates the generator's first
/// [`WarmStartSettings::demo_tasks`](crate::WarmStartSettings::demo_tasks) training tasks, these
/// and the ones after them).
pub const TRAIN_TASKS: usize = 2200;
/// Validation tasks of [`default_environment`] (10 of each of the 11 question types).
pub const VALIDATION_TASKS: usize = 110;
/// Test tasks of [`default_environment`].
pub const TEST_TASKS: usize = 110;

/// The task split sizes of [`default_environment`].
pub fn task_splits(seed: u64) -> GeneratorConfig {
    GeneratorConfig {
        seed,
        train: TRAIN_TASKS,
        validation: VALIDATION_TASKS,
        test: TEST_TASKS,
    }
}

/// The environment the main job should use with a warm start made from `seed`: DBBench tasks
/// generated from `seed` ([`task_splits`]), whose tools are documented in one short line each
/// so that prompts stay a few hundred tokens ([`CompactDbBench`]).
pub fn default_environment(seed: u64) -> Arc<dyn Environment> {
    Arc::new(CompactDbBench::new(DbBench::generated(&task_splits(seed))))
}

/// The environment's name (that of DBBench).
pub const ENV_NAME: &str = dbbench::ENV_NAME;

/// DBBench with the same tasks, sessions and verifier, but tool specs whose descriptions and
/// schemas are one short line each (the tool list is rendered into every prompt).
#[derive(Debug, Clone)]
pub struct CompactDbBench {
    inner: DbBench,
}

impl CompactDbBench {
    /// Wrap `inner`.
    pub fn new(inner: DbBench) -> Self {
        CompactDbBench { inner }
    }

    /// The wrapped environment.
    pub fn inner(&self) -> &DbBench {
        &self.inner
    }
}

/// The compact tool specs of [`CompactDbBench`].
pub fn compact_tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec::new(
            SQL_TOOL,
            "Run one SQL statement.",
            json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}),
        ),
        ToolSpec::new(
            COMMIT_TOOL,
            "Commit the answer values and end.",
            json!({"type": "object", "properties": {"answers": {"type": "array", "items": {"type": "string"}}}, "required": ["answers"]}),
        )
        .with_kind(ToolKind::Submit),
    ]
}

#[async_trait]
impl Environment for CompactDbBench {
    fn name(&self) -> &str {
        ENV_NAME
    }

    async fn reset(&self, task: &Task, seed: u64) -> harness_core::Result<Box<dyn EnvSession>> {
        Ok(Box::new(CompactSession(
            self.inner.reset(task, seed).await?,
        )))
    }

    fn tasks(&self, split: Split) -> harness_core::Result<Vec<Task>> {
        self.inner.tasks(split)
    }
}

struct CompactSession(Box<dyn EnvSession>);

#[async_trait]
impl EnvSession for CompactSession {
    fn tools(&self) -> Vec<ToolSpec> {
        compact_tools()
    }

    async fn step(&mut self, call: &ToolCall) -> harness_core::Result<Observation> {
        self.0.step(call).await
    }

    async fn verify(&mut self, final_answer: Option<&str>) -> harness_core::Result<Outcome> {
        self.0.verify(final_answer).await
    }

    fn initial_observation(&self) -> String {
        self.0.initial_observation()
    }

    fn action_parser(&self, format: &str) -> Option<Arc<dyn ActionParser>> {
        self.0.action_parser(format)
    }
}

/// Limits of the compact H0: short episodes so the CPU can train and sample them fast.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EpisodeLimits {
    /// Policy calls per episode.
    pub max_model_calls: u32,
    /// SQL statements and commits per episode.
    pub max_env_actions: u32,
    /// Generated tokens per policy call.
    pub max_output_tokens: u32,
    /// Context tokens (at most the model's positions).
    pub max_context_tokens: u32,
}

impl Default for EpisodeLimits {
    fn default() -> Self {
        EpisodeLimits {
            max_model_calls: 5,
            max_env_actions: 5,
            max_output_tokens: 96,
            max_context_tokens: 1024,
        }
    }
}

const COMPACT_SYSTEM: &str = "You work with a MySQL table: answer the question, or change the table as asked. {action_guidance} Run one SQL statement per step. At most {max_env_actions} steps.";

const COMPACT_GUIDANCE: &str = "Call execute_sql to run SQL and commit_final_answer to commit the answer values (an empty list after a change).";

/// The compact base harness H0 of the embedded default: a two-sentence system prompt with the
/// `action_guidance` slot of DBBench's H0, the `<tool_call>` format of DBBench
/// ([`TOOL_FORMAT`]) and short limits.
pub fn compact_base(limits: &EpisodeLimits) -> Harness {
    let mut harness = Harness::new("dbbench-compact-H0", COMPACT_SYSTEM);
    harness.description =
        "Compact base harness for the embedded default: DBBench in few tokens and few steps."
            .into();
    harness.tool_view.format = TOOL_FORMAT.into();
    harness
        .prompt
        .slots
        .insert("action_guidance".into(), COMPACT_GUIDANCE.into());
    harness.limits.max_model_calls = limits.max_model_calls;
    harness.limits.max_env_actions = limits.max_env_actions;
    harness.limits.max_output_tokens = limits.max_output_tokens;
    harness.limits.max_context_tokens = limits.max_context_tokens;
    harness
}

/// DBBench's built-in siblings ([`dbbench::siblings`]) re-based on `base`: the same hooks
/// (names, conditions, messages) and prompt rules on the compact H0, children of it.
pub fn rebased_siblings(base: &Harness) -> Vec<Harness> {
    dbbench::siblings()
        .into_iter()
        .map(|s| {
            let mut h = base.clone();
            h.name = s.name.replace("dbbench-", "dbbench-compact-");
            h.description = s.description.clone();
            h.hooks.extend(s.hooks);
            h.prompt_rules.extend(s.prompt_rules);
            h.lineage.parent = Some(base.id());
            h.lineage.generation = 1;
            h.lineage.direction = s.lineage.direction;
            h
        })
        .collect()
}

/// One-hook siblings of `base` carrying the hooks harness-evolve's built-in editor writes for
/// the causes these failures are diagnosed as (`budget-before-completion`: a low-step and a
/// low-reply reminder; `unknown-schema-name`: an unknown-name reminder; `repeated-failing-call`:
/// a repeated-failure reminder), with the editor's names, conditions and messages. The warm
/// start demonstrates under them too, so that a pool evolved from H0 by the built-in editor
/// can elicit the planted behaviours as the hand-written siblings do.
pub fn editor_repairs(base: &Harness) -> Vec<Harness> {
    EDITOR_REPAIRS
        .iter()
        .map(|&(kind, name)| editor_repair(base, kind, name))
        .collect()
}

/// One-rule siblings of `base`, each carrying a prompt rule the built-in editor writes for a
/// planted family's cause (`RULE_REPAIRS`: `commit-when-changed` for the
/// change family, `check-schema-first` for quoting): the repairing siblings of
/// [`Organism::PromptRules`](crate::Organism::PromptRules).
pub fn rule_siblings(base: &Harness) -> Vec<Harness> {
    crate::organism::RULE_REPAIRS
        .iter()
        .map(|&(_, kind, name)| editor_repair(base, kind, name))
        .collect()
}

/// The siblings `organism` is built against, in the pool's order: under
/// [`Organism::RecoveryHooks`](crate::Organism::RecoveryHooks) DBBench's hook siblings
/// ([`rebased_siblings`]); under [`Organism::PromptRules`](crate::Organism::PromptRules) the
/// rule siblings ([`rule_siblings`]) and then the same hook siblings, which repair nothing there.
pub fn organism_siblings(organism: crate::Organism, base: &Harness) -> Vec<Harness> {
    match organism {
        crate::Organism::RecoveryHooks => rebased_siblings(base),
        crate::Organism::PromptRules => {
            let mut all = rule_siblings(base);
            all.extend(rebased_siblings(base));
            all
        }
    }
}

/// Every harness the warm start's demonstrations can show a message of, whatever the organism:
/// the hook siblings ([`rebased_siblings`]), the rule siblings ([`rule_siblings`]) and the
/// built-in editor's one-hook repairs ([`editor_repairs`]). Nothing RQ6 calls unseen may share a
/// mechanism with them ([`unseen_harnesses`]).
pub fn demonstrated_harnesses(base: &Harness) -> Vec<Harness> {
    let mut all = rebased_siblings(base);
    all.extend(rule_siblings(base));
    all.extend(editor_repairs(base));
    all
}

/// Harnesses of the embedded default that RQ6 (Figure 4) evaluates as unseen: each changes one
/// component that no demonstration of the warm start uses (hooks and prompt rules are all it
/// uses) and carries no text of one: a note store that records every action
/// (`dbbench-compact-notes`: memory), a context that keeps only the last two observations
/// (`dbbench-compact-short-context`: context), and documentation of the two tools
/// (`dbbench-compact-tool-docs`: tool view). The pipeline still leaves out any of them that
/// shares a mechanism with a member of the run's training pool (the built-in editor writes
/// memory, context and tool-view edits too), and says so.
pub fn unseen_harnesses(base: &Harness) -> Vec<Harness> {
    let child = |name: &str, description: &str| {
        let mut h = base.clone();
        h.name = format!("{}-{name}", base.name.trim_end_matches("-H0"));
        h.description = description.into();
        h.lineage.parent = Some(base.id());
        h.lineage.generation = 1;
        h
    };
    let mut notes = child(
        "notes",
        "H0 with a note store: one note per action, shown in the context.",
    );
    notes.memory.enabled = true;
    notes.memory.auto_notes = true;
    let mut short = child(
        "short-context",
        "H0 that keeps only the last two observations verbatim.",
    );
    short.context.keep_last_observations = Some(2);
    let mut docs = child("tool-docs", "H0 with documentation of the two tools.");
    docs.tool_view.docs.insert(
        "execute_sql".into(),
        "Runs against a MySQL server; rows come back as lists of values, one list per row.".into(),
    );
    docs.tool_view.docs.insert(
        "commit_final_answer".into(),
        "Ends the episode: the values given are graded against the expected ones.".into(),
    );
    vec![notes, short, docs]
}

/// The text of `harness`'s prompt rule or skill `name`, if it has one.
pub fn rule_text<'a>(harness: &'a Harness, name: &str) -> Option<&'a str> {
    harness
        .prompt_rules
        .get(name)
        .map(|r| r.text.as_str())
        .or_else(|| harness.skills.get(name).map(|s| s.text.as_str()))
}

/// The (cause kind, operator) pairs of [`editor_repairs`], in its order.
const EDITOR_REPAIRS: [(&str, &str); 4] = [
    ("budget-before-completion", EDITOR_LOW_BUDGET_HOOK),
    ("budget-before-completion", EDITOR_LOW_CALLS_HOOK),
    ("unknown-schema-name", EDITOR_UNKNOWN_NAME_HOOK),
    ("repeated-failing-call", EDITOR_REPEATED_FAILURE_HOOK),
];

/// `base` with the one hook the built-in editor's operator `name` (for cause `kind`) writes:
/// the operator's own edit, so the warm start cannot drift from the editor.
fn editor_repair(base: &Harness, kind: &str, name: &str) -> Harness {
    use harness_evolve::repair::{OpCtx, operators};
    let op = operators(kind)
        .iter()
        .find(|op| op.name == name)
        .unwrap_or_else(|| panic!("the built-in editor has no operator `{name}` for `{kind}`"));
    let cause = harness_evolve::cause::Cause {
        kind: kind.into(),
        summary: String::new(),
        tasks: Vec::new(),
        evidence: Vec::new(),
        tools: Vec::new(),
    };
    let tools = compact_tools();
    let ctx = OpCtx {
        parent: base,
        cause: &cause,
        tools: &tools,
    };
    let ops = (op.build)(&ctx)
        .unwrap_or_else(|| panic!("the built-in editor's `{name}` needs a tool or slot"));
    let mut h = harness_core::HarnessEdit::new(ops, format!("the editor's `{name}`"))
        .apply(base)
        .unwrap_or_else(|e| panic!("the built-in editor's `{name}` does not apply to H0: {e}"));
    h.name = format!("{}+{name}", base.name);
    h.description = format!("H0 with the built-in editor's `{name}` edit.");
    h.lineage.parent = Some(base.id());
    h.lineage.generation = 1;
    h
}

/// The built-in editor's low-step reminder (`budget-before-completion`).
pub const EDITOR_LOW_BUDGET_HOOK: &str = "low-budget-completion";
/// The built-in editor's low-reply reminder (`budget-before-completion`).
pub const EDITOR_LOW_CALLS_HOOK: &str = "low-call-budget";
/// The built-in editor's unknown-name reminder (`unknown-schema-name`).
pub const EDITOR_UNKNOWN_NAME_HOOK: &str = "unknown-name-recovery";
/// The built-in editor's repeated-failure reminder (`repeated-failing-call`).
pub const EDITOR_REPEATED_FAILURE_HOOK: &str = "repeated-failure-recovery";

/// The hooks that prompt for the same behaviour as `hook` (itself included): the built-in
/// editor's reminders count as the hand-written siblings' hooks they paraphrase.
pub fn same_behaviour(hook: &str) -> &'static [&'static str] {
    match hook {
        LOW_BUDGET_HOOK | EDITOR_LOW_BUDGET_HOOK | EDITOR_LOW_CALLS_HOOK => &[
            LOW_BUDGET_HOOK,
            EDITOR_LOW_BUDGET_HOOK,
            EDITOR_LOW_CALLS_HOOK,
        ],
        RECOVERY_HOOK | EDITOR_UNKNOWN_NAME_HOOK | EDITOR_REPEATED_FAILURE_HOOK => &[
            RECOVERY_HOOK,
            EDITOR_UNKNOWN_NAME_HOOK,
            EDITOR_REPEATED_FAILURE_HOOK,
        ],
        COMMIT_AFTER_CHANGE_HOOK => &[COMMIT_AFTER_CHANGE_HOOK],
        _ => &[],
    }
}

/// The hook of the sibling that repairs [`Family::Quoting`].
pub const RECOVERY_HOOK: &str = "sql-error-recovery";
/// The hook of the sibling that repairs [`Family::Recheck`] (and [`Family::Change`]).
pub const LOW_BUDGET_HOOK: &str = "low-budget-commit";
/// The hook of the sibling that repairs [`Family::Change`].
pub const COMMIT_AFTER_CHANGE_HOOK: &str = "commit-after-change";

/// The task families of the embedded default, by DBBench question type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// Counting, comparison, MIN, MAX: nothing planted, the demonstrations solve them.
    Plain,
    /// INSERT, UPDATE, DELETE: without a prompt the policy checks the table after the change
    /// instead of committing (repaired by commit-after-change and low-budget).
    Change,
    /// SUM, AVG: without a prompt the policy re-runs its query instead of committing the result
    /// (repaired by low-budget).
    Recheck,
    /// "other" lookups and rankings (one-value answers): the policy writes table and column
    /// names unquoted and,
    /// without a prompt, repeats the failed statement (repaired by sql-error-recovery).
    Quoting,
}

impl Family {
    /// Every family, in table order.
    pub const ALL: [Family; 4] = [
        Family::Plain,
        Family::Change,
        Family::Recheck,
        Family::Quoting,
    ];

    /// The family of a question type.
    pub fn of_type(kind: QuestionType) -> Family {
        match kind {
            QuestionType::Insert | QuestionType::Update | QuestionType::Delete => Family::Change,
            QuestionType::AggregationSum | QuestionType::AggregationAvg => Family::Recheck,
            QuestionType::Other | QuestionType::Ranking => Family::Quoting,
            QuestionType::Counting
            | QuestionType::Comparison
            | QuestionType::AggregationMin
            | QuestionType::AggregationMax => Family::Plain,
        }
    }

    /// The family of a task of this environment (`None` for a task that is not DBBench's).
    pub fn of_task(task: &Task) -> Option<Family> {
        let db = dbbench::db_task(task).ok()?;
        QuestionType::parse(&db.kind).map(Family::of_type)
    }

    /// A short name.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::Plain => "plain",
            Family::Change => "change",
            Family::Recheck => "recheck",
            Family::Quoting => "quoting",
        }
    }

    /// The hooks whose messages prompt for this family's planted behaviour.
    pub fn repairing_hooks(self) -> &'static [&'static str] {
        match self {
            Family::Plain => &[],
            Family::Change => &[
                COMMIT_AFTER_CHANGE_HOOK,
                LOW_BUDGET_HOOK,
                EDITOR_LOW_BUDGET_HOOK,
                EDITOR_LOW_CALLS_HOOK,
            ],
            Family::Recheck => &[
                LOW_BUDGET_HOOK,
                EDITOR_LOW_BUDGET_HOOK,
                EDITOR_LOW_CALLS_HOOK,
            ],
            Family::Quoting => &[
                RECOVERY_HOOK,
                EDITOR_UNKNOWN_NAME_HOOK,
                EDITOR_REPEATED_FAILURE_HOOK,
            ],
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unseen_harnesses_share_no_mechanism_or_message_with_any_demonstration() {
        use harness_core::harness::mechanism::{mechanisms, shared_mechanism};
        let base = compact_base(&EpisodeLimits::default());
        let unseen = unseen_harnesses(&base);
        assert_eq!(unseen.len(), 3);
        let demonstrated = demonstrated_harnesses(&base);
        assert!(demonstrated.len() >= 8, "{}", demonstrated.len());
        for u in &unseen {
            u.validate().unwrap();
            assert_ne!(u.id(), base.id());
            let mu = mechanisms(u, &base);
            assert!(!mu.is_empty(), "{} changes nothing", u.name);
            for d in &demonstrated {
                let md = mechanisms(d, &base);
                assert!(!md.is_empty());
                assert_eq!(
                    shared_mechanism(&mu, &md),
                    None,
                    "{} shares with {}",
                    u.name,
                    d.name
                );
            }
        }
        // The check is not vacuous: the hand-written siblings RQ6 used before share their
        // hooks with the demonstrations.
        let builtin = rebased_siblings(&base);
        let mb = mechanisms(&builtin[0], &base);
        assert!(
            demonstrated
                .iter()
                .any(|d| shared_mechanism(&mb, &mechanisms(d, &base)).is_some())
        );
    }

    #[test]
    fn editor_repairs_add_one_editor_hook_each_with_the_editors_message() {
        use harness_evolve::repair::{
            LOW_BUDGET_MESSAGE, LOW_CALL_BUDGET_MESSAGE, REPEATED_FAILURE_MESSAGE,
            UNKNOWN_NAME_MESSAGE,
        };
        let base = compact_base(&EpisodeLimits::default());
        let repairs = editor_repairs(&base);
        let expected = [
            (EDITOR_LOW_BUDGET_HOOK, LOW_BUDGET_MESSAGE),
            (EDITOR_LOW_CALLS_HOOK, LOW_CALL_BUDGET_MESSAGE),
            (EDITOR_UNKNOWN_NAME_HOOK, UNKNOWN_NAME_MESSAGE),
            (EDITOR_REPEATED_FAILURE_HOOK, REPEATED_FAILURE_MESSAGE),
        ];
        assert_eq!(repairs.len(), expected.len());
        for (h, (name, message)) in repairs.iter().zip(expected) {
            h.validate_for_tools(&compact_tools()).unwrap();
            assert_eq!(h.hooks.len(), base.hooks.len() + 1, "{}", h.name);
            assert_eq!(h.hooks[name].message, message);
            assert_eq!(h.prompt, base.prompt);
            assert_eq!(h.limits, base.limits);
            assert_eq!(h.lineage.parent, Some(base.id()));
            assert!(same_behaviour(name).contains(&name));
        }
    }

    #[test]
    fn the_editors_commit_after_change_hook_is_the_demonstrated_one() {
        // The warm start demonstrates under the hand-written commit-after-change sibling; the
        // editor's operator for `no-commit-after-change` must write the same message for the
        // organism's policy to recognise it.
        let base = compact_base(&EpisodeLimits::default());
        let sibling = rebased_siblings(&base)
            .into_iter()
            .find(|s| s.hooks.contains_key(COMMIT_AFTER_CHANGE_HOOK))
            .unwrap();
        let demonstrated = &sibling.hooks[COMMIT_AFTER_CHANGE_HOOK];
        let edited = editor_repair(&base, "no-commit-after-change", COMMIT_AFTER_CHANGE_HOOK);
        let hook = &edited.hooks[COMMIT_AFTER_CHANGE_HOOK];
        assert_eq!(hook.message, demonstrated.message);
        assert_eq!(hook.condition, demonstrated.condition);
        assert_eq!(hook.event, demonstrated.event);
    }

    #[test]
    fn harnesses_validate_and_siblings_keep_the_hooks() {
        let base = compact_base(&EpisodeLimits::default());
        base.validate().unwrap();
        base.validate_for_tools(&compact_tools()).unwrap();
        let siblings = rebased_siblings(&base);
        assert_eq!(siblings.len(), 3);
        for (s, original) in siblings.iter().zip(dbbench::siblings()) {
            s.validate().unwrap();
            s.compile_hooks().unwrap();
            assert_eq!(s.hooks, original.hooks);
            assert_eq!(s.lineage.parent, Some(base.id()));
            assert_eq!(s.limits, base.limits);
        }
        let hooks: Vec<&String> = siblings.iter().flat_map(|s| s.hooks.keys()).collect();
        for name in [RECOVERY_HOOK, LOW_BUDGET_HOOK, COMMIT_AFTER_CHANGE_HOOK] {
            assert!(hooks.iter().any(|h| *h == name), "{name}");
        }
    }

    #[test]
    fn rule_siblings_render_their_rule_into_the_system_prompt() {
        let base = compact_base(&EpisodeLimits::default());
        let task = dbbench::generate::generate_task(0, harness_core::Split::Train, 0);
        let siblings = rule_siblings(&base);
        assert_eq!(siblings.len(), 2);
        for (s, (family, _, rule)) in siblings.iter().zip(crate::organism::RULE_REPAIRS) {
            s.validate_for_tools(&compact_tools()).unwrap();
            assert!(s.hooks.is_empty(), "{}", s.name);
            let text = rule_text(s, rule).unwrap();
            assert!(s.system_prompt(&task).unwrap().contains(text), "{}", s.name);
            assert!(!base.system_prompt(&task).unwrap().contains(text));
            assert!(crate::Organism::PromptRules.repairs(family, s));
            assert!(!crate::Organism::RecoveryHooks.repairs(family, s));
        }
        let all = organism_siblings(crate::Organism::PromptRules, &base);
        assert_eq!(all.len(), 5);
        for s in &all[2..] {
            for f in Family::ALL {
                assert!(
                    !crate::Organism::PromptRules.repairs(f, s),
                    "{} {f}",
                    s.name
                );
            }
        }
    }

    #[test]
    fn every_type_has_a_family() {
        let mut counts = std::collections::BTreeMap::new();
        for kind in QuestionType::ALL {
            *counts.entry(Family::of_type(kind)).or_insert(0) += 1;
        }
        assert_eq!(counts.len(), 4);
        assert_eq!(counts[&Family::Change], 3);
    }
}
