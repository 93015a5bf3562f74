//! The behaviour labeller of the app world ([`harness_core::TrajectoryLabeller`]): pagination, documentation lookups, read-backs and `complete_task`.
//!
//! The router's built-in profiler compares a sibling's trajectory with H0's on the same task
//! through these labels (paper Eq. 8 and Table 7), and the same labels can produce the paper's
//! behaviour table. The labeller adds its environment's features to the generic ones of
//! [`GenericLabeller`].

use std::collections::BTreeSet;

use harness_core::labels::flag_value;
use harness_core::{
    BehaviourFeature, GenericLabeller, Step, Trajectory, TrajectoryLabeller, TrajectoryLabels,
    steps,
};
use serde_json::Value;

use crate as appworld;

/// The app world: pagination, documentation lookups, read-backs and `complete_task`.
#[derive(Debug, Clone, Copy, Default)]
pub struct AppWorldLabeller;

/// The `(app, api, arguments)` of a `call_api` step.
fn api_call(step: &Step) -> Option<(&str, &str, &Value)> {
    if step.call.name != appworld::tool::CALL_API {
        return None;
    }
    let args = &step.call.arguments;
    Some((
        args.get("app")?.as_str()?,
        args.get("api")?.as_str()?,
        args.get("arguments").unwrap_or(&Value::Null),
    ))
}

fn is_read_api(api: &str) -> bool {
    api.starts_with("list_") || api.starts_with("show_")
}

impl TrajectoryLabeller for AppWorldLabeller {
    fn env(&self) -> &str {
        appworld::ENV_NAME
    }

    fn features(&self) -> Vec<BehaviourFeature> {
        GenericLabeller::with_generic_features(vec![
            BehaviourFeature::count("pages_fetched", "listing pages fetched"),
            BehaviourFeature::count("later_pages", "pages beyond the first fetched"),
            BehaviourFeature::count("folders_searched", "mail folders searched"),
            BehaviourFeature::count(
                "docs_before_first_use",
                "APIs whose documentation is read before their first call",
            ),
            BehaviourFeature::count("writes", "state-changing API calls"),
            BehaviourFeature::flag(
                "readback_after_write",
                "reads the changed state back after its last write",
            ),
            BehaviourFeature::flag("completes_task", "submits through complete_task"),
        ])
    }

    fn label(&self, trajectory: &Trajectory) -> TrajectoryLabels {
        let steps = steps(trajectory);
        let mut labels = GenericLabeller::generic_labels(trajectory);
        let mut pages = 0.0;
        let mut later_pages = 0.0;
        let mut folders = BTreeSet::new();
        let mut documented = BTreeSet::new();
        let mut called = BTreeSet::new();
        let mut docs_first = 0.0;
        let mut writes = 0.0;
        let mut last_write: Option<(usize, String)> = None;
        let mut read_after_write = false;
        for (i, step) in steps.iter().enumerate() {
            if step.call.name == appworld::tool::SHOW_API {
                let args = &step.call.arguments;
                if let (Some(app), Some(api)) = (
                    args.get("app").and_then(Value::as_str),
                    args.get("api").and_then(Value::as_str),
                ) {
                    documented.insert((app.to_string(), api.to_string()));
                }
                continue;
            }
            let Some((app, api, arguments)) = api_call(step) else {
                continue;
            };
            let key = (app.to_string(), api.to_string());
            if called.insert(key.clone()) && documented.contains(&key) {
                docs_first += 1.0;
            }
            if api.starts_with("list_") {
                pages += 1.0;
                if arguments.get("page").and_then(Value::as_u64).unwrap_or(1) >= 2 {
                    later_pages += 1.0;
                }
                if let Some(folder) = arguments.get("folder").and_then(Value::as_str) {
                    folders.insert(folder.to_string());
                }
            }
            if is_read_api(api) {
                if last_write.as_ref().is_some_and(|(_, a)| a == app) {
                    read_after_write = true;
                }
            } else {
                writes += 1.0;
                last_write = Some((i, app.to_string()));
                read_after_write = false;
            }
        }
        labels.insert("pages_fetched".into(), pages);
        labels.insert("later_pages".into(), later_pages);
        labels.insert("folders_searched".into(), folders.len() as f64);
        labels.insert("docs_before_first_use".into(), docs_first);
        labels.insert("writes".into(), writes);
        labels.insert(
            "readback_after_write".into(),
            flag_value(last_write.is_some() && read_after_write),
        );
        labels.insert(
            "completes_task".into(),
            flag_value(
                steps
                    .iter()
                    .any(|s| s.call.name == appworld::tool::COMPLETE_TASK),
            ),
        );
        labels
    }
}
