//! Building blocks of hand-written siblings: one hook added to a base harness (the built-in
//! environments' siblings are made this way).

use harness_core::{Harness, HookAction, HookEvent, HookSpec};
use serde_json::Value;

/// `base` with one more hook, named and described, descended from `base` (generation 1).
pub fn one_hook_sibling(
    base: &Harness,
    name: &str,
    description: &str,
    hook: &str,
    spec: HookSpec,
) -> Harness {
    let mut harness = base.clone();
    harness.name = name.into();
    harness.description = description.into();
    harness.hooks.insert(hook.into(), spec);
    harness.lineage.parent = Some(base.id());
    harness.lineage.generation = 1;
    harness.lineage.direction = Some(description.into());
    harness
}

/// A hook spec from its parts; `parameters` is a JSON object.
pub fn hook_spec(
    action: HookAction,
    event: HookEvent,
    condition: &str,
    parameters: Value,
    message: &str,
) -> HookSpec {
    HookSpec {
        action,
        condition: condition.into(),
        event,
        message: message.into(),
        parameters: serde_json::from_value(parameters).unwrap_or_default(),
    }
}
