//! The oracle: a policy that replays an instance's gold patch through the tools and submits.

use async_trait::async_trait;
use harness_core::{Policy, PolicyRequest, PolicyTurn, Result, Role, ToolCall};
use serde_json::json;

use super::diff;
use super::instance::SweInstance;
use super::session::{occurrences, tools};

/// The tool calls that turn the instance's repository into the gold-patched one: one
/// `replace` per hunk (its text widened with neighbouring lines until it is unique in the file
/// at that moment), `create_file` for new files, and a whole-file `create_file` where a hunk
/// cannot be made unique. Files the patch deletes are emptied (the tools cannot delete), and
/// a renamed file is created at its new path while the old one stays.
pub fn oracle_calls(instance: &SweInstance) -> std::result::Result<Vec<ToolCall>, String> {
    let mut calls = Vec::new();
    for fp in diff::parse_patch(&instance.patch)? {
        match (&fp.old_path, &fp.new_path) {
            (None, Some(new)) => {
                calls.push(create(new, &diff::apply_hunks("", &fp.hunks)?));
            }
            (Some(old), None) => calls.push(create(old, "")),
            (Some(old), Some(new)) => {
                let current = instance
                    .files
                    .get(old)
                    .ok_or_else(|| format!("the gold patch changes `{old}`, which is missing"))?;
                let target = diff::apply_hunks(current, &fp.hunks)?;
                if old != new {
                    calls.push(create(new, &target));
                    calls.push(create(old, ""));
                    continue;
                }
                match hunk_replacements(current, &fp.hunks, &target) {
                    Some(replacements) => calls.extend(replacements.into_iter().map(|(o, n)| {
                        ToolCall::new(tools::REPLACE, json!({"path": old, "old": o, "new": n}))
                    })),
                    None => calls.push(create(old, &target)),
                }
            }
            (None, None) => return Err("a file patch without paths".into()),
        }
    }
    calls.push(ToolCall::new(tools::SUBMIT, json!({})));
    Ok(calls)
}

fn create(path: &str, content: &str) -> ToolCall {
    ToolCall::new(tools::CREATE, json!({"path": path, "content": content}))
}

/// `(old, new)` pairs applied bottom-up, each `old` unique in the file when it is applied;
/// `None` when that is impossible (an empty file) or the result would differ from `target`.
fn hunk_replacements(
    text: &str,
    hunks: &[diff::Hunk],
    target: &str,
) -> Option<Vec<(String, String)>> {
    let positions = diff::locate_hunks(text, hunks).ok()?;
    let mut lines: Vec<String> = text.split_inclusive('\n').map(str::to_string).collect();
    let mut out = Vec::new();
    for (hunk, at) in hunks.iter().zip(positions).rev() {
        let old_len = hunk.old_lines().len();
        let new_block: String = hunk.new_lines().concat();
        let current: String = lines.concat();
        let (mut lo, mut hi) = (at, at + old_len);
        let mut grow_below = true;
        loop {
            let old: String = lines[lo..hi].concat();
            if !old.is_empty() && occurrences(&current, &old).len() == 1 {
                let new = format!(
                    "{}{new_block}{}",
                    lines[lo..at].concat(),
                    lines[at + old_len..hi].concat()
                );
                out.push((old, new));
                break;
            }
            if lo == 0 && hi == lines.len() {
                return None;
            }
            if (grow_below && hi < lines.len()) || lo == 0 {
                hi += 1;
            } else {
                lo -= 1;
            }
            grow_below = !grow_below;
        }
        let new_lines: Vec<String> = new_block
            .split_inclusive('\n')
            .map(str::to_string)
            .collect();
        lines.splice(at..at + old_len, new_lines);
    }
    (lines.concat() == target).then_some(out)
}

/// A policy that makes the oracle's calls one per turn, then submits. It is stateless (the
/// turn index is the number of its earlier turns in the request), so one value serves any
/// number of concurrent episodes of its instance. Its turns are [`PolicyTurn::text_only`]
/// (pseudo tokens, not training data).
#[derive(Debug, Clone)]
pub struct OraclePolicy {
    calls: Vec<ToolCall>,
}

impl OraclePolicy {
    /// The oracle of `instance`.
    pub fn new(instance: &SweInstance) -> std::result::Result<Self, String> {
        Ok(OraclePolicy {
            calls: oracle_calls(instance)?,
        })
    }

    /// The calls it makes, submit included.
    pub fn calls(&self) -> &[ToolCall] {
        &self.calls
    }
}

#[async_trait]
impl Policy for OraclePolicy {
    fn name(&self) -> &str {
        "swe-oracle"
    }

    async fn generate(&self, request: PolicyRequest) -> Result<PolicyTurn> {
        let turn = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        let text = match self.calls.get(turn) {
            Some(call) => call.to_tool_call_block(),
            None => "The fix is submitted.".to_string(),
        };
        Ok(PolicyTurn::text_only(text, request.max_new_tokens))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Replaying the replacements with the `replace` tool's rule (the text must occur
        /// exactly once) reproduces the patched file, whatever the edit.
        #[test]
        fn replacements_replay_any_patch(
            old in proptest::collection::vec("[ab]{0,2}", 1..25),
            new in proptest::collection::vec("[ab]{0,2}", 1..25),
            context in 0usize..4,
        ) {
            let old = old.join("\n") + "\n";
            let new = new.join("\n") + "\n";
            let patch = diff::unified_diff("f", Some(&old), Some(&new), context);
            prop_assume!(!patch.is_empty());
            let hunks = &diff::parse_patch(&patch).unwrap()[0].hunks;
            if let Some(reps) = hunk_replacements(&old, hunks, &new) {
                let mut text = old.clone();
                for (o, n) in reps {
                    let at = occurrences(&text, &o);
                    prop_assert_eq!(at.len(), 1);
                    text = format!("{}{}{}", &text[..at[0]], n, &text[at[0] + o.len()..]);
                }
                prop_assert_eq!(text, new);
            }
        }
    }

    #[test]
    fn replacements_are_unique_and_reproduce_the_target() {
        let old = "x = 1\ny = 2\nx = 1\ny = 2\nz = 3\n";
        let new = "x = 1\ny = 2\nx = 1\ny = 20\nz = 3\n";
        let patch = diff::unified_diff("f.py", Some(old), Some(new), 0);
        let fps = diff::parse_patch(&patch).unwrap();
        let reps = hunk_replacements(old, &fps[0].hunks, new).unwrap();
        assert_eq!(reps.len(), 1);
        assert_eq!(occurrences(old, &reps[0].0).len(), 1);
        assert!(
            hunk_replacements(
                "",
                &diff::parse_patch("--- a/f\n+++ b/f\n@@ -0,0 +1,1 @@\n+a\n").unwrap()[0].hunks,
                "a\n"
            )
            .is_none()
        );
    }
}
