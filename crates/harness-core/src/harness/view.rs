//! What a harness shows the policy: the rendered prompts and the visible tools.

use std::collections::BTreeMap;

use super::template::{TemplateVars, render_template};
use super::{Harness, NOTE_TOOL};
use crate::env::{ToolKind, ToolSpec};
use crate::error::Result;
use crate::task::Task;

impl Harness {
    /// The built-in values for `task` under this harness's limits.
    pub fn template_vars(&self, task: &Task) -> TemplateVars {
        TemplateVars {
            instruction: task.instruction.clone(),
            environment: task.env.clone(),
            max_env_actions: self.limits.max_env_actions,
            max_model_calls: self.limits.max_model_calls,
        }
    }

    /// Slot texts with their rules appended (rules in name order, one paragraph each).
    pub fn filled_slots(&self) -> BTreeMap<String, String> {
        let mut slots = self.prompt.slots.clone();
        for rule in self.prompt_rules.values() {
            if let Some(text) = slots.get_mut(&rule.slot) {
                if !text.is_empty() && !text.ends_with('\n') {
                    text.push('\n');
                }
                text.push_str(rule.text.trim());
            }
        }
        slots
    }

    /// The system message for `task`: the template with slots and rules filled in, then the
    /// skills whose trigger matches the instruction.
    pub fn system_prompt(&self, task: &Task) -> Result<String> {
        let vars = self.template_vars(task);
        let mut out = render_template(
            &self.prompt.system,
            &self.filled_slots(),
            &vars,
            "prompt.system",
        )?;
        let skills: Vec<(&String, &super::Skill)> = self
            .skills
            .iter()
            .filter(|(_, skill)| match &skill.trigger {
                None => true,
                Some(trigger) => super::validate::compile_pattern(trigger, true)
                    .is_ok_and(|re| re.is_match(&task.instruction)),
            })
            .collect();
        if !skills.is_empty() {
            out.push_str("\n\n# Skills\n");
            for (name, skill) in skills {
                out.push_str(&format!("\n## {name}\n{}\n", skill.text.trim()));
            }
        }
        Ok(out)
    }

    /// The first user message for `task`.
    pub fn user_prompt(&self, task: &Task) -> Result<String> {
        render_template(
            &self.prompt.user,
            &self.filled_slots(),
            &self.template_vars(task),
            "prompt.user",
        )
    }

    /// The tools the policy sees: the environment's, filtered by the view, with extra docs,
    /// plus the memory tool when enabled.
    pub fn visible_tools(&self, tools: &[ToolSpec]) -> Vec<ToolSpec> {
        let view = &self.tool_view;
        let mut visible: Vec<ToolSpec> = tools
            .iter()
            .filter(|t| {
                view.include
                    .as_ref()
                    .is_none_or(|inc| inc.contains(&t.name))
            })
            .filter(|t| !view.hide.contains(&t.name))
            .cloned()
            .map(|mut t| {
                if let Some(doc) = view.docs.get(&t.name) {
                    t.description = format!("{}\n{}", t.description.trim_end(), doc.trim());
                }
                t
            })
            .collect();
        if self.memory.enabled && self.memory.note_tool {
            visible.push(note_tool_spec());
        }
        visible
    }
}

/// The schema of the memory tool.
pub(crate) fn note_tool_spec() -> ToolSpec {
    ToolSpec {
        name: NOTE_TOOL.to_string(),
        description: "Save a short note (a fact, a page reached, an id) that stays visible for the rest of the episode."
            .to_string(),
        parameters: serde_json::json!({
            "type": "object",
            "properties": { "text": { "type": "string", "description": "The note." } },
            "required": ["text"]
        }),
        kind: ToolKind::Action,
    }
}
