//! The retail world's behaviour labels ([`harness_core::TrajectoryLabeller`]), for the
//! router's profiles and the behaviour tables: the customer-service failures the paper's
//! analysis counts (changing the database before looking the customer or the order up, or
//! without the customer's yes right before the change).

use harness_core::labels::flag_value;
use harness_core::{
    BehaviourFeature, GenericLabeller, Step, Trajectory, TrajectoryLabeller, TrajectoryLabels,
    steps,
};

use crate as tau_retail;

/// The retail world: lookups before writes, confirmation before writes, policy violations.
#[derive(Debug, Clone, Copy, Default)]
pub struct TauRetailLabeller;

fn succeeded(step: &Step) -> bool {
    step.response
        .as_deref()
        .is_some_and(|r| !r.starts_with("Error"))
}

impl TrajectoryLabeller for TauRetailLabeller {
    fn env(&self) -> &str {
        tau_retail::ENV_NAME
    }

    fn features(&self) -> Vec<BehaviourFeature> {
        let mut features = vec![
            BehaviourFeature::count("lookups", "database lookups"),
            BehaviourFeature::count("writes", "database changes attempted"),
            BehaviourFeature::count("messages_to_customer", "messages sent to the customer"),
            BehaviourFeature::flag(
                "authenticated_before_first_write",
                "finds the customer's user id before its first change",
            ),
            BehaviourFeature::flag(
                "lookup_before_first_write",
                "reads the user or the order before its first change",
            ),
            BehaviourFeature::count(
                "confirmed_writes",
                "changes made right after the customer's yes",
            ),
            BehaviourFeature::count(
                "policy_violations",
                "changes made without a yes right before them or before authentication",
            ),
            BehaviourFeature::flag("transferred", "transfers the customer to a human agent"),
        ];
        features.extend(GenericLabeller::generic_features());
        features
    }

    fn label(&self, trajectory: &Trajectory) -> TrajectoryLabels {
        use tau_retail::tools::{self, name};
        let steps = steps(trajectory);
        let mut labels = GenericLabeller::generic_labels(trajectory);
        let is_write = |s: &Step| tools::is_write(&s.call.name);
        let first_write = steps.iter().position(is_write);
        let before_first_write =
            |pred: &dyn Fn(&Step) -> bool| first_write.is_some_and(|w| steps[..w].iter().any(pred));
        let (mut confirmed, mut violations, mut authenticated) = (0.0, 0.0, false);
        for (i, step) in steps.iter().enumerate() {
            if tools::AUTH_TOOLS.contains(&step.call.name.as_str()) && succeeded(step) {
                authenticated = true;
            }
            if !is_write(step) {
                continue;
            }
            let yes = i > 0
                && steps[i - 1].call.name == tau_retail::RESPOND_TOOL
                && steps[i - 1]
                    .response
                    .as_deref()
                    .is_some_and(tau_retail::user::is_affirmative);
            if yes {
                confirmed += 1.0;
            } else {
                violations += 1.0;
            }
            if !authenticated {
                violations += 1.0;
            }
        }
        let count = |f: &dyn Fn(&Step) -> bool| steps.iter().filter(|s| f(s)).count() as f64;
        labels.insert("lookups".into(), count(&|s| tools::is_read(&s.call.name)));
        labels.insert("writes".into(), count(&is_write));
        labels.insert(
            "messages_to_customer".into(),
            count(&|s| s.call.name == tau_retail::RESPOND_TOOL),
        );
        labels.insert(
            "authenticated_before_first_write".into(),
            flag_value(before_first_write(&|s| {
                tools::AUTH_TOOLS.contains(&s.call.name.as_str()) && succeeded(s)
            })),
        );
        labels.insert(
            "lookup_before_first_write".into(),
            flag_value(before_first_write(&|s| {
                (s.call.name == name::GET_ORDER_DETAILS || s.call.name == name::GET_USER_DETAILS)
                    && succeeded(s)
            })),
        );
        labels.insert("confirmed_writes".into(), confirmed);
        labels.insert("policy_violations".into(), violations);
        labels.insert(
            "transferred".into(),
            flag_value(
                steps
                    .iter()
                    .any(|s| s.call.name == name::TRANSFER_TO_HUMAN_AGENTS && succeeded(s)),
            ),
        );
        labels
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    use harness_core::{
        Counts, HarnessId, Outcome, Role, Source, Termination, ToolCall, TrajectoryMessage,
    };
    use serde_json::json;

    /// A trajectory of `calls`, each answered `ok`.
    fn trajectory(env: &str, calls: &[ToolCall], termination: Termination) -> Trajectory {
        let mut messages = Vec::new();
        for call in calls {
            messages.push(TrajectoryMessage {
                role: Role::Assistant,
                source: Source::Policy,
                content: call.to_tool_call_block(),
                name: None,
                hook: None,
            });
            messages.push(TrajectoryMessage {
                role: Role::Tool,
                source: Source::Environment,
                content: "ok".into(),
                name: Some(call.name.clone()),
                hook: None,
            });
        }
        Trajectory {
            task_id: "t".into(),
            env: env.into(),
            harness_id: HarnessId("h".into()),
            harness_name: "H".into(),
            seed: 0,
            policy: "p".into(),
            messages,
            turns: Vec::new(),
            final_answer: None,
            outcome: Outcome::failure(json!(null)),
            termination,
            policy_version: None,
            counts: Counts {
                env_actions: calls.len() as u32,
                ..Counts::default()
            },
        }
    }

    fn assert_complete(labeller: &dyn TrajectoryLabeller, labels: &TrajectoryLabels) {
        let names: BTreeSet<String> = labeller.features().into_iter().map(|f| f.name).collect();
        let got: BTreeSet<String> = labels.keys().cloned().collect();
        assert_eq!(names, got, "every feature labelled");
    }

    #[test]
    fn tau_retail_labels_lookups_confirmations_and_violations() {
        use tau_retail::tools::name;
        let respond =
            |text: &str| ToolCall::new(tau_retail::RESPOND_TOOL, json!({"content": text}));
        let cancel = ToolCall::new(
            name::CANCEL_PENDING_ORDER,
            json!({"order_id": "#W1", "reason": "no longer needed"}),
        );
        let calls = vec![
            respond("Your email?"),
            ToolCall::new(name::FIND_USER_ID_BY_EMAIL, json!({"email": "a@b.c"})),
            ToolCall::new(name::GET_ORDER_DETAILS, json!({"order_id": "#W1"})),
            respond("I will cancel order #W1. Do you confirm (yes/no)?"),
            cancel.clone(),
            cancel.clone(),
        ];
        let mut t = trajectory(tau_retail::ENV_NAME, &calls, Termination::PolicyFinished);
        // The customer's yes to the confirmation request.
        t.messages[7].content = "Yes, please go ahead.".into();
        let labels = TauRetailLabeller.label(&t);
        assert_complete(&TauRetailLabeller, &labels);
        assert_eq!(labels["lookups"], 2.0);
        assert_eq!(labels["writes"], 2.0);
        assert_eq!(labels["messages_to_customer"], 2.0);
        assert_eq!(labels["authenticated_before_first_write"], 1.0);
        assert_eq!(labels["lookup_before_first_write"], 1.0);
        assert_eq!(labels["confirmed_writes"], 1.0);
        assert_eq!(
            labels["policy_violations"], 1.0,
            "the second cancel has no yes"
        );
        assert_eq!(labels["transferred"], 0.0);
        // Straight to the write: no lookup, no authentication, no yes.
        let rushed = TauRetailLabeller.label(&trajectory(
            tau_retail::ENV_NAME,
            &calls[4..5],
            Termination::PolicyFinished,
        ));
        assert_eq!(rushed["authenticated_before_first_write"], 0.0);
        assert_eq!(rushed["lookup_before_first_write"], 0.0);
        assert_eq!(rushed["policy_violations"], 2.0);
    }
}
