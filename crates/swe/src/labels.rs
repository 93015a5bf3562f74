//! The behaviour labeller of the repository-repair world ([`harness_core::TrajectoryLabeller`]): reproduction and verification.
//!
//! The router's built-in profiler compares a sibling's trajectory with H0's on the same task
//! through these labels (paper Eq. 8 and Table 7), and the same labels can produce the paper's
//! behaviour table. The labeller adds its environment's features to the generic ones of
//! [`GenericLabeller`].

use harness_core::labels::flag_value;
use harness_core::{
    BehaviourFeature, GenericLabeller, Step, Trajectory, TrajectoryLabeller, TrajectoryLabels,
    steps,
};

use crate as swe;

/// The repository world: reading, searching, editing and running the tests.
#[derive(Debug, Clone, Copy, Default)]
pub struct SweLabeller;

impl TrajectoryLabeller for SweLabeller {
    fn env(&self) -> &str {
        swe::ENV_NAME
    }

    fn features(&self) -> Vec<BehaviourFeature> {
        GenericLabeller::with_generic_features(vec![
            BehaviourFeature::count("files_viewed", "files viewed"),
            BehaviourFeature::count("searches", "repository searches"),
            BehaviourFeature::count("edits", "file edits"),
            BehaviourFeature::count("test_runs", "test runs"),
            BehaviourFeature::flag(
                "tests_before_first_edit",
                "runs the tests before its first edit (reproduces the failure)",
            ),
            BehaviourFeature::flag(
                "tests_after_last_edit",
                "runs the tests after its last edit (checks the assertions)",
            ),
        ])
    }

    fn label(&self, trajectory: &Trajectory) -> TrajectoryLabels {
        use swe::tools;
        let steps = steps(trajectory);
        let mut labels = GenericLabeller::generic_labels(trajectory);
        let count = |name: &str| steps.iter().filter(|s| s.call.name == name).count() as f64;
        let is_edit = |s: &Step| s.call.name == tools::REPLACE || s.call.name == tools::CREATE;
        let first_edit = steps.iter().position(is_edit);
        let last_edit = steps.iter().rposition(is_edit);
        let test_at: Vec<usize> = steps
            .iter()
            .enumerate()
            .filter(|(_, s)| s.call.name == tools::RUN_TESTS)
            .map(|(i, _)| i)
            .collect();
        labels.insert("files_viewed".into(), count(tools::VIEW));
        labels.insert("searches".into(), count(tools::SEARCH));
        labels.insert(
            "edits".into(),
            steps.iter().filter(|s| is_edit(s)).count() as f64,
        );
        labels.insert("test_runs".into(), test_at.len() as f64);
        labels.insert(
            "tests_before_first_edit".into(),
            flag_value(first_edit.is_some_and(|e| test_at.iter().any(|t| *t < e))),
        );
        labels.insert(
            "tests_after_last_edit".into(),
            flag_value(last_edit.is_some_and(|e| test_at.iter().any(|t| *t > e))),
        );
        labels
    }
}
