//! Which variant of the model organism a warm start plants: what the siblings that repair a
//! family look like, and which families are planted at all.
//!
//! | variant | repairing siblings | where the repair acts | planted families |
//! |---|---|---|---|
//! | [`Organism::RecoveryHooks`] (this crate's default) | DBBench's hook siblings and the built-in editor's reminders | a hook message *after* an action: right after a change (commit-after-change), after the planted mistake (low-budget after the first check or the re-run; sql-error-recovery after the failed statement) | change, recheck, quoting |
//! | [`Organism::PromptRules`] | the built-in editor's prompt rules `commit-when-changed` (change) and `check-schema-first` (quoting), rendered into the system prompt | from the first token, *before* the decision it repairs | change, quoting |
//!
//! Under `RecoveryHooks` several repairs fire only after the planted mistake, so a rescue
//! rollout is token-identical to an H0 rollout up to the hook, the mistake included, and a
//! successful rescue credits that mistake in an H0-identical context; the recheck family's good
//! action (commit a SELECT result) is the plain family's, so plain GRPO learns it without any
//! H0 success of its own.
//!
//! `PromptRules` is the paper's regime (its siblings are prompt, skill, tool-view and hook
//! edits whose behaviour the base harness does not elicit): the policy follows a rule when the
//! system prompt carries it, so every rescue rollout differs from H0 before its first
//! decision, and each planted good action is one no plain task shares (commit an empty answer
//! after a change; backticks on the first statement of a name with spaces). Recheck is left
//! unplanted there: its good action is the plain family's. Hook messages repair nothing in this
//! variant (the demonstrations run under the hook siblings too and ignore their messages), so
//! the hook siblings stay in its pool as members that do not help.
//!
//! [`Organism::default`] is `RecoveryHooks`, the variant a settings table without `organism`
//! means (so warm starts cached before the setting existed keep their names). The main job's
//! run configuration (harness-pipeline, `policy.warm_start.organism`) picks `PromptRules`: why
//! is in `docs/STUDY.md`, "The default organism".

use serde::{Deserialize, Serialize};

use crate::environment::Family;

/// The variant of the model organism (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Organism {
    /// Hook siblings, several firing after the planted mistake; three planted families.
    #[default]
    RecoveryHooks,
    /// Prompt-rule siblings acting before the decision; two planted families whose good
    /// actions no plain task shares.
    PromptRules,
}

/// The built-in editor's prompt rule that repairs [`Family::Change`] under
/// [`Organism::PromptRules`] (operator of the cause `no-commit-after-change`).
pub const CHANGE_RULE: &str = "commit-when-changed";
/// The built-in editor's prompt rule that repairs [`Family::Quoting`] under
/// [`Organism::PromptRules`] (operator of the cause `unknown-schema-name`).
pub const QUOTING_RULE: &str = "check-schema-first";

/// The (cause kind, operator) of each repairing rule, with its family.
pub(crate) const RULE_REPAIRS: [(Family, &str, &str); 2] = [
    (Family::Change, "no-commit-after-change", CHANGE_RULE),
    (Family::Quoting, "unknown-schema-name", QUOTING_RULE),
];

impl Organism {
    /// Its name in settings and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Organism::RecoveryHooks => "recovery_hooks",
            Organism::PromptRules => "prompt_rules",
        }
    }

    /// Whether this is the default variant (settings leave it out, so the default's cache
    /// name is unchanged).
    pub fn is_default(&self) -> bool {
        *self == Organism::default()
    }

    /// Whether `family` carries a planted failure in this variant.
    pub fn plants(self, family: Family) -> bool {
        match self {
            Organism::RecoveryHooks => family != Family::Plain,
            Organism::PromptRules => matches!(family, Family::Change | Family::Quoting),
        }
    }

    /// The prompt rule that repairs `family` in this variant, if any.
    pub fn repairing_rule(self, family: Family) -> Option<&'static str> {
        match self {
            Organism::RecoveryHooks => None,
            Organism::PromptRules => RULE_REPAIRS
                .iter()
                .find(|(f, _, _)| *f == family)
                .map(|(_, _, rule)| *rule),
        }
    }

    /// The hooks whose messages repair `family` in this variant (none under
    /// [`Organism::PromptRules`]).
    pub fn repairing_hooks(self, family: Family) -> &'static [&'static str] {
        match self {
            Organism::RecoveryHooks => family.repairing_hooks(),
            Organism::PromptRules => &[],
        }
    }

    /// Whether `harness` carries a repair of `family` in this variant.
    pub fn repairs(self, family: Family, harness: &harness_core::Harness) -> bool {
        if !self.plants(family) {
            return false;
        }
        let by_hook = harness
            .hooks
            .keys()
            .any(|k| self.repairing_hooks(family).contains(&k.as_str()));
        let by_rule = self.repairing_rule(family).is_some_and(|r| {
            harness.prompt_rules.contains_key(r) || harness.skills.contains_key(r)
        });
        by_hook || by_rule
    }
}

impl std::fmt::Display for Organism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Per-family overrides of [`WarmStartSettings::unprompted_good_rate`](crate::WarmStartSettings::unprompted_good_rate):
/// the share of a planted family's demonstrations that make the good decision without a
/// repair. A family left out uses the shared rate.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FamilyRates {
    /// [`Family::Change`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change: Option<f64>,
    /// [`Family::Recheck`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recheck: Option<f64>,
    /// [`Family::Quoting`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quoting: Option<f64>,
}

impl FamilyRates {
    /// Whether no family is overridden.
    pub fn is_empty(&self) -> bool {
        *self == FamilyRates::default()
    }

    /// The override for `family`.
    pub fn get(&self, family: Family) -> Option<f64> {
        match family {
            Family::Plain => None,
            Family::Change => self.change,
            Family::Recheck => self.recheck,
            Family::Quoting => self.quoting,
        }
    }

    /// Each override with its field name.
    pub fn fields(&self) -> [(&'static str, Option<f64>); 3] {
        [
            ("change", self.change),
            ("recheck", self.recheck),
            ("quoting", self.quoting),
        ]
    }
}
