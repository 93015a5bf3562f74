//! What a harness adds to a base harness, as comparable mechanisms, so that a harness can be
//! checked for sharing nothing with another (RQ6's unseen harnesses: none may share a hook
//! message, a rule's text or a mechanism with a training pool member or with what a warm start
//! demonstrated).
//!
//! A mechanism is a component and a key: a hook's event and condition (with its parameters), a
//! prompt rule, skill or prompt slot by name, a tool's documentation by tool, the tool view's
//! other settings, the memory policy, the context policy. Two harnesses share one when both
//! change the same component at the same key, or when any text of one paraphrases any text of
//! the other (the word sets of the two texts overlap by [`PARAPHRASE_OVERLAP`] or more).

use std::collections::BTreeSet;

use super::Harness;

/// Word-set overlap (Jaccard, over lowercase words of three letters or more) at which two
/// texts count as paraphrases of each other.
pub const PARAPHRASE_OVERLAP: f64 = 0.5;

/// One mechanism a harness adds to its base.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Mechanism {
    /// `hook`, `prompt_rule`, `skill`, `prompt`, `tool_doc`, `tool_view`, `memory` or `context`.
    pub component: &'static str,
    /// What it is keyed by within the component (a hook's `event/condition parameters`, a
    /// rule's name, a tool's name, ...).
    pub key: String,
    /// Its text (a hook's message, a rule's text; empty for a setting without text).
    pub text: String,
}

/// The mechanisms `harness` adds to `base`: every component value that is not `base`'s.
pub fn mechanisms(harness: &Harness, base: &Harness) -> Vec<Mechanism> {
    let mut out = Vec::new();
    let mut push = |component: &'static str, key: String, text: String| {
        out.push(Mechanism {
            component,
            key,
            text,
        })
    };
    for (name, hook) in &harness.hooks {
        if base.hooks.get(name) == Some(hook) {
            continue;
        }
        let parameters = serde_json::to_string(&hook.parameters).unwrap_or_default();
        push(
            "hook",
            format!("{:?}/{} {parameters}", hook.event, hook.condition),
            hook.message.clone(),
        );
    }
    for (name, rule) in &harness.prompt_rules {
        if base.prompt_rules.get(name) != Some(rule) {
            push("prompt_rule", name.clone(), rule.text.clone());
        }
    }
    for (name, skill) in &harness.skills {
        if base.skills.get(name) != Some(skill) {
            push("skill", name.clone(), skill.text.clone());
        }
    }
    if harness.prompt.system != base.prompt.system {
        push("prompt", "system".into(), harness.prompt.system.clone());
    }
    if harness.prompt.user != base.prompt.user {
        push("prompt", "user".into(), harness.prompt.user.clone());
    }
    for (slot, text) in &harness.prompt.slots {
        if base.prompt.slots.get(slot) != Some(text) {
            push("prompt", slot.clone(), text.clone());
        }
    }
    for (tool, doc) in &harness.tool_view.docs {
        if base.tool_view.docs.get(tool) != Some(doc) {
            push("tool_doc", tool.clone(), doc.clone());
        }
    }
    let (v, b) = (&harness.tool_view, &base.tool_view);
    if v.include != b.include || v.hide != b.hide {
        push("tool_view", "shown tools".into(), String::new());
    }
    if v.max_observation_chars != b.max_observation_chars {
        push("tool_view", "max_observation_chars".into(), String::new());
    }
    if harness.memory != base.memory {
        push("memory", "policy".into(), String::new());
    }
    if harness.context.keep_last_observations != base.context.keep_last_observations {
        push("context", "keep_last_observations".into(), String::new());
    }
    if harness.context.elision_text != base.context.elision_text {
        push(
            "context",
            "elision_text".into(),
            harness.context.elision_text.clone(),
        );
    }
    out
}

fn words(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().count() >= 3)
        .map(str::to_lowercase)
        .collect()
}

/// The word-set overlap of two texts (0 when either has no word of three letters or more).
pub fn text_overlap(a: &str, b: &str) -> f64 {
    let (a, b) = (words(a), words(b));
    if a.is_empty() || b.is_empty() {
        return 0.0;
    }
    let shared = a.intersection(&b).count();
    shared as f64 / (a.len() + b.len() - shared) as f64
}

/// What `a` and `b` (each as [`mechanisms`] of its base) share, in words: the first shared
/// component and key, or the first pair of paraphrased texts; `None` when they share nothing.
pub fn shared_mechanism(a: &[Mechanism], b: &[Mechanism]) -> Option<String> {
    for x in a {
        for y in b {
            if x.component == y.component && x.key == y.key {
                return Some(format!("the same {} ({})", x.component, x.key));
            }
            if !x.text.is_empty()
                && !y.text.is_empty()
                && text_overlap(&x.text, &y.text) >= PARAPHRASE_OVERLAP
            {
                return Some(format!(
                    "a paraphrase: {} `{}` and {} `{}`",
                    x.component, x.text, y.component, y.text
                ));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::{HookAction, HookEvent, HookSpec, PromptRule};

    fn hook(condition: &str, message: &str) -> HookSpec {
        HookSpec {
            action: HookAction::Warn,
            condition: condition.into(),
            event: HookEvent::OnError,
            message: message.into(),
            parameters: Default::default(),
        }
    }

    #[test]
    fn a_paraphrased_message_or_the_same_trigger_is_shared_and_other_mechanisms_are_not() {
        let base = Harness::new("H0", "Base.");
        let mut a = base.clone();
        a.hooks.insert(
            "unknown-name".into(),
            hook(
                "error_matches",
                "The query names a table or column that does not exist: check the schema first.",
            ),
        );
        // Another name, another condition, the same message reworded.
        let mut b = base.clone();
        b.hooks.insert(
            "sql-error-recovery".into(),
            hook(
                "always",
                "That query names a column or table which does not exist; check the schema.",
            ),
        );
        let (ma, mb) = (mechanisms(&a, &base), mechanisms(&b, &base));
        assert_eq!(ma.len(), 1);
        let why = shared_mechanism(&ma, &mb).expect("a paraphrase");
        assert!(why.contains("paraphrase"), "{why}");
        // The same trigger with an unrelated message.
        let mut c = base.clone();
        c.hooks
            .insert("other".into(), hook("error_matches", "Try again slowly."));
        let why = shared_mechanism(&ma, &mechanisms(&c, &base)).unwrap();
        assert!(why.contains("the same hook"), "{why}");
        // Memory and a prompt rule on another subject: nothing shared.
        let mut d = base.clone();
        d.memory.enabled = true;
        d.memory.auto_notes = true;
        d.prompt_rules.insert(
            "units".into(),
            PromptRule {
                slot: "system".into(),
                text: "Report money amounts with two decimals.".into(),
            },
        );
        let md = mechanisms(&d, &base);
        assert_eq!(md.len(), 2);
        assert_eq!(shared_mechanism(&ma, &md), None);
        assert_eq!(shared_mechanism(&mb, &md), None);
        assert!(mechanisms(&base, &base).is_empty());
    }
}
