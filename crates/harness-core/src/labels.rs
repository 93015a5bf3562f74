//! Behaviour labels of trajectories: the [`TrajectoryLabeller`] seam.
//!
//! The router's built-in profiler (paper Eq. 8, "Harness Behavior Profiles") describes how a
//! sibling's execution differs from H0's on the same task. It needs numbers it can compare, such
//! as pages fetched, documentation lookups before the first use of an API, read-backs after
//! writes, submission through the completion tool, tool errors or test runs after the last edit.
//! Which of these exist depends on the environment, so each environment provides a labeller; the
//! same labels can later produce the paper's behaviour table (Table 3).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::action::{ActionParser, ParsedAction, ToolCall, ToolCallParser};
use crate::chat::Role;
use crate::trajectory::{Source, Termination, Trajectory};

/// How a behaviour feature's value reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FeatureKind {
    /// A count (pages fetched, tests run): "more" or "fewer" than H0.
    Count,
    /// Present (1) or absent (0): "does" or "does not" where H0 does the opposite.
    Flag,
}

/// One behaviour a labeller measures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BehaviourFeature {
    /// A stable key, e.g. `pages_fetched`.
    pub name: String,
    /// A phrase that completes "the sibling ... than H0" for counts (`pages fetched`) or
    /// "the sibling ... where H0 does not" for flags (`submits through complete_task`).
    pub description: String,
    /// Count or flag.
    pub kind: FeatureKind,
}

impl BehaviourFeature {
    /// A count feature.
    pub fn count(name: impl Into<String>, description: impl Into<String>) -> Self {
        BehaviourFeature {
            name: name.into(),
            description: description.into(),
            kind: FeatureKind::Count,
        }
    }

    /// A flag feature.
    pub fn flag(name: impl Into<String>, description: impl Into<String>) -> Self {
        BehaviourFeature {
            name: name.into(),
            description: description.into(),
            kind: FeatureKind::Flag,
        }
    }
}

/// The values of one trajectory's features, keyed by [`BehaviourFeature::name`].
pub type TrajectoryLabels = BTreeMap<String, f64>;

/// Measures behaviours of an environment's trajectories.
///
/// # Design
/// Labellers read only the recorded trajectory (messages, counts, termination), never the live
/// environment, so they run on trajectories loaded from `trajectories.jsonl` long after the
/// episode. Every feature [`TrajectoryLabeller::features`] lists must get a value in every
/// [`TrajectoryLabeller::label`] result, so that two trajectories can always be compared.
pub trait TrajectoryLabeller: Send + Sync {
    /// The environment whose trajectories this labeller understands ([`crate::Task::env`]).
    fn env(&self) -> &str;

    /// The features it measures.
    fn features(&self) -> Vec<BehaviourFeature>;

    /// The value of every feature on one trajectory.
    fn label(&self, trajectory: &Trajectory) -> TrajectoryLabels;
}

/// Features every trajectory has, from its counters and termination; environments without a
/// labeller of their own fall back to these, and environment labellers include them.
#[derive(Debug, Clone, Copy, Default)]
pub struct GenericLabeller;

/// A flag feature's value: 1 for `true`, 0 for `false`.
pub fn flag_value(b: bool) -> f64 {
    if b { 1.0 } else { 0.0 }
}

impl GenericLabeller {
    /// `specific` followed by the generic features: the feature list of an environment's
    /// labeller, which includes the generic ones.
    pub fn with_generic_features(mut specific: Vec<BehaviourFeature>) -> Vec<BehaviourFeature> {
        specific.extend(Self::generic_features());
        specific
    }

    /// The generic features.
    pub fn generic_features() -> Vec<BehaviourFeature> {
        vec![
            BehaviourFeature::count("env_actions", "environment actions"),
            BehaviourFeature::count("tool_errors", "tool errors"),
            BehaviourFeature::count("parse_failures", "unparseable turns"),
            BehaviourFeature::flag("submitted", "submits through the submit tool"),
            BehaviourFeature::flag("ran_out_of_budget", "runs out of its execution budget"),
        ]
    }

    /// The generic labels of a trajectory.
    pub fn generic_labels(trajectory: &Trajectory) -> TrajectoryLabels {
        let c = &trajectory.counts;
        let flag = flag_value;
        TrajectoryLabels::from([
            ("env_actions".to_string(), f64::from(c.env_actions)),
            ("tool_errors".to_string(), f64::from(c.tool_errors)),
            ("parse_failures".to_string(), f64::from(c.parse_failures)),
            (
                "submitted".to_string(),
                flag(trajectory.termination == Termination::EnvDone),
            ),
            (
                "ran_out_of_budget".to_string(),
                flag(matches!(
                    trajectory.termination,
                    Termination::MaxEnvActions
                        | Termination::MaxModelCalls
                        | Termination::ContextLimit
                )),
            ),
        ])
    }
}

impl TrajectoryLabeller for GenericLabeller {
    fn env(&self) -> &str {
        "*"
    }

    fn features(&self) -> Vec<BehaviourFeature> {
        Self::generic_features()
    }

    fn label(&self, trajectory: &Trajectory) -> TrajectoryLabels {
        Self::generic_labels(trajectory)
    }
}

/// One executed tool call of a trajectory with the environment's response.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The call.
    pub call: ToolCall,
    /// The environment's response text, when the call reached the environment (calls refused
    /// by the harness have none).
    pub response: Option<String>,
}

/// The tool calls of a trajectory in order, each with its response.
///
/// Calls are read back from the policy's `<tool_call>` blocks and matched, in order and by
/// name, to the environment's tool messages that follow them; turns in other action formats
/// yield no steps.
pub fn steps(trajectory: &Trajectory) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::new();
    // Index of the first step of the current turn that still waits for its response.
    let mut pending = 0;
    for message in &trajectory.messages {
        match (message.source, message.role) {
            (Source::Policy, _) => {
                pending = out.len();
                if let ParsedAction::Calls(calls) = ToolCallParser.parse(&message.content, &[]) {
                    out.extend(calls.into_iter().map(|call| Step {
                        call,
                        response: None,
                    }));
                }
            }
            (Source::Environment, Role::Tool) => {
                let name = message.name.as_deref().unwrap_or_default();
                if let Some(offset) = out[pending..]
                    .iter()
                    .position(|s| s.response.is_none() && s.call.name == name)
                {
                    let at = pending + offset;
                    out[at].response = Some(message.content.clone());
                    pending = at + 1;
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trajectory::TrajectoryMessage;
    use crate::{Counts, HarnessId, Outcome};
    use serde_json::json;

    fn message(role: Role, source: Source, content: &str, name: Option<&str>) -> TrajectoryMessage {
        TrajectoryMessage {
            role,
            source,
            content: content.into(),
            name: name.map(str::to_string),
            hook: None,
        }
    }

    #[test]
    fn steps_pair_calls_with_responses_and_skip_refused_ones() {
        let call = |n: &str| ToolCall::new(n, json!({"page": 1})).to_tool_call_block();
        let trajectory = Trajectory {
            task_id: "t".into(),
            env: "e".into(),
            harness_id: HarnessId("h".into()),
            harness_name: "H0".into(),
            seed: 0,
            policy: "p".into(),
            messages: vec![
                message(
                    Role::Assistant,
                    Source::Policy,
                    &format!("{}{}", call("a"), call("b")),
                    None,
                ),
                // `a` was refused by the harness: its reply comes from the harness.
                message(Role::Tool, Source::Harness, "refused", Some("a")),
                message(Role::Tool, Source::Environment, "B!", Some("b")),
                message(Role::Assistant, Source::Policy, &call("a"), None),
                message(Role::Tool, Source::Environment, "A!", Some("a")),
            ],
            turns: Vec::new(),
            final_answer: None,
            outcome: Outcome::failure(json!(null)),
            termination: Termination::EnvDone,
            policy_version: None,
            counts: Counts {
                env_actions: 2,
                ..Counts::default()
            },
        };
        let got = steps(&trajectory);
        let responses: Vec<(&str, Option<&str>)> = got
            .iter()
            .map(|s| (s.call.name.as_str(), s.response.as_deref()))
            .collect();
        assert_eq!(
            responses,
            vec![("a", None), ("b", Some("B!")), ("a", Some("A!"))]
        );
        let labels = GenericLabeller.label(&trajectory);
        assert_eq!(labels["submitted"], 1.0);
        assert_eq!(labels["env_actions"], 2.0);
        assert_eq!(
            GenericLabeller.features().len(),
            labels.len(),
            "every feature has a value"
        );
    }
}
