//! Harness validation: every cross-reference resolves and every value is in range.

use std::collections::BTreeSet;

use regex::{Regex, RegexBuilder};

use super::hooks::CompiledHook;
use super::template::{BUILTIN_PLACEHOLDERS, placeholders};
use super::{Harness, NOTE_TOOL};
use crate::env::ToolSpec;
use crate::error::{Error, Result};

/// Component names (slots, rules, skills, hooks) are path segments of edits, so they are
/// restricted to letters, digits, `_` and `-`.
pub(crate) fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The most a harness's regular expression (a skill trigger, an `observation_matches` pattern)
/// may take once compiled. Harness patterns are a few words long; without a limit of its own a
/// pattern like `(a{1000}){1000}` makes the regex crate build tens of megabytes before its
/// default limit refuses it.
pub(crate) const PATTERN_SIZE_LIMIT: usize = 1 << 20;

/// Compile a harness's regular expression within [`PATTERN_SIZE_LIMIT`].
pub(crate) fn compile_pattern(
    pattern: &str,
    case_insensitive: bool,
) -> std::result::Result<Regex, regex::Error> {
    RegexBuilder::new(pattern)
        .case_insensitive(case_insensitive)
        .size_limit(PATTERN_SIZE_LIMIT)
        .dfa_size_limit(PATTERN_SIZE_LIMIT)
        .build()
}

fn check_name(kind: &str, path: &str, name: &str) -> Result<()> {
    if is_valid_name(name) {
        Ok(())
    } else {
        Err(Error::invalid(
            path,
            format!(
                "{kind} name `{name}` must be non-empty and use only letters, digits, `_` and `-`"
            ),
        ))
    }
}

fn check_template(harness: &Harness, template: &str, path: &str) -> Result<BTreeSet<String>> {
    let names = placeholders(template).map_err(|m| Error::invalid(path, m))?;
    let mut used = BTreeSet::new();
    for name in names {
        if !harness.prompt.slots.contains_key(name) && !BUILTIN_PLACEHOLDERS.contains(&name) {
            let mut known: Vec<String> = harness.prompt.slots.keys().cloned().collect();
            known.extend(BUILTIN_PLACEHOLDERS.iter().map(|s| s.to_string()));
            return Err(Error::invalid(
                path,
                format!(
                    "placeholder `{{{name}}}` is a dangling slot; expected one of: {}",
                    known.join(", ")
                ),
            ));
        }
        used.insert(name.to_string());
    }
    Ok(used)
}

impl Harness {
    /// Check every component; the error names the JSON path and what was expected.
    pub fn validate(&self) -> Result<()> {
        if self.name.trim().is_empty() {
            return Err(Error::invalid("name", "expected a non-empty harness name"));
        }
        if let Some(program) = &self.program {
            if program.command.first().is_none_or(|c| c.trim().is_empty()) {
                return Err(Error::invalid(
                    "program.command",
                    "expected the program and its arguments, e.g. [\"python3\", \"agent.py\"]",
                ));
            }
            if !(program.timeout_s.is_finite() && program.timeout_s > 0.0) {
                return Err(Error::invalid(
                    "program.timeout_s",
                    format!(
                        "expected a number of seconds above zero, got {}",
                        program.timeout_s
                    ),
                ));
            }
        }
        if self.prompt.system.trim().is_empty() {
            return Err(Error::invalid(
                "prompt.system",
                "expected a non-empty system prompt template",
            ));
        }
        for name in self.prompt.slots.keys() {
            check_name("slot", &format!("prompt.slots.{name}"), name)?;
            if BUILTIN_PLACEHOLDERS.contains(&name.as_str()) {
                return Err(Error::invalid(
                    format!("prompt.slots.{name}"),
                    format!("`{name}` is a built-in placeholder and cannot be a slot"),
                ));
            }
        }
        let mut used = check_template(self, &self.prompt.system, "prompt.system")?;
        used.extend(check_template(self, &self.prompt.user, "prompt.user")?);
        if let Some(unused) = self.prompt.slots.keys().find(|s| !used.contains(*s)) {
            return Err(Error::invalid(
                format!("prompt.slots.{unused}"),
                format!(
                    "slot `{unused}` is never used; expected `{{{unused}}}` in prompt.system or prompt.user"
                ),
            ));
        }
        for (name, rule) in &self.prompt_rules {
            let path = format!("prompt_rules.{name}");
            check_name("rule", &path, name)?;
            if !self.prompt.slots.contains_key(&rule.slot) {
                let known: Vec<&String> = self.prompt.slots.keys().collect();
                return Err(Error::invalid(
                    format!("{path}.slot"),
                    format!(
                        "rule points at missing slot `{}`; expected one of: {known:?}",
                        rule.slot
                    ),
                ));
            }
            if rule.text.trim().is_empty() {
                return Err(Error::invalid(
                    format!("{path}.text"),
                    "expected non-empty rule text",
                ));
            }
        }
        for (name, skill) in &self.skills {
            let path = format!("skills.{name}");
            check_name("skill", &path, name)?;
            if skill.text.trim().is_empty() {
                return Err(Error::invalid(
                    format!("{path}.text"),
                    "expected non-empty skill text",
                ));
            }
            if let Some(trigger) = &skill.trigger {
                compile_pattern(trigger, true).map_err(|e| {
                    Error::invalid(
                        format!("{path}.trigger"),
                        format!("not a valid regular expression: {e}"),
                    )
                })?;
            }
        }
        if self.context.keep_last_observations == Some(0) {
            return Err(Error::invalid(
                "context.keep_last_observations",
                "expected at least 1 (or null to keep every observation)",
            ));
        }
        if self.memory.enabled {
            if self.memory.max_notes == 0 {
                return Err(Error::invalid(
                    "memory.max_notes",
                    "expected at least 1 when memory is enabled",
                ));
            }
            if self.memory.note_chars < 16 {
                return Err(Error::invalid(
                    "memory.note_chars",
                    "expected at least 16 characters",
                ));
            }
            if !self.memory.auto_notes && !self.memory.note_tool {
                return Err(Error::invalid(
                    "memory",
                    "memory is enabled but neither `auto_notes` nor `note_tool` is set; expected at least one",
                ));
            }
        } else if self.memory.auto_notes || self.memory.note_tool {
            return Err(Error::invalid(
                "memory.enabled",
                "expected `true` when `auto_notes` or `note_tool` is set",
            ));
        }
        self.compile_hooks()?;
        let view = &self.tool_view;
        for (i, name) in view.include.iter().flatten().enumerate() {
            if name.is_empty() {
                return Err(Error::invalid(
                    format!("tool_view.include[{i}]"),
                    "expected a tool name",
                ));
            }
        }
        if view.max_observation_chars.is_some_and(|m| m < 16) {
            return Err(Error::invalid(
                "tool_view.max_observation_chars",
                "expected at least 16 characters",
            ));
        }
        if view.format.trim().is_empty() {
            return Err(Error::invalid(
                "tool_view.format",
                "expected an action format name such as `tool_call`",
            ));
        }
        let limits = [
            ("limits.max_model_calls", self.limits.max_model_calls),
            ("limits.max_env_actions", self.limits.max_env_actions),
            ("limits.max_context_tokens", self.limits.max_context_tokens),
            ("limits.max_output_tokens", self.limits.max_output_tokens),
        ];
        for (path, value) in limits {
            if value == 0 {
                return Err(Error::invalid(path, "expected a limit of at least 1"));
            }
        }
        Ok(())
    }

    /// Validate and compile every hook, in name order.
    pub fn compile_hooks(&self) -> Result<Vec<CompiledHook>> {
        self.hooks
            .iter()
            .map(|(name, spec)| {
                let path = format!("hooks.{name}");
                check_name("hook", &path, name)?;
                spec.compile(name, &path)
            })
            .collect()
    }

    /// Check the references to tools against what an environment offers.
    pub fn validate_for_tools(&self, tools: &[ToolSpec]) -> Result<()> {
        let known: BTreeSet<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        let unknown = |path: String, name: &str| {
            let mut names: Vec<&str> = known.iter().copied().collect();
            names.sort_unstable();
            Error::invalid(
                path,
                format!(
                    "unknown tool `{name}`; the environment offers: {}",
                    names.join(", ")
                ),
            )
        };
        for (i, name) in self.tool_view.include.iter().flatten().enumerate() {
            if !known.contains(name.as_str()) {
                return Err(unknown(format!("tool_view.include[{i}]"), name));
            }
        }
        for (i, name) in self.tool_view.hide.iter().enumerate() {
            if !known.contains(name.as_str()) {
                return Err(unknown(format!("tool_view.hide[{i}]"), name));
            }
        }
        for name in self.tool_view.docs.keys() {
            if !known.contains(name.as_str()) {
                return Err(unknown(format!("tool_view.docs.{name}"), name));
            }
        }
        for (hook_name, hook) in &self.hooks {
            if let Some(serde_json::Value::String(tool)) = hook.parameters.get("name")
                && !known.contains(tool.as_str())
            {
                return Err(unknown(format!("hooks.{hook_name}.parameters.name"), tool));
            }
        }
        if self.memory.note_tool && known.contains(NOTE_TOOL) {
            return Err(Error::invalid(
                "memory.note_tool",
                format!(
                    "the environment already has a tool named `{NOTE_TOOL}`; the memory tool would shadow it"
                ),
            ));
        }
        Ok(())
    }
}
