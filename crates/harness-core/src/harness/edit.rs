//! Structured harness edits, addressed by path as in the paper's Table 7
//! (`state.hooks.pagination-completion-guidance` set to a hook, or to `null` to remove it).

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{Harness, canonical_json};
use crate::error::{Error, Result};

/// Maps whose entries an edit replaces whole rather than field by field.
const KEYED_MAPS: &[&str] = &[
    "prompt.slots",
    "prompt_rules",
    "skills",
    "hooks",
    "tool_view.docs",
];

/// One change: set the component at `path` to `value`, or remove it when `value` is `null`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EditOp {
    /// `state.` followed by a dotted path into the harness JSON, e.g. `state.prompt_rules.x`.
    pub path: String,
    /// The new value; `None` (JSON `null`) removes the entry, or resets a field to its default.
    pub value: Option<serde_json::Value>,
}

/// A structured patch of harness components, as the editor emits it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HarnessEdit {
    /// The changes, applied in order.
    pub ops: Vec<EditOp>,
    /// Why (the repair direction, in the editor's words).
    #[serde(default)]
    pub rationale: String,
}

fn segments(path: &str) -> Result<Vec<&str>> {
    let rest = path.strip_prefix("state.").ok_or_else(|| {
        Error::invalid(
            "path",
            format!("edit path `{path}` must start with `state.`"),
        )
    })?;
    let segs: Vec<&str> = rest.split('.').collect();
    if segs.iter().any(|s| s.is_empty()) {
        return Err(Error::invalid(
            "path",
            format!("edit path `{path}` has an empty segment"),
        ));
    }
    Ok(segs)
}

fn lookup<'a>(root: &'a serde_json::Value, segs: &[&str]) -> Option<&'a serde_json::Value> {
    segs.iter()
        .try_fold(root, |node, seg| node.as_object()?.get(*seg))
}

impl EditOp {
    /// Set `path` to `value`.
    pub fn set(path: impl Into<String>, value: serde_json::Value) -> Self {
        EditOp {
            path: path.into(),
            value: Some(value),
        }
    }

    /// Remove the entry at `path`.
    pub fn remove(path: impl Into<String>) -> Self {
        EditOp {
            path: path.into(),
            value: None,
        }
    }

    /// Apply to a harness JSON document; returns the previous value at the path.
    fn apply_to(&self, root: &mut serde_json::Value) -> Result<Option<serde_json::Value>> {
        let segs = segments(&self.path)?;
        let (last, parents) = segs
            .split_last()
            .unwrap_or_else(|| unreachable!("split yields a segment"));
        let mut node = root;
        for (depth, seg) in parents.iter().enumerate() {
            node = node
                .as_object_mut()
                .and_then(|map| map.get_mut(*seg))
                .filter(|child| child.is_object())
                .ok_or_else(|| {
                    Error::invalid(
                        "path",
                        format!(
                            "edit path `{}`: `state.{}` is not an existing component",
                            self.path,
                            segs[..=depth].join(".")
                        ),
                    )
                })?;
        }
        let map = node.as_object_mut().ok_or_else(|| {
            Error::invalid(
                "path",
                format!("edit path `{}` does not lead into an object", self.path),
            )
        })?;
        Ok(match &self.value {
            Some(value) => map.insert((*last).to_string(), value.clone()),
            None => map.remove(*last),
        })
    }
}

impl HarnessEdit {
    /// An edit with the given operations.
    pub fn new(ops: Vec<EditOp>, rationale: impl Into<String>) -> Self {
        HarnessEdit {
            ops,
            rationale: rationale.into(),
        }
    }

    /// Apply to `harness`, returning the validated result. The lineage is left to the caller.
    pub fn apply(&self, harness: &Harness) -> Result<Harness> {
        Ok(self.apply_with_inverse(harness)?.0)
    }

    /// Apply and also return the edit that undoes it.
    pub fn apply_with_inverse(&self, harness: &Harness) -> Result<(Harness, HarnessEdit)> {
        let mut value = harness.to_value();
        let mut inverse = Vec::with_capacity(self.ops.len());
        for (i, op) in self.ops.iter().enumerate() {
            let previous = op.apply_to(&mut value).map_err(|e| at_op(e, i))?;
            inverse.push(EditOp {
                path: op.path.clone(),
                value: previous,
            });
            // Re-read after every operation so a removed component is back at its defaults
            // for the next one, and a bad value is reported at the operation that wrote it.
            value = Harness::from_value(value)
                .map_err(|e| at_op(e, i))?
                .to_value();
        }
        inverse.reverse();
        let edited = Harness::from_value(value)?;
        edited.validate()?;
        Ok((
            edited,
            HarnessEdit::new(inverse, format!("undo: {}", self.rationale)),
        ))
    }

    /// The edit that turns `from` into `to` (lineage excluded). Entries of keyed maps (slots,
    /// rules, skills, hooks, tool docs) are replaced whole; other components field by field.
    pub fn diff(from: &Harness, to: &Harness) -> HarnessEdit {
        let strip = |h: &Harness| {
            let mut v = h.to_value();
            if let Some(map) = v.as_object_mut() {
                map.remove("lineage");
            }
            v
        };
        let (a, b) = (strip(from), strip(to));
        let mut ops = Vec::new();
        diff_into(&a, &b, &mut Vec::new(), &mut ops);
        HarnessEdit::new(ops, String::new())
    }

    /// Whether the edit changes nothing.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The value at an edit path in `harness`, if any.
    pub fn current_value(harness: &Harness, path: &str) -> Result<Option<serde_json::Value>> {
        let segs = segments(path)?;
        Ok(lookup(&harness.to_value(), &segs).cloned())
    }
}

fn at_op(error: Error, index: usize) -> Error {
    match error {
        Error::Invalid { location, message } => Error::Invalid {
            location: crate::error::Location {
                path: format!("ops[{index}].{}", location.path),
                ..location
            },
            message,
        },
        Error::Parse { location, message } => Error::Parse {
            location: crate::error::Location {
                path: format!("ops[{index}] -> {}", location.path),
                ..location
            },
            message,
        },
        other => other,
    }
}

fn diff_into(
    a: &serde_json::Value,
    b: &serde_json::Value,
    path: &mut Vec<String>,
    ops: &mut Vec<EditOp>,
) {
    let (Some(ma), Some(mb)) = (a.as_object(), b.as_object()) else {
        if a != b {
            ops.push(EditOp::set(format!("state.{}", path.join(".")), b.clone()));
        }
        return;
    };
    let keyed = KEYED_MAPS.contains(&path.join(".").as_str());
    let mut keys: Vec<&String> = ma.keys().chain(mb.keys()).collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        path.push(key.clone());
        let full = format!("state.{}", path.join("."));
        match (ma.get(key), mb.get(key)) {
            (Some(_), None) => ops.push(EditOp::remove(full)),
            (None, Some(vb)) => ops.push(EditOp::set(full, vb.clone())),
            (Some(va), Some(vb)) if va != vb => {
                if keyed || path.is_empty() {
                    ops.push(EditOp::set(full, vb.clone()));
                } else {
                    diff_into(va, vb, path, ops);
                }
            }
            _ => {}
        }
        path.pop();
    }
}

impl fmt::Display for HarnessEdit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.rationale.is_empty() {
            writeln!(f, "# {}", self.rationale)?;
        }
        for op in &self.ops {
            match &op.value {
                Some(value) => writeln!(f, "set    {} = {}", op.path, canonical_json(value))?,
                None => writeln!(f, "remove {}", op.path)?,
            }
        }
        Ok(())
    }
}
