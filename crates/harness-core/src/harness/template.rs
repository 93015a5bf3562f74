//! Prompt templates: `{name}` placeholders, `{{` and `}}` for literal braces.

use std::collections::BTreeMap;

use crate::error::{Error, Result};

/// Placeholders every template may use besides its slots.
pub const BUILTIN_PLACEHOLDERS: &[&str] = &[
    "instruction",
    "environment",
    "max_env_actions",
    "max_model_calls",
];

/// Values for the built-in placeholders.
#[derive(Debug, Clone, Default)]
pub struct TemplateVars {
    /// The task's instruction.
    pub instruction: String,
    /// The environment's name.
    pub environment: String,
    /// The harness's environment-action limit.
    pub max_env_actions: u32,
    /// The harness's model-call limit.
    pub max_model_calls: u32,
}

enum Piece<'a> {
    Text(&'a str),
    Brace(char),
    Placeholder(&'a str),
}

fn pieces(template: &str) -> std::result::Result<Vec<Piece<'_>>, String> {
    let mut out = Vec::new();
    let bytes = template.as_bytes();
    let mut i = 0;
    let mut text_start = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'{' if bytes.get(i + 1) == Some(&b'{') => {
                out.push(Piece::Text(&template[text_start..i]));
                out.push(Piece::Brace('{'));
                i += 2;
                text_start = i;
            }
            b'}' if bytes.get(i + 1) == Some(&b'}') => {
                out.push(Piece::Text(&template[text_start..i]));
                out.push(Piece::Brace('}'));
                i += 2;
                text_start = i;
            }
            b'{' => {
                let Some(len) = template[i + 1..].find('}') else {
                    return Err(format!(
                        "`{{` at byte {i} is never closed (write `{{{{` for a literal brace)"
                    ));
                };
                let name = &template[i + 1..i + 1 + len];
                if !super::validate::is_valid_name(name) {
                    return Err(format!(
                        "`{{{name}}}` at byte {i} is not a placeholder name (letters, digits, `_`, `-`; write `{{{{` for a literal brace)"
                    ));
                }
                out.push(Piece::Text(&template[text_start..i]));
                out.push(Piece::Placeholder(name));
                i += len + 2;
                text_start = i;
            }
            b'}' => {
                return Err(format!(
                    "`}}` at byte {i} has no matching `{{` (write `}}}}` for a literal brace)"
                ));
            }
            _ => i += 1,
        }
    }
    out.push(Piece::Text(&template[text_start..]));
    Ok(out)
}

/// The placeholder names a template uses, or a description of its syntax error.
pub(crate) fn placeholders(template: &str) -> std::result::Result<Vec<&str>, String> {
    Ok(pieces(template)?
        .into_iter()
        .filter_map(|p| match p {
            Piece::Placeholder(name) => Some(name),
            _ => None,
        })
        .collect())
}

/// Fill a template from slot texts and built-in values; `path` names the template in errors.
pub fn render_template(
    template: &str,
    slots: &BTreeMap<String, String>,
    vars: &TemplateVars,
    path: &str,
) -> Result<String> {
    let pieces = pieces(template).map_err(|m| Error::invalid(path, m))?;
    let mut out = String::with_capacity(template.len());
    for piece in pieces {
        match piece {
            Piece::Text(t) => out.push_str(t),
            Piece::Brace(c) => out.push(c),
            Piece::Placeholder(name) => match (slots.get(name), name) {
                (Some(text), _) => out.push_str(text),
                (None, "instruction") => out.push_str(&vars.instruction),
                (None, "environment") => out.push_str(&vars.environment),
                (None, "max_env_actions") => out.push_str(&vars.max_env_actions.to_string()),
                (None, "max_model_calls") => out.push_str(&vars.max_model_calls.to_string()),
                (None, other) => {
                    return Err(Error::invalid(
                        path,
                        format!("placeholder `{{{other}}}` names no slot and no built-in value"),
                    ));
                }
            },
        }
    }
    Ok(out)
}
